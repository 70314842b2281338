"""The second try's metric scale: the gyro repair (`gyro_repair`), in parts when the
model it maps again splits, scaled by the visual-inertial bundle adjustment.

The scale of a repaired model comes from the visual-inertial bundle adjustment
(`viba_scale`) on the adjustment's points and observations, whatever `--solver`
says: its positions are tied by the IMU between keyframes, where the windowed solve
takes the visual positions as given. On the 23 repaired every-effect and plain-room
bench sessions (seeds 3-22) the windowed solve on the repaired keyframes was off by
up to -37.5% (6 refused, 17 accepted within 1.8%), the bundle adjustment by 1.83%
at most (median 0.35%). Its marginal std is too small here (0.12-0.65%, errors up
to 12 of it): what the visual part leaves in the path's shape is not in it, and
REPAIRED_REL_STD is added for it; where the IMU factors fit worse than on the right
models (REPAIRED_IMU_CHI2), the marginal std grows with them. What the bundle
adjustment refuses stays refused.

In parts: on every-effect bench seeds 10 and 40 (keyframes 0.1 s apart) the model
mapped on the gyro's rotations split where the view turns plain; its largest part held
47-48 of 101 keyframes (too few), the rest is a model GLOMAP drops. With keyframes
halfway on plain stretches (`tracks.TrackOptions.scarce_shared`) those two map whole;
seed 21 still splits (56 keyframes of its first 5.5 s, then 49 across a 0.4 s gap). Mapped alone, the keyframes
left out are a right model too, but the two parts share no keyframe: nothing in the
images ties them together. The IMU does. Both parts' rotations are the same gyro's
(one start), so only a scale and an offset lie between them: the windowed solve
gives each part its scale, the velocities at the gap place the later part, and one
visual-inertial bundle adjustment over all the keyframes, its IMU factors spanning
the gap, solves the rest. A part must register `min_registered` of its own
keyframes (seed 12's later part, 21 of 63, came out 16% off at +-1.5% alone).

The parts are first the clusters GLOMAP split the model into (`SfmModel.clusters`:
its last step prunes a model into clusters of strong covisibility and returns each
alone, in a frame of its own), each adjusted on the model's calibration
(`gyro_repair.cluster_part`); only when those register too few are the stretches left
out mapped again alone. Mapped again, seed 12's left-out 91 keyframes split into
clusters again (53, 28, 10); its clusters from the first mapping (70, 53, 28 of 151)
register 116 and are joined at two gaps of 0.3 s.

Then the images tie what they can (`_linked`): a track that crosses a gap, and the same
corners seen again from another part (`revisits`), merge points across parts
(`part_links`); parts that share MIN_LINKS points are one piece, and only a piece the
images do not tie keeps a join term. Seed 12's three parts came to share 63-72 points
each: -0.37% at +-0.68% (joined by the IMU alone, +0.30% at +-2.2%: refused)."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from packer.imu_gaps import find_gaps, gap_summary
from packer.slam.inertial.imu_align import AlignmentError, align_imu
from packer.slam.mapping.part_links import imu_joins, link_parts, segments, shared_points
from packer.slam.mapping.revisits import LOOP_APART_S, corner_features, renamed, same_tracks
from packer.slam.repair.gyro_repair import Repaired, RepairFailed, applies, cluster_part, gyro_repair
from packer.slam.scale.refusals import ModelRefused, estimate_only
from packer.slam.scale.scale import ScaleRefused
from packer.slam.scale.viba_scale import viba_scale
from shardship.errors import SessionError

if TYPE_CHECKING:
    from collections.abc import Callable

    from packer.session import Imu, Session
    from packer.slam.frontend.tracks import Tracks
    from packer.slam.inertial.imu_align import ImuAlignment
    from packer.slam.mapping import colmap
    from packer.slam.options import SlamOptions

REPAIRED_REL_STD = 0.006  # in the std (quadrature) of a repaired model's scale, for the shape the images leave in
# it: the errors of the 23 repaired bench sessions had an RMS of 0.6%, the bundle adjustment's own std 0.2%
REPAIRED_IMU_CHI2 = 0.1  # the IMU factors' chi^2/dof the visual-inertial bundle adjustment reaches on a repaired
# model that is right (bench seeds 3-22: median 0.1, 0.03-0.6); above it the images force the path off the IMU and
# the std grows with the root of the ratio (every-effect seed 23: chi^2 1.2, -2.9% at +-0.56% before)
REPAIRED_GYRO_BIAS_PRIOR = 0.002  # rad/s, the visual-inertial bundle adjustment's prior on the gyro bias the
# repair's adjustment measured from every keyframe's images (its default, 0.01, let every-effect seed 13's bias
# move from 0.001 to 0.007 rad/s off the truth while fitting the accelerometer: 1.07 deg RMS in rotation, 0.94 with
# it; seed 21 1.08 -> 0.74 deg and +1.2% -> +0.7%)
REPAIRED_OFFSET_SEARCH = 0.03  # s, how far the visual-inertial bundle adjustment searches the clock offset
# (`viba_timing`): the repair keeps its start's, 0-8 ms off on the every-effect bench (18-21 ms on seeds 5 and 62)
JOIN_OFFSET = 0.03  # m, how far the IMU alone may place a part across its gap, along the direction the scale is
# most sensitive to: the edge keyframes of both parts sat 1-1.7 cm off on seeds 10 and 40, and the joined scale of
# 40 moved as a ~4 cm offset would (-2.6%; its parts alone -0.4% and +1.7%)
JOIN_GAP = 0.4  # s, the gap the IMU bridged on seed 10 (+0.38%); across a longer one the later part is placed by the
# IMU alone for longer, and its offset grows at least as the velocity error times the gap: JOIN_OFFSET grows in
# proportion (every-effect seed 24 when pairs of 6 corners entered the view graph: two parts joined across 0.90 s,
# +2.5% at +-1.45% with 3 cm, refused at +-2.8% with 6.75 cm)
MIN_LINKS = 20  # points two parts both see (`part_links`) that make them one piece in the images, with no join term:
# where revisits tied the parts of every-effect seeds 12, 42, 21 and 24, each two shared 61-236 (and one track across a
# join, unmatched, gave 2-10)
MIN_PART = 20  # keyframes (2 s at the default step): a shorter stretch the repaired model left out is not mapped
# alone (too short for the gyro alignment and the windowed solve that start it)
OVERLAP = 6  # keyframes of the repaired model a stretch left out is mapped with, so the two may share some

Repair = tuple[np.ndarray, np.ndarray, np.ndarray, "colmap.SfmModel", dict[str, Any]]


def repaired_scale(session: Session, opts: SlamOptions, imu: Imu, model: colmap.SfmModel, refusal: ModelRefused,
                   stages: Callable[[str], None]) -> Repair:
    """(keyframes, registered ones, their poses, model, scale fields with "scale" and
    "keyframe_poses", the metric ones) of the gyro repair of a refused model
    (`gyro_repair`, in parts when it registers too few); the refusal stands, with what
    the repair found, when it does not apply, fails, or its model is refused too."""
    if not applies(opts, model):
        raise refusal
    gaps = find_gaps(imu.t)
    if gaps:  # the model is mapped on the gyro's rotations integrated from its first sample: unknown after a gap
        raise session.error(refusal.path, f"{refusal.reason}; not mapped again on the gyro's rotations: "
                            f"{gap_summary(gaps)}, so the gyro's turn across it is unknown")
    stages("scale (gyro repair)")
    try:
        rep = gyro_repair(session, opts, imu, model, refusal.alignment)
        if len(rep.key_pos) < max(3, opts.min_registered * len(rep.kpos)):
            rep = _in_parts(session, opts, imu, model, refusal.alignment, rep)
        else:
            rep = _closed(session, model, rep)
        scale, _metric, extra = viba_scale(session, opts, imu, session.timestamps[rep.key_pos], rep.key_T,
                                           rep.model, rep.model.names, shape_rel_std=REPAIRED_REL_STD,
                                           imu_chi2_ref=REPAIRED_IMU_CHI2, joins=rep.moves,
                                           join_offset=join_offsets(session.timestamps[rep.key_pos], rep.joins),
                                           gyro_bias_prior=REPAIRED_GYRO_BIAS_PRIOR,
                                           offset_search=REPAIRED_OFFSET_SEARCH)
    except (RepairFailed, SessionError) as e:
        why = e.reason if isinstance(e, SessionError) else str(e)
        raise session.error(refusal.path, f"{refusal.reason}; mapped again on the gyro's rotations, "
                            f"calibrated from the images: {why}") from None
    extra.update({"scale": scale, "gyro_repair": rep.fields})
    return rep.kpos, rep.key_pos, rep.key_T, rep.model, extra


def join_offsets(key_ts: np.ndarray, joins: tuple[int, ...]) -> tuple[float, ...]:
    """How far (m) the IMU may place each part across its join (`JOIN_OFFSET`, `JOIN_GAP`):
    the gap is the time from the last keyframe before the join to the first after it."""
    return tuple(JOIN_OFFSET * max(1.0, float(key_ts[j] - key_ts[j - 1]) / JOIN_GAP) for j in joins)


class PartialModel(ModelRefused):
    """A model refused for registering too few keyframes, with the gyro aligned on those it
    did (`found`: what `pipeline._reconstruct_keyframes` returns). The second try maps every
    keyframe again on the gyro's rotations, as for a model refused for its rotations: on a
    plain room with the glove in view, where the first model broke into parts of 48, 20
    and 18 of 101 keyframes (every-effect bench seed 24)."""

    def __init__(self, refusal: SessionError, alignment: ImuAlignment,
                 found: tuple[np.ndarray, colmap.SfmModel, np.ndarray, np.ndarray]):
        super().__init__(refusal.session, refusal.path, refusal.reason, alignment)
        self.found = found


def too_few_registered(refusal: SessionError, session: Session, opts: SlamOptions, imu: Imu | None,
                       found: tuple[np.ndarray, colmap.SfmModel, np.ndarray, np.ndarray]) -> SessionError:
    """`refusal` as a `PartialModel` the pipeline repairs when the repair applies and the
    gyro aligns on the keyframes the model did register; else `refusal` as it is."""
    _kpos, model, key_pos, key_T = found
    if imu is None or not applies(opts, model):
        return refusal
    try:
        al = align_imu(session.timestamps[key_pos], key_T[:, :3, :3], imu.t, imu.gyro, max_offset=opts.max_imu_offset)
    except AlignmentError:
        return refusal
    return PartialModel(refusal, al, found)


def left_out(placed: np.ndarray, n: int, min_part: int = MIN_PART, overlap: int = OVERLAP) -> list[tuple[int, int]]:
    """Keyframe ranges [a, b) to map alone: the stretch before the first of `placed`
    (sorted keyframe indices out of n) and the one after the last, each at least
    `min_part` long, with `overlap` of the placed ones."""
    if len(placed) == 0:
        return []
    first, last = int(placed[0]), int(placed[-1])
    ranges = []
    if first >= min_part:
        ranges.append((0, min(n, first + overlap)))
    if n - 1 - last >= min_part:
        ranges.append((max(0, last + 1 - overlap), n))
    return ranges


def _in_parts(session: Session, opts: SlamOptions, imu: Imu, model: colmap.SfmModel, al: ImuAlignment,
              rep: Repaired) -> Repaired:
    """`rep` with the clusters GLOMAP split off it (`cluster_part`), or else the stretches
    it left out mapped alone from the same start (`_left_out_parts`), joined to it
    (`join_parts`); RepairFailed when the whole registers too few."""
    def placed(parts: list[Repaired]) -> int:
        return len(np.unique(np.concatenate([p.key_pos for p in parts])))

    def enough(parts: list[Repaired]) -> bool:
        return len(parts) > 1 and placed(parts) >= opts.min_registered * len(rep.kpos)

    parts = _cluster_parts(session, opts, imu, rep)
    failed: list[str] = []
    if not enough(parts):
        more, failed = _left_out_parts(session, opts, imu, model, al, rep,
                                       np.concatenate([p.key_pos for p in parts]))
        parts += more
    n_placed = placed(parts)
    if not enough(parts):
        raise RepairFailed(f"it registered only {n_placed}/{len(rep.kpos)} keyframes"
                           + ("" if len(parts) == 1 else " with the rest mapped in parts")
                           + "".join(f"; {why}" for why in failed))
    scales = [_part_scale(session, opts, imu, p) for p in parts]
    key_pos, key_T, m, how, joins = join_parts(session.timestamps, [(p.key_pos, p.key_T, p.model) for p in parts],
                                               scales)
    assert model.tracks is not None
    m, shared, same, by_imu = _linked(session, model.tracks, key_pos, m, joins, rep.calibration[1])
    fields = {**rep.fields, "parts": [{"frames": [int(p.key_pos[0]), int(p.key_pos[-1])],
                                       "registered": len(p.key_pos), "scale_start": s, "joined": h,
                                       **({"cluster_of": p.fields["cluster_of"]} if "cluster_of" in p.fields
                                          else {})}
                                      for p, s, h in zip(parts, scales, how)],
              "shared_points": shared.tolist(), "revisited_tracks": same,
              **({"left_out_failed": failed} if failed else {})}  # stretches mapped alone that placed too few
    return Repaired(rep.kpos, key_pos, key_T, dataclasses.replace(m, camera=rep.model.camera), fields,
                    rep.calibration, tuple(j for j, _m in by_imu), tuple(m for _j, m in by_imu))


def _linked(session: Session, tracks: Tracks, key_pos: np.ndarray, m: colmap.SfmModel, joins: tuple[int, ...],
            camera: list[float]) -> tuple[colmap.SfmModel, np.ndarray, int, list[tuple[int, np.ndarray]]]:
    """(the joined model `m` with its parts tied where the images tie them: tracks across
    a join, the same corners seen again (`revisits`); the points each two parts share;
    how many tracks were found the same; the joins the IMU alone places, `part_links.imu_joins`)."""
    seg = segments(len(key_pos), joins)
    R_wc = np.swapaxes(m.R_cw, -1, -2)
    feats = corner_features([session.frame_paths[int(k)] for k in key_pos], tracks, key_pos,
                            m.rolling_shutter or 0.0, session.fps)
    same = same_tracks(feats, R_wc, seg, camera, key_ts=session.timestamps[key_pos], apart=LOOP_APART_S)
    m = link_parts(m, key_pos, renamed(tracks, same), joins)
    shared = shared_points(m.obs_image, m.obs_point, seg)
    return m, shared, len(same), imu_joins(shared, joins, seg, MIN_LINKS)


def _closed(session: Session, model: colmap.SfmModel, rep: Repaired) -> Repaired:
    """`rep` (one piece) with the corners it sees again later made one (`revisits`)."""
    assert model.tracks is not None
    m, _shared, same, _imu = _linked(session, model.tracks, rep.key_pos, rep.model, (), rep.calibration[1])
    return dataclasses.replace(rep, model=m, fields={**rep.fields, "revisited_tracks": same})


def _cluster_parts(session: Session, opts: SlamOptions, imu: Imu, rep: Repaired) -> list[Repaired]:
    """`rep` and each cluster of MIN_PART keyframes or more GLOMAP split off it that the
    held adjustment places (`cluster_part`) for `min_registered` of its keyframes:
    every-effect seed 12's second try was clusters of 70, 53 and 28 of 151 keyframes,
    the left-out 91 mapped alone split again (seed 62's cluster of 27 placed 3: dropped)."""
    parts = [rep]
    for cluster in rep.clusters:
        if len(cluster.names) < MIN_PART:
            continue
        try:
            part = cluster_part(session, imu, rep.kpos, rep.calibration, cluster)
        except RepairFailed:
            continue
        if len(part.key_pos) >= opts.min_registered * len(cluster.names):
            parts.append(part)
    return parts


def _left_out_parts(session: Session, opts: SlamOptions, imu: Imu, model: colmap.SfmModel, al: ImuAlignment,
                    rep: Repaired, placed: np.ndarray) -> tuple[list[Repaired], list[str]]:
    """(the stretches before and after the keyframes `placed` so far (`left_out`), each
    mapped alone on `rep`'s calibration; why each other stretch failed). One that fails
    does not stop the other: every-effect seed 22 placed keyframes 26-86 of 129, its
    first 1.9 s mapped alone failed, and its last 42 keyframes were never tried."""
    assert model.tracks is not None
    parts, failed = [], []
    for a, b in left_out(np.searchsorted(rep.kpos, np.unique(placed)), len(rep.kpos)):
        sub = dataclasses.replace(model, tracks=model.tracks.subset(a, b))
        head = (f"the {session.timestamps[rep.kpos[a]]:.1f}-{session.timestamps[rep.kpos[b - 1]]:.1f} s of video "
                "it left out, mapped alone,")
        try:
            part = gyro_repair(session, opts, imu, sub, al, held=rep.calibration)
        except RepairFailed as e:
            failed.append(f"{head} failed: {e}")
            continue
        if len(part.key_pos) < opts.min_registered * (b - a):
            failed.append(f"{head} registered only {len(part.key_pos)}/{b - a}")
            continue
        parts.append(part)
    return parts, failed


def _part_scale(session: Session, opts: SlamOptions, imu: Imu, part: Repaired) -> float:
    """The windowed solve's scale of one part (where the join starts from)."""
    try:
        s = estimate_only(session.timestamps[part.key_pos], part.key_T, imu, part.calibration[0],
                          opts.scale_options).scale
    except ScaleRefused as e:
        raise RepairFailed(f"the windowed solve found no scale for a part ({e})") from None
    if not s > 0:
        raise RepairFailed("the windowed solve found no positive scale for a part")
    return float(s)


Part = tuple[np.ndarray, np.ndarray, "colmap.SfmModel"]  # (registered frame positions, camera-to-world, model)


def join_parts(times: np.ndarray, parts: list[Part], scales: list[float]
               ) -> tuple[np.ndarray, np.ndarray, colmap.SfmModel, list[str], tuple[int, ...]]:
    """(frame positions, camera-to-world, model, how each part was placed, the index of each
    later part's first keyframe not placed before it) of parts in one
    world, in the units of the earliest part: each scaled by its scale over that one's,
    then moved onto the keyframes it shares with those placed before it, or, sharing
    none, across the gap by the mean of the velocities at its two ends. The rotations
    are left as they are (one gyro's); the points and observations go with their part,
    a shared keyframe keeping the first placement's pose."""
    order = np.argsort([p[0][0] for p in parts])
    ref = scales[order[0]]
    pos: list[int] = []
    T: list[np.ndarray] = []
    R_check: list[np.ndarray] = []
    names: list[str] = []
    pts, o_key, o_pt, o_xy = [], [], [], []
    how = [""] * len(parts)
    n_pts = 0
    starts = []
    for i in order:
        key_pos, key_T, m = parts[i]
        T_i = key_T.copy()
        T_i[:, :3, 3] *= scales[i] / ref
        if not pos:
            off, how[i] = np.zeros(3), "the first"
        else:
            off, how[i] = _offset(times, np.array(pos), np.array(T)[:, :3, 3], key_pos, T_i[:, :3, 3])
        T_i[:, :3, 3] += off
        new = ~np.isin(key_pos, pos)
        if pos and new.any():
            starts.append(int(key_pos[new][0]))
        seen = dict(zip(pos, range(len(pos))))
        index = np.array([seen.get(int(k), -1) for k in key_pos])
        index[new] = len(pos) + np.arange(int(new.sum()))
        pos += [int(k) for k in key_pos[new]]
        T += list(T_i[new])
        R_check += list((m.check_R_wc if m.check_R_wc is not None else T_i[:, :3, :3])[new])
        names += [m.names[j] for j in np.flatnonzero(new)]
        pts.append(m.points_xyz * (scales[i] / ref) + off)
        o_key.append(index[m.obs_image])
        o_pt.append(m.obs_point.astype(np.int64) + n_pts)
        o_xy.append(m.obs_xy)
        n_pts += len(m.points_xyz)
    sort = np.argsort(pos)
    rank = np.empty(len(pos), np.int64)
    rank[sort] = np.arange(len(pos))
    T_all, placed = np.array(T)[sort], np.array(pos)[sort]
    joined = dataclasses.replace(
        parts[order[0]][2], names=[names[j] for j in sort], R_cw=np.swapaxes(T_all[:, :3, :3], -1, -2),
        t_cw=-np.einsum("nji,nj->ni", T_all[:, :3, :3], T_all[:, :3, 3]),
        points_xyz=np.concatenate(pts), obs_image=rank[np.concatenate(o_key)].astype(np.int32),
        obs_point=np.concatenate(o_pt).astype(np.int32), obs_xy=np.concatenate(o_xy),
        check_R_wc=np.array(R_check)[sort], n_points=n_pts)
    return placed, T_all, joined, how, tuple(int(j) for j in np.searchsorted(placed, starts))


def _offset(times: np.ndarray, pos: np.ndarray, centres: np.ndarray, key_pos: np.ndarray, c: np.ndarray
            ) -> tuple[np.ndarray, str]:
    """(translation, how) putting a part's centres `c` with those placed (`pos`, `centres`)."""
    shared, a, b = np.intersect1d(pos, key_pos, return_indices=True)
    if len(shared):
        return (centres[a] - c[b]).mean(0), f"on {len(shared)} shared keyframes"
    before = np.flatnonzero(pos < key_pos[0])
    if len(before) < 2 or len(key_pos) < 2:
        raise RepairFailed("a part mapped alone neither shares keyframes with the rest nor follows it")
    j0, j1 = before[np.argsort(pos[before])[-2:]]
    t = times[[pos[j0], pos[j1], key_pos[0], key_pos[1]]]
    v_end = (centres[j1] - centres[j0]) / (t[1] - t[0])
    v_start = (c[1] - c[0]) / (t[3] - t[2])
    gap = float(t[2] - t[1])
    return centres[j1] + 0.5 * (v_end + v_start) * gap - c[0], f"across a {gap:.2f} s gap by the IMU"
