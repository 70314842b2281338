"""The metric scale of one SfM reconstruction, by the method the user chose
(`--scale imu | marker | known-distance | none`).

Kept apart from `pipeline` because each method pulls in its own solver and its
own failure messages, while the pipeline only needs "scale, metric?, fields for
metadata". A method that cannot give a trustworthy scale raises the session's
error naming the file to blame, never a silently wrong number."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from packer.session import Imu, Session
from packer.slam.inertial.imu_align import AlignmentError, ImuAlignment, align_imu
from packer.slam.poses.interpolate import interpolate_poses
from packer.slam.scale.marker import (
    MarkerError,
    marker_camera_centres,
    parse_known_distance,
    scale_from_known_distance,
    scale_from_marker,
)
from packer.slam.scale.refusals import ModelRefused, refuse_disagreement
from packer.slam.scale.scale import ScaleRefused, ShapeRefused, solve_scale

if TYPE_CHECKING:
    from packer.slam.mapping.colmap import SfmModel
    from packer.slam.options import SlamOptions

ScaleFit = tuple[float, bool, dict[str, Any]]  # (metres per SfM unit, metric?, metadata fields)


def metric_scale(
    session: Session, opts: SlamOptions, imu: Imu | None, key_pos: np.ndarray, key_ts: np.ndarray, key_T: np.ndarray,
    model: SfmModel | None = None, spans: list[tuple[float, float]] | None = None,
) -> ScaleFit:
    """(scale in metres per SfM unit, metric?, metadata fields) by the chosen method.
    With `--solver viba`, and `auto` where the bundle adjustment took the scale, the
    fields carry "keyframe_poses": the refined metric camera-to-world poses of the
    keyframes, which replace the scaled SfM ones.
    `spans`: the time spans of the parts a long session was mapped in (the IMU
    scale is also solved per part: see `_part_scales`)."""
    if opts.scale == "none":
        return 1.0, False, {}
    if opts.scale == "imu":
        assert imu is not None
        names = [session.frame_paths[int(k)].name for k in key_pos]
        if opts.solver == "viba" and model is not None:
            from packer.slam.scale.viba_scale import viba_scale

            return viba_scale(session, opts, imu, key_ts, key_T, model, names)
        readout = float(model.rolling_shutter or 0.0) if model is not None else 0.0
        fit = _imu_scale(session, opts, imu, key_ts, key_T, spans, readout)
        if opts.solver == "auto" and model is not None and not (spans and len(spans) > 1):
            from packer.slam.scale.viba_scale import refine_accepted

            return refine_accepted(session, opts, imu, key_ts, key_T, model, names, fit)
        return fit
    if opts.scale == "marker":
        return _marker_scale(session, opts, key_pos, key_T)
    return _known_distance_scale(session, opts, key_ts, key_T)


def _imu_scale(session: Session, opts: SlamOptions, imu: Imu, key_ts: np.ndarray, key_T: np.ndarray,
               spans: list[tuple[float, float]] | None = None, readout: float = 0.0) -> ScaleFit:
    """Gyro/video alignment (clock offset, camera-IMU rotation, gyro bias), then the
    accelerometer scale solve on that alignment (and per part of a long session).
    The std's model term: see `_model_rel_std`. (A model the stage mapped again on the
    gyro's rotations is scaled by `viba_scale` instead: `gyro_repair`.)"""
    centres = key_T[:, :3, 3]
    R_wc = key_T[:, :3, :3]
    try:
        al: ImuAlignment = align_imu(key_ts, R_wc, imu.t, imu.gyro, max_offset=opts.max_imu_offset)
    except AlignmentError as e:
        raise session.error("imu.json", f"gyro/video alignment failed: {e}") from None
    disagree = al.residual / max(al.rotation_rms, 1e-9)
    if disagree > opts.max_gyro_disagreement:
        refuse_disagreement(session, key_ts, key_T, imu, al, opts.scale_options,
                            f"need <= {opts.max_gyro_disagreement:.0%}", "part of the model is wrong")
    try:
        sr = solve_scale(key_ts, centres, R_wc, imu.t, imu.accel, imu.gyro, offset=al.offset, R_ic=al.R_ic,
                         gyro_bias=al.gyro_bias, options=opts.scale_options,
                         model_rel_std=_model_rel_std(opts, disagree, readout))
    except ShapeRefused as e:  # the model's shape: `gyro_repair` may map it again on the gyro's rotations
        raise ModelRefused.of(session, "imu.json", f"scale refused: {e}", al) from None
    except ScaleRefused as e:
        raise session.error("imu.json", f"scale refused: {e}") from None
    parts: dict[str, Any] = {}
    if spans and len(spans) > 1:
        parts = _part_scales(sr.scale, spans, key_ts, centres, R_wc, imu, al, opts, sr.model_rel_std)
        total = float(np.hypot(sr.rel_std, parts["parts_rel_std"]))
        if total > opts.scale_options.max_rel_std:
            raise session.error(
                "imu.json",
                f"scale uncertain: +-{total:.1%}, mostly because the {len(spans)} parts this long session was mapped "
                f"in disagree on the scale by {parts['parts_scale_spread']:.1%} (a part's model is distorted): record "
                "with more texture and light in view, or map it in larger parts ([slam] chunk_keyframes)")
        sr.rel_std = total
    return sr.scale, True, {
        "imu_offset": al.offset,  # IMU (epoch) clock = frame clock + offset: frame 0's epoch time
        "imu_lag": al.offset - float(imu.t[0]),  # frame 0 after the first IMU sample
        "R_imu_cam": al.R_ic.tolist(),
        "gyro_bias": al.gyro_bias.tolist(),
        "gyro_residual": al.residual,
        "gyro_correlation": al.correlation,
        "rotation_rms": al.rotation_rms,
        "scale_rel_std": sr.rel_std,
        "scale_fit_rel_std": sr.fit_rel_std,
        "scale_model_rel_std": sr.model_rel_std,
        "gyro_disagreement": disagree,
        "residual": sr.residual,
        "confidence": sr.confidence,
        "excitation": sr.excitation,
        "explained": sr.explained,
        "condition": sr.condition,
        "accel_mode": sr.accel_mode,
        "accel_sign": sr.accel_sign,
        "gravity_sfm": sr.gravity,
        "accel_bias": sr.accel_bias,
        "scale_windows": sr.n_windows,
        "scale_keyframes": sr.n_keyframes,
        "imu_noise_ratio": sr.imu_noise_ratio,
        "scale_window_spread": sr.window_spread,
        "imu_lever_arm": sr.lever_arm,  # m, the IMU's position in the camera frame (None: at its centre)
        "imu_lever_arm_chi2": sr.lever_arm_chi2,
        "scale_shape_spread": sr.shape_spread,
        **parts,
    }


def _model_rel_std(opts: SlamOptions, disagree: float, readout: float) -> float:
    """The std's share for what the SfM model gets wrong beyond its jitter, in quadrature:
    a distorted model (the gyro disagreement above its noise floor), what the rolling-
    shutter correction leaves, and the slow path distortion every SfM model has."""
    return float(np.linalg.norm([opts.gyro_std_factor * max(0.0, disagree - opts.gyro_noise_floor),
                                 opts.readout_std_factor * readout, opts.sfm_rel_std]))


def _part_scales(scale: float, spans: list[tuple[float, float]], key_ts: np.ndarray, centres: np.ndarray,
                 R_wc: np.ndarray, imu: Imu, al: ImuAlignment, opts: SlamOptions,
                 model_rel_std: float) -> dict[str, Any]:
    """The IMU scale of each part of a long session on its own (same alignment), in
    the joined model's frame. Were the joins exact, every part would give the whole's
    scale within its own std; the scatter beyond that is what the joins left (each
    part's own drift carried into the next), and the whole's scale, an average over
    the parts, is uncertain by that scatter over sqrt(parts) besides its own std."""
    ratios: list[float | None] = []
    stds: list[float] = []
    for t0, t1 in spans:
        sel = (key_ts >= t0) & (key_ts <= t1)
        try:
            p = solve_scale(key_ts[sel], centres[sel], R_wc[sel], imu.t, imu.accel, imu.gyro, offset=al.offset,
                            R_ic=al.R_ic, gyro_bias=al.gyro_bias, options=opts.scale_options,
                            model_rel_std=model_rel_std)
        except ScaleRefused:  # a part with too little motion says nothing about the joins
            ratios.append(None)
            continue
        ratios.append(p.scale / scale)
        stds.append(p.rel_std)
    dev = np.array([r - 1.0 for r in ratios if r is not None])
    var = np.array(stds) ** 2
    spread = float(np.sqrt(max(0.0, float(np.mean(dev**2 - var))))) if len(dev) >= 2 else 0.0
    return {"part_scales": [None if r is None else round(r, 6) for r in ratios], "parts_scale_spread": spread,
            "parts_rel_std": float(spread / np.sqrt(max(1, len(dev))))}


def _marker_scale(session: Session, opts: SlamOptions, key_pos: np.ndarray, key_T: np.ndarray) -> ScaleFit:
    """Camera centres relative to a printed ArUco marker of known size, found in
    the keyframes, fitted against the SfM centres."""
    centres = key_T[:, :3, 3]
    R_wc = key_T[:, :3, :3]
    paths = [session.frame_paths[int(k)] for k in key_pos]
    found, mid = marker_camera_centres(paths, session.intrinsics, float(opts.marker_size),  # type: ignore[arg-type]
                                       opts.marker_dict, opts.marker_id, R_wc=R_wc)
    idx = np.array(sorted(found), dtype=np.int64)
    try:
        ms = scale_from_marker(centres[idx] if len(idx) else np.zeros((0, 3)),
                               np.array([found[i] for i in idx]).reshape(-1, 3), marker_id=mid)
    except MarkerError as e:
        raise session.error("rgb/", f"marker scale: {e}") from None
    return ms.scale, True, {"residual": ms.residual, "scale_rel_std": ms.rel_std, "marker_frames": ms.n_frames,
                            "marker_id": ms.marker_id, "marker_size": opts.marker_size,
                            "confidence": max(0.0, 1.0 - ms.rel_std / 0.02)}


def _known_distance_scale(session: Session, opts: SlamOptions, key_ts: np.ndarray, key_T: np.ndarray) -> ScaleFit:
    """The user's measured distance between two frames' camera centres
    (interpolated when those frames are not keyframes)."""
    a, b, d = parse_known_distance(opts.known_distance or "")
    fr = {int(f): i for i, f in enumerate(session.frames)}
    P, _fl = interpolate_poses(session.timestamps[[fr[a], fr[b]]], key_ts, key_T)
    try:
        s = scale_from_known_distance(P[0, :3, 3], P[1, :3, 3], d)
    except MarkerError as e:
        raise session.error("rgb/", str(e)) from None
    return s, True, {"known_distance": [a, b, d], "residual": 0.0, "confidence": None}
