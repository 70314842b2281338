"""`packer slam` on the hard world: many seeds per profile, today's code against a
baseline commit, as a user runs it (defaults, a fresh process per session).

Profiles (`packer.effects.PROFILES`): easy (today's renders), fast (real hand
speeds), each camera effect alone (glove, lens, blur + rolling shutter, exposure,
low texture), all of them on fast motion, and a real phone's build (`PHONE_RIGS`: the
IMU off the camera, a later first frame, an off-centre principal point) on vigorous
motion (fast-phone, fast-phone-all with every effect) and in a room papered with
photographs (photos). Each session is rendered once per
(profile, seed, frames) and cached under bench/data/slam_hard/ (rendering is the
slow part); each method runs `python -m packer slam --raw DIR --force --quiet` on a
fresh copy, the baseline from a `git worktree` of `--baseline` (default: the
commit before the hard-world work) on PYTHONPATH, methods interleaved per session.

Per profile and method: accepted %, and among the accepted: scale error of the
packed poses (median, worst: the scale of the sim(3) fit of every frame's position
to the truth's, the estimate fitted on the truth; the other way round, the fit
until session 13, the estimate's own noise shrinks the slope by (ATE / extent)^2,
0.4% on an every-effect session with a 1 cm ATE: `scale_error_fwd_pct` keeps it),
|error| / reported std (RMS, worst: a calibrated std gives ~1 and rarely > 3),
ATE after that fit as % of the path length, rotation RMS (deg, every frame),
registered %, wall and CPU seconds per second of video. A refusal's first words
are counted by kind in `refusals`.

    python -m bench.slam_hard [--sessions 20] [--seconds 10] [--profiles all,fast] [--baseline REF]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from bench.common import machine, write_csv

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("SHARDSHIP_BENCH_DATA", REPO / "bench" / "data")) / "slam_hard"
BASELINE_REF = "b3fb826"  # main before the hard-world work (issue 20)


def render(profile: str, seed: int, frames: int) -> Path:
    """The cached session folder for (profile, seed, frames)."""
    from packer.effects import PHONE_RIGS, PROFILES

    out = DATA / f"{profile}-{frames}"
    d = out / session_name(seed)
    if not (d / "synth_truth.json").exists():
        motion, fx = PROFILES[profile]
        synth_seed(out, seed, frames, motion, fx, PHONE_RIGS.get(profile))
    return d


def session_name(seed: int) -> str:
    return f"session_2026-03-{1 + seed // 24:02d}_{seed % 24:02d}0000"


def synth_seed(out: Path, seed: int, frames: int, motion: str, effects, rig=None) -> Path:
    """Bench seed `seed` rendered into `out` (the tests render the same sessions)."""
    from packer.synth import synth_session

    return synth_session(out, session_name(seed), frames, seed=1000 + seed, motion=motion, effects=effects,
                         imu_offset=0.2 + 0.1 * ((seed * 7919) % 11) / 10, rig=rig)


def run_slam(src: Path, work: Path, pythonpath: str) -> tuple[int, float, float, str]:
    """(exit code, wall s, CPU s of the child tree, last output line) on a fresh copy."""
    raw = work / "raw"
    shutil.rmtree(raw, ignore_errors=True)
    shutil.copytree(src, raw / src.name, ignore=shutil.ignore_patterns("synth_truth.json"))
    env = dict(os.environ, PYTHONPATH=pythonpath)
    argv = [sys.executable, "-m", "packer", "slam", "--raw", str(raw), "--force"]
    t0 = time.perf_counter()
    with open(work / "slam.log", "w+") as log:  # a file, not a pipe: a child that prints much never waits on us
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True, env=env, cwd=work)
        _pid, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        log.seek(0)
        out = log.read()
    lines = [ln for ln in out.splitlines() if ln.strip()]
    failed = [ln for ln in lines if ln.startswith(("FAILED", "FAIL "))]
    return (os.waitstatus_to_exitcode(status), wall, ru.ru_utime + ru.ru_stime,
            (failed or lines or [""])[-1])


def accuracy(d: Path, src: Path) -> dict:
    """Packed poses against the truth (see the module docstring)."""
    from packer.slam.rotations import rotation_mean, so3_log, umeyama
    from packer.synth import truth

    tr = truth(src)
    entries = json.loads((d / "poses.json").read_text())
    idx = np.array([e["rgbIndex"] for e in entries])
    T = np.array([e["transform"] for e in entries])
    gt = tr["poses"][idx]
    s, R, t = umeyama(T[:, :3, 3], gt[:, :3, 3])
    k = umeyama(gt[:, :3, 3], T[:, :3, 3])[0]  # the estimate's size against the truth's (noise-free) one
    p = s * T[:, :3, 3] @ R.T + t
    ate = float(np.sqrt(np.mean(np.sum((p - gt[:, :3, 3]) ** 2, axis=1))))
    length = float(np.sum(np.linalg.norm(np.diff(gt[:, :3, 3], axis=0), axis=1)))
    # rotations aligned on their own (the chordal mean of gt R_est^T): the position fit's R carries
    # the position noise, which is not a rotation error of the poses
    A = rotation_mean(gt[:, :3, :3] @ np.swapaxes(T[:, :3, :3], -1, -2))
    dR = np.swapaxes(gt[:, :3, :3], -1, -2) @ (A @ T[:, :3, :3])
    ang = np.linalg.norm(so3_log(dR), axis=1)
    info = json.loads((d / "metadata.json").read_text())["shardship"]
    std = info.get("scale_rel_std")
    return {
        "scale_error_pct": 100 * (1.0 / k - 1.0),  # > 0: the packed poses are too small, as before
        "scale_error_fwd_pct": 100 * (s - 1.0),  # the truth fitted on the estimate (sessions 9-13)
        "rel_std_pct": 100 * float(std) if std else float("nan"),
        "ate_pct": 100 * ate / length,
        "rot_rms_deg": float(np.degrees(np.sqrt(np.mean(ang**2)))),
        "registered": float(info["registered_fraction"]),
        "offset_error_ms": 1000 * (float(info.get("imu_offset", np.nan)) - float(tr["imu_offset"])),
        "gyro_residual": float(info.get("gyro_residual", np.nan)),
        "rotation_rms": float(info.get("rotation_rms", np.nan)),
        "explained": float(info.get("explained", np.nan)),
        "window_spread": float(info.get("window_spread") or np.nan),
        "readout_ms": 1000 * float(info.get("rolling_shutter") or 0.0),
        "camera": info.get("camera"),
        "repaired": "gyro_repair" in info,  # refused by the gyro check, then mapped on the gyro's rotations
        # the windowed solve's own answer where the adjustment replaced it (--solver auto), same sign convention
        "window_error_pct": (100 * (float(info["scale"]) / (k * float(info["window_scale"])) - 1.0)
                             if info.get("window_scale") and info.get("scale") else float("nan")),
        "viba_imu_chi2": float(info.get("viba_imu_chi2") or np.nan),
        "lever_arm": info.get("imu_lever_arm"),
    }


def _refusal_kind(line: str) -> str:
    for key in ("did not converge", "focal length went", "registered only", "poorly constrained", "explains only",
                "not observable", "no similarity", "disagree",
                "no model", "almost no features", "barely translates", "alignment failed"):
        if key in line:
            return key
    return line[-60:]


def summarise(profile: str, method: str, runs: list[dict], seconds: float) -> dict:
    ok = [r for r in runs if r["accepted"]]
    row: dict = {"profile": profile, "method": method, "sessions": len(runs), "session_seconds": seconds,
                 "accepted_pct": round(100 * len(ok) / max(len(runs), 1), 1)}
    if ok:
        err = np.array([abs(r["scale_error_pct"]) for r in ok])
        z = np.array([r["scale_error_pct"] / r["rel_std_pct"] for r in ok if r["rel_std_pct"] > 0])
        row.update(
            scale_err_median_pct=round(float(np.median(err)), 3), scale_err_worst_pct=round(float(err.max()), 3),
            z_rms=round(float(np.sqrt(np.mean(z**2))), 2) if len(z) else None,
            z_worst=round(float(np.abs(z).max()), 2) if len(z) else None,
            over_3_std=int(np.sum(np.abs(z) > 3)),
            ate_median_pct=round(float(np.median([r["ate_pct"] for r in ok])), 3),
            ate_worst_pct=round(float(max(r["ate_pct"] for r in ok)), 3),
            rot_rms_median_deg=round(float(np.median([r["rot_rms_deg"] for r in ok])), 3),
            rot_rms_worst_deg=round(float(max(r["rot_rms_deg"] for r in ok)), 3),
            registered_median=round(float(np.median([r["registered"] for r in ok])), 3),
            repaired=sum(bool(r.get("repaired")) for r in ok),
            signed_err_median_pct=round(float(np.median([r["scale_error_pct"] for r in ok])), 3),
        )
    row["wall_per_video_s"] = round(statistics.median(r["wall"] for r in runs) / seconds, 2)
    row["cpu_per_video_s"] = round(statistics.median(r["cpu"] for r in runs) / seconds, 2)
    refused = Counter(_refusal_kind(r["line"]) for r in runs if not r["accepted"])
    row["refusals"] = "; ".join(f"{k}: {n}" for k, n in refused.most_common())
    return row


def baseline_tree(ref: str, work: Path) -> Path:
    tree = work / "baseline"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-f", str(tree), ref], check=True,
                   capture_output=True)
    return tree


def sweep(profiles: list[str], sessions: int, seconds: float, baseline: str | None, log: Path | None = None,
          baseline_dir: Path | None = None, first_seed: int = 0) -> list[dict]:
    frames = int(round(seconds * 60))
    work = Path(tempfile.mkdtemp(prefix="bench-slam-hard-"))
    methods = {"shardship (this tree)": str(REPO)}
    if baseline_dir is not None:
        methods[f"baseline {baseline_dir}"] = str(baseline_dir)
        baseline = None
    elif baseline:
        methods[f"baseline {baseline}"] = str(baseline_tree(baseline, work))
    rows: list[dict] = []
    try:
        for prof in profiles:
            runs: dict[str, list[dict]] = {m: [] for m in methods}
            for seed in range(first_seed, first_seed + sessions):
                src = render(prof, seed, frames)
                for m, pp in methods.items():
                    rc, wall, cpu, line = run_slam(src, work / "run", pp)
                    rec = {"seed": seed, "accepted": rc == 0, "wall": wall, "cpu": cpu, "line": line}
                    if rc == 0:
                        rec.update(accuracy(work / "run" / "raw" / src.name, src))
                    runs[m].append(rec)
                    msg = (f"{prof} seed {seed} {m[:24]}: " + (f"scale err {rec['scale_error_pct']:+.2f}% "
                           f"(+-{rec['rel_std_pct']:.2f}%), ATE {rec['ate_pct']:.3f}%, rot {rec['rot_rms_deg']:.2f} deg"
                           if rc == 0 else f"refused: {line[-150:]}") + f", {wall:.0f} s")
                    print("   ", msg, flush=True)
                    if log is not None:
                        with log.open("a") as f:
                            f.write(json.dumps({"profile": prof, "method": m, **rec}) + "\n")
            rows += [summarise(prof, m, v, frames / 60.0) for m, v in runs.items()]
    finally:
        if baseline:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(work / "baseline")],
                           capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    base = {"machine": machine()}
    return [dict(base, **r) for r in rows]


def run(results_dir: Path, quick: bool = False) -> list[dict]:
    """`make bench` entry: 20 sessions of 10 s per profile (3 of 5 s with --quick)."""
    from packer.effects import PROFILES

    sessions, seconds = (3, 5.0) if quick else (20, 10.0)
    rows = sweep(list(PROFILES), sessions, seconds, BASELINE_REF)
    write_csv(Path(results_dir) / "slam_hard.csv", rows,
              "make bench (python -m bench --only slam_hard" + (" --quick)" if quick else ")"))
    return rows


def main() -> int:
    from packer.effects import PROFILES

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--first-seed", type=int, default=0, help="seeds first-seed .. first-seed + sessions - 1")
    ap.add_argument("--profiles", default=",".join(PROFILES))
    ap.add_argument("--baseline", default=BASELINE_REF, help="git ref of the baseline ('' for none)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "slam_hard.csv")
    ap.add_argument("--baseline-dir", type=Path, default=None, help="an existing checkout to use as the baseline")
    ap.add_argument("--log", type=Path, default=None, help="also append every session's record (JSON lines)")
    a = ap.parse_args()
    rows = sweep(a.profiles.split(","), a.sessions, a.seconds, a.baseline or None, a.log, a.baseline_dir,
                 a.first_seed)
    for r in rows:
        print({k: v for k, v in r.items() if k != "machine"})
    write_csv(a.out, rows, "python -m bench.slam_hard " + " ".join(sys.argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
