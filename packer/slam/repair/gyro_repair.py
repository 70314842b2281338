"""A second try for a model refused for itself: map again on the gyro's rotations, then
calibrate the gyro from the images (`gyro_ba`).

Why: on a plain room with the glove over a quarter of the view, GLOMAP puts a few
keyframes 5-30 deg off and the model is refused (its rotations disagree with the
gyro: bench/results/slam_hard.csv, 18 of 20 every-effect sessions); on a plain room
alone its rotations drift a few % and the scale is refused as distorted (the std's
gyro term, `scale.ModelDistorted`), or its positions as too noisy or stretched
(`scale.ShapeRefused`) although the IMU saw enough motion. Most of such a model is
right, so the gyro can be aligned on it, or on a 3 s window SfM, or on the KLT model
SIFT replaced (offset, camera-IMU rotation, bias; `_start` picks the one that fits
the tracks best); where the repair from that start fails its checks, once more from the
gyro aligned on the tracks' own rotation chain (`rotation_chain`: every-effect seed 16,
whose only start was 100 deg off). Then:

1. the tracks off the gyro's geometry go (`gyro_prior.drop_off_gyro`: the glove's
   corners, slid tracks), and GLOMAP maps again with the gyro's relative rotations as
   its two-view rotations, held through its bundle adjustments (`hold_rotations`);
2. the gyro-calibrated bundle adjustment (`gyro_ba`) refines centres, points, the
   camera-IMU rotation, the gyro bias, focal length and k1, every rotation following
   the gyro; keyframes it places too loosely are left out;
3. the rotations each keyframe's own images want, with centres and points held, are
   returned for the gyro check (`SfmModel.check_R_wc`): the repaired model passes
   only if the images do not pull away from the rotations forced on them.

Its scale: `packer.slam.repair.repaired`.
Not for models mapped in parts or without KLT tracks (`--frontend sift`)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from packer.slam.inertial.gyro_ba import (
    Gyro,
    GyroBaOptions,
    GyroBaResult,
    Observations,
    free_rotations,
    gyro_bundle_adjust,
)
from packer.slam.inertial.gyro_prior import drop_off_gyro, gyro_fit_px, gyro_rotations
from packer.slam.inertial.imu_align import AlignmentError, align_imu
from packer.slam.mapping import colmap
from packer.slam.mapping.rotation_chain import chain_rotations
from packer.slam.rotations import rotation_mean, so3_log

if TYPE_CHECKING:
    from packer.session import Imu, Session
    from packer.slam.frontend.tracks import Tracks
    from packer.slam.inertial.imu_align import ImuAlignment
    from packer.slam.options import SlamOptions

MIN_OBSERVATIONS = 30  # a keyframe seeing fewer points (or under a fifth of the median) is left out: its centre
# would rest on a handful of short tracks (every-effect seed 7: 7 observations, 0.29 m off, the scale refused)
MAX_CENTRE_STD = 5.0  # a keyframe whose centre's marginal std is over this times the median is left out: every-
# effect seed 4's first three keyframes, 25x the median, sat 0.16-0.20 m off and made its scale refused as noisy
MAX_FOCAL_CHANGE = 0.15  # three of GyroBaOptions.focal_prior: further from calib.txt, the adjustment fitted a wrong
# model by bending the camera (every-effect seeds whose start was 18-180 deg off: 256-756 px for a true 412)
CHAIN_MIN_DEG = 5.0  # the tracks' rotation chain (`rotation_chain`) is tried when the chosen start failed its
# checks and the chain's camera-IMU rotation differs from it by more than this (else it would fail the same way)
MIN_INLIERS = 0.8  # share of the observations within GyroBaOptions.outlier_px after the first pass; below it the
# gyro's rotations did not fit the images (a start too far off, or a model wrong beyond its rotations)


HELD = GyroBaOptions(rotation_prior=1e-4, bias_prior=1e-5, focal_prior=1e-4, k1_prior=1e-4)  # a calibration kept
Calibration = tuple["ImuAlignment", list[float]]


class RepairFailed(ValueError):
    """The repair could not run or its result does not fit; str() says why in a few words."""


@dataclass
class Repaired:
    kpos: np.ndarray  # the keyframes mapped (the KLT tracks' keyframes the IMU covers)
    key_pos: np.ndarray  # registered keyframes (positions into the frame list), time order
    key_T: np.ndarray  # (M,4,4) camera-to-world in the gyro's world, SfM units
    model: colmap.SfmModel  # the re-mapped model: camera, reprojection error, check_R_wc from the adjustment
    fields: dict[str, Any]  # metadata.json's "gyro_repair"
    calibration: Calibration  # the adjustment's gyro calibration (offset, R_ic, bias) and camera [f, cx, cy, k1]
    joins: tuple[int, ...] = ()  # mapped in parts (`packer.slam.repair.repaired`): where each later part the IMU alone
    # places begins (parts the images tie are one piece: `part_links.imu_joins`)
    moves: tuple[np.ndarray, ...] = ()  # per join, the keyframes its placement moves
    clusters: list[colmap.SfmModel] = dataclasses.field(default_factory=list)  # the other clusters GLOMAP split off
    # the model (`SfmModel.clusters`), on the same rotations: `repaired` adjusts them as parts (`cluster_part`)


def applies(opts: SlamOptions, model: colmap.SfmModel) -> bool:
    """Whether a refused model can be repaired: KLT tracks of one part, the window solve's checks, the global
    mapper."""
    return (model.tracks is not None and not model.chunks and opts.solver in ("auto", "window")
            and opts.mapper == "global" and opts.scale == "imu")


def gyro_repair(session: Session, opts: SlamOptions, imu: Imu, model: colmap.SfmModel, al: ImuAlignment,
                held: Calibration | None = None) -> Repaired:
    """The repaired keyframes of a refused model (module docstring), or RepairFailed.
    The KLT tracks are mapped again even when the SIFT front-end made the refused
    model (it registered more than KLT's own): its alignment is the start. `held`:
    a calibration to keep instead of `_start`'s choice and the adjustment's own (a
    part of a model mapped in parts keeps the whole's, so the parts share one world
    and one camera: with their own, every-effect seed 10's joined keyframes were
    1.9 deg RMS off in rotation and 1.9% in scale, held 1.1 deg and 0.3%)."""
    assert model.tracks is not None
    kpos = np.asarray(model.tracks.keyframes, dtype=np.int64)
    ts = session.timestamps[kpos]
    cam0 = [float(v) for v in (session.intrinsics or (model.camera[0], 0, model.camera[1], model.camera[2]))]
    k1 = model.camera[3] if len(model.camera) > 3 else 0.0
    if held is None:
        start, starts = _start(model, imu, ts, [cam0[0], cam0[2], cam0[3], k1],
                               {"the refused model": al, **model.gyro_starts})
    else:
        start, starts = held[0], {"chosen": "the whole model's calibration, held"}
    try:
        n, m, k_of_image, res = _map_and_adjust(session, opts, imu, model.tracks, ts, start, cam0,
                                                None if held is None else held[1])
        _check(res, cam0[0], start)
    except RepairFailed as first:
        alt = None if held is not None else _chain_start(model.tracks, imu, ts, [cam0[0], cam0[2], cam0[3], k1])
        if alt is None or _deg(alt.R_ic, start.R_ic) < CHAIN_MIN_DEG:
            raise
        start, starts = alt, {**starts, "chosen": f"the rotation chain (from {starts['chosen']}: {first})"}
        try:
            n, m, k_of_image, res = _map_and_adjust(session, opts, imu, model.tracks, ts, start, cam0)
            _check(res, cam0[0], start)
        except RepairFailed as second:
            raise RepairFailed(f"{first}; from the tracks' rotation chain: {second}") from None
    rep = _repaired(session, kpos[:n], m, k_of_image, res, start, {
        "refused_gyro_disagreement": al.residual / max(al.rotation_rms, 1e-9),
        "start": starts,
        "R_imu_cam_change_deg": _deg(res.R_ic, al.R_ic),  # from the refused model's alignment
        "gyro_bias_change": (res.gyro_bias - al.gyro_bias).tolist(),
    })
    return dataclasses.replace(rep, clusters=m.clusters)


def _repaired(session: Session, kpos: np.ndarray, m: colmap.SfmModel, k_of_image: np.ndarray, res: GyroBaResult,
              start: ImuAlignment, fields: dict[str, Any]) -> Repaired:
    """The keyframes the adjustment `res` placed well enough (MAX_CENTRE_STD), as a Repaired."""
    placed = res.centre_std <= MAX_CENTRE_STD * float(np.median(res.centre_std))
    k_of_image = k_of_image[placed]
    key_T = np.tile(np.eye(4), (int(placed.sum()), 1, 1))
    key_T[:, :3, :3], key_T[:, :3, 3] = res.R_wc[placed], res.centres[placed]
    m = _adjusted_model(m, res, placed, key_T, _rgb_names(session, kpos[k_of_image]))
    fields = {
        **fields,
        "camera": list(res.camera),
        "inliers": res.inliers,
        "reprojection_rms_px": res.rms_px,
        "iterations": res.iterations,
        "left_out_keyframes": int((~placed).sum()),  # placed too loosely (MAX_CENTRE_STD)
    }
    calibration = (dataclasses.replace(start, R_ic=res.R_ic, gyro_bias=res.gyro_bias), list(res.camera))
    return Repaired(kpos, kpos[k_of_image], key_T, m, fields, calibration)


def cluster_part(session: Session, imu: Imu, kpos: np.ndarray, calibration: Calibration,
                 cluster: colmap.SfmModel) -> Repaired:
    """A cluster GLOMAP split off a model mapped on the gyro's rotations (`Repaired.clusters`),
    adjusted on that model's calibration, held: a part `repaired` joins to it. Its own
    frame and scale (the pruning re-normalises each) are the adjustment's start only."""
    al, camera = calibration
    ts = session.timestamps[kpos]
    gyro_R = gyro_rotations(imu, al, ts)
    k_sorted, res = _adjust(imu, al, ts, cluster, _rgb_names(session, kpos), gyro_R, camera, HELD)
    _check(res, camera[0], al)
    return _repaired(session, kpos, cluster, k_sorted, res, al, {"cluster_of": len(cluster.names)})


def _adjusted_model(m: colmap.SfmModel, res: GyroBaResult, placed: np.ndarray, key_T: np.ndarray,
                    names: list[str]) -> colmap.SfmModel:
    """The model as the adjustment left it, keyframes `placed` only, in time order: its
    poses, points, observations and camera (what the visual-inertial bundle adjustment
    starts from; GLOMAP's points are in another frame and numbering), and the rotations
    those keyframes' images want, for the gyro check."""
    new = np.cumsum(placed) - 1
    o = res.obs.subset(placed[res.obs.cam])
    R_cw = np.swapaxes(key_T[:, :3, :3], -1, -2)
    return dataclasses.replace(
        m, names=names, R_cw=R_cw, t_cw=-np.einsum("nij,nj->ni", R_cw, key_T[:, :3, 3]), points_xyz=res.points,
        obs_image=new[o.cam].astype(np.int32), obs_point=o.point.astype(np.int32), obs_xy=o.xy.astype(np.float32),
        camera=list(res.camera), reprojection_error=res.rms_px, check_R_wc=free_rotations(res)[placed], clusters=[])


def _rgb_names(session: Session, kpos: np.ndarray) -> list[str]:
    """The keyframes' image names as the SfM model has them (relative to rgb/)."""
    return [str(session.frame_paths[int(k)].relative_to(session.path / "rgb")) for k in kpos]


def _map_and_adjust(session: Session, opts: SlamOptions, imu: Imu, tracks: Tracks, ts: np.ndarray, al: ImuAlignment,
                    cam0: list[float], camera: list[float] | None = None
                    ) -> tuple[int, colmap.SfmModel, np.ndarray, GyroBaResult]:
    """(keyframes the IMU covers, the model mapped on the gyro's rotations, its images' keyframe
    indices in time order (the well-seen ones), the adjustment) for one calibration; with
    `camera` given, that camera and `al`'s R_ic and bias are held (`HELD`)."""
    n = int(np.sum(ts + al.offset < imu.t[-1] - 0.01))  # keyframes the IMU covers (its last ~0.25 s may be missing)
    if n < 3:
        raise RepairFailed("the IMU covers too few keyframes")
    rel = _rgb_names(session, np.asarray(tracks.keyframes[:n]))
    held = dataclasses.replace(tracks.subset(0, n), rotations=gyro_rotations(imu, al, ts[:n]))
    held = drop_off_gyro(held, [cam0[0], cam0[2], cam0[3], 0.0])
    sfm = dataclasses.replace(opts.sfm_options(), hold_rotations=True)
    try:
        m = colmap.reconstruct(session.path / "rgb", rel, session.intrinsics, sfm, tracks=held)
    except colmap.SfmError as e:
        raise RepairFailed(f"mapping on the gyro's rotations failed ({e})") from None
    assert held.rotations is not None
    k_sorted, res = _adjust(imu, al, ts, m, rel, held.rotations, list(m.camera) if camera is None else camera,
                            GyroBaOptions() if camera is None else HELD)
    return n, m, k_sorted, res


def _adjust(imu: Imu, al: ImuAlignment, ts: np.ndarray, m: colmap.SfmModel, rel: list[str], gyro_R: np.ndarray,
            camera: list[float], opt: GyroBaOptions) -> tuple[np.ndarray, GyroBaResult]:
    """(the well-seen keyframes (indices into `rel`) in time order, the gyro-calibrated
    adjustment of them) of a model mapped on the gyro's rotations `gyro_R` (`_in_gyro_world`)."""
    k_time, c_m, points, obs = _in_gyro_world(m, rel, gyro_R)
    seen, obs = well_seen(obs, len(k_time))
    if len(seen) < 3:  # a fast hand over a plain room with the glove in view: seen once, as an IndexError
        raise RepairFailed(f"only {len(seen)} of the {len(k_time)} keyframes it mapped see {MIN_OBSERVATIONS} "
                           "points or more")
    c_m, k_sorted = c_m[seen], k_time[seen]
    gyro = Gyro(imu.t - al.offset, imu.gyro, ts[k_sorted])
    return k_sorted, gyro_bundle_adjust(gyro, obs, c_m - c_m[0], points - c_m[0], camera, al.R_ic, al.gyro_bias,
                                        opt)


def _in_gyro_world(m: colmap.SfmModel, rel: list[str], gyro_R: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, Observations]:
    """(its keyframes (indices into `rel`) in time order, their centres and the points
    turned into the gyro's world, the observations by time rank) of a model whose
    rotations are the gyro's `gyro_R` (one per name in `rel`) up to one turn of the world."""
    where = {name: i for i, name in enumerate(rel)}
    k_of_image = np.array([where[name] for name in m.names])  # SfM image -> keyframe (index into rel)
    order = np.argsort(k_of_image)
    R_m = np.swapaxes(m.R_cw, -1, -2)[order]  # camera-to-world, time order
    c_m = -np.einsum("nij,nj->ni", R_m, m.t_cw[order])
    G = rotation_mean(R_m @ np.swapaxes(gyro_R[k_of_image[order]], -1, -2))  # model world <- gyro world
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    obs = Observations(rank[m.obs_image], m.obs_point.astype(np.int64), m.obs_xy.astype(np.float64))
    return k_of_image[order], c_m @ G, m.points_xyz @ G, obs


def _check(res: GyroBaResult, f_calib: float, al: ImuAlignment) -> None:
    """RepairFailed unless the adjustment converged to a plausible camera that fits the observations."""
    if not res.converged:
        raise RepairFailed(f"the gyro-calibrated bundle adjustment did not converge in {res.iterations} iterations "
                           f"(the camera-IMU rotation moved {_deg(res.R_ic, al.R_ic):.1f} deg)")
    if abs(res.camera[0] / f_calib - 1) > MAX_FOCAL_CHANGE:
        raise RepairFailed(f"its focal length went to {res.camera[0]:.0f} px, calib.txt says {f_calib:.0f}")
    if res.inliers < MIN_INLIERS:
        raise RepairFailed(f"the gyro's rotations fit only {res.inliers:.0%} of the observations "
                           f"(need {MIN_INLIERS:.0%})")


def _start(model: colmap.SfmModel, imu: Imu, ts: np.ndarray, camera: list[float],
           candidates: dict[str, ImuAlignment | None]) -> tuple[ImuAlignment, dict[str, Any]]:
    """(the gyro calibration to start from, what was compared): each candidate, with its
    bias and with none (a phone's rotation rate comes bias-corrected), scored by how well
    its rotations fit the tracks (`gyro_fit_px`). The refused model's own alignment is
    0.2-180 deg off on every-effect sessions, a 3 s window's 0.7-6.6 deg; where SIFT
    replaced a KLT model that registered 52-64%, the KLT model's was 0.9-2.2 deg off
    against 17-109 deg for the SIFT model's (seeds 5 and 10)."""
    assert model.tracks is not None
    scores: dict[str, float] = {}
    best: tuple[float, ImuAlignment] | None = None
    for name, cand in candidates.items():
        if cand is None:
            continue
        for label, al in ((name, cand), (f"{name}, no bias", dataclasses.replace(cand, gyro_bias=np.zeros(3)))):
            n = int(np.sum(ts + al.offset < imu.t[-1] - 0.01))
            if n < 3:
                continue
            tracks = dataclasses.replace(model.tracks.subset(0, n), rotations=gyro_rotations(imu, al, ts[:n]))
            scores[label] = round(gyro_fit_px(tracks, camera), 4)
            if best is None or scores[label] < best[0]:
                best = (scores[label], al)
    if best is None:
        raise RepairFailed("the IMU covers too few keyframes")
    return best[1], {"epipolar_px": scores, "chosen": min(scores, key=lambda k: scores[k])}


def _chain_start(tracks: Tracks, imu: Imu, ts: np.ndarray, camera: list[float]) -> ImuAlignment | None:
    """The gyro aligned on the tracks' rotation chain (`rotation_chain`), or None."""
    idx, R = chain_rotations(tracks, camera)
    try:
        return align_imu(ts[idx], R, imu.t, imu.gyro)
    except AlignmentError:
        return None


def _deg(A: np.ndarray, B: np.ndarray) -> float:
    return float(np.degrees(np.linalg.norm(so3_log((A @ B.T)[None])[0])))


def well_seen(obs: Observations, n_images: int, min_obs: int = MIN_OBSERVATIONS) -> tuple[np.ndarray, Observations]:
    """(the images kept, their observations renumbered): images seeing at least
    `min_obs` points and a fifth of the median, then points still seen twice."""
    count = np.bincount(obs.cam, minlength=n_images)
    keep = count >= max(min_obs, 0.2 * float(np.median(count)))
    new = np.cumsum(keep) - 1
    o = obs.subset(keep[obs.cam])
    o = Observations(new[o.cam], o.point, o.xy)
    twice = np.bincount(o.point)[o.point] >= 2
    return np.flatnonzero(keep), o.subset(twice)


def klt_alignment(found: tuple[np.ndarray, colmap.SfmModel, np.ndarray, np.ndarray], session: Session,
                  imu: Imu | None) -> dict[str, Any]:
    """{"the KLT model": the gyro aligned on it} when it can be: the SIFT model that replaced
    it registered more, but on a plain room may be the wrong one (`gyro_repair` compares)."""
    _kpos, _model, key_pos, key_T = found
    if imu is None:
        return {}
    try:
        return {"the KLT model": align_imu(session.timestamps[key_pos], key_T[:, :3, :3], imu.t, imu.gyro)}
    except AlignmentError:
        return {}
