"""Session names and the capture's clocks (epoch seconds).

The app names the folder from Date() just before `startTime = Date()`, so the
name carries the capture's start to the second; every other clock (frame 0, the
IMU phase, stop, metadata's endTime) follows from it by a seeded delay. Planning
them in one place, from one generator, keeps their draws in a fixed order."""
from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import numpy as np

from packer.synth.imu import IMU_RATE

FRAME0_DELAY = (0.010, 0.040)  # s from capture start to frame 0
FINALIZE_DELAY = (0.8, 1.6)  # s from stop to metadata's endTime = Date() in finalize
DEFAULT_START = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)  # for names that carry no time


def session_name(seed: int, index: int) -> str:
    """`session_2026-01-01_1200SS`-style name: the date moves with the seed, the
    clock with the index (unique for any index)."""
    t = datetime(2026, 1, 1, 12, 0, 0) + timedelta(days=seed % 3650, seconds=index)
    return t.strftime("session_%Y-%m-%d_%H%M%S")


def name_epoch(name: str) -> float:
    """The session name's time read as UTC (the app names the folder from Date()
    just before startTime = Date()); names without one give 2026-01-01 12:00:00 UTC."""
    try:
        t = datetime.strptime(name, "session_%Y-%m-%d_%H%M%S").replace(tzinfo=timezone.utc)
    except ValueError:
        t = DEFAULT_START
    return float(t.timestamp())


def iso8601(epoch: float) -> str:
    """JSONEncoder .iso8601 date: UTC, whole seconds (fraction truncated), 'Z'."""
    return datetime.fromtimestamp(math.floor(epoch), tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Clocks:
    """Epoch times of one capture (all recorded in the truth file)."""

    capture_start: float  # startTime = Date()
    frame0_epoch: float  # frame 0 (frame time 0)
    imu_phase: float  # s, where the 200 Hz IMU grid falls
    stop_epoch: float  # stop pressed one frame period after the last frame
    end_epoch: float  # metadata's endTime
    imu_offset_epoch: float  # IMU clock = frame time + this (truth "imu_offset")
    step: float = 0.0  # s the phone's Date() jumps (an NTP correction) at step_epoch (true time)
    step_epoch: float = 0.0

    def stamped(self, epoch: np.ndarray) -> np.ndarray:
        """What Date() reads at true `epoch`: the true time, plus `step` from
        `step_epoch` on (every stamp the app writes goes through Date())."""
        epoch = np.asarray(epoch, dtype=np.float64)
        return epoch + self.step * (epoch >= self.step_epoch) if self.step else epoch


def plan_clocks(name: str, n_frames: int, fps: float, imu_offset: float, rng: np.random.Generator,
                step: float = 0.0, step_at: float = 0.5, lead: float = 0.0) -> Clocks:
    """The session's clocks; draws from `rng` in a fixed order (start, frame-0
    delay, IMU phase, finalize delay). `step`: the phone's wall clock jumps by this
    many seconds at `step_at` (fraction) of the capture, as an NTP correction of
    Date() does mid-recording; `lead`: s more from the IMU's start to frame 0 (a camera
    that takes longer to start); no draw depends on either."""
    capture_start = name_epoch(name) + float(rng.uniform(0.0, 0.999))  # startTime = Date()
    frame0_epoch = capture_start + float(rng.uniform(*FRAME0_DELAY)) + float(lead)
    imu_phase = float(rng.uniform(0.0, 1.0 / IMU_RATE))
    finalize_delay = float(rng.uniform(*FINALIZE_DELAY))
    stop_epoch = frame0_epoch + n_frames / fps  # stop pressed one frame period after the last frame
    end_epoch = stop_epoch + finalize_delay
    imu_offset_epoch = frame0_epoch + float(imu_offset)
    step_epoch = capture_start + (stop_epoch - capture_start) * float(step_at)
    if step:
        end_epoch += float(step)  # metadata's endTime is a Date() too
    return Clocks(capture_start, frame0_epoch, imu_phase, stop_epoch, end_epoch, imu_offset_epoch, float(step),
                  step_epoch)
