"""Ctrl-C stress on `packer pack`: many runs, SIGINT to the process group (as a
terminal sends it) at a random moment of each, a hang being the rare failure that
a handful of test points cannot show (CI met one in ~100 interrupts). Per tree:
runs, exits by kind (130 interrupted, 0 finished first, -2 Python's own SIGINT
exit, 1 other), hangs (the group still holding the pack's output 10 s after the
signal, killed then), and the time from the signal to the group's exit (median,
worst). The baseline is a `git worktree` of BASELINE_REF, runs interleaved.

    python -m bench --only interrupt [--quick]      (SHARDSHIP_BENCH_BASELINE=<ref>)"""
from __future__ import annotations

import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.common import baseline_worktree, machine, write_csv

ROOT = Path(__file__).resolve().parents[1]
BASELINE_REF = os.environ.get("SHARDSHIP_BENCH_BASELINE", "55bcc81")  # main before the pool fixes
HANG_S = 10.0


def _start(tree: Path, raw: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "packer", "pack", "--raw", str(raw), "--out", str(out),
                             "--workers", "2", "--no-slam"], cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _one(tree: Path, raw: Path, out: Path, delay: float) -> tuple[str, float]:
    """(outcome, seconds from the signal to the group's output closing) of one run."""
    shutil.rmtree(out, ignore_errors=True)
    p = _start(tree, raw, out)
    time.sleep(delay)
    sent = time.monotonic()
    os.killpg(p.pid, signal.SIGINT)
    try:
        p.communicate(timeout=HANG_S)
        kind = {130: "interrupted", 0: "finished", -2: "sigint_exit"}.get(p.returncode, f"rc_{p.returncode}")
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        kind = "hang"
    return kind, time.monotonic() - sent


def run(results_dir: Path, quick: bool = False) -> list[dict]:
    work = Path(tempfile.mkdtemp(prefix="bench-interrupt-"))
    trees = {"shardship (this tree)": ROOT}
    try:
        with baseline_worktree(BASELINE_REF, work / "baseline") as (base, _rev):
            if base is not None:
                trees[f"baseline {BASELINE_REF}"] = base
            return _stress(trees, work, results_dir, quick)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _stress(trees: dict[str, Path], work: Path, results_dir: Path, quick: bool) -> list[dict]:
    from packer.synth import synth_dataset

    runs = 40 if quick else 300
    raw = work / "raw"
    synth_dataset(raw, sessions=3, frames=240, seed=11, export="folder", progress=False)
    t0 = time.monotonic()
    _start(ROOT, raw, work / "ref").communicate()
    span = time.monotonic() - t0
    rng = random.Random(0)
    kinds: dict[str, Counter] = {k: Counter() for k in trees}
    took: dict[str, list[float]] = {k: [] for k in trees}
    load = [os.getloadavg()[0]]
    for i in range(runs):
        delay = rng.uniform(0.05, 1.1 * span)  # the same moments for every tree
        for name, tree in (trees.items() if i % 2 == 0 else reversed(trees.items())):
            kind, sec = _one(tree, raw, work / "out", delay)
            kinds[name][kind] += 1
            if kind != "hang":
                took[name].append(sec)
    load.append(os.getloadavg()[0])
    rows = [{"machine": machine(), "method": name, "runs": runs, "pack_seconds": round(span, 2),
             **{k: kinds[name][k] for k in ("interrupted", "finished", "sigint_exit", "hang")},
             "other": sum(v for k, v in kinds[name].items()
                          if k not in ("interrupted", "finished", "sigint_exit", "hang")),
             "exit_s_median": round(statistics.median(took[name]), 3) if took[name] else None,
             "exit_s_worst": round(max(took[name]), 3) if took[name] else None,
             "load_avg_1m": f"{load[0]:.1f}-{load[1]:.1f}",
             "command": "python -m bench --only interrupt" + (" --quick" if quick else "")}
            for name in trees]
    write_csv(results_dir / "interrupt.csv", rows)
    return rows
