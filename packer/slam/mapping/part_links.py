"""Visual links across the joins of a model mapped in parts (`packer.slam.repair.repaired`).

GLOMAP prunes a model into clusters of strong covisibility; a corner the KLT tracker
followed across the boundary still lies in both, as two points (one per part) or as
observations one part never triangulated. Tied back together by their track id,
they give the visual-inertial bundle adjustment what the IMU alone gave before: how
the later part sits against the earlier one. Pure numpy; the tracks are the ones the
model was mapped from (rolling shutter taken out), so an observation's pixel is a
track's pixel to the float32 digit."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from packer.slam.frontend.tracks import Tracks
    from packer.slam.mapping.colmap import SfmModel

QUANT = 64.0  # pixel positions compared on a 1/64 px grid (they are equal to the float32 digit when they match)


def _keys(xy: np.ndarray) -> np.ndarray:
    q = np.round(np.asarray(xy, np.float64) * QUANT).astype(np.int64)
    return q[:, 0] * (1 << 24) + q[:, 1]


def observation_tracks(obs_image: np.ndarray, obs_xy: np.ndarray, key_pos: np.ndarray, tracks: Tracks
                       ) -> np.ndarray:
    """Per observation, the id of the track it is a pixel of (-1 where none is):
    `obs_image` indexes `key_pos` (frame positions, as `tracks.keyframes`)."""
    out = np.full(len(obs_image), -1, np.int64)
    where = tracks.index()
    for i, k in enumerate(key_pos):
        ti = where.get(int(k))
        rows = np.flatnonzero(obs_image == i)
        if ti is None or not len(rows) or not len(tracks.points[ti]):
            continue
        tk = _keys(tracks.points[ti])
        order = np.argsort(tk)
        ok = _keys(obs_xy[rows])
        j = np.clip(np.searchsorted(tk[order], ok), 0, len(tk) - 1)
        hit = tk[order][j] == ok
        out[rows[hit]] = tracks.ids[ti][order][j[hit]]
    return out


def point_tracks(obs_point: np.ndarray, obs_track: np.ndarray, n_points: int) -> np.ndarray:
    """Per point, the one track all its observations belong to, or -1 (none, or several)."""
    lo = np.full(n_points, np.iinfo(np.int64).max)
    hi = np.full(n_points, -2, np.int64)
    np.minimum.at(lo, obs_point, obs_track)
    np.maximum.at(hi, obs_point, obs_track)
    return np.where((lo == hi) & (lo >= 0), hi, -1)


def segments(n_images: int, joins: tuple[int, ...]) -> np.ndarray:
    """Per image (time order), which part it lies in: 0 before the first join, 1 after it, ..."""
    return np.searchsorted(np.asarray(joins, np.int64), np.arange(n_images), side="right")


def link_parts(model: SfmModel, key_pos: np.ndarray, tracks: Tracks, joins: tuple[int, ...]) -> SfmModel:
    """The model with the points of one track merged across parts and the track's
    pixels in the other parts' keyframes added. `model`: images in time order
    (`key_pos`), `joins` the index of each later part's first image; `tracks` with
    the ids of one corner made one (`revisits.renamed`)."""
    if not len(model.obs_image):
        return model
    obs_track = observation_tracks(model.obs_image, model.obs_xy, key_pos, tracks)
    p_track = point_tracks(model.obs_point, obs_track, len(model.points_xyz))
    # one point per track: the first one of it keeps its position, the others' observations move to it
    canon = np.arange(len(p_track))
    has = np.flatnonzero(p_track >= 0)
    _u, first, inv = np.unique(p_track[has], return_index=True, return_inverse=True)
    canon[has] = has[first][inv]
    seg = segments(len(key_pos), joins)
    o_img, o_pt, o_xy = [model.obs_image.astype(np.int64)], [canon[model.obs_point]], [model.obs_xy]
    # the track's pixels in the keyframes of parts the point is not seen in
    point_of_track = dict(zip(p_track[has][first].tolist(), has[first].tolist()))
    seen_in = {(int(p), int(s)) for p, s in zip(o_pt[0], seg[o_img[0]])}
    where = tracks.index()
    for i, k in enumerate(key_pos):
        ti = where.get(int(k))
        if ti is None:
            continue
        for j, tid in enumerate(tracks.ids[ti].tolist()):
            p = point_of_track.get(tid)
            if p is not None and (p, int(seg[i])) not in seen_in:
                o_img.append(np.array([i]))
                o_pt.append(np.array([p]))
                o_xy.append(tracks.points[ti][j:j + 1])
    img, pt, xy = np.concatenate(o_img), np.concatenate(o_pt), np.concatenate(o_xy).astype(np.float32)
    _k, once = np.unique(img * (len(canon) + 1) + pt, return_index=True)  # one observation per image and point
    once = np.sort(once)
    img, pt, xy = img[once], pt[once], xy[once]
    used, new_pt = np.unique(pt, return_inverse=True)
    return dataclasses.replace(model, points_xyz=model.points_xyz[used], obs_image=img.astype(np.int32),
                               obs_point=new_pt.astype(np.int32), obs_xy=xy.reshape(-1, 2))


def shared_points(obs_image: np.ndarray, obs_point: np.ndarray, seg: np.ndarray) -> np.ndarray:
    """(parts, parts) how many points each two parts both see, among those seen three
    times or more in all (what the bundle adjustment keeps: `VibaOptions.min_track`)."""
    n_seg = int(seg.max(initial=0)) + 1
    n = int(obs_point.max(initial=-1)) + 1
    seen = np.zeros((n, n_seg), bool)
    seen[obs_point, seg[obs_image]] = True
    seen &= (np.bincount(obs_point, minlength=n) >= 3)[:, None]
    s = seen.astype(np.int64)
    return s.T @ s


def imu_joins(shared: np.ndarray, joins: tuple[int, ...], seg: np.ndarray, min_links: int
              ) -> list[tuple[int, np.ndarray]]:
    """(join's first image, which images an error in its placement moves) for each join
    that the IMU alone places. Parts that see `min_links` points in common are one
    piece; a piece whose first part follows another piece is placed across that join
    by the IMU, moving every later part of the piece with it, on top of the error of
    the part it follows (a chain of such joins adds up)."""
    n_seg = len(joins) + 1
    piece = list(range(n_seg))

    def find(x: int) -> int:
        while piece[x] != x:
            x = piece[x]
        return x

    for p in range(n_seg):
        for q in range(p + 1, n_seg):
            if shared[p, q] >= min_links:
                piece[max(find(p), find(q))] = min(find(p), find(q))
    error: dict[int, frozenset[int]] = {find(0): frozenset()}  # piece -> the joins whose errors it carries
    carries = [frozenset[int]()] * n_seg
    for p in range(n_seg):
        r = find(p)
        if r not in error:
            error[r] = carries[p - 1] | {p - 1}
        carries[p] = error[r]
    used = sorted(set().union(*carries))
    return [(joins[j], np.isin(seg, [p for p in range(n_seg) if j in carries[p]])) for j in used]
