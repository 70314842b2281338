"""What the report takes from the raw session folder, when it is there: the gyro
against the visual rotation rate, and the glove's read errors and gaps.

Both are recomputed here rather than stored by `packer slam`: they cost a read of
imu.json / encoders.json and a few vector operations (milliseconds), the numbers
they depend on (`imu_offset`, `gyro_bias` in the calibration) are already stored,
and keeping them out of metadata.json leaves the SLAM cache and the user's own
tools untouched. After `transfer pull` (no raw folder) the page says so and shows
the stored numbers alone."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packer.encoders import JOINTS, READ_ERROR, esp_clock, parse_rows
from packer.imu import read_imu
from packer.jsonfile import read_json
from packer.report.series import Series
from packer.slam.inertial.imu_align import GyroIntegral
from packer.slam.rotations import so3_log
from shardship.errors import SessionError

RATE_STEP = 0.1  # s between the frames compared: the keyframe spacing packer slam uses
GAP = 0.1  # s without a valid reading of a joint (5 readings at the glove's 50 Hz) counts as a gap


@dataclass
class Rates:
    """Rotation rate (rad/s) at `t` (frame clock) seen by the camera and by the gyro."""

    t: np.ndarray
    visual: np.ndarray
    gyro: np.ndarray
    offset_ms: float  # frame 0 after the first IMU sample, as packer slam found it
    correlation: float  # of the two rate series, here

    @property
    def rms_diff(self) -> float:
        return float(np.sqrt(np.mean((self.visual - self.gyro) ** 2))) if len(self.t) else float("nan")


@dataclass
class GloveEvents:
    """Per joint: frame-clock times of read errors, and (start, end) gaps."""

    errors: list[np.ndarray]
    gaps: list[list[tuple[float, float]]]
    rows: int


def rotation_rates(series: Series, session_dir: Path, calibration: dict[str, Any]) -> tuple[Rates | None, str]:
    """(rates, '') or (None, why not)."""
    offset = calibration.get("imu_offset")
    if offset is None:
        return None, f"no gyro alignment ({calibration.get('method') or 'no'} scale): nothing to compare"
    if not (session_dir / "imu.json").exists():
        return None, f"{session_dir / 'imu.json'} not here (raw folder absent): stored numbers only"
    try:
        imu = read_imu(session_dir, session_dir.name)
    except SessionError as e:
        return None, str(e)
    ok = np.flatnonzero(series.posed)
    if len(ok) < 3:
        return None, "too few posed frames"
    dt_frame = float(np.median(np.diff(series.t[ok]))) if len(ok) > 1 else RATE_STEP
    k = max(1, int(round(RATE_STEP / max(dt_frame, 1e-6))))
    a, b = ok[:-k], ok[k:]
    span = series.t[b] - series.t[a]
    keep = span > 0
    a, b, span = a[keep], b[keep], span[keep]
    R = series.rot
    visual = np.linalg.norm(so3_log(np.swapaxes(R[a], -1, -2) @ R[b]), axis=1) / span
    bias = np.asarray(calibration.get("gyro_bias") or [0.0, 0.0, 0.0], dtype=np.float64)
    g = GyroIntegral(imu.t - float(offset), imu.gyro - bias)
    gyro = np.linalg.norm(g.increment(series.t[a], series.t[b]), axis=1) / span
    varies = len(a) > 2 and visual.std() > 0 and gyro.std() > 0
    corr = float(np.corrcoef(visual, gyro)[0, 1]) if varies else float("nan")
    lag = calibration.get("imu_lag")
    mid = 0.5 * (series.t[a] + series.t[b])
    return Rates(mid, visual, gyro, float("nan") if lag is None else 1000.0 * float(lag), corr), ""


def glove_events(session_dir: Path, frame0_epoch: float | None) -> tuple[GloveEvents | None, str]:
    """Read errors and gaps of each joint on the frame clock, or (None, why not)."""
    p = session_dir / "encoders.json"
    if not p.exists():
        return None, "no encoders.json here" + ("" if session_dir.exists() else " (raw folder absent)")
    if frame0_epoch is None:
        return None, "no clock places the glove on the frames"
    try:
        receive, esp, deg = parse_rows(read_json(session_dir.name, p))
    except (SessionError, ValueError) as e:
        return None, str(e)
    order = np.argsort(receive, kind="stable")
    receive, deg = receive[order], deg[order]
    t = esp_clock(esp[order], receive) if esp is not None else None
    t = (receive if t is None else t) - float(frame0_epoch)
    errors, gaps = [], []
    for j in range(min(deg.shape[1], len(JOINTS))):
        bad = (deg[:, j] == READ_ERROR) | ~np.isfinite(deg[:, j])
        errors.append(t[bad])
        tv = t[~bad]
        d = np.diff(tv)
        gaps.append([(float(tv[i]), float(tv[i + 1])) for i in np.flatnonzero(d > GAP)])
    return GloveEvents(errors, gaps, len(t)), ""
