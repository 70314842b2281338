"""Frames the camera dropped, seen by the gyro: the IMU-to-frame offset measured on
the first third of the keyframes and on the last.

Without video.mov a frame's time is its number / fps (`packer.videoclock`). Each
frame the camera dropped puts every later frame one period early, so the offset
that lines the gyro up with the images' rotation grows along the recording by a
period per drop. A steady offset, the IMU starting early, rolling shutter: these
shift both thirds alike. Where the thirds disagree by more than
`MAX_DRIFT_PERIODS`, the frame clock is known to be wrong and the session is
refused, naming the drops, before any pose or joint is placed on it. (Too many
drops to miss show earlier, at load, as fewer numbers than the IMU's span holds.)
A third whose rotation is too weak to align, or that the gyro does not fit soundly,
says nothing; nor does a drift the wrong way (drops only make later frames late)."""
from __future__ import annotations

import numpy as np

from packer.slam.inertial.imu_align import AlignmentError, align_imu

MAX_DRIFT_PERIODS = 2.5  # the thirds' offsets more than this many frame periods apart: frames dropped
MARGIN = 0.5  # s of IMU searched beyond a third's span around the whole recording's offset
# a third's alignment counts only when sound: both thirds find roughly the same camera-to-IMU rotation (one
# rigid phone; drops inside a third bend its fit, so not too tight: at 5 deg a 3% session was let through to
# be refused as "plain surfaces") and the rate norms correlate; an every-effect session's third once peaked
# 687 ms off (the wrong way: only growth refuses)
MAX_RIC_DEG = 20.0
MIN_CORR = 0.5


def offsets_by_third(key_ts: np.ndarray, R_wc: np.ndarray, imu_t: np.ndarray, gyro: np.ndarray,
                     ) -> tuple[float, float] | None:
    """(offset of the first third, offset of the last third), s; None where the
    recording or a third cannot be aligned on its own."""
    try:
        whole = align_imu(key_ts, R_wc, imu_t, gyro).offset
    except AlignmentError:
        return None
    out = []
    for sel in (np.array_split(np.arange(len(key_ts)), 3)[0], np.array_split(np.arange(len(key_ts)), 3)[-1]):
        ts = key_ts[sel]
        m = (imu_t >= ts[0] + whole - MARGIN) & (imu_t <= ts[-1] + whole + MARGIN)
        try:
            out.append(align_imu(ts, R_wc[sel], imu_t[m], gyro[m]))
        except AlignmentError:
            return None
    a, b = out
    cos = (np.trace(a.R_ic.T @ b.R_ic) - 1.0) / 2.0
    if np.degrees(np.arccos(np.clip(cos, -1.0, 1.0))) > MAX_RIC_DEG or min(a.correlation, b.correlation) < MIN_CORR:
        return None  # a third the gyro does not fit soundly (a wrong peak) says nothing
    return a.offset, b.offset


def dropped_reason(offsets: tuple[float, float] | None, fps: float) -> str | None:
    """The refusal where the thirds' offsets say frames were dropped, else None."""
    if offsets is None:
        return None
    drift = offsets[1] - offsets[0]
    if drift * fps <= MAX_DRIFT_PERIODS:  # a drop makes every later frame late: the offset only grows
        return None
    return (f"the gyro runs {drift * 1000:+.0f} ms ahead of the images in the last third of the recording against "
            f"the first: about {abs(drift) * fps:.0f} frames were dropped by the camera and there is no video.mov to "
            "place the others in time; copy video.mov from the phone's export into the session")
