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
+ v (t - t_k) + D_k(t), D_k the double integral from t_k of the acceleration turned
into the world by R(t), v the one velocity that lands on p_k+1. A constant error in
the acceleration bows a segment by a dt^2 / 8: a bias of 0.1 m/s^2 (taken out
here) moves the middle of a 0.1 s segment 0.1 mm, of a 0.4 s gap 2 mm; with
gravity in the samples it would bow by centimetres, so a raw accelerometer keeps
the cubic's positions."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from packer.slam.imu_align import gyro_orientation
from packer.slam.interpolate import INTERPOLATED
from packer.slam.rotations import so3_exp, so3_log

if TYPE_CHECKING:
    from packer.session import Imu

GRAVITY = 9.80665  # the accelerometer's g unit (m/s^2)


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
    sel, k = sel[covered], k[covered]
    out = poses.copy()
    if len(sel) == 0:
        return out
    turn = _Turn(t_imu, imu.gyro - cal.gyro_bias, cal.R_ic, key_ts, key_T[:, :3, :3])
    out[sel, :3, :3] = turn.at(frame_ts[sel], k)
    if cal.gravity_removed:
        out[sel, :3, 3] = _positions(frame_ts[sel], k, key_ts, key_T[:, :3, 3], t_imu, imu.accel, cal, turn)
    return out


class _Turn:
    """Camera-to-world rotations between keyframes: the gyro's turn from the earlier one,
    its shortfall at the later one spread linearly in time."""

    def __init__(self, t: np.ndarray, gyro: np.ndarray, R_ic: np.ndarray, key_ts: np.ndarray, key_R: np.ndarray):
        self.t, self.gyro, self.R_ic, self.key_ts, self.key_R = t, gyro, R_ic, key_ts, key_R
        Rg = self._gyro(key_ts)
        reach = key_R[:-1] @ np.swapaxes(Rg[:-1], -1, -2) @ Rg[1:]  # R_k Q_k(t_k+1)
        self.short = so3_log(np.swapaxes(reach, -1, -2) @ key_R[1:])  # (K-1,3) Log E_k

    def _gyro(self, times: np.ndarray) -> np.ndarray:
        return gyro_orientation(self.t, self.gyro, times) @ self.R_ic  # the camera in the gyro's world

    def at(self, times: np.ndarray, k: np.ndarray) -> np.ndarray:
        """(n,3,3) at `times`, each between keyframes k and k+1."""
        Rg, Rk = self._gyro(times), self._gyro(self.key_ts[k])
        u = (times - self.key_ts[k]) / (self.key_ts[k + 1] - self.key_ts[k])
        return self.key_R[k] @ np.swapaxes(Rk, -1, -2) @ Rg @ so3_exp(u[:, None] * self.short[k])


def _positions(times: np.ndarray, k: np.ndarray, key_ts: np.ndarray, key_c: np.ndarray, t_imu: np.ndarray,
               accel_g: np.ndarray, cal: ImuCalibration, turn: _Turn) -> np.ndarray:
    """(n,3) p_k + v (t - t_k) + D_k(t), v landing on p_k+1 (module docstring)."""
    span = (t_imu >= key_ts[0]) & (t_imu <= key_ts[-1])
    ts = np.concatenate([key_ts[:1], t_imu[span], key_ts[-1:]])  # the samples, the first and last keyframe
    ks = np.clip(np.searchsorted(key_ts, ts, side="right") - 1, 0, len(key_ts) - 2)
    b = np.zeros(3) if cal.accel_bias is None else np.asarray(cal.accel_bias, dtype=np.float64)
    a_imu = cal.accel_sign * (GRAVITY * np.column_stack([np.interp(ts, t_imu, accel_g[:, i]) for i in range(3)]) - b)
    a_w = np.einsum("nij,nj->ni", turn.at(ts, ks) @ cal.R_ic.T, a_imu)
    dt = np.diff(ts)[:, None]
    V = np.vstack([np.zeros((1, 3)), np.cumsum(0.5 * (a_w[1:] + a_w[:-1]) * dt, axis=0)])
    P = np.vstack([np.zeros((1, 3)), np.cumsum(0.5 * (V[1:] + V[:-1]) * dt, axis=0)])

    def at(x: np.ndarray, M: np.ndarray) -> np.ndarray:
        return np.column_stack([np.interp(x, ts, M[:, i]) for i in range(3)])

    def D(t0: np.ndarray, t1: np.ndarray) -> np.ndarray:  # double integral from t0 to t1, starting at rest
        return at(t1, P) - at(t0, P) - at(t0, V) * (t1 - t0)[:, None]

    t0, t1 = key_ts[k], key_ts[k + 1]
    v = (key_c[k + 1] - key_c[k] - D(t0, t1)) / (t1 - t0)[:, None]
    return key_c[k] + v * (times - t0)[:, None] + D(t0, times)
