"""`--scale imu --solver viba`: the metric scale and refined keyframe poses from the
visual-inertial bundle adjustment (`packer.slam.inertial.viba`), with its refusals.

Kept apart from `scale_methods` (the windowed solve's path) because this path
differs in what it trusts: the gyro-vs-SfM disagreement is not a refusal here (the
bundle adjustment straightens the rotations with the gyro); instead the solved
graph must be consistent (the IMU factors' chi^2, the share of observations kept)
and the marginal std small enough."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from packer.session import Imu, Session
from packer.slam.inertial.imu_align import AlignmentError, ImuAlignment, align_imu
from packer.slam.inertial.viba import VibaError, VibaOptions, VibaResult, solve_viba
from packer.slam.inertial.viba_inputs import keyframe_structure
from packer.slam.scale.refusals import estimate_only, refuse_disagreement
from packer.slam.scale.scale import ScaleRefused, ScaleResult, still_reason
from shardship.errors import SessionError

if TYPE_CHECKING:
    from packer.slam.mapping.colmap import SfmModel
    from packer.slam.options import SlamOptions


def viba_scale(session: Session, opts: SlamOptions, imu: Imu, key_ts: np.ndarray, key_T: np.ndarray,
               model: SfmModel, names: list[str], shape_rel_std: float = 0.0,
               imu_chi2_ref: float | None = None, joins: tuple[np.ndarray, ...] = (),
               join_offset: float | tuple[float, ...] = 0.0, readout_rel_std: float = 0.0,
               gyro_bias_prior: float | None = None, offset_search: float = 0.0) -> tuple[float, bool, dict[str, Any]]:
    """(scale, metric, metadata fields with "keyframe_poses") or the session's error.
    A model whose rotations are the gyro's (`gyro_repair`: `model.check_R_wc` holds the
    rotations its images want) is checked on those, against the window solver's limit:
    the bundle adjustment cannot straighten what the gyro already set. `shape_rel_std`:
    added to the std in quadrature, for what the marginal covariance does not see;
    `imu_chi2_ref`: the IMU factors' chi^2/dof of a right model of this kind, the marginal
    std then grows with the root of how far above it this one's is (a Birge ratio); `joins`:
    per join of parts the IMU alone places, which keyframes its placement moves
    (`part_links.imu_joins`), each by about `join_offset` metres (one for all, or one per
    join: `join_rel_std`); `readout_rel_std`:
    added in quadrature per READOUT_REF of rolling-shutter readout the observations were
    corrected for (the front-end's, or the adjustment's own estimate), up to READOUT_REF;
    `offset_search`: s, how far from the gyro alignment's clock offset the adjustment
    searches its own (`viba_timing`)."""
    # the front-end already moved the observations to the frame time when it knew the readout (`rolling.py`)
    vopt = VibaOptions(rolling_shutter=0.0 if model.rolling_shutter is not None else opts.rolling_shutter,
                       offset_search=offset_search)
    if gyro_bias_prior is not None:
        vopt = dataclasses.replace(vopt, gyro_bias_prior=gyro_bias_prior)
    al, disagree = _aligned(session, opts, vopt, imu, key_ts, key_T, model)
    try:
        sr = estimate_only(key_ts, key_T, imu, al, opts.scale_options)
    except ScaleRefused as e:
        raise session.error("imu.json", f"scale refused: {e}") from None
    if sr.excitation < opts.scale_options.min_excitation:
        raise session.error("imu.json", still_reason(sr.excitation, opts.scale_options.min_excitation))
    if not sr.scale > 0:
        raise session.error("imu.json", "scale not observable: the accelerometer fits no positive scale to the SfM "
                            "motion (the reconstruction is distorted, or imu.json belongs to another recording)")
    gravity = None if sr.gravity is None else np.asarray(sr.gravity)  # m/s^2 along the SfM axes (raw accel only)
    b_acc = None if sr.accel_bias is None else np.asarray(sr.accel_bias)
    try:
        r = solve_viba(key_ts, key_T, keyframe_structure(model, names), imu.t, imu.accel, imu.gyro,
                       offset=al.offset, R_ic=al.R_ic, gyro_bias=al.gyro_bias, scale0=sr.scale,
                       accel_sign=sr.accel_sign, accel_bias=b_acc, gravity=gravity, options=vopt,
                       lever_arm=None if sr.lever_arm is None else np.asarray(sr.lever_arm))
    except (VibaError, RuntimeError) as e:  # RuntimeError: GTSAM's (an indeterminate system)
        raise session.error("rgb/", f"visual-inertial bundle adjustment failed: {str(e).strip().splitlines()[0]}",
                            AdjustmentFailed) from None
    readout = model.rolling_shutter if model.rolling_shutter is not None else r.rolling_shutter
    model_std = model_rel_std(vopt.model_factor * max(0.0, disagree - opts.gyro_noise_floor), shape_rel_std,
                              readout, readout_rel_std)
    fit_std = r.rel_std * (1.0 if imu_chi2_ref is None else float(np.sqrt(max(1.0, r.imu_chi2 / imu_chi2_ref))))
    join_std = join_rel_std(r.T_wc[:, :3, 3], joins, join_offset)
    lever_std = LEVER_REL_STD if r.lever_arm is not None else 0.0  # (x + 0.0**2: the sums of before, to the bit)
    rel_std = float(np.sqrt(fit_std**2 + model_std**2 + join_std**2 + lever_std**2))
    _check(session, opts, vopt, r, rel_std, sr.excitation, len(joins), join_std,
           None if model.check_R_wc is not None or disagree > opts.max_gyro_disagreement else disagree)
    return r.scale, True, {
        "keyframe_poses": r.T_wc,
        "solver": "viba",
        "imu_offset": al.offset + r.offset_shift,
        "imu_lag": al.offset + r.offset_shift - float(imu.t[0]),
        **({"imu_offset_shift": r.offset_shift} if offset_search else {}),  # what the adjustment's search moved it
        "R_imu_cam": al.R_ic.tolist(),
        "gyro_bias": r.gyro_bias.tolist(),
        "accel_bias": r.accel_bias.tolist(),
        "gyro_residual": al.residual,
        "rotation_rms": al.rotation_rms,
        "gyro_disagreement": disagree,  # of the SfM model before the VI-BA (a repaired one: of its free rotations)
        "scale_rel_std": rel_std,
        "scale_fit_rel_std": fit_std,  # from the marginal covariance (and imu_chi2_ref)
        "scale_model_rel_std": model_std,
        **({"scale_join_rel_std": join_std} if joins else {}),
        # the readout: the front-end's when it corrected the tracks (the metadata has it already), else viba's own
        **({} if model.rolling_shutter is not None else {"rolling_shutter": r.rolling_shutter}),
        "scale_start": sr.scale,
        **_lever_fields(sr, r),
        "accel_mode": sr.accel_mode,
        "accel_sign": sr.accel_sign,
        "excitation": sr.excitation,
        "viba_imu_chi2": r.imu_chi2,
        "viba_visual_chi2": r.visual_chi2,
        "viba_reprojection_rms": r.reprojection_rms,
        "viba_inliers": r.inlier_fraction,
        "viba_points": r.n_points,
        "viba_camera": r.camera,
        "viba_seconds": r.seconds,
        "confidence": float(np.clip(1.0 - rel_std / opts.scale_options.max_rel_std, 0.0, 1.0)),
    }


class AdjustmentFailed(SessionError):
    """The bundle adjustment could not run (too few observations, an indeterminate
    system): it says nothing about the model, unlike its refusals, which are evidence
    that the images and the IMU disagree (`refine_accepted`)."""


def _lever_fields(sr: ScaleResult, r: VibaResult) -> dict[str, Any]:
    """metadata.json's lever arm (m, the IMU's position in the camera frame; None: at its
    centre): the adjustment's, searched from the windowed solve's, which only its
    significance (chi^2, 3 dof) admits."""
    fields: dict[str, Any] = {"imu_lever_arm": None if r.lever_arm is None else [float(v) for v in r.lever_arm],
                              "imu_lever_arm_window": sr.lever_arm, "imu_lever_arm_chi2": sr.lever_arm_chi2}
    if r.lever_arm is not None:
        fields["scale_lever_rel_std"] = LEVER_REL_STD  # its term in the std
    return fields


def _aligned(session: Session, opts: SlamOptions, vopt: VibaOptions, imu: Imu, key_ts: np.ndarray,
             key_T: np.ndarray, model: SfmModel) -> tuple[ImuAlignment, float]:
    """(the gyro aligned on the keyframes, the model's gyro disagreement: on the rotations
    its images want for a repaired model), or the session's error where the alignment
    fails or the disagreement is over what the adjustment may start from."""
    try:
        al = align_imu(key_ts, key_T[:, :3, :3], imu.t, imu.gyro, max_offset=opts.max_imu_offset)
        checked = al if model.check_R_wc is None else align_imu(key_ts, model.check_R_wc, imu.t, imu.gyro,
                                                                max_offset=opts.max_imu_offset)
    except AlignmentError as e:
        raise session.error("imu.json", f"gyro/video alignment failed: {e}") from None
    disagree = checked.residual / max(checked.rotation_rms, 1e-9)
    repaired = model.check_R_wc is not None
    limit = opts.max_gyro_disagreement if repaired else vopt.max_gyro_disagreement
    if disagree > limit:
        check_T = key_T.copy()
        if repaired:
            check_T[:, :3, :3] = model.check_R_wc
        words = ((f"need <= {limit:.0%}", "part of the model is wrong") if repaired else
                 (f"the bundle adjustment repairs up to {limit:.0%}", "the model is wrong, not distorted"))
        refuse_disagreement(session, key_ts, check_T, imu, checked, opts.scale_options, *words)
    return al, disagree


def model_rel_std(gyro_term: float, shape_rel_std: float, readout: float, readout_rel_std: float) -> float:
    """What the marginal covariance does not see, in quadrature: the input model's gyro
    disagreement term, its kind's shape term, and `readout_rel_std` per READOUT_REF of
    the rolling-shutter readout (s) the observations were corrected for, up to READOUT_REF."""
    readout_std = readout_rel_std * min(1.0, abs(readout) / READOUT_REF)
    return float(np.linalg.norm([gyro_term, shape_rel_std, readout_std]))


def join_rel_std(centres: np.ndarray, joins: tuple[np.ndarray, ...], offset: float | tuple[float, ...]) -> float:
    """The relative std the scale gets from parts joined with an uncertain offset: an
    offset d that moves the centres `joins[j]` (a mask) moves the scale of the fit to
    the whole path by d . sum_{k moved} (c_k - c_mean) / sum_k |c_k - c_mean|^2 (the
    fit's derivative); `offset` m along the most sensitive direction (one for every
    join, or one each), each join independent."""
    d = centres - centres.mean(0)
    g = np.array([np.linalg.norm(d[m].sum(0)) for m in joins]) * np.broadcast_to(offset, (len(joins),))
    return float(np.sqrt(np.sum(np.square(g))) / max(float(np.sum(d * d)), 1e-12))


def _check(session: Session, opts: SlamOptions, vopt: VibaOptions, r: VibaResult, rel_std: float,
           excitation: float, joins: int = 0, join_std: float = 0.0, rotations_agree: float | None = None) -> None:
    """Refuse a solved graph that is inconsistent, or a scale it leaves uncertain (saying
    "more translation" only where the IMU saw little motion, and naming the `joins` of
    parts the IMU alone placed where their term `join_std` is most of the std)."""
    if r.imu_chi2 > vopt.max_imu_chi2 or r.inlier_fraction < vopt.min_inliers:
        raise session.error("rgb/", disagreement_reason(r, vopt, rotations_agree))
    max_std = opts.scale_options.max_rel_std
    if not rel_std <= max_std:
        head = (f"scale poorly constrained: {r.scale:.4g} +- {rel_std:.1%} (need <= {max_std:.0%}) after the "
                "visual-inertial bundle adjustment")
        if excitation >= 5 * opts.scale_options.min_excitation and joins and join_std**2 > rel_std**2 / 2:
            raise session.error("imu.json", f"{head}, although the IMU sees enough motion ({excitation:.2f} m/s^2 "
                                f"RMS): the video broke into {joins + 1} parts that nothing in the images ties "
                                f"together, placed by the IMU alone (+-{join_std:.1%} of it): record with more "
                                "texture and light in view, turn more slowly where the view is plain, and come "
                                "back past what you filmed before")
        if excitation >= 5 * opts.scale_options.min_excitation:
            raise session.error("imu.json", f"{head}, although the IMU sees enough motion ({excitation:.2f} m/s^2 "
                                "RMS): the images place the path too loosely (few or weak features: record with "
                                "more texture and light in view)")
        raise session.error("imu.json", f"{head}; record with more translation or use --scale marker / "
                            "known-distance")


def disagreement_reason(r: VibaResult, vopt: VibaOptions, rotations_agree: float | None = None) -> str:
    """Why the solved graph is refused, naming the side that does not fit. Where the
    images fit (most observations kept, sub-pixel), or the model's own rotations agree
    with the gyro (`rotations_agree`: their disagreement, within the windowed check's
    limit), the scene is not the cause and "more texture" would be wrong advice: the
    IMU's motion model does not explain the recording (measured on fast sessions: an IMU
    off the optical centre that the solve did not place gave chi^2/dof 2-21 in sharp,
    textured rooms)."""
    head = (f"poses refused: after the visual-inertial bundle adjustment the images and the IMU still disagree "
            f"(IMU chi^2/dof {r.imu_chi2:.2f}, need <= {vopt.max_imu_chi2:g}; {r.inlier_fraction:.0%} of the "
            f"observations fit, need {vopt.min_inliers:.0%})")
    if rotations_agree is not None or (r.inlier_fraction >= vopt.min_inliers and r.reprojection_rms <= 1.0):
        fit = (f"the images fit ({r.reprojection_rms:.2f} px RMS)" if r.inlier_fraction >= vopt.min_inliers else
               f"the images' own model turns with the gyro ({rotations_agree:.0%} disagreement)")
        return (f"{head}: {fit}, the IMU's motion does not fit them, so "
                "the scene is not the cause: the IMU model does not explain this recording (its clock, where it "
                "sits on the phone, its noise at these speeds). Scale it with --scale marker or known-distance, "
                "or record the same moves more slowly")
    return (f"{head}: part of the model is wrong (sliding features on plain surfaces, blur, a rolling shutter at "
            "fast turns). Record with more texture and light in view, and turn more slowly")


AUTO_SHAPE_REL_STD = 0.0015  # in quadrature: what the marginal covariance of a model the windowed solve accepted
# does not see (calibrated on bench.viba; see the README)
READOUT_REL_STD = 0.0025  # in quadrature, per READOUT_REF of readout corrected, for such a model: what a rolling-
# shutter correction leaves in the scale. The every-effect bench's models the windowed solve accepted (a 20 ms
# readout, measured at 17.8-20.8 ms) were off by 0.30% RMS at stds of 0.18-0.34% (|error|/std RMS 1.48, seed 59
# at 3.0); with it 0.96, the worst 1.9. The other profiles (no rolling shutter, 0-17 ms measured) barely move.
READOUT_REF = 0.02  # s, a phone's readout at 480x360 (the app's frames: 20 ms in the synthetic camera)
LEVER_REL_STD = 0.002  # in quadrature where the adjustment placed the IMU off the camera (a lever arm): what its
# search leaves in the scale. Its axis along the view is the least seen (fast-phone seed 3, photos seed 11: 6 mm
# off, the scale 0.5% and 1.1% off at 2.1 and 3.4 std); on session 21's 52 such sessions (fast-phone, fast-phone-
# all, photos: the same sessions it was chosen on) |error|/std RMS 0.86 -> 0.71, the worst 3.43 -> 2.88


def refine_accepted(session: Session, opts: SlamOptions, imu: Imu, key_ts: np.ndarray, key_T: np.ndarray,
                    model: SfmModel, names: list[str], window: tuple[float, bool, dict[str, Any]]
                    ) -> tuple[float, bool, dict[str, Any]]:
    """`--solver auto`: a model the windowed solve accepted (its checks: the gyro, the
    shape, the std), scaled by the bundle adjustment, which also refines its poses. Why:
    on plain rooms the windowed solve leans small on SfM positions whose errors follow
    the motion (low texture, 5 seeds: -0.47 to -1.41% at 0.57-1.88% std; the bundle
    adjustment on the same models -0.31 to +0.19%).

    A refusal of the adjustment is evidence, not a reason to fall back: it sees every
    image observation and every IMU sample at once, and when they disagree (its IMU
    chi^2, its inliers) or leave the scale loose, the windowed answer from the same
    data is no better, only blinder (a fast session made elsewhere: the adjustment
    refused at IMU chi^2/dof 21 and the windowed scale, kept, was 19% off at +-1.8%).
    So the session is refused, saying both. Only where the adjustment could not run at
    all (`AdjustmentFailed`) does the windowed answer stand, and metadata.json says why."""
    try:
        scale, metric, fields = viba_scale(session, opts, imu, key_ts, key_T, model, names,
                                           shape_rel_std=AUTO_SHAPE_REL_STD, readout_rel_std=READOUT_REL_STD)
    except AdjustmentFailed as e:
        return window[0], window[1], {**window[2], "solver": "window", "viba_refused": e.reason}
    except SessionError as e:
        raise session.error(e.path, f"{e.reason} (the windowed accelerometer solve alone gave "
                            f"{window[0]:.4g} m/unit +-{window[2]['scale_rel_std']:.1%}, not accepted against "
                            "this refusal)") from None
    # the windowed solve's own fields stay (its fit's residual, windows, explained share: the user's scripts
    # read `residual`); what both have is the adjustment's
    return scale, metric, {**window[2], **fields, "window_scale": window[0],
                           "window_rel_std": window[2]["scale_rel_std"]}
