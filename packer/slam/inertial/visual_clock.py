"""Frame 0 on the IMU's clock without poses (`packer pack --no-slam`): the gyro
against the images' own rotation over the recording's first seconds.

Without poses frame 0 is placed at the IMU's first sample, 10-40 ms off (the first
frame follows the capture's start by up to a frame period and the processing after
it), and every joint with it: 4 degrees at hand speeds (`make bench`, phone_drops
rows). Over 3 frames (~50 ms) a hand moves the camera millimetres against a scene a
metre away, so the bearing vectors of the tracks two keyframes share turn by the
rotation alone (Kabsch; an essential matrix is ill-posed at that baseline and
flipped rotations by 180 degrees here). Chained over the first `SECONDS`, those
rotations align on the gyro as SfM's do (`imu_align`). Used only where the
alignment is sound (the gyro explains the rotation, rates correlate, the offset is
where the capture's start allows); otherwise the first-sample guess stands."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from packer.slam.frontend.tracks import track_keyframes
from packer.slam.inertial.imu_align import AlignmentError, align_imu

SECONDS = 10.0  # of the recording's start tracked: enough rotation, a few seconds of CPU whatever the length
STEP = 3  # frames between keyframes
MAX_RESIDUAL = 0.3  # the gyro's mismatch at most this share of the rotation rate ...
MIN_CORRELATION = 0.85  # ... the rate norms correlating at least this well ...
WINDOW = (-0.05, 0.6)  # ... and frame 0 this many s after the IMU's first sample (its latency and a slow camera start)


def visual_offset(paths: list[Path], t: np.ndarray, K: np.ndarray, imu_t: np.ndarray,
                  gyro: np.ndarray) -> float | None:
    """IMU clock - frame clock (s) from the images' rotation, or None where the
    images do not say it soundly (module docstring)."""
    n = int(np.searchsorted(t, t[0] + SECONDS, side="right"))
    kpos, R_wc = chained_rotations(paths[:n], K)
    if len(kpos) < 12:
        return None
    lo, hi = imu_t[0] + WINDOW[0], imu_t[0] + WINDOW[1]
    m = (imu_t >= lo + t[0] - 0.5) & (imu_t <= hi + t[n - 1] + 0.5)
    try:
        al = align_imu(t[kpos], R_wc, imu_t[m], gyro[m])
    except AlignmentError:
        return None
    sound = al.residual <= MAX_RESIDUAL * al.rotation_rms and al.correlation >= MIN_CORRELATION
    return float(al.offset) if sound and lo <= al.offset <= hi else None


def chained_rotations(paths: list[Path], K: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(keyframe positions, camera-to-world rotations) of every `STEP`-th frame,
    chained from consecutive keyframes' rotations (Kabsch twice: the second time
    without the fifth of the tracks the first fits worst); the chain stops at a
    pair with too few shared tracks."""
    tracks = track_keyframes(paths, STEP)
    Kinv = np.linalg.inv(K)
    R = [np.eye(3)]
    for k in range(1, len(tracks.keyframes)):
        m = tracks.matches(k - 1, k)
        if len(m) < 15:
            break
        ra = _bearings(tracks.points[k - 1][m[:, 0]], Kinv)
        rb = _bearings(tracks.points[k][m[:, 1]], Kinv)
        R_ba = _kabsch(ra, rb)
        resid = np.linalg.norm(rb - ra @ R_ba.T, axis=1)
        keep = resid <= np.quantile(resid, 0.8)
        R.append(R[-1] @ _kabsch(ra[keep], rb[keep]).T)
    return np.asarray(tracks.keyframes[:len(R)], dtype=np.int64), np.stack(R)


def _bearings(points: np.ndarray, Kinv: np.ndarray) -> np.ndarray:
    """Unit rays of pixel positions in COLMAP's convention (centre at +0.5)."""
    h = np.column_stack([points.astype(np.float64) - 0.5, np.ones(len(points))]) @ Kinv.T
    return h / np.linalg.norm(h, axis=1, keepdims=True)


def _kabsch(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The rotation R minimising |b - R a| over the rows (a proper rotation)."""
    u, _s, vt = np.linalg.svd(b.T @ a)
    d = np.sign(np.linalg.det(u @ vt))
    return u @ np.diag([1.0, 1.0, d]) @ vt
