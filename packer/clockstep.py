"""The phone's wall clock stepping mid-recording, found and undone before anything
reads the timestamps.

imu.json and encoders.json are both stamped with `Date()`, which an NTP correction
can move by a fraction of a second while the app records. The frames are not
stamped with it (frame i is at i / fps from frame 0), so after such a step every
IMU sample and every joint reading lands on the wrong frame: +0.5 s puts the
second half's joints 30 frames late. Two clocks do not step, and each shows it:

* the IMU's cadence: CoreMotion delivers every 5 ms, so an interval of -0.495 s
  or +0.505 s is the step itself (to within one sample);
* the ESP32's millis() in encoders.json: receive time minus millis() is the BLE
  latency (5-30 ms) plus a constant, and that constant jumps by the step.

A jump both streams show, by the same amount at the same time, is a clock step:
the stamps after it are moved back by it (the frames' clock is the one of the
first IMU sample), and the session says so. An IMU clock going backwards with no
glove recording is a step too (time never runs back), its size given by the
cadence. Anything else is refused with what was seen, except a forward IMU jump
that the glove's clock does not share, which is a CoreMotion stall (a gap, kept),
and a forward jump nothing can confirm, which is kept with a warning. Pure
functions on the decoded JSON; nothing here writes a file."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

STEP_MIN = 0.1  # s: an IMU interval this much longer than the cadence is a gap or a step (NTP steps >= 0.128 s)
AGREE = 0.03  # s: the two streams' jumps must agree to this (BLE latency jitter is up to 25 ms)
EDGE = 3  # encoder readings either side of the step whose side is decided by their own latency
SIDE = 50  # encoder readings (1 s at 50 Hz) either side whose median latency measures the jump


class ClockStepError(ValueError):
    """A step the data do not determine; the message says what was seen and what to do."""


@dataclass
class _Glove:
    """encoders.json reduced to what places a step: receive stamps and millis() in
    file (= arrival) order; None when the rows cannot say (no or unsteady millis())."""
    rows: list[dict[str, Any]]
    receive: np.ndarray
    esp_s: np.ndarray

    @classmethod
    def of(cls, rows: Any) -> _Glove | None:
        try:
            receive = np.array([float(r["timestamp"]) for r in rows], dtype=np.float64)
            esp = np.array([float(r["esp_timestamp_ms"]) for r in rows], dtype=np.float64) / 1000.0
        except (KeyError, TypeError, ValueError):
            return None
        if len(esp) < 2 * SIDE or not np.all(np.isfinite(receive)) or np.any(np.diff(esp) <= 0):
            return None  # too short to measure, or millis() reset (a reboot): cannot confirm anything
        return cls(list(rows), receive, esp)

    def split(self, epoch: float) -> int | None:
        """The first reading read after `epoch` (the clock before the step), by
        millis() placed with the latency of the first readings; None outside."""
        lag0 = float(np.median((self.receive - self.esp_s)[:SIDE // 2]))
        k = int(np.searchsorted(self.esp_s + lag0, epoch))
        return k if SIDE <= k <= len(self.esp_s) - SIDE else None

    def jump(self, k: int) -> tuple[float, float]:
        """(jump of the latency at reading k, the latency before it), from the
        medians of SIDE readings either side, EDGE readings away from k."""
        lag = self.receive - self.esp_s
        before = float(np.median(lag[k - SIDE:k - EDGE]))
        return float(np.median(lag[k + EDGE:k + SIDE])) - before, before

    def shift(self, k: int, step: float, before: float) -> None:
        """Move every reading received after the step back by `step`; near k the
        reading's own latency says on which side it was received."""
        lag = self.receive - self.esp_s
        after = np.arange(len(lag)) >= k + EDGE
        edge = np.arange(max(0, k - EDGE), min(len(lag), k + EDGE))
        after[edge] = np.abs(lag[edge] - before - step) < np.abs(lag[edge] - before)
        self.receive[after] -= step
        for j in np.flatnonzero(after):
            self.rows[j]["timestamp"] = float(self.receive[j])


def repair(imu_t: np.ndarray, encoder_rows: Any) -> tuple[np.ndarray, list[str]]:
    """(IMU stamps on one clock, warnings); the rows' "timestamp" values are moved
    in place. Raises ClockStepError when a step is seen that the data do not
    determine (see the module docstring)."""
    t = np.asarray(imu_t, dtype=np.float64).copy()
    if len(t) < 3 or not np.all(np.isfinite(t)):
        return t, []  # load_imu says what is wrong
    glove = _Glove.of(encoder_rows) if encoder_rows is not None else None
    has_glove = encoder_rows is not None
    cadence = float(np.median(np.diff(t)))
    warnings: list[str] = []
    i = 0
    while True:
        d = np.diff(t[i:])
        odd = np.flatnonzero((d <= 0) | (d > cadence + STEP_MIN))
        if not len(odd):
            return t, warnings
        i += int(odd[0])
        step = float(t[i + 1] - t[i]) - cadence  # the cadence says how far the clock moved
        at = f"{t[i] - t[0]:.2f} s into the recording (imu.json entry {i + 1})"
        if not _resolve(t, i, step, at, glove, has_glove, warnings):
            i += 1
            continue
        t[i + 1:] -= step
        i += 1


def _resolve(t: np.ndarray, i: int, step: float, at: str, glove: _Glove | None, has_glove: bool,
             warnings: list[str]) -> bool:
    """Decide one IMU jump: True to undo it (the glove is shifted here too), False
    to keep it as a gap; raises when it cannot be decided."""
    what = f"the phone's clock stepped {step:+.3f} s at {at} (an NTP correction of the wall clock?)"
    k = glove.split(float(t[i]) + 0.5 * (t[i] - t[i - 1] if i else 0.0)) if glove is not None else None
    if glove is not None and k is not None:
        jump, before = glove.jump(k)
        if abs(jump - step) <= AGREE:
            glove.shift(k, step, before)
            warnings.append(f"{what}: imu.json and encoders.json (by the ESP32's own clock) both show it, so "
                            f"their stamps after it were moved back {step:+.3f} s onto the frames' clock")
            return True
        if step > 0 and abs(jump) <= AGREE:
            return False  # the glove's clock runs on: CoreMotion stalled, a real gap
        raise ClockStepError(f"imu.json jumps {step:+.3f} s at {at} but encoders.json jumps {jump:+.3f} s "
                             "there (by the ESP32's clock): the phone's clock stepped and the streams disagree "
                             "on how far, so the joints cannot be placed on the frames; remove encoders.json to "
                             "pack with the joints masked, or re-record")
    if step < 0 and has_glove:
        raise ClockStepError(f"{what}, and encoders.json cannot confirm it (no steady esp_timestamp_ms around "
                             "it): its readings would land on the wrong frames; remove encoders.json to pack with "
                             "the joints masked, or re-record")
    if step < 0:
        warnings.append(f"{what}: imu.json's stamps after it were moved by {-step:+.3f} s (time never runs "
                        "back, and its 200 Hz cadence gives the size to one sample; no encoders.json to confirm)")
        return True
    warnings.append(f"imu.json has no samples for {step:.3f} s at {at}: a CoreMotion stall, or the phone's "
                    "clock stepping forward (NTP); nothing else recorded tells which, so the stamps are kept")
    return False
