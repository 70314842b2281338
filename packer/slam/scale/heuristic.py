"""The reference workflow's scale heuristic, kept only as the benchmark baseline.

Per 1 s window: integrate the accelerometer in the device frame (no rotation to the
world, no clock offset: IMU and frames are aligned by their first timestamps),
remove the window mean, and divide the mean speed by the mean SfM speed (finite
differences, also mean-removed); the scale is the trimmed median of the window
ratios. Ignoring rotation and offset is what makes it wrong by tens of percent when
the camera turns; `packer.slam.scale.scale` is the replacement."""
from __future__ import annotations

import numpy as np

GRAVITY = 9.80665


def heuristic_scale(
    frame_ts: np.ndarray,
    positions: np.ndarray,
    imu_t: np.ndarray,
    accel_g: np.ndarray,
    window: float = 1.0,
    trim: float = 0.2,
) -> float:
    """Velocity-norm ratio over `window`-second windows, trimmed median (drops `trim`
    of the ratios at each end). frame_ts / positions: SfM camera centres per frame
    (arbitrary units); accel_g: gravity-removed accelerometer in g, device frame."""
    frame_ts = np.asarray(frame_ts, dtype=np.float64)
    positions = np.asarray(positions, dtype=np.float64)
    t_imu = np.asarray(imu_t, dtype=np.float64) - imu_t[0] + frame_ts[0]  # start-aligned clocks
    acc = np.asarray(accel_g, dtype=np.float64) * GRAVITY
    v_sfm = np.gradient(positions, frame_ts, axis=0)
    ratios = []
    t0 = frame_ts[0]
    while t0 + window <= frame_ts[-1] + 1e-9:
        fi = (frame_ts >= t0) & (frame_ts < t0 + window)
        ii = (t_imu >= t0) & (t_imu < t0 + window)
        if fi.sum() >= 3 and ii.sum() >= 3:
            dt = np.diff(t_imu[ii], prepend=t_imu[ii][0])
            v_imu = np.cumsum(acc[ii] * dt[:, None], axis=0)
            v_imu -= v_imu.mean(0)
            vs = v_sfm[fi] - v_sfm[fi].mean(0)
            den = float(np.mean(np.linalg.norm(vs, axis=1)))
            if den > 0:
                ratios.append(float(np.mean(np.linalg.norm(v_imu, axis=1))) / den)
        t0 += window
    if not ratios:
        raise ValueError("no complete window with both IMU and frames")
    r = np.sort(np.asarray(ratios))
    k = int(len(r) * trim)
    r = r[k:len(r) - k] if len(r) - 2 * k > 0 else r
    return float(np.median(r))
