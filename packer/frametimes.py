"""Where each numbered frame sits in time, from video.mov's sample times, and the
gaps nothing may span. Pure numpy.

The app numbers frames as they reach it; video.mov has one sample per frame that
reached it, at its real time (`packer.video`). Three faults, told apart:

- the camera dropped a late frame: a gap in the video's times, the numbering runs
  on (no number is missing: the next frame took it);
- a JPEG encode failed: a number without a file, its sample still in the video;
- the writer was not ready: a number with a file but no sample (the video has fewer
  samples than numbers). Such a number sits in one of the video's gaps; which slot
  is known only when every missing slot is one (then there were no drops);
  otherwise the frames between the first and the last candidate gap cannot be
  placed and are left out, never guessed.

A camera set to a fixed rate delivers on its frame grid, so a time within a
quarter period of a grid slot is taken as that slot (the 1/600 s timescale rounds
by up to 0.83 ms; the grid is exact); otherwise the video's own times are used."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from packer.timebase import APP_FPS, snap

GRID_TOLERANCE = 0.25  # periods: within this of a slot, a time is that slot
GAP_PERIODS = 1.5  # consecutive frames further apart than this many periods are not consecutive


@dataclass(frozen=True)
class Placement:
    """Times of frame numbers 0..n-1 (s since frame 0; NaN: could not be placed)."""

    times: np.ndarray
    fps: float
    on_grid: bool  # times are slots of the 1/fps grid
    dropped: int  # frames the camera dropped (missing slots that no number fills)
    skipped: list[int] = field(default_factory=list)  # numbers without a video sample, placed in a gap
    unplaced: list[int] = field(default_factory=list)  # numbers whose time is unknown


def video_fps(video_t: np.ndarray) -> float:
    """The camera's rate from the video's median interval, snapped to the app's rates
    (60, or 30 where the camera cannot); the raw rate where neither is close."""
    raw = 1.0 / float(np.median(np.diff(video_t)))
    return snap(raw, APP_FPS) or raw


def place(video_t: np.ndarray, n_numbers: int) -> Placement:
    """Place frame numbers 0..n_numbers-1 on the video's sample times `video_t`
    (sorted, first 0). More samples than numbers means trailing frames whose JPEG
    failed: the caller passes the larger count."""
    fps = video_fps(video_t)
    slots_f = video_t * fps
    slots = np.round(slots_f).astype(np.int64)
    on_grid = bool(np.max(np.abs(slots_f - slots)) < GRID_TOLERANCE and np.all(np.diff(slots) > 0))
    t = slots / fps if on_grid else np.asarray(video_t, dtype=np.float64)
    k, n = len(t), max(n_numbers, len(t))
    period = 1.0 / fps
    missing = (np.round(np.diff(t) / period).astype(np.int64) - 1).clip(0)  # slots missing after sample j
    skips = n - k
    times = np.full(n, np.nan)
    if skips == 0:
        return Placement(t, fps, on_grid, int(missing.sum()))
    gaps = np.nonzero(missing)[0]
    if int(missing.sum()) == skips:  # every missing slot is a skip: no drops, each gap is a skipped number
        return _fill(t, missing, skips, n, fps, on_grid)
    if len(gaps) == 0:  # no gap to hold them: at the end (at the start, every time is one period late: a constant)
        times[:k] = t
        times[k:] = t[-1] + period * np.arange(1, n - k + 1)
        return Placement(times, fps, on_grid, 0, list(range(k, n)))
    first, last = int(gaps[0]), int(gaps[-1])
    times[:first + 1] = t[:first + 1]  # before the first candidate gap: number = sample
    tail = k - 1 - last  # samples after the last candidate gap: counted from the end
    times[n - tail:] = t[last + 1:]
    unplaced = list(range(first + 1, n - tail))
    return Placement(times, fps, on_grid, int(missing.sum()) - skips, [], unplaced)


def _fill(t: np.ndarray, missing: np.ndarray, skips: int, n: int, fps: float, on_grid: bool) -> Placement:
    """Numbers without a sample placed in the video's gaps, in order, one slot each
    (the caller checked that the missing slots are exactly the skipped numbers)."""
    times, skipped = np.empty(n), []
    out, left = 0, skips
    for j in range(len(t)):
        times[out] = t[j]
        out += 1
        take = min(int(missing[j]) if j < len(missing) else 0, left)
        for s in range(1, take + 1):
            times[out] = t[j] + s / fps
            skipped.append(out)
            out += 1
        left -= take
    assert out == n, (out, n)
    return Placement(times, fps, on_grid, int(missing.sum()) - skips, skipped)


def breaks(times: np.ndarray, numbers: np.ndarray, fps: float, step: int = 1) -> np.ndarray:
    """(N-1,) bool: True where frame i+1 does not follow frame i: a number missing
    between them (a failed JPEG, or a frame left out; `step` apart when packing every
    step-th frame) or their times further apart than `step` periods by more than
    half a period (the camera dropped frames). Action chunks and observation windows
    never span one."""
    numbers = np.asarray(numbers, dtype=np.int64)
    dt = np.diff(np.asarray(times, dtype=np.float64))
    return (np.diff(numbers) != step) | (dt > (step - 1 + GAP_PERIODS) / fps)


def describe_gaps(times: np.ndarray, numbers: np.ndarray, cut: np.ndarray, limit: int = 4) -> str:
    """'3 gaps: after frame 41 (50 ms to frame 42), ...' for warnings and `check`;
    `cut` is what `breaks` found."""
    br = np.nonzero(cut)[0]
    parts = [f"after frame {int(numbers[i])} ({(times[i + 1] - times[i]) * 1000:.0f} ms to frame {int(numbers[i + 1])})"
             for i in br[:limit]]
    more = f", and {len(br) - limit} more" if len(br) > limit else ""
    return f"{len(br)} gap{'s' if len(br) != 1 else ''}: " + ", ".join(parts) + more if len(br) else "no gap"
