"""imu.json, as the app writes it (CoreMotion deviceMotion at 200 Hz on the main queue,
stamped with Date(): userAcceleration in g, gravity removed, rotationRate in rad/s,
device axes): read, checked, a wall-clock step repaired, gaps named. Reads only."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packer.clockstep import ClockStepError
from packer.clockstep import repair as repair_clock_steps
from packer.jsonfile import read_json
from shardship.errors import SessionError


@dataclass
class Imu:
    t: np.ndarray  # (N,) seconds, the phone's epoch clock
    accel: np.ndarray  # (N,3) g, gravity removed, device frame
    gyro: np.ndarray  # (N,3) rad/s


def monotonic(name: str, file: str, t: np.ndarray, what: str) -> None:
    if not np.all(np.isfinite(t)):
        raise SessionError(name, file, f"{what} contain NaN/inf")
    d = np.diff(t)
    if np.any(d <= 0):
        i = int(np.argmax(d <= 0))
        raise SessionError(
            name, file, f"{what} not strictly increasing at entry {i + 1} ({t[i]:.6f} -> {t[i + 1]:.6f})"
        )


def read_imu(folder: Path, name: str, encoder_rows: Any = None, warnings: list[str] | None = None) -> Imu:
    """`folder`/imu.json of session `name`, parsed and checked, without loading the
    rest of the session (`packer report` needs only the gyro). A wall-clock step is
    repaired where the data determine it (`packer.clockstep`, with encoders.json's
    rows when given) and said in `warnings`."""
    p, file = folder / "imu.json", "imu.json"
    data = read_json(name, p)
    if not isinstance(data, list) or len(data) < 2:
        raise SessionError(name, file, "expected a list of at least 2 samples")
    try:
        t = np.array([d["timestamp"] for d in data], dtype=np.float64)
        acc = np.array([d["accel"] for d in data], dtype=np.float64)
        gyr = np.array([d["gyro"] for d in data], dtype=np.float64)
    except (KeyError, TypeError, ValueError) as e:
        raise SessionError(name, file, f"each sample needs timestamp, accel[3], gyro[3] ({e})") from None
    if acc.shape != (len(t), 3) or gyr.shape != (len(t), 3):
        raise SessionError(name, file, "accel and gyro must be 3-vectors")
    bad = ~(np.isfinite(acc).all(1) & np.isfinite(gyr).all(1) & np.isfinite(t))
    if bad.any():
        i = int(np.argmax(bad))
        raise SessionError(name, file, f"NaN/inf in {int(bad.sum())} sample(s), first at entry {i} (t={t[i]})")
    try:
        t, steps = repair_clock_steps(t, encoder_rows)
    except ClockStepError as e:
        raise SessionError(name, file, str(e)) from None
    if warnings is not None:
        warnings.extend(steps)
    monotonic(name, file, t, "IMU timestamps")
    if warnings is not None:  # stretches without samples (the main thread busy): named (`packer.imu_gaps`)
        from packer.imu_gaps import gap_warnings

        warnings.extend(gap_warnings(t))
    return Imu(t, acc, gyr)
