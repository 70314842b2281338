"""Keyframe rotations chained from the tracks alone, as if the camera only turned: a
start for the gyro calibration that owes nothing to a model.

Why: the second try (`gyro_repair`) starts from the gyro aligned on the refused
model, on a 3 s window SfM or on the KLT model. Where every one of those is wrong
(every-effect bench seed 16: the refused model's alignment 100 deg and 0.26 s off,
no other), the adjustment bends the camera instead (its focal length went to 170 px
for a true 412) and the session is refused. Between keyframes 0.05-0.1 s apart a
hand turns ~10-17 deg and moves a few cm in front of a scene 1-2 m away, so each
pair's rotation is close to the one that maps one keyframe's bearings onto the
next's (orthogonal Procrustes, the worst-fitting tracks dropped twice). The chain of
them drifts, but the gyro alignment compares rotation increments over short
intervals: on seed 16 it gave the clock offset within 2 ms and the camera-IMU
rotation within 15 deg, which the adjustment then refines (the session accepted at
the defaults, +0.19% at +-0.74%)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from packer.slam.frontend.tracks import Tracks


def bearings(points: np.ndarray, camera: list[float]) -> np.ndarray:
    """(n, 3) unit viewing rays of pixel positions for camera [f, cx, cy, k1] (k1 undone
    to first order: enough for a start)."""
    f, cx, cy, k1 = camera
    x, y = (points[:, 0] - cx) / f, (points[:, 1] - cy) / f
    d = 1.0 + k1 * (x * x + y * y)
    v = np.stack([x / d, y / d, np.ones_like(x)], axis=1)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def pair_rotation(a: np.ndarray, b: np.ndarray, rounds: int = 3) -> np.ndarray:
    """R with b ~ R a for unit rays a, b (n, 3): orthogonal Procrustes, each round
    dropping the rays more than 3 times the median residual off (the ones that moved on
    their own, slid, or sit close and show the translation)."""
    keep = np.ones(len(a), bool)
    R = np.eye(3)
    for _ in range(rounds):
        if keep.sum() < 3:
            break
        U, _s, Vt = np.linalg.svd(a[keep].T @ b[keep])
        D = np.diag([1.0, 1.0, np.linalg.det(Vt.T @ U.T)])
        R = Vt.T @ D @ U.T
        res = np.linalg.norm(b - a @ R.T, axis=1)
        keep = res <= max(3.0 * float(np.median(res)), 1e-4)
    return R


def chain_rotations(tracks: Tracks, camera: list[float], min_shared: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """(keyframe indices, (K, 3, 3) their camera-to-world rotations, the first the
    identity) over the longest run of keyframes whose consecutive pairs share
    `min_shared` tracks or more (the chain breaks where they do not: every-effect seed
    16 kept 4-6 tracks per pair in its last half second)."""
    pairs = [np.intersect1d(tracks.ids[k], tracks.ids[k + 1], assume_unique=True, return_indices=True)[1:]
             for k in range(len(tracks.ids) - 1)]  # (ia, ib) of each consecutive pair's shared tracks
    best, start = (0, 1), 0
    for k in range(len(pairs) + 1):  # runs of pairs k..k+1 that hold
        if k == len(pairs) or len(pairs[k][0]) < min_shared:
            if k + 1 - start > best[1] - best[0]:
                best = (start, k + 1)
            start = k + 1
    a, b = best
    R = [np.eye(3)]
    for k in range(a, b - 1):
        ia, ib = pairs[k]
        rel = pair_rotation(bearings(tracks.points[k][ia], camera), bearings(tracks.points[k + 1][ib], camera))
        R.append(R[-1] @ rel.T)  # b_{k+1} = R_cw(k+1) R_wc(k) b_k
    return np.arange(a, b), np.array(R)
