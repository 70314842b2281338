"""Frame 0 on the phone's epoch clock: what places the glove's readings on frames.

imu.json and encoders.json are stamped with the same clock (Date() on the phone),
so the IMU-to-frame offset that gyro/visual alignment measures places the encoders
too, to a few milliseconds. In order of trust:

1. the offset `packer slam` stored in metadata.json (IMU clock = frame clock + offset);
2. gyro vs visual rotation rate on poses.json from elsewhere (the user's calibrated
   SLAM): the same alignment, run on their poses, takes well under a second;
3. without poses, gyro alignment on the images' own rotation over the first seconds
   (`packer.slam.inertial.visual_clock`), where it is sound;
4. the session's first guess (IMU start, glove start, or the 1-s metadata start time),
   which is off by up to a frame period and the camera's start (or a second)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packer.session import Session


@dataclass(frozen=True)
class FrameClock:
    frame0_epoch: float | None  # epoch seconds of frame 0 (None: nothing to place it with)
    source: str

    def epoch(self, frame_t: np.ndarray) -> np.ndarray:
        assert self.frame0_epoch is not None
        return self.frame0_epoch + np.asarray(frame_t, dtype=np.float64)

    def to_json(self) -> dict:
        return {"frame0_epoch": self.frame0_epoch, "source": self.source}


def frame_clock(session: Session, poses: dict[int, np.ndarray] | None) -> FrameClock:
    """The best available placement of frame 0 (see the module docstring)."""
    ours = session.metadata.get("shardship")
    if session.pose_source == "shardship" and isinstance(ours, dict) and ours.get("imu_offset") is not None:
        return FrameClock(float(ours["imu_offset"]), "gyro alignment in packer slam")
    if session.imu is not None and poses:
        aligned = _align_on_poses(session, poses)
        if aligned is not None:
            return FrameClock(aligned, f"gyro alignment on {session.pose_source} poses.json")
    if session.imu is not None and not poses and session.intrinsics is not None:
        seen = _align_on_images(session)
        if seen is not None:
            return FrameClock(seen, "gyro alignment on the images' own rotation")
    return FrameClock(session.frame0_epoch, session.frame0_source or "none")


def _align_on_images(session: Session) -> float | None:
    """Frame 0 from the images' rotation against the gyro where there are no poses
    (`packer.slam.inertial.visual_clock`), or None where that is not sound."""
    from packer.slam.inertial.visual_clock import visual_offset

    assert session.imu is not None and session.intrinsics is not None
    fx, fy, cx, cy = session.intrinsics
    K = np.array([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]])
    try:
        return visual_offset(session.frame_paths, session.timestamps, K, session.imu.t, session.imu.gyro)
    except (OSError, ValueError):  # a frame that does not decode: the encoder names it, the first guess stands
        return None


def _align_on_poses(session: Session, poses: dict[int, np.ndarray]) -> float | None:
    """IMU offset from the given poses' rotations, or None when not observable
    (too little rotation, too few poses: the caller falls back)."""
    from packer.slam.inertial.imu_align import AlignmentError, align_imu

    assert session.imu is not None
    idx = [i for i, f in enumerate(session.frames) if int(f) in poses]
    step = max(1, int(round(session.fps / 20)))  # ~20 Hz keeps the rate signal, costs little
    idx = idx[::step]
    if len(idx) < 12:
        return None
    key_ts = session.timestamps[idx]
    R_wc = np.stack([poses[int(session.frames[i])][:3, :3] for i in idx])
    try:
        return float(align_imu(key_ts, R_wc, session.imu.t, session.imu.gyro).offset)
    except AlignmentError:
        return None
