"""Gaps in imu.json: stretches where the phone delivered no IMU sample.

The app receives CoreMotion's deviceMotion on the main queue and stamps each sample
with Date() as it runs, so while the main thread is busy (an encode, a UI hitch) no
sample arrives at all: real sessions hold 0.1-0.5 s holes in an otherwise 200 Hz
stream. Nothing measured what the phone did there, so nothing may integrate the IMU
across one: the SLAM stage leaves each gap out of its IMU terms (`packer.slam`),
`packer check` names it, and a session with one says so at load.

Pure functions of the timestamps (numpy only): what counts as a gap is measured on
the stream itself (`gap_threshold`), and the rest turn the gaps into the masks the
IMU's users need (which intervals cross one, which gap-free stretch a time lies in,
which sample-to-sample steps are gaps)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GAP_CADENCES = 10.0  # an interval this many times the stream's median one is a gap ...
GAP_FLOOR = 0.05  # s ... and never one shorter than this


@dataclass(frozen=True)
class ImuGap:
    at: float  # s from the IMU's first sample to the last sample before the gap
    length: float  # s from that sample to the next one

    def words(self) -> str:
        return f"{self.length:.2f} s at {self.at:.2f} s"


def gap_threshold(t: np.ndarray) -> float:
    """The longest interval between samples that is still the stream's own cadence:
    GAP_CADENCES times the median interval, at least GAP_FLOOR.

    Why the median: it is the cadence the phone ran at (200 Hz for the app, 100 Hz for
    others) measured on the data, whatever the rate, and a few long holes or a jittery
    main queue do not move it. Why ten of them: Date() stamps samples as the main queue
    runs, so ordinary intervals scatter around the cadence by a frame of UI work (16-33
    ms, 3-7 intervals at 200 Hz) without any sample being lost, while a busy main thread
    leaves 0.1-0.5 s (20-100 intervals). Why a floor: a fast stream (or one whose
    median interval is tiny because samples arrive in bursts) would otherwise have its
    jitter called gaps, and across 50 ms the samples at both ends, linearly
    interpolated, still describe a hand's motion (its turn rate changes over ~0.1 s)."""
    t = np.asarray(t, dtype=np.float64)
    if len(t) < 2:
        return float("inf")
    return max(GAP_CADENCES * float(np.median(np.diff(t))), GAP_FLOOR)


def gap_steps(t: np.ndarray) -> np.ndarray:
    """(N-1,) bool: which sample-to-sample intervals of `t` are gaps."""
    t = np.asarray(t, dtype=np.float64)
    if len(t) < 2:
        return np.zeros(max(len(t) - 1, 0), dtype=bool)
    return np.diff(t) > gap_threshold(t)


def find_gaps(t: np.ndarray) -> list[ImuGap]:
    """Each gap in the timestamps `t` (s, increasing): where it starts, in seconds from
    the first sample (the last sample before it), and how long it lasts (to the next
    sample). Empty for a stream at its own cadence (`gap_threshold`)."""
    t = np.asarray(t, dtype=np.float64)
    i = np.flatnonzero(gap_steps(t))
    return [ImuGap(float(t[k] - t[0]), float(t[k + 1] - t[k])) for k in i]


def gap_spans(t: np.ndarray) -> np.ndarray:
    """(G,2) each gap as [last sample before, first sample after] on `t`'s own clock."""
    t = np.asarray(t, dtype=np.float64)
    i = np.flatnonzero(gap_steps(t))
    return np.column_stack([t[i], t[i + 1]]) if len(i) else np.zeros((0, 2))


def crosses_gap(spans: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """bool, shaped as a and b: whether [a, b] reaches into a gap (any of `spans`), i.e.
    holds time the IMU has no sample for: what may not be integrated or interpolated."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    out = np.zeros(np.broadcast(a, b).shape, dtype=bool)
    for lo, hi in spans:
        out |= (a < hi) & (b > lo)
    return out


def stretch_of(spans: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """int per time in `ts`: which gap-free stretch of the stream it lies in (0 before
    the first gap, 1 after it, ...), -1 inside a gap. Times in one stretch share one
    integration of the gyro; times in two have an unknown turn between them."""
    ts = np.asarray(ts, dtype=np.float64)
    if not len(spans):
        return np.zeros(ts.shape, dtype=np.int64)
    out = np.searchsorted(spans[:, 0], ts, side="left").astype(np.int64)
    inside = crosses_gap(spans, ts, ts)
    out[inside] = -1
    return out


def stretches(t: np.ndarray) -> list[slice]:
    """The samples of each gap-free stretch of `t`, in order (one slice without gaps)."""
    i = np.flatnonzero(gap_steps(t)) + 1
    bounds = [0, *i.tolist(), len(t)]
    return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


def gap_summary(gaps: list[ImuGap]) -> str:
    """One clause for a message about a session: the gap, or how many and the longest."""
    if len(gaps) == 1:
        return f"imu.json has no samples for {gaps[0].words()} after its start"
    longest = max(gaps, key=lambda g: g.length)
    return f"imu.json has {len(gaps)} stretches without samples (the longest {longest.words()} after its start)"


def gap_warnings(t: np.ndarray) -> list[str]:
    """The session's warning at load (`packer.session.read_imu`): empty without a gap."""
    gaps = find_gaps(t)
    if not gaps:
        return []
    return [f"{gap_summary(gaps)}: the phone's main thread was busy; packer slam leaves "
            f"{'it' if len(gaps) == 1 else 'them'} out of the IMU terms"]


def second_differences(t: np.ndarray, x: np.ndarray) -> np.ndarray:
    """np.diff(x, 2, axis=0) of samples x at times t, less the rows that reach across a
    gap (where the noise measured on them would be the motion in the gap)."""
    d2 = np.diff(x, 2, axis=0)
    gap = gap_steps(t)
    if not gap.any():
        return d2
    return d2[~(gap[:-1] | gap[1:])]
