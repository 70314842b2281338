"""The frame clock of a session: its frame rate, and where frame 0 sits on the
phone's epoch clock (the clock of imu.json and encoders.json).

The app records no frame timestamps and no fps key: it asks for 60 fps and falls
back to 30 when the camera cannot, and the frame counter advances once per
delivered frame. So the rate is measured from spans the app does record (the IMU
and the encoders run from capture start to stop, the metadata start/end times
have 1-second resolution) and snapped to a standard rate. Pure functions."""
from __future__ import annotations

import math
from datetime import datetime

STANDARD_FPS = (24.0, 25.0, 30.0, 48.0, 50.0, 60.0, 120.0, 240.0)
APP_FPS = (30.0, 60.0)  # what StackCapture can record
DEFAULT_FPS = 60.0
SNAP_TOLERANCE = 0.08  # relative: within this of a standard rate, take the standard rate


def snap(fps: float, candidates: tuple[float, ...] = STANDARD_FPS, tol: float = SNAP_TOLERANCE) -> float | None:
    """The standard rate within `tol` (relative) of `fps`, else None."""
    best = min(candidates, key=lambda c: abs(math.log(fps / c)))
    return best if abs(fps / best - 1.0) <= tol else None


def fps_from_span(frame_count: int, seconds: float, candidates: tuple[float, ...] = STANDARD_FPS,
                  tol: float = SNAP_TOLERANCE) -> float | None:
    """Rate from `frame_count` frames recorded while a stream ran `seconds`
    (the stream brackets the frames, so it is a slight over-estimate of their span)."""
    if frame_count < 2 or not seconds > 0:
        return None
    return snap((frame_count - 1) / seconds, candidates, tol)


def iso_epoch(value: object) -> float | None:
    """Epoch seconds from the app's ISO-8601 dates ("2026-01-31T15:30:45Z"), else None."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def estimate_fps(frame_count: int, spans: list[tuple[str, float]], pose_dt: float | None = None
                 ) -> tuple[float, str, list[str]]:
    """(fps, what it came from, warnings).

    frame_count: frame counter at the end (last index + 1); spans: (name, seconds)
    of streams that ran for the whole capture, best first; pose_dt: median interval
    of recorded frame timestamps (ARKit sessions), which wins when present."""
    if pose_dt and pose_dt > 0:
        raw = 1.0 / pose_dt
        return (snap(raw) or raw), "poses.json timestamps", []
    for name, seconds in spans:
        # (metadata times have 1 s resolution: they only tell 30 from 60). Only the
        # app's two rates are candidates, so a stream that stopped early is not
        # mistaken for a faster camera: it matches neither and the next span decides.
        coarse = name == "metadata startTime/endTime"
        fps = fps_from_span(frame_count, seconds, APP_FPS, 0.3 if coarse else SNAP_TOLERANCE)
        if fps is not None:
            return fps, f"{name} ({frame_count} frames in {seconds:.2f} s)", []
    tried = ", ".join(f"{n} {s:.2f} s" for n, s in spans) or "no imu.json, encoders.json or start/end times"
    return DEFAULT_FPS, "default", [f"frame rate not measurable ({tried}): assuming {DEFAULT_FPS:g} fps"]
