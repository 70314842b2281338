"""`packer pack`'s memory does not grow with the session's length: the encoded
JPEGs are held only AHEAD_FRAMES ahead of the writer and let go once written,
and each sample's JSON is built as it is written (packer.framepool,
packer.samples.SampleMetas). Before, a session's JPEGs and its sample JSON all
stayed in memory until the session was done: ~35 kB per frame, 2.7 GB for a
5-minute session with poses.

Measured on real processes: peak RSS (wait4's ru_maxrss, the pack and the
workers it reaped) of `packer pack --no-slam` on a short and a 6x longer session
with poses (actions in every sample); the growth per added frame is bounded.
Memory, not time: the same on a loaded machine. `make bench` (bench/pack_memory.py)
gives the 5-minute figure."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from packer.synth import synth_session
from tests.datasets import write_truth_as_metric

ROOT = Path(__file__).resolve().parent.parent
SHORT, LONG = 600, 3600  # 10 s and 60 s at 60 fps
# What is left per frame (~9 kB measured): the session's arrays (poses, the action
# chunks as float64 and their statistics' copies: ~5 kB), and imu.json's JSON objects
# while it is read (~3.5 kB a frame at 200 Hz, freed after loading). Before: ~40 kB.
MAX_KB_PER_FRAME = 15.0


# The peak RSS of the processes a small parent started (its children's ru_maxrss):
# not measured from the test process itself, whose own RSS a forked child carries
# until it execs (the kernel counts that too).
MEASURE = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL); "
           "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(r.returncode)")


def peak_rss_kb(raw: Path, out: Path) -> int:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", MEASURE, sys.executable, "-m", "packer", "pack", "--no-slam",
                          "--quiet", "--workers", "2", "--raw", str(raw), "--out", str(out)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    return int(res.stdout.split()[-1])


@pytest.mark.slow
def test_peak_rss_grows_by_a_few_kb_per_frame_at_most(tmp_path: Path) -> None:
    peaks = {}
    for n in (SHORT, LONG):
        raw = tmp_path / f"raw{n}"
        s = synth_session(raw, "session_2026-04-01_100000", n, seed=1, motion="static", jpeg_quality=95)
        write_truth_as_metric(s)
        peaks[n] = peak_rss_kb(raw, tmp_path / f"out{n}")
    per_frame = (peaks[LONG] - peaks[SHORT]) / (LONG - SHORT)
    print(f"peak RSS {peaks[SHORT] / 1024:.0f} MB ({SHORT} frames), {peaks[LONG] / 1024:.0f} MB ({LONG} frames): "
          f"{per_frame:.1f} kB per frame")
    assert per_frame <= MAX_KB_PER_FRAME, peaks
