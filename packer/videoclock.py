"""The frame clock of a session the app recorded (no recorded frame timestamps):
video.mov's sample times where it is readable, else the frame numbers, refused
where the recording shows the numbers cannot be the clock.

The numbers are a clock only when the camera dropped nothing: a dropped frame
leaves no number behind (`packer.frametimes`), so every later frame would be
placed early, by a period per drop, and its joints read from the wrong moment.
Without video.mov the drops still show as fewer numbers than the IMU's span holds
at the camera's rate; they cannot be placed, so such a session is refused with the
count, never packed on a clock known to be wrong."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from packer.frametimes import place
from packer.imu_gaps import find_gaps
from packer.video import VideoError, frame_times

# The IMU runs from the capture's start to its stop, the frames from the first that
# arrives to the last: frame 0 comes 10-40 ms after the IMU's first sample (up to
# ~0.3 s on a phone whose camera starts slowly) and the stop a period after the last
# frame. More than this many seconds of frames missing from the IMU's span are drops.
DROP_SLACK = 0.4
MIN_SHARE = 0.5  # a video with fewer samples than this share of the numbers is another recording


@dataclass(frozen=True)
class VideoClock:
    times: np.ndarray  # (N,) s since frame 0 of each present frame (NaN: not placed)
    fps: float
    fps_source: str
    notes: list[str]  # what the video showed, for the session's warnings

    @property
    def placed(self) -> np.ndarray:
        return np.isfinite(self.times)


def from_video(path: Path, frames: np.ndarray, count: int, warnings: list[str]) -> VideoClock | None:
    """The present frames' times from video.mov at `path`, or None (with a warning
    saying why when the file exists) where it cannot give them."""
    if not path.exists():
        return None
    try:
        vt = frame_times(path)
    except VideoError as e:
        warnings.append(f"video.mov {e}: frame times from the frame numbers")
        return None
    if len(vt) < MIN_SHARE * count:
        warnings.append(f"video.mov has {len(vt)} frames for {count} frame numbers: not this recording's video; "
                        "frame times from the frame numbers")
        return None
    p = place(vt, count)
    times = p.times[frames]
    notes = []
    if p.dropped:
        share = p.dropped / (p.dropped + len(p.times))
        notes.append(f"video.mov: the camera dropped {p.dropped} frame(s) ({share:.1%}); frames placed at their "
                     "recorded times, nothing spans a drop")
    if p.skipped:
        notes.append(f"video.mov lacks {len(p.skipped)} frame(s) (the writer was not ready): placed in its gaps")
    lost = int(np.isnan(times).sum())
    if lost:
        notes.append(f"{lost} frame(s) between the camera's drops and the video writer's skips cannot be placed in "
                     "time: left out")
    return VideoClock(times, p.fps, f"video.mov ({len(vt)} frames over {vt[-1]:.2f} s)", notes)


def numbers_short(count: int, fps: float, imu_t: np.ndarray) -> str | None:
    """The refusal when `count` frame numbers at `fps` fill clearly less of the
    IMU's span (`imu_t`) than they should (drops, and no video.mov to place them),
    else None. The IMU's own gaps are not counted: a forward jump in imu.json that
    the glove does not confirm is kept as a stall (`packer.clockstep`) but may be a
    clock step the glove missed, and drops are not claimed on that ambiguity
    (`packer slam` still sees drops from the gyro)."""
    imu_span = float(imu_t[-1] - imu_t[0]) - sum(g.length for g in find_gaps(imu_t))
    expected = imu_span * fps
    short = expected - count
    if short <= DROP_SLACK * fps:
        return None
    return (f"{count} frames in the {imu_span:.2f} s the IMU ran at {fps:g} fps: about {short:.0f} frames "
            f"({short / expected:.0%}) were dropped by the camera and there is no video.mov to place the others in "
            "time; copy video.mov from the phone's export into the session")

