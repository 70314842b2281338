"""Frames the camera dropped, as a user meets them: `packer pack` at its defaults (SLAM,
or `--no-slam`) on sessions whose camera discarded 1%, 3% or 10% of its frames
(`alwaysDiscardsLateVideoFrames`: the numbering runs on over the gap), with the app's
video.mov and without it, today's code against a baseline commit, a fresh process per
session.

Per (drop rate, video.mov, mode, method): accepted share; among the accepted, the
worst joint error of any label marked valid (the proprio and, with poses, every real
action-chunk step, against the glove's true angles at the frame's true time), the
share of real chunk steps that span a gap (a "teleport": their frames are more than
half a period off k periods apart), and with SLAM the scale error (median, worst) of
the packed poses. Sessions: fast hand motion at 60 fps, rendered once per (seed,
seconds, rate) with video.mov and cached under bench/data/phone_drops/.

    python -m bench.phone_drops [--sessions 5] [--seconds 10] [--rates 0.01,0.03,0.1] [--modes slam,no-slam]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import machine, write_csv
from bench.slam_hard import REPO, accuracy, baseline_tree

DATA = Path(os.environ.get("SHARDSHIP_BENCH_DATA", REPO / "bench" / "data")) / "phone_drops"
BASELINE_REF = "4e35375"  # main before issue 39 (index/fps frame times, joints held across gaps)
FPS = 60.0


def render(seed: int, seconds: float, rate: float) -> Path:
    from packer.synth import synth_session
    from packer.synth.spec import Faults

    out = DATA / f"r{rate:g}-{seconds:g}s"
    name = f"session_2026-04-01_{seed:02d}0000"
    d = out / name
    if not (d / "synth_truth.json").exists():
        synth_session(out, name, int(round(seconds * FPS)), seed=2000 + seed, motion="fast", video=True,
                      faults=Faults(drop_rate=rate))
    return d


def pack_one(src: Path, work: Path, pythonpath: str, video: bool, slam: bool) -> tuple[int, float, Path, Path]:
    """(exit code, wall s, packed dir, the session as packed) on a fresh copy."""
    raw, out = work / "raw", work / "packed"
    shutil.rmtree(work, ignore_errors=True)
    ignore = ["synth_truth.json"] + ([] if video else ["video.mov"])
    shutil.copytree(src, raw / src.name, ignore=shutil.ignore_patterns(*ignore))
    argv = [sys.executable, "-m", "packer", "pack", "--raw", str(raw), "--out", str(out), "--quiet", "--workers", "1"]
    argv += [] if slam else ["--no-slam"]
    t0 = time.perf_counter()
    with open(work.parent / f"{work.name}.log", "w") as log:
        rc = subprocess.call(argv, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONPATH=pythonpath),
                             cwd=work.parent)
    return rc, time.perf_counter() - t0, out, raw / src.name


def labels(out: Path, src: Path) -> dict | None:
    """The packed labels against the truth; None when the session was not packed."""
    from packer.synth import truth

    index_path = out / "index.json"
    if not index_path.exists():
        return None
    entry = json.loads(index_path.read_text())["sessions"].get(src.name)
    if not entry:
        return None
    metas = []
    for shard in entry["shards"]:
        with tarfile.open(out / shard) as tf:
            metas += [json.load(tf.extractfile(m)) for m in tf.getmembers() if m.name.endswith(".json")]
    metas.sort(key=lambda m: m["frame"])
    tr = truth(src)
    joints, times = tr["joints_deg"], tr["frame_timestamps"]
    worst, steps, teleports = 0.0, 0, 0
    for p, m in enumerate(metas):
        jm = np.array(m.get("joint_mask", [1] * joints.shape[1]), bool)
        ok = m.get("joints_valid") is not False
        if ok:
            worst = max(worst, float(np.abs(_wrapped(np.array(m["proprio"]) - joints[m["frame"]]))[jm].max()))
        if m.get("action") is None:
            continue
        act, jk = np.array(m["action"]), m.get("joints_mask") or [1] * len(m["action_mask"])
        for k, real in enumerate(m["action_mask"], start=1):
            if not real or p + k >= len(metas):
                continue
            nxt = metas[p + k]["frame"]
            steps += 1
            teleports += abs(times[nxt] - times[m["frame"]] - k / FPS) > 0.5 / FPS
            if ok and jk[k - 1]:
                worst = max(worst, float(np.abs(_wrapped(act[k - 1, 9:] - joints[nxt]))[jm].max()))
    return {"worst_joint_deg": worst, "samples": len(metas), "valid": sum(m.get("joints_valid") is not False
                                                                          for m in metas),
            "steps": steps, "teleport_pct": 100.0 * teleports / steps if steps else 0.0}


def _wrapped(d: np.ndarray) -> np.ndarray:
    return (d + 180.0) % 360.0 - 180.0


def sweep(rates: list[float], modes: list[str], sessions: int, seconds: float, baseline: str | None,
          log: Path | None = None, today: Path | None = None) -> list[dict]:
    work = Path(tempfile.mkdtemp(prefix="phone_drops-"))
    methods = [("today", str(today or REPO))]
    if baseline:
        methods.append((f"baseline {baseline}", str(baseline_tree(baseline, work / "base"))))
    runs: dict[tuple, list[dict]] = {}
    try:
        for rate in rates:
            for seed in range(sessions):
                src = render(seed, seconds, rate)
                for mode in modes:
                    for video in (True, False):
                        for method, path in methods:  # interleaved per session
                            rc, wall, out, packed_src = pack_one(src, work / "run", path, video, mode == "slam")
                            rec = {"rate": rate, "video": video, "mode": mode, "method": method, "seed": seed,
                                   "rc": rc, "wall_s": wall}
                            got = labels(out, src)
                            rec["accepted"] = got is not None
                            if got:
                                rec.update(got)
                                if mode == "slam" and (packed_src / "poses.json").exists():
                                    try:
                                        rec["scale_error_pct"] = accuracy(packed_src, src)["scale_error_pct"]
                                    except (KeyError, ValueError):
                                        pass
                            runs.setdefault((rate, video, mode, method), []).append(rec)
                            if log:
                                with open(log, "a") as f:
                                    f.write(json.dumps(rec) + "\n")
    finally:
        if baseline:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(work / "base")],
                           capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    return [dict({"machine": machine()}, **summarise(k, v)) for k, v in runs.items()]


def summarise(key: tuple, recs: list[dict]) -> dict:
    rate, video, mode, method = key
    acc = [r for r in recs if r["accepted"]]
    scale = [abs(r["scale_error_pct"]) for r in acc if "scale_error_pct" in r]
    return {"drop_rate": rate, "video_mov": video, "mode": mode, "method": method, "sessions": len(recs),
            "accepted_pct": 100.0 * len(acc) / len(recs),
            "worst_joint_deg": max((r["worst_joint_deg"] for r in acc), default=float("nan")),
            "valid_share_pct": 100.0 * sum(r["valid"] for r in acc) / max(1, sum(r["samples"] for r in acc)),
            "teleport_steps_pct": max((r["teleport_pct"] for r in acc), default=float("nan")),
            "scale_err_median_pct": statistics.median(scale) if scale else float("nan"),
            "scale_err_worst_pct": max(scale) if scale else float("nan"),
            "wall_s_median": statistics.median(r["wall_s"] for r in recs)}


def run(results_dir: Path, quick: bool = False) -> list[dict]:
    """`make bench` entry: 5 sessions of 10 s per rate (2 of 5 s with --quick)."""
    sessions, seconds = (2, 5.0) if quick else (5, 10.0)
    rows = sweep([0.01, 0.03, 0.10], ["no-slam", "slam"], sessions, seconds, BASELINE_REF)
    write_csv(Path(results_dir) / "phone_drops.csv", rows,
              "make bench (python -m bench --only phone_drops" + (" --quick)" if quick else ")"))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rates", default="0.01,0.03,0.1")
    ap.add_argument("--modes", default="no-slam,slam")
    ap.add_argument("--baseline", default=BASELINE_REF, help="git ref of the baseline ('' for none)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "phone_drops.csv")
    ap.add_argument("--log", type=Path, default=None, help="also append every session's record (JSON lines)")
    ap.add_argument("--today-dir", type=Path, default=None,
                    help="a checkout to measure as today's code (default: this one; a fixed worktree keeps edits made "
                         "while the bench runs out of it)")
    a = ap.parse_args()
    rows = sweep([float(r) for r in a.rates.split(",")], a.modes.split(","), a.sessions, a.seconds,
                 a.baseline or None, a.log, a.today_dir)
    for r in rows:
        print({k: v for k, v in r.items() if k != "machine"})
    write_csv(a.out, rows, "python -m bench.phone_drops " + " ".join(sys.argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
