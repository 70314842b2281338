"""The refusals of the metric scale, with their wording, shared by the windowed solve's
path (`scale_methods`) and the visual-inertial bundle adjustment's (`viba_scale`): a
model whose rotations disagree with the gyro, a camera that barely translates, a path
too short for any method, the imu.json gaps named first. Apart from both so neither
imports the other for them."""
from __future__ import annotations

import dataclasses
from typing import NoReturn

import numpy as np

from packer.imu_gaps import find_gaps, gap_summary
from packer.session import Imu, Session
from packer.slam.inertial.imu_align import ImuAlignment, worst_stretch
from packer.slam.scale.scale import ScaleOptions, ScaleRefused, ScaleResult, solve_scale, still_reason
from shardship.errors import SessionError


def estimate_only(key_ts: np.ndarray, key_T: np.ndarray, imu: Imu, al: ImuAlignment,
                  opt: ScaleOptions) -> ScaleResult:
    """The windowed solve with its refusals off: only its estimate is wanted (scale,
    accelerometer sign and bias, gravity, the IMU's motion acceleration)."""
    relaxed = dataclasses.replace(opt, max_rel_std=np.inf, min_explained=-np.inf, min_excitation=0.0)
    return solve_scale(key_ts, key_T[:, :3, 3], key_T[:, :3, :3], imu.t, imu.accel, imu.gyro, offset=al.offset,
                       R_ic=al.R_ic, gyro_bias=al.gyro_bias, options=relaxed)


def baseline_reason(baseline: float, least: float) -> str:
    """Why no method can scale a path that spans `baseline` of the scene depth (< `least`)."""
    return (f"scale refused: the camera barely translates (path spans {baseline:.2%} of the median scene depth, "
            f"need {least:.1%}), so no method can recover a metric scale; record with more hand motion, or use "
            "--scale none for unscaled poses")


def refuse_if_still(session: Session, key_ts: np.ndarray, key_T: np.ndarray, imu: Imu, al: ImuAlignment,
                    opt: ScaleOptions) -> None:
    """Before a model is refused as wrong (its rotations disagree with the gyro): if the
    IMU says the camera barely translates, that is the reason to give. A camera turning
    in place has no parallax, so whatever SfM built from it is wrong, and "record with
    more texture" would send the user the wrong way."""
    try:
        excitation = estimate_only(key_ts, key_T, imu, al, opt).excitation
    except ScaleRefused:
        return
    if excitation < opt.min_excitation:
        raise session.error("imu.json", still_reason(excitation, opt.min_excitation))


def gaps_named(refusal: SessionError, imu: Imu | None) -> SessionError:
    """`refusal` of a session whose imu.json has gaps (`packer.imu_gaps`), naming them
    first: the IMU terms leave each out, so the IMU said less about this recording
    than its length suggests, and the user should know before reading the rest.
    Without a gap, `refusal` as it is."""
    gaps = [] if imu is None else find_gaps(imu.t)
    if not gaps or gap_summary(gaps) in refusal.reason:
        return refusal
    return SessionError(refusal.session, refusal.path, f"{gap_summary(gaps)} (the phone's main thread busy), left "
                        f"out of the IMU terms; on the rest: {refusal.reason}")


class ModelRefused(SessionError):
    """The model is refused for itself, not for what was recorded: its rotations disagree
    with the gyro, or its scale is refused for its shape (`scale.ShapeRefused`: distorted,
    too noisy, stretched); `alignment` is the gyro aligned on that model anyway (most of it
    is often right: `gyro_repair` starts from it and maps again)."""

    def __init__(self, session: str, path: str, reason: str, alignment: ImuAlignment):
        super().__init__(session, path, reason)
        self.alignment = alignment

    @classmethod
    def of(cls, session: Session, file: str, reason: str, alignment: ImuAlignment) -> ModelRefused:
        """`session.error(file, reason)`, carrying the alignment."""
        plain = session.error(file, reason)
        return cls(plain.session, plain.path, plain.reason, alignment)


def refuse_disagreement(session: Session, key_ts: np.ndarray, key_T: np.ndarray, imu: Imu, al: ImuAlignment,
                        opt: ScaleOptions, limit: str, verdict: str) -> NoReturn:
    """Refuse a model whose rotations disagree with the gyro (either solver: `limit` and
    `verdict` are its words), naming the second of video where they disagree most so
    the user can look at what was in view there; a camera that barely translates is
    the reason given instead (`refuse_if_still`)."""
    refuse_if_still(session, key_ts, key_T, imu, al, opt)
    disagree = al.residual / max(al.rotation_rms, 1e-9)
    t0, t1, share = worst_stretch(key_ts, key_T[:, :3, :3], imu.t, imu.gyro, al)
    raise ModelRefused.of(
        session, "rgb/",
        f"poses refused: the reconstruction's rotations disagree with the gyro by {al.residual:.3f} rad/s RMS "
        f"({disagree:.0%} of the {al.rotation_rms:.2f} rad/s the camera turns; {limit}): {verdict}, most "
        f"{t0:.1f}-{t1:.1f} s into the video ({share:.0%} of the disagreement): too few or sliding features there "
        "(plain surfaces, blur, the glove filling the view). Record with more texture and light in view",
        al,
    )
