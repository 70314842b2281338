"""packer slam: global (GLOMAP) vs incremental mapping, and the IMU scale vs the
reference workflow's velocity-norm heuristic, on the same rendered session, one run.

Per mapper: `slam_session` (SIFT, matching, mapping, interpolation, writing) with
--scale none, then the IMU alignment + scale solve (the code --scale imu runs) on
the poses it wrote, so a refused scale still reports the SfM accuracy. Rows carry
seconds per 100 frames, registered fraction, ATE after sim(3) alignment and the
scale error against synth_truth.json; then the reference heuristic's scale error on
the global run's SfM trajectory and the same IMU. Time ratios are against the
global run of this run."""
from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import machine, write_csv
from packer.session import load_imu, load_session
from packer.slam import SlamOptions, slam_session
from packer.slam.heuristic import heuristic_scale
from packer.slam.imu_align import AlignmentError, align_imu
from packer.slam.rotations import umeyama
from packer.slam.scale import ScaleRefused, solve_scale


def _sfm_trajectory(d: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(frame indices, timestamps, camera-to-world (N,4,4), registered mask) from poses.json."""
    entries = json.loads((d / "poses.json").read_text())
    idx = np.array([e["rgbIndex"] for e in entries])
    ts = np.array([e["timestamp"] for e in entries])
    T = np.array([e["transform"] for e in entries])
    reg = np.array([e["flag"] == "registered" for e in entries])
    return idx, ts, T, reg


def run(results_dir: Path, quick: bool = False) -> list[dict]:
    from packer.synth import synth_session, truth

    frames, step = (120, 2) if quick else (300, 3)
    work = Path(tempfile.mkdtemp(prefix="bench-slam-"))
    rows: list[dict] = []
    try:
        src = synth_session(work, "session_2026-01-01_120000", frames, seed=13, imu_offset=0.0237)
        tr = truth(src)
        imu = load_imu(load_session(src))
        base: dict = {"machine": machine(), "command": "make bench (python -m bench --only slam"
                      + (" --quick)" if quick else ")"), "frames": frames, "keyframe_step": step}
        global_s = None
        global_traj = None
        for mapper in ("global", "incremental"):
            d = work / mapper
            shutil.copytree(src, d)
            r = slam_session(d, SlamOptions(mapper=mapper, keyframe_step=step, scale="none", progress=False,
                                            force=True))
            secs = sum(r.seconds.values())
            row = dict(base, method=f"packer slam --mapper {mapper} --scale imu",
                       mapping_seconds=round(r.seconds.get("mapping", 0.0), 2))
            if r.status != "ok":
                row.update(seconds=round(secs, 2), error=r.message)
                rows.append(row)
                continue
            idx, ts, T, reg = _sfm_trajectory(d)
            gt = tr["poses"][idx, :3, 3]
            s_true, R, t = umeyama(T[:, :3, 3], gt)  # metres per SfM unit, the truth for this model
            ate = float(np.sqrt(np.mean(np.sum((s_true * T[:, :3, 3] @ R.T + t - gt) ** 2, axis=1))))
            length = float(np.sum(np.linalg.norm(np.diff(gt, axis=0), axis=1)))
            t0 = time.perf_counter()
            try:
                al = align_imu(ts[reg], T[reg, :3, :3], imu.t, imu.gyro)
                sr = solve_scale(ts[reg], T[reg, :3, 3], T[reg, :3, :3], imu.t, imu.accel, imu.gyro,
                                 offset=al.offset, R_ic=al.R_ic, gyro_bias=al.gyro_bias)
                row.update(scale_error_pct=round(100 * abs(sr.scale / s_true - 1.0), 3),
                           scale_rel_std_pct=round(100 * sr.rel_std, 3),
                           offset_error_ms=round(float(1000 * (al.offset - float(tr["imu_offset"]))), 3))
            except (AlignmentError, ScaleRefused) as e:
                row.update(error=f"scale refused: {e}")
            secs += time.perf_counter() - t0
            row.update(seconds=round(secs, 2), seconds_per_100_frames=round(100 * secs / frames, 2),
                       registered_fraction=round(r.info["registered_fraction"], 3),
                       other_models=len(r.info["other_models"]),
                       ate_pct_of_length=round(100 * ate / length, 4),
                       reprojection_px=round(r.info["reprojection_error"], 3))
            if mapper == "global":
                global_s, global_traj = secs, (ts, T, s_true)
            row["time_ratio_vs_global"] = round(secs / global_s, 2) if global_s else None
            rows.append(row)
        if global_traj is not None:
            ts, T, s_true = global_traj
            h = heuristic_scale(ts, T[:, :3, 3], imu.t, imu.accel)
            rows.append(dict(base, method="reference heuristic (velocity-norm ratio, 1 s windows, trimmed median) "
                             "on the global SfM trajectory",
                             scale_error_pct=round(100 * abs(h / s_true - 1.0), 3),
                             scale_signed_error_pct=round(100 * (h / s_true - 1.0), 3)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_csv(Path(results_dir) / "slam.csv", rows)
    return rows
