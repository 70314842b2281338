"""SfM of a long session in overlapping chunks, joined into one model.

Why: GLOMAP's memory and time grow faster than the number of keyframes (measured,
one process: 301 keyframes peak at 334 MB, 901 at 1,067 MB and 3.5 minutes of
mapping; a 5-minute session has ~3,000). A laptop or a shared login node runs out
first. Each chunk of at most `chunk` keyframes is reconstructed on its own, so the
peak is that of one chunk whatever the session's length, and consecutive chunks
are joined by a similarity on the keyframes they share: the rotation from the
shared cameras' orientations, the scale and translation from their centres. The
3-D points both chunks triangulated were tried first and were worse: on a
5-minute session their joins were off by 1.6% RMS in scale (worst 3.4%), the
cameras' by 0.40% (worst 0.78%, which is each chunk's own drift from its middle to
its edge). A join is refused, and the chunk starts a separate model (reported like
COLMAP's own smaller models, never glued on), when the shared cameras are too few,
barely move (the scale would be a guess), or still disagree after the fit. A
session of at most `chunk` keyframes is reconstructed whole, exactly as before."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from packer.slam.frontend.tracks import Tracks
from packer.slam.mapping.colmap import SfmError, SfmModel, SfmOptions, reconstruct
from packer.slam.rotations import rotation_mean


@dataclass(frozen=True)
class ChunkOptions:
    chunk: int = 400  # keyframes per chunk at most (0: never split); ~40 s at 10 keyframes/s, ~0.4 GB of mapping
    overlap: int = 40  # keyframes two consecutive chunks share (~4 s): what the join is fitted on
    min_shared: int = 10  # registered keyframes two chunks must share to be joined
    min_spread: float = 0.02  # ... whose centres must spread (RMS) over this share of the median scene depth
    max_centre_err: float = 0.01  # shared camera centres after the join: RMS distance / median scene depth
    max_angle_deg: float = 1.0  # ... and RMS rotation difference


def chunk_ranges(n: int, chunk: int, overlap: int) -> list[tuple[int, int]]:
    """[start, stop) keyframe ranges of about equal size, at most `chunk` long,
    consecutive ones sharing `overlap`; one range when n <= chunk (or chunk == 0)."""
    if chunk <= 0 or n <= chunk:
        return [(0, n)]
    if not 0 <= overlap < chunk // 2:
        raise ValueError(f"chunk overlap must be 0..{chunk // 2 - 1} keyframes, got {overlap}")
    m = math.ceil((n - overlap) / (chunk - overlap))
    step = (n - overlap) / m
    bounds = [round(i * step) for i in range(m + 1)]
    return [(bounds[i], min(n, bounds[i + 1] + overlap)) for i in range(m)]


def reconstruct_chunked(image_dir: Path, image_names: list[str], intrinsics: tuple[float, float, float, float] | None,
                        options: SfmOptions, stage: Callable[[str], None] | None = None,
                        tracks: Tracks | None = None, chunks: ChunkOptions | None = None) -> SfmModel:
    """`colmap.reconstruct` over `image_names` (keyframes in time order), in chunks
    when there are more than `chunks.chunk` of them (see the module docstring)."""
    copt = chunks or ChunkOptions()
    ranges = chunk_ranges(len(image_names), copt.chunk, copt.overlap)
    if len(ranges) == 1:
        return reconstruct(image_dir, image_names, intrinsics, options, stage=stage, tracks=tracks)
    note = stage or (lambda _s: None)
    groups: list[SfmModel] = []
    joins: list[dict[str, Any]] = []
    first_error: SfmError | None = None
    for i, (a, b) in enumerate(ranges):
        part = None if tracks is None else tracks.subset(a, b)
        label = f"part {i + 1}/{len(ranges)}, keyframes {a}-{b - 1}"

        def labelled(s: str, label: str = label) -> None:
            note(f"{s} ({label})")

        try:
            model = reconstruct(image_dir, image_names[a:b], intrinsics, options, stage=labelled, tracks=part)
        except SfmError as e:
            first_error = first_error or SfmError(f"{label}: {e}")
            joins.append({"part": i + 1, "joined": False, "why": str(e)})
            groups.append(_empty())
            continue
        fit = join(groups[-1], model, copt) if groups and groups[-1].names else None
        if fit is None:
            groups.append(model)
            joins.append({"part": i + 1, "joined": False, "why": "first part" if i == 0 else "no earlier model"})
        else:
            groups[-1], stats = fit
            joins.append({"part": i + 1, **stats})
            if not stats["joined"]:
                groups.append(model)
    groups = [g for g in groups if g.names]
    if not groups:
        assert first_error is not None
        raise first_error
    groups.sort(key=lambda g: len(g.names), reverse=True)
    best = groups[0]
    best.other_models = sorted(best.other_models + [len(g.names) for g in groups[1:]], reverse=True)
    best.n_images = len(image_names)
    best.chunks = joins
    return best


def _empty() -> SfmModel:
    return SfmModel(names=[], R_cw=np.zeros((0, 3, 3)), t_cw=np.zeros((0, 3)), reprojection_error=0.0, n_points=0,
                    median_depth=float("nan"))


def _rows(model: SfmModel, names: set[str]) -> np.ndarray:
    """Indices into model.names of the images named in `names`."""
    return np.array([i for i, n in enumerate(model.names) if n in names], dtype=np.int64)


def camera_similarity(ca: np.ndarray, cb: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """(s, R, t) with ca ~ s R cb + t for two sets of the same cameras' camera-to-world
    poses (N,4,4): R the chordal mean of the orientations' differences (the centres
    of a short, straight stretch leave a rotation about it open), then s and t by
    least squares on the centres with R held."""
    R = rotation_mean(ca[:, :3, :3] @ np.swapaxes(cb[:, :3, :3], 1, 2))
    pa, pb = ca[:, :3, 3], cb[:, :3, 3] @ R.T
    da, db = pa - pa.mean(0), pb - pb.mean(0)
    s = float(np.sum(da * db) / max(float(np.sum(db * db)), 1e-300))
    return s, R, pa.mean(0) - s * pb.mean(0)


def join(a: SfmModel, b: SfmModel, copt: ChunkOptions) -> tuple[SfmModel, dict[str, Any]]:
    """Model b brought into a's frame and merged, when the shared keyframes allow
    it: (merged, stats) with stats["joined"] True; else (a unchanged, stats saying why)."""
    shared = sorted(set(a.names) & set(b.names))
    stats: dict[str, Any] = {"joined": False, "shared_keyframes": len(shared)}
    if len(shared) < copt.min_shared:
        stats["why"] = f"{len(shared)} shared registered keyframes (need {copt.min_shared})"
        return a, stats
    ra, rb = {n: i for i, n in enumerate(a.names)}, {n: i for i, n in enumerate(b.names)}
    ca = a.camera_to_world()[[ra[n] for n in shared]]
    cb = b.camera_to_world()[[rb[n] for n in shared]]
    depth = a.median_depth if a.median_depth > 0 else 1.0
    spread = float(np.sqrt(np.mean(np.sum((ca[:, :3, 3] - ca[:, :3, 3].mean(0)) ** 2, axis=1)))) / depth
    s, R, t = camera_similarity(ca, cb)
    Tb = _transform(b, s, R, t)
    cb = Tb.camera_to_world()[[rb[n] for n in shared]]
    centre_err = float(np.sqrt(np.mean(np.sum((ca[:, :3, 3] - cb[:, :3, 3]) ** 2, axis=1)))) / depth
    cos = (np.einsum("nij,nij->n", ca[:, :3, :3], cb[:, :3, :3]) - 1.0) / 2.0
    angle = float(np.degrees(np.sqrt(np.mean(np.arccos(np.clip(cos, -1.0, 1.0)) ** 2))))
    stats.update({"scale": s, "spread_over_depth": spread, "centre_err_over_depth": centre_err,
                  "angle_deg": angle})
    if spread < copt.min_spread:
        stats["why"] = (f"the shared cameras barely move ({spread:.1%} of the scene depth, need "
                        f"{copt.min_spread:.0%}): the scale between the parts is not determined")
    elif centre_err > copt.max_centre_err or angle > copt.max_angle_deg:
        stats["why"] = (f"shared cameras disagree after the join ({centre_err:.1%} of the scene depth, "
                        f"{angle:.2f} deg)")
    else:
        stats["joined"] = True
        return _merge(a, Tb, shared), stats
    return a, stats


def _transform(m: SfmModel, s: float, R: np.ndarray, t: np.ndarray) -> SfmModel:
    """The model in the frame x' = s R x + t (cameras: R_cw' = R_cw R^T, t_cw' = s t_cw - R_cw' t)."""
    R_cw = m.R_cw @ R.T
    t_cw = s * m.t_cw - np.einsum("nij,j->ni", R_cw, t)
    return replace(m, R_cw=R_cw, t_cw=t_cw, points_xyz=m.points_xyz @ R.T * s + t, median_depth=s * m.median_depth)


def _merge(a: SfmModel, b: SfmModel, shared: list[str]) -> SfmModel:
    """One model from two in one frame: the first half of the shared keyframes from
    a, the second from b (a chunk's edge is its least constrained part); b's points
    appended, each image's observations from the model that keeps it."""
    from_b = set(b.names) - set(shared[: len(shared) // 2])
    names = sorted((set(a.names) - from_b) | from_b)
    row = {n: i for i, n in enumerate(names)}
    R_cw = np.empty((len(names), 3, 3))
    t_cw = np.empty((len(names), 3))
    obs_i, obs_p, obs_xy = [], [], []
    for m, keep, offset in ((a, set(a.names) - from_b, 0), (b, from_b, len(a.points_xyz))):
        for j, n in enumerate(m.names):
            if n in keep:
                R_cw[row[n]], t_cw[row[n]] = m.R_cw[j], m.t_cw[j]
        ok = np.isin(m.obs_image, _rows(m, keep))
        obs_i.append(np.array([row[m.names[k]] for k in m.obs_image[ok]], dtype=np.int32))
        obs_p.append(m.obs_point[ok] + offset)
        obs_xy.append(m.obs_xy[ok])
    na, nb = len(a.obs_image), len(b.obs_image)
    return replace(
        a, names=names, R_cw=R_cw, t_cw=t_cw, n_points=a.n_points + b.n_points,
        reprojection_error=(a.reprojection_error * na + b.reprojection_error * nb) / max(1, na + nb),
        median_depth=float(np.median([a.median_depth, b.median_depth])) if a.median_depth > 0 else b.median_depth,
        other_models=a.other_models + b.other_models, median_features=max(a.median_features, b.median_features),
        camera=[float(v) for v in np.median([a.camera, b.camera], axis=0)] if a.camera and b.camera else a.camera,
        points_xyz=np.concatenate([a.points_xyz, b.points_xyz]), obs_image=np.concatenate(obs_i),
        obs_point=np.concatenate(obs_p).astype(np.int32), obs_xy=np.concatenate(obs_xy),
    )
