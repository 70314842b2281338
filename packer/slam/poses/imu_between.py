"""Poses between keyframes from the IMU: what the camera did between two registered
keyframes is what the gyro and the accelerometer measured, pinned to both ends.

Why: `interpolate.interpolate_poses` draws a cubic through the keyframes. At the
default 0.1 s step that is fine, but where keyframes did not register (every-effect
bench sessions register 67-97% of them) the gap is 0.2-0.7 s of a hand turning at
up to 3 rad/s, and a cubic or a slerp across it misses the turn by degrees
(every-effect seed 10, a 0.4 s gap: 9.6 deg RMS in it, 1.7 deg over the session
against 1.1 on the keyframes).

Rotation: R(t) = R_k Q(t) Exp(u Log E), Q(t) the gyro's turn from t_k to t in the
camera frame (through R_ic, the bias taken out), E the part of keyframe k+1's
rotation it does not reach, spread over u = (t - t_k) / (t_k+1 - t_k): exact at both
keyframes whatever the world (SfM or the gyro's).

Position (an accelerometer without gravity, the app's userAcceleration): p(t) = p_k
+ v (t - t_k) + M_k D_k(t), D_k the double integral from t_k of the acceleration in
the gyro's world (`imu_align.ImuTrack`, integrated once, exact between samples), M_k
= R_k R_ic^T R_g(t_k)^T turning it into the keyframes' world at keyframe k, v the one
velocity that lands on p_k+1. A constant error in
the acceleration bows a segment by a dt^2 / 8: a bias of 0.1 m/s^2 (taken out
here) moves the middle of a 0.1 s segment 0.1 mm, of a 0.4 s gap 2 mm; with
gravity in the samples it would bow by centimetres, so a raw accelerometer keeps
the cubic's positions.

Between two keyframes with a gap in imu.json (`packer.imu_gaps`) the IMU did not
see what the camera did: those frames keep the cubic."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from packer.imu_gaps import crosses_gap, gap_spans
from packer.slam.inertial.accel import GRAVITY
from packer.slam.inertial.imu_align import ImuTrack
from packer.slam.poses.interpolate import INTERPOLATED
from packer.slam.rotations import so3_exp, so3_log

if TYPE_CHECKING:
    from packer.session import Imu

@dataclass
class ImuCalibration:
    """The IMU on the frame clock, as the scale stage found it (metadata.json's fields)."""

    offset: float  # IMU clock = frame clock + offset
    R_ic: np.ndarray  # v_imu = R_ic v_cam
    gyro_bias: np.ndarray  # rad/s, subtracted from the samples
    accel_sign: float = 1.0  # -1: the accelerometer reports minus the acceleration
    accel_bias: np.ndarray | None = None  # m/s^2, IMU frame, the accelerometer's own sign: a = sign (g accel - bias)
    gravity_removed: bool = True  # False: positions stay the cubic's

    @classmethod
    def from_info(cls, info: dict[str, Any]) -> ImuCalibration | None:
        """From metadata.json's fields, or None when the scale stage aligned no IMU."""
        if info.get("R_imu_cam") is None or info.get("imu_offset") is None:
            return None
        bias = info.get("accel_bias")
        return cls(float(info["imu_offset"]), np.asarray(info["R_imu_cam"], dtype=np.float64),
                   np.asarray(info.get("gyro_bias") or np.zeros(3), dtype=np.float64),
                   float(info.get("accel_sign", 1.0)), None if bias is None else np.asarray(bias, dtype=np.float64),
                   info.get("accel_mode") == "removed")


def imu_between(frame_ts: np.ndarray, poses: np.ndarray, flags: np.ndarray, key_ts: np.ndarray,
                key_T: np.ndarray, imu: Imu, cal: ImuCalibration) -> np.ndarray:
    """`poses` (N,4,4) with every INTERPOLATED frame between two keyframes the IMU covers
    redrawn from the IMU (module docstring); the keyframes and the frames outside stay."""
    t_imu = np.asarray(imu.t, dtype=np.float64) - cal.offset  # on the frame clock
    sel = np.flatnonzero((flags == INTERPOLATED) & (frame_ts > key_ts[0]) & (frame_ts < key_ts[-1]))
    k = np.searchsorted(key_ts, frame_ts[sel], side="right") - 1
    covered = (key_ts[k] >= t_imu[0]) & (key_ts[k + 1] <= t_imu[-1])
    covered &= ~crosses_gap(gap_spans(t_imu), key_ts[k], key_ts[k + 1])  # the IMU saw none of a gap
    sel, k = sel[covered], k[covered]
    out = poses.copy()
    if len(sel) == 0:
        return out
    b = np.zeros(3) if cal.accel_bias is None else np.asarray(cal.accel_bias, dtype=np.float64)
    track = ImuTrack(t_imu, cal.accel_sign * (GRAVITY * np.asarray(imu.accel, dtype=np.float64) - b),
                     np.asarray(imu.gyro, dtype=np.float64) - cal.gyro_bias)
    turn = _Turn(track, cal.R_ic, key_ts, key_T[:, :3, :3])
    out[sel, :3, :3] = turn.at(frame_ts[sel], k)
    if cal.gravity_removed:
        out[sel, :3, 3] = _positions(frame_ts[sel], k, key_ts, key_T, track, cal.R_ic)
    return out


class _Turn:
    """Camera-to-world rotations between keyframes: the gyro's turn from the earlier one,
    its shortfall at the later one spread linearly in time."""

    def __init__(self, track: ImuTrack, R_ic: np.ndarray, key_ts: np.ndarray, key_R: np.ndarray):
        self.track, self.R_ic, self.key_ts, self.key_R = track, R_ic, key_ts, key_R
        self.key_g = track.orientation(key_ts) @ R_ic  # each keyframe's camera in the gyro's world
        reach = key_R[:-1] @ np.swapaxes(self.key_g[:-1], -1, -2) @ self.key_g[1:]  # R_k Q_k(t_k+1)
        self.short = so3_log(np.swapaxes(reach, -1, -2) @ key_R[1:])  # (K-1,3) Log E_k

    def at(self, times: np.ndarray, k: np.ndarray) -> np.ndarray:
        """(n,3,3) at `times`, each between keyframes k and k+1."""
        Rg = self.track.orientation(times) @ self.R_ic
        u = (times - self.key_ts[k]) / (self.key_ts[k + 1] - self.key_ts[k])
        return self.key_R[k] @ np.swapaxes(self.key_g[k], -1, -2) @ Rg @ so3_exp(u[:, None] * self.short[k])


def _positions(times: np.ndarray, k: np.ndarray, key_ts: np.ndarray, key_T: np.ndarray, track: ImuTrack,
               R_ic: np.ndarray) -> np.ndarray:
    """(n,3) p_k + v (t - t_k) + M_k D_k(t), v landing on p_k+1 (module docstring)."""
    i1_k, i2_k = (i[:, :3] for i in track.integrals(key_ts))
    M = key_T[:, :3, :3] @ R_ic.T @ np.swapaxes(track.orientation(key_ts), -1, -2)

    def D(t: np.ndarray) -> np.ndarray:  # M_k times the double integral from t_k to t, starting at rest
        i2 = track.integrals(t)[1][:, :3]
        return np.einsum("nij,nj->ni", M[k], i2 - i2_k[k] - i1_k[k] * (t - key_ts[k])[:, None])

    t0, t1, c = key_ts[k], key_ts[k + 1], key_T[:, :3, 3]
    v = (c[k + 1] - c[k] - D(t1)) / (t1 - t0)[:, None]
    return c[k] + v * (times - t0)[:, None] + D(times)
