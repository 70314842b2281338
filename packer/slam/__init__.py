"""Stage 1: metric camera poses per session (pycolmap SfM + IMU scale calibration).

Public API:
    slam_session(session_dir, opts) -> SlamResult
    slam_sessions(paths, opts, jobs) -> list[SlamResult]
    interpolate_poses(frame_ts, key_ts, key_poses) -> (poses (N,4,4), flags (N,))
"""
from packer.slam.options import SCALE_METHODS, SlamOptions
from packer.slam.pipeline import SlamResult, slam_session, slam_sessions
from packer.slam.poses.interpolate import FLAG_NAMES, INTERPOLATED, OUTSIDE, REGISTERED, interpolate_poses
from packer.slam.scale.scale import ScaleOptions

__all__ = [
    "FLAG_NAMES",
    "INTERPOLATED",
    "OUTSIDE",
    "REGISTERED",
    "SCALE_METHODS",
    "ScaleOptions",
    "SlamOptions",
    "SlamResult",
    "interpolate_poses",
    "slam_session",
    "slam_sessions",
]
