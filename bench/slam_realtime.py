"""`packer slam` on the 30 s fast-hand session against real time (issue 20: at or under
the session's duration on 2 cores), today's tree and a baseline commit interleaved.

The session is `packer synth --profile fast` seed 0, 1,800 frames (29.98 s), cached under
bench/data/slam_hard/ like the other hard-world renders. Each run is the whole command
as a user types it (`python -m packer slam --raw DIR --force --quiet`, a fresh copy, a
fresh process); wall and CPU seconds of the process tree, the ratio to the video's
duration, and the scale error against the truth (the same poses every run: the stage is
repeatable, so a spread in time is the machine's, not the work's). One row per run,
then a median row per tree.

    python -m bench.slam_realtime [--reps 3] [--baseline REF]
"""
from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from bench.common import baseline_worktree, machine, write_csv
from bench.slam_hard import REPO, accuracy, render, run_slam

BASELINE_REF = "07abe31"  # main before the mapper's coarser stop and the block-wise clock search (session 11)
FRAMES = 1800
VIDEO_S = (FRAMES - 1) / 60.0  # 29.98 s from the first frame to the last


def sweep(reps: int, baseline: str | None) -> list[dict]:
    src = render("fast", 0, FRAMES)
    work = Path(tempfile.mkdtemp(prefix="bench-slam-realtime-"))
    trees = {"shardship (this tree)": str(REPO)}
    try:
        with contextlib.ExitStack() as stack:
            if baseline:
                base, why = stack.enter_context(baseline_worktree(baseline, work / "baseline"))
                if base is None:
                    print("   ", why, flush=True)
                else:
                    trees[f"baseline {baseline}"] = str(base)
            rows = [_one_run(src, work, name, tree, rep) for rep in range(reps) for name, tree in trees.items()]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows + [_median_row(name, [r for r in rows if r["tree"] == name]) for name in trees]


def _one_run(src: Path, work: Path, name: str, tree: str, rep: int) -> dict:
    """The whole `packer slam` command once on a fresh copy (`slam_hard.run_slam`), as one row."""
    rc, wall, cpu, line = run_slam(src, work / "run", tree)
    row = {"machine": machine(), "tree": name, "rep": rep, "accepted": rc == 0, "wall_s": round(wall, 1),
           "cpu_s": round(cpu, 1), "x_real_time": round(wall / VIDEO_S, 3)}
    if rc == 0:
        row["scale_err_pct"] = round(accuracy(work / "run" / "raw" / src.name, src)["scale_error_pct"], 3)
    else:
        row["refusal"] = line[-120:]
    print("   ", {k: v for k, v in row.items() if k != "machine"}, flush=True)
    return row


def _median_row(name: str, mine: list[dict]) -> dict:
    walls = [r["wall_s"] for r in mine]
    return {"machine": machine(), "tree": name, "rep": "median", "wall_s": statistics.median(walls),
            "cpu_s": statistics.median(r["cpu_s"] for r in mine),
            "x_real_time": round(statistics.median(walls) / VIDEO_S, 3), "spread_s": f"{min(walls)}-{max(walls)}"}


def run(results_dir: Path, quick: bool = False) -> list[dict]:
    """`make bench` entry: 3 interleaved runs per tree (1 with --quick)."""
    rows = sweep(1 if quick else 3, BASELINE_REF)
    write_csv(Path(results_dir) / "slam_realtime.csv", rows,
              "make bench (python -m bench --only slam_realtime" + (" --quick)" if quick else ")"))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3, help="runs per tree, interleaved")
    ap.add_argument("--baseline", default=BASELINE_REF, help="git ref of the baseline ('' for none)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "slam_realtime.csv")
    a = ap.parse_args()
    write_csv(a.out, sweep(a.reps, a.baseline or None), "python -m bench.slam_realtime " + " ".join(sys.argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
