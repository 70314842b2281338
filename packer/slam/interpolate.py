"""Poses for every frame from the registered keyframes: linear position, slerp
rotation, and a flag per frame so the packer can say which poses were observed.

Frames before the first / after the last registered keyframe get the nearest
registered pose (no extrapolation: a guess past the data is worse than a hold) and
are flagged OUTSIDE."""
from __future__ import annotations

import numpy as np

from packer.slam.rotations import make_pose, slerp

REGISTERED, INTERPOLATED, OUTSIDE = 0, 1, 2
FLAG_NAMES = {REGISTERED: "registered", INTERPOLATED: "interpolated", OUTSIDE: "outside"}


def interpolate_poses(
    frame_ts: np.ndarray, key_ts: np.ndarray, key_poses: np.ndarray, tol: float = 1e-6
) -> tuple[np.ndarray, np.ndarray]:
    """Camera-to-world poses (N, 4, 4) at `frame_ts` from keyframe poses (K, 4, 4) at
    strictly increasing `key_ts`, plus int8 flags (REGISTERED / INTERPOLATED / OUTSIDE).
    A frame within `tol` seconds of a keyframe time takes that keyframe's pose."""
    frame_ts = np.asarray(frame_ts, dtype=np.float64)
    key_ts = np.asarray(key_ts, dtype=np.float64)
    key_poses = np.asarray(key_poses, dtype=np.float64)
    if key_ts.ndim != 1 or len(key_ts) == 0 or key_poses.shape != (len(key_ts), 4, 4):
        raise ValueError("need K >= 1 keyframe times and (K, 4, 4) poses")
    if np.any(np.diff(key_ts) <= 0):
        raise ValueError("keyframe times must be strictly increasing")
    n = len(frame_ts)
    flags = np.full(n, INTERPOLATED, dtype=np.int8)
    # index of the keyframe at or before each frame
    i0 = np.clip(np.searchsorted(key_ts, frame_ts, side="right") - 1, 0, len(key_ts) - 1)
    i1 = np.minimum(i0 + 1, len(key_ts) - 1)
    span = key_ts[i1] - key_ts[i0]
    u = np.where(span > 0, (frame_ts - key_ts[i0]) / np.where(span > 0, span, 1.0), 0.0)
    before = frame_ts < key_ts[0] - tol
    after = frame_ts > key_ts[-1] + tol
    u = np.clip(np.where(before, 0.0, u), 0.0, 1.0)
    R0, R1 = key_poses[i0, :3, :3], key_poses[i1, :3, :3]
    p0, p1 = key_poses[i0, :3, 3], key_poses[i1, :3, 3]
    R = slerp(R0, R1, u)
    p = p0 + u[:, None] * (p1 - p0)
    d0, d1 = np.abs(frame_ts - key_ts[i0]), np.abs(frame_ts - key_ts[i1])
    j = np.where(d0 <= d1, i0, i1)
    near = np.minimum(d0, d1) <= tol
    R[near] = key_poses[j[near], :3, :3]
    p[near] = key_poses[j[near], :3, 3]
    flags[near] = REGISTERED
    flags[(before | after) & ~near] = OUTSIDE
    return make_pose(R, p), flags
