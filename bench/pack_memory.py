"""Peak memory of `packer pack` on a long session: a 1-minute and a 5-minute one
(3,600 and 18,000 frames at 60 fps; --quick: 30 s and 2 minutes).

The sessions are static synthetic ones (one rendered frame written 18,000 times:
rendering 18,000 views would take an hour here) with the ground truth as poses
in the user's calibrated format, so every sample carries a pose and a 16 x 13
action chunk and the SLAM stage has nothing to do. What is measured is the pack's
own memory: per-session planning, the encoded JPEGs waiting for the writer, the
sample JSON. Two figures per run, from a small parent process (its own RSS is
not in them): the peak RSS of the largest process (RUSAGE_CHILDREN ru_maxrss: the
pack's main process) and of the whole process tree (the pack and its workers,
/proc sampled every 20 ms). SLAM's own memory (a spawned worker per session,
COLMAP's mapping over all keyframes) is not in these rows: bench/slam.py."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import machine, write_csv

ROOT = Path(__file__).resolve().parent.parent
FPS = 60
# The bound the test (tests/test_pack_memory.py) checks per frame, and what it
# allows for 5 minutes: the interpreter with numpy and PIL (~60 MB), the JPEGs
# encoded ahead of the writer (packer.framepool.AHEAD_FRAMES x ~25 kB = 0.1 GB at
# most), and ~15 kB per frame of the session's arrays and imu.json being parsed.
BOUND_MB_5MIN = 60 + 100 + 18_000 * 15 / 1024

_PARENT = r"""
import os, resource, subprocess, sys, time
def tree(pid):
    kids = {}
    for d in os.listdir('/proc'):
        if d.isdigit():
            try:
                kids.setdefault(int(open(f'/proc/{d}/stat').read().rsplit(')', 1)[1].split()[1]), []).append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += next(int(l.split()[1]) for l in open(f'/proc/{p}/status') if l.startswith('VmRSS'))
        except (OSError, StopIteration):
            pass
        todo += kids.get(p, [])
    return total
p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
peak = 0
while p.poll() is None:
    peak = max(peak, tree(p.pid))
    time.sleep(0.02)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, peak, p.returncode)
"""


def session(root: Path, frames: int) -> Path:
    from packer.synth import synth_session
    from tests.datasets import write_truth_as_metric

    s = synth_session(root, "session_2026-05-01_090000", frames, seed=3, motion="static")
    write_truth_as_metric(s)
    return root


def measure(raw: Path, out: Path, *extra: str) -> tuple[float, float, float]:
    """(main process peak MB, process tree peak MB, seconds) of one `packer pack`."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "packer", "pack", "--quiet", "--raw", str(raw), "--out", str(out), *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", _PARENT, *cmd], cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    main_kb, tree_kb, rc = (int(x) for x in res.stdout.split())
    if rc != 0:
        raise RuntimeError(f"packer pack exited {rc}: {res.stderr[-500:]}")
    return main_kb / 1024, tree_kb / 1024, wall


def run(results_dir: Path, quick: bool = False) -> list[dict]:
    sizes = (1_800, 7_200) if quick else (3_600, 18_000)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-packmem-") as tmp:
        peaks: dict[tuple[int, str], float] = {}
        for frames in sizes:
            raw = session(Path(tmp) / f"raw{frames}", frames)
            for mode, extra in (("with SLAM stage (cached)", ()), ("--no-slam", ("--no-slam",))):
                main_mb, tree_mb, wall = measure(raw, Path(tmp) / "out", *extra)
                peaks[frames, mode] = main_mb
                rows.append({"frames": frames, "minutes": round(frames / FPS / 60, 2), "mode": mode,
                             "peak_rss_main_mb": round(main_mb), "peak_rss_tree_mb": round(tree_mb),
                             "seconds": round(wall, 1), "machine": machine(), "load": os.getloadavg()[0],
                             "command": f"packer pack {' '.join(extra)}".strip()})
            shutil.rmtree(raw)
        lo, hi = sizes
        for r in rows:
            if r["frames"] == hi:
                r["kb_per_frame"] = round((peaks[hi, r["mode"]] - peaks[lo, r["mode"]]) * 1024 / (hi - lo), 1)
                r["bound_mb_5min"] = round(BOUND_MB_5MIN)
    write_csv(results_dir / "pack_memory.csv", rows)
    return rows
