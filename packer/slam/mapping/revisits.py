"""One place seen again in another part: the tracks of a model mapped in parts that
are the same corner (`packer.slam.repair.repaired`, `packer.slam.mapping.part_links`).

Where the view turns plain for a moment, every KLT track dies and GLOMAP splits the
model into parts that share no track; the IMU alone then places each later part.
But a hand-held session keeps coming back to the same things: on every-effect bench
seed 12, whose three parts shared one track at one join and none at the other, SIFT
descriptors at the tracked corners of keyframes from different parts looking the
same way (the parts share the gyro's world, so "the same way" is known) matched 30+
corners per pair, verified against the gyro's relative rotation. Such matches make
the two tracks one (as ORB-SLAM3 merges its maps on a revisit, here with the gyro's
rotation as the place prior), and `part_links` ties the parts through them. Within one
part the same search between keyframes LOOP_APART_S or more apart closes its loops:
a model built from short tracks drifts, and the corners seen again pull it back.

Descriptors are computed where the corner was in the image as recorded: the tracks
are corrected for the rolling shutter (`rolling.readout_shift`), up to ~8 px at the
top and bottom rows of a fast turn."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from packer.slam.frontend.rolling import readout_shift
from packer.slam.inertial.gyro_prior import epipolar_px, translation_direction, undistorted_bearings
from packer.slam.rotations import so3_log

if TYPE_CHECKING:
    from pathlib import Path

    from packer.slam.frontend.tracks import Tracks

MAX_TURN_DEG = 15.0  # keyframes of two parts are compared when their rotations differ by at most this (a SIFT
# descriptor at a fixed orientation tolerates about that much roll)
RATIO = 0.8  # Lowe's ratio test
MAX_EPIPOLAR_PX = 2.0  # a match must lie this close to its epipolar line under the gyro's rotation
MIN_INLIERS = 12  # verified matches a pair of keyframes needs before any of them counts (chance gives ~5 of 40)
TRIALS = 64  # translation hypotheses (two matches each) per pair
DESCRIPTOR_PX = 12.0  # SIFT keypoint size at a tracked corner
LOOP_APART_S = 2.0  # within one part, keyframes this far apart in time are compared too (a loop closed)


Features = tuple[np.ndarray, np.ndarray, np.ndarray]  # (pixels as tracked, track ids, SIFT descriptors)


def corner_features(paths: list[Path], tracks: Tracks, key_pos: np.ndarray, readout: float, fps: float
                    ) -> list[Features]:
    """Per keyframe in `key_pos`, its tracked corners with a SIFT descriptor each,
    computed in the recorded image (`paths`, one per keyframe) at the corner's place there."""
    import cv2

    sift = cv2.SIFT_create()  # type: ignore[attr-defined]
    where = tracks.index()
    out = []
    for path, k in zip(paths, key_pos):
        ti = where[int(k)]
        p = tracks.points[ti].astype(np.float64)
        raw = p + readout_shift(p, tracks.velocity[ti], tracks.height, readout, fps) if readout > 0 else p
        img = cv2.imread(str(path), cv2.IMREAD_GRAYSCALE)
        if img is None or not len(p):
            out.append((p, tracks.ids[ti], np.zeros((len(p), 128), np.float32)))
            continue
        # COLMAP's pixel centres are at +0.5, OpenCV's at 0; a corner too near the border keeps a zero descriptor
        kps = [cv2.KeyPoint(float(x - 0.5), float(y - 0.5), DESCRIPTOR_PX) for x, y in raw]
        _k, d = sift.compute(img, kps)
        out.append((p, tracks.ids[ti], np.zeros((len(p), 128), np.float32) if d is None or len(d) != len(p)
                    else d.astype(np.float32)))
    return out


def candidate_pairs(R_wc: np.ndarray, seg: np.ndarray, max_deg: float = MAX_TURN_DEG,
                    key_ts: np.ndarray | None = None, apart: float = np.inf) -> list[tuple[int, int]]:
    """Pairs (a, b), a < b, of keyframes that look the same way, in different parts
    (`seg`) or, with `key_ts`, `apart` seconds or more apart in one part: for each
    keyframe, the nearest in rotation of each other part (and of each `apart`-long
    stretch of time), if within `max_deg`."""
    ts = np.zeros(len(seg)) if key_ts is None else np.asarray(key_ts, np.float64)
    stretch = np.zeros(len(seg), np.int64) if key_ts is None or not np.isfinite(apart) else \
        np.floor((ts - ts[0]) / apart).astype(np.int64)
    group = seg.astype(np.int64) * (int(stretch.max(initial=0)) + 1) + stretch
    pairs = set()
    for g in np.unique(group):
        members = np.flatnonzero(group == g)
        for a in range(len(seg)):
            others = members[(seg[members] != seg[a]) | (np.abs(ts[members] - ts[a]) >= apart)]
            if not len(others):
                continue
            rel = np.einsum("ji,njk->nik", R_wc[a], R_wc[others])
            deg = np.degrees(np.linalg.norm(so3_log(rel), axis=1))
            j = int(np.argmin(deg))
            if deg[j] <= max_deg:
                pairs.add((min(a, int(others[j])), max(a, int(others[j]))))
    return sorted(pairs)


def mutual_matches(da: np.ndarray, db: np.ndarray, ratio: float = RATIO) -> np.ndarray:
    """(m,2) index pairs: each the other's nearest descriptor, passing the ratio test."""
    if len(da) < 2 or len(db) < 2:
        return np.zeros((0, 2), np.int64)
    d2 = (da * da).sum(1)[:, None] + (db * db).sum(1)[None, :] - 2.0 * da @ db.T
    two = np.argpartition(d2, 1, axis=1)[:, :2]
    rows = np.arange(len(da))
    first = np.where(d2[rows, two[:, 0]] <= d2[rows, two[:, 1]], two[:, 0], two[:, 1])
    second = np.where(first == two[:, 0], two[:, 1], two[:, 0])
    ok = d2[rows, first] < ratio**2 * d2[rows, second]
    ok &= np.argmin(d2, axis=0)[first] == rows
    ok &= np.abs(da).sum(1) > 0
    return np.column_stack([rows[ok], first[ok]])


def verified(xa: np.ndarray, xb: np.ndarray, R: np.ndarray, f: float, rng: np.random.Generator) -> np.ndarray:
    """Inlier mask of bearing matches xa -> xb (N,3) under the rotation R (cam_b from
    cam_a) and the translation direction two of them give that most agree with
    (refitted on those), within MAX_EPIPOLAR_PX."""
    if len(xa) < MIN_INLIERS:
        return np.zeros(len(xa), bool)
    pick = np.array([rng.choice(len(xa), 2, replace=False) for _ in range(TRIALS)])
    normals = np.cross(xa @ R.T, xb)
    t = np.cross(normals[pick[:, 0]], normals[pick[:, 1]])
    t /= np.maximum(np.linalg.norm(t, axis=1, keepdims=True), 1e-12)
    line = np.cross(t[:, None, :], (xa @ R.T)[None])  # (S,N,3)
    err = f * np.abs(np.einsum("snk,nk->sn", line, xb)) / np.maximum(np.linalg.norm(line[..., :2], axis=2), 1e-12)
    use = err[int(np.argmax((err < MAX_EPIPOLAR_PX).sum(1)))] < MAX_EPIPOLAR_PX
    if use.sum() < 2:
        return use
    return epipolar_px(xa, xb, R, translation_direction(xa[use], xb[use], R), f) < MAX_EPIPOLAR_PX


def same_tracks(features: list[Features], R_wc: np.ndarray, seg: np.ndarray, camera: list[float],
                key_ts: np.ndarray | None = None, apart: float = np.inf, seed: int = 0) -> dict[int, int]:
    """{track id: the id it is the same corner as} for the tracks of keyframes of
    different parts (or `apart` s apart: `candidate_pairs`) that verified matches join
    (each id maps to the smallest of its group)."""
    rng = np.random.default_rng(seed)
    parent: dict[int, int] = {}

    def root(x: int) -> int:
        while parent.get(x, x) != x:
            x = parent[x]
        return x

    for a, b in candidate_pairs(R_wc, seg, MAX_TURN_DEG, key_ts, apart):
        (pa, ia, da), (pb, ib, db) = features[a], features[b]
        m = mutual_matches(da, db)
        if len(m) < MIN_INLIERS:
            continue
        ok = verified(undistorted_bearings(pa[m[:, 0]], camera), undistorted_bearings(pb[m[:, 1]], camera),
                      R_wc[b].T @ R_wc[a], camera[0], rng)
        if ok.sum() < MIN_INLIERS:
            continue
        for u, v in zip(ia[m[ok, 0]].tolist(), ib[m[ok, 1]].tolist()):
            ru, rv = root(u), root(v)
            if ru != rv:
                parent[max(ru, rv)] = min(ru, rv)
    return {x: root(x) for x in parent}


def renamed(tracks: Tracks, same: dict[int, int]) -> Tracks:
    """`tracks` with each id replaced by the one it is the same corner as."""
    if not same:
        return tracks
    ids = [np.array([same.get(int(i), int(i)) for i in row], np.int64) for row in tracks.ids]
    return dataclasses.replace(tracks, ids=ids)
