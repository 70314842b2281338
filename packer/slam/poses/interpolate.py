"""Poses for every frame from the registered keyframes: cubic Hermite position
and rotation (tangents from the neighbouring keyframes), and a flag per frame so
the packer can say which poses were observed.

Why cubic: keyframes are chosen by parallax, ~5 per second of hand motion. A
straight chord between them cuts every curve of the hand's path (at 5 Hz and a
1 Hz, 3 cm jiggle, ~3 mm off the path and ~0.5 deg off in rotation); a cubic
through the neighbours follows it to a small fraction of that. Across a long
gap (an unregistered stretch, > `max_smooth_gap` s) the neighbours say nothing
about the gap, so that segment stays linear / slerp.

Frames before the first / after the last registered keyframe get the nearest
registered pose (no extrapolation: a guess past the data is worse than a hold) and
are flagged OUTSIDE."""
from __future__ import annotations

import numpy as np

from packer.slam.rotations import make_pose, slerp, so3_exp, so3_log

REGISTERED, INTERPOLATED, OUTSIDE = 0, 1, 2
FLAG_NAMES = {REGISTERED: "registered", INTERPOLATED: "interpolated", OUTSIDE: "outside"}


def interpolate_poses(
    frame_ts: np.ndarray, key_ts: np.ndarray, key_poses: np.ndarray, tol: float = 1e-6, max_smooth_gap: float = 0.5,
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
    if len(key_ts) >= 3:
        smooth = (span > 0) & (span <= max_smooth_gap) & ~(before | after)
        vp, wb = _tangents(key_ts, key_poses, max_smooth_gap)
        p[smooth], R[smooth] = _hermite(u[smooth], span[smooth], key_poses, i0[smooth], i1[smooth], vp, wb)
    d0, d1 = np.abs(frame_ts - key_ts[i0]), np.abs(frame_ts - key_ts[i1])
    j = np.where(d0 <= d1, i0, i1)
    near = np.minimum(d0, d1) <= tol
    R[near] = key_poses[j[near], :3, :3]
    p[near] = key_poses[j[near], :3, 3]
    flags[near] = REGISTERED
    flags[(before | after) & ~near] = OUTSIDE
    return make_pose(R, p), flags


def _tangents(key_ts: np.ndarray, key_poses: np.ndarray, max_gap: float) -> tuple[np.ndarray, np.ndarray]:
    """Velocity (K,3) and body angular rate (K,3) at each keyframe: the derivative of
    the parabola through it and its neighbours (one-sided at the ends and next to a
    gap longer than `max_gap`)."""
    h = np.diff(key_ts)
    dp = np.diff(key_poses[:, :3, 3], axis=0) / h[:, None]
    R = key_poses[:, :3, :3]
    dw = so3_log(np.swapaxes(R[:-1], -1, -2) @ R[1:]) / h[:, None]
    ok = h <= max_gap
    vp = np.zeros((len(key_ts), 3))
    wb = np.zeros((len(key_ts), 3))
    for out, d in ((vp, dp), (wb, dw)):
        left = np.vstack([d[:1] * 0, d])  # slope of the segment before each keyframe
        right = np.vstack([d, d[-1:] * 0])
        hl = np.concatenate([[0.0], h])
        hr = np.concatenate([h, [0.0]])
        has_l = np.concatenate([[False], ok])
        has_r = np.concatenate([ok, [False]])
        both = has_l & has_r
        out[both] = (left[both] * hr[both, None] + right[both] * hl[both, None]) / (hl[both] + hr[both])[:, None]
        out[has_l & ~has_r] = left[has_l & ~has_r]
        out[has_r & ~has_l] = right[has_r & ~has_l]
    return vp, wb


def _hermite(u: np.ndarray, span: np.ndarray, key_poses: np.ndarray, i0: np.ndarray, i1: np.ndarray,
             vp: np.ndarray, wb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cubic Hermite between keyframes i0 and i1 at fraction u: position in the
    world, rotation as R_i0 Exp(phi(u)) with phi a Hermite curve from 0 to
    Log(R_i0^T R_i1) (exact at both keyframes)."""
    u2, u3 = u * u, u * u * u
    h00, h10, h01, h11 = 2 * u3 - 3 * u2 + 1, u3 - 2 * u2 + u, -2 * u3 + 3 * u2, u3 - u2
    hs = span[:, None]
    p0, p1 = key_poses[i0, :3, 3], key_poses[i1, :3, 3]
    p = h00[:, None] * p0 + h10[:, None] * hs * vp[i0] + h01[:, None] * p1 + h11[:, None] * hs * vp[i1]
    R0 = key_poses[i0, :3, :3]
    d = so3_log(np.swapaxes(R0, -1, -2) @ key_poses[i1, :3, :3])
    phi = h10[:, None] * hs * wb[i0] + h01[:, None] * d + h11[:, None] * hs * wb[i1]
    return p, R0 @ so3_exp(phi)
