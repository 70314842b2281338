"""packer slam as a user runs it, today's defaults against the previous pipeline.

One rendered session of 1,800 frames (30 s at 60 fps, IMU with noise, bias and a
0.25 s clock offset). Each repetition is the whole command in a fresh process on a
fresh copy of the session (`python -m packer slam --raw DIR --force --quiet`), so
start-up, tracking / SIFT, matching, mapping, the IMU alignment and the scale
solve are all inside the figures. Wall seconds and CPU seconds (user + system of
the child, every thread) per session; the ratio to the session's own duration
(target <= 1.0: SLAM keeps up with recording); the ratio to the baseline measured
in this run. The baseline is the previous default pipeline, still available as
options: `--frontend sift --keyframe-step 3` with overlap 5 and 200 tracks per
view. Repetitions are interleaved (new, old, new, old, new) because this VM's
speed drifts by +-20% between minutes; medians and min/max are reported.

Accuracy from the last repetition's poses.json against synth_truth.json: scale
error (the sim(3) fit of the metric poses to the truth should have scale 1), ATE
after that fit as % of the path length (every frame, interpolated ones included),
registered fraction of keyframes, IMU clock offset error. The reference
workflow's velocity-norm heuristic scale on the same trajectory is the last row."""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import machine, write_csv

BASELINE_TOML = """[slam]
frontend = "sift"
keyframe_step = 3
overlap = 5
tracks_per_view = 200
"""
METHODS = {  # method -> [slam] section of the --config it runs with (None: the defaults)
    "packer slam (defaults: klt front-end)": None,
    "baseline: previous defaults (--frontend sift --keyframe-step 3, overlap 5, 200 tracks/view)": BASELINE_TOML,
}


def _run_once(src: Path, work: Path, config: str | None) -> tuple[float, float, Path]:
    """(wall s, child CPU s, session dir) of one `packer slam` on a fresh copy."""
    raw = work / "raw"
    shutil.rmtree(raw, ignore_errors=True)
    shutil.copytree(src, raw / src.name)
    argv = [sys.executable, "-m", "packer", "slam", "--raw", str(raw), "--force", "--quiet"]
    if config is not None:
        cfg = work / "shardship.toml"
        cfg.write_text(config)
        argv += ["--config", str(cfg)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _pid, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    out, err = proc.communicate()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"packer slam failed ({' '.join(argv)}): {(out + err).strip()[-400:]}")
    return wall, ru.ru_utime + ru.ru_stime, raw / src.name


def _accuracy(d: Path, src: Path) -> dict:
    from packer.session import load_imu, load_session
    from packer.slam.rotations import umeyama
    from packer.slam.scale.heuristic import heuristic_scale
    from packer.synth import truth

    tr = truth(src)
    entries = json.loads((d / "poses.json").read_text())
    idx = np.array([e["rgbIndex"] for e in entries])
    T = np.array([e["transform"] for e in entries])
    gt = tr["poses"][idx, :3, 3]
    s, R, t = umeyama(T[:, :3, 3], gt)
    ate = float(np.sqrt(np.mean(np.sum((s * T[:, :3, 3] @ R.T + t - gt) ** 2, axis=1))))
    length = float(np.sum(np.linalg.norm(np.diff(gt, axis=0), axis=1)))
    info = json.loads((d / "metadata.json").read_text())["shardship"]
    ts = np.array([e["timestamp"] for e in entries])
    imu = load_imu(load_session(d))
    heur = heuristic_scale(ts, T[:, :3, 3], imu.t, imu.accel)
    return {
        "scale_error_pct": round(100 * abs(s - 1.0), 3),
        "scale_rel_std_pct": round(100 * float(info.get("scale_rel_std") or float("nan")), 3),
        "ate_pct_of_length": round(100 * ate / length, 4),
        "registered_fraction": round(float(info["registered_fraction"]), 3),
        "keyframes": int(info["keyframes"]),
        "offset_error_ms": round(1000 * (float(info["imu_offset"]) - float(tr["imu_offset"])), 3),
        "_heuristic_error_pct": round(100 * (heur - 1.0), 3),  # metric poses: the true scale factor is 1
    }


def run(results_dir: Path, quick: bool = False) -> list[dict]:
    from packer.synth import synth_session

    frames, reps = (360, 1) if quick else (1800, 2)
    work = Path(tempfile.mkdtemp(prefix="bench-slam-"))
    try:
        src = synth_session(work / "src", "session_2026-01-01_120000", frames, seed=13, imu_offset=0.25)
        duration = frames / 60.0
        order = [m for _ in range(reps) for m in METHODS] + [next(iter(METHODS))]  # new, old, new, old, new
        times: dict[str, list[tuple[float, float]]] = {m: [] for m in METHODS}
        last: dict[str, Path] = {}
        for i, m in enumerate(order):
            wall, cpu, d = _run_once(src, work / f"run{i}", METHODS[m])
            times[m].append((wall, cpu))
            last[m] = d
            print(f"    {m[:40]}: {wall:.1f} s wall, {cpu:.1f} CPU-s", flush=True)
        base = {"machine": machine(), "command": "make bench (python -m bench --only slam" + (" --quick)" if quick
                else ")"), "frames": frames, "session_seconds": duration}
        med = {m: (statistics.median(w for w, _c in v), statistics.median(c for _w, c in v)) for m, v in times.items()}
        base_wall, base_cpu = med[list(METHODS)[1]]
        rows = []
        heur = None
        for m, v in times.items():
            walls, cpus = [w for w, _c in v], [c for _w, c in v]
            acc = _accuracy(last[m], src)
            heur = heur if heur is not None else acc["_heuristic_error_pct"]
            acc.pop("_heuristic_error_pct")
            rows.append(dict(
                base, method=m, runs=len(v),
                wall_s_median=round(med[m][0], 1), wall_s_min=round(min(walls), 1), wall_s_max=round(max(walls), 1),
                cpu_s_median=round(med[m][1], 1), cpu_s_min=round(min(cpus), 1), cpu_s_max=round(max(cpus), 1),
                wall_over_duration=round(med[m][0] / duration, 2), cpu_over_duration=round(med[m][1] / duration, 2),
                wall_ratio_vs_baseline=round(med[m][0] / base_wall, 3),
                cpu_ratio_vs_baseline=round(med[m][1] / base_cpu, 3),
                **acc,
            ))
        rows.append(dict(base, method="reference heuristic (velocity-norm ratio, 1 s windows, trimmed median) on the "
                         "default run's metric trajectory", scale_error_pct=abs(heur or 0.0),
                         scale_signed_error_pct=heur))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_csv(Path(results_dir) / "slam.csv", rows)
    return rows
