"""What the accelerometer says on its own, before any fit: whether it carries gravity
(`detect_accel_mode`), how much motion it saw (`excitation`), and what it would have
read at the camera centre (`at_camera_centre`). Shared by the windowed solve
(`packer.slam.scale.scale`) and the visual-inertial bundle adjustment (`packer.slam.inertial.viba`)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from packer.imu_gaps import stretches
from packer.slam.inertial.imu_align import ImuTrack
from packer.slam.scale.lsq import lstsq as _lstsq

GRAVITY = 9.80665  # the accelerometer's g unit (m/s^2)


class Span(Protocol):
    """A stretch of keyframes the IMU is integrated over (the windowed solve's windows)."""

    @property
    def t0(self) -> float: ...

    @property
    def t1(self) -> float: ...

    @property
    def anchor(self) -> np.ndarray: ...  # (3,3) IMU-gyro frame -> SfM world


def detect_accel_mode(accel_g: np.ndarray, track: ImuTrack | None = None) -> str:
    """'raw' when the accelerometer carries gravity, else 'removed' (the app's
    userAcceleration). With the gyro's `track` (samples in m/s^2): the mean of the
    samples turned into one frame by the gyro, where gravity is a constant ~1 g and a
    hand's own acceleration averages out (its mean is the change of velocity over the
    session, ~0). Without: the median norm, near 1 g with gravity, which a vigorous hand
    reaches without it (fast-phone seed 8: median |a| 0.500 g, read as raw, a gravity
    fitted into gravity-free samples: the scale 13-22% off on the true poses, the
    adjustment at IMU chi^2/dof 35)."""
    if track is not None and len(track.t) > 1 and track.t[-1] > track.t[0]:
        # per stretch of <= 20 s, so that the gyro's drift over a long session cannot turn gravity away, and
        # none across a gap in the IMU (the phone's turn there is unknown)
        means = [_mean_accel(track, track.t[s]) for s in stretches(track.t) if s.stop - s.start > 1]
        return "raw" if float(np.median(np.concatenate(means))) > 0.5 * GRAVITY else "removed"
    return "raw" if float(np.median(np.linalg.norm(accel_g, axis=1))) > 0.5 else "removed"


def _mean_accel(track: ImuTrack, t: np.ndarray) -> np.ndarray:
    """|mean acceleration| in the gyro's frame over each <= 20 s of the samples at t."""
    edges = np.linspace(t[0], t[-1], int(np.ceil((t[-1] - t[0]) / 20.0)) + 1)
    i1, _i2 = track.integrals(edges)
    return np.linalg.norm(np.diff(i1[:, :3], axis=0), axis=1) / np.diff(edges)


def excitation(imu: ImuTrack, wins: Sequence[Span], bias: bool, raw: bool) -> float:
    """RMS over 0.2 s bins of the world-frame acceleration the IMU measured, less
    what a constant bias (IMU frame) and gravity (world frame, raw mode) explain,
    which is the part that can fix a scale, and less what the accelerometer's white
    noise puts into a bin mean (its level from second differences of the samples,
    where smooth motion cancels). m/s^2; independent of the scale fit, so it stays
    meaningful when that fit is not."""
    rows, cols, n_samples = [], [], []
    for w in wins:
        edges = np.linspace(w.t0, w.t1, max(1, int(round((w.t1 - w.t0) / 0.2))) + 1)
        i1, _i2 = imu.integrals(edges)
        d = np.diff(i1, axis=0) / np.diff(edges)[:, None]
        rows.append((d[:, :3] @ w.anchor.T).reshape(-1))
        J = [np.einsum("ab,nbc->nac", w.anchor, d[:, 3:].reshape(-1, 3, 3))] if bias else []
        J += [np.tile(np.eye(3), (len(d), 1, 1))] if raw else []
        cols.append(np.concatenate(J, axis=2).reshape(3 * len(d), -1) if J else np.zeros((3 * len(d), 0)))
        n_samples.append(np.diff(np.searchsorted(imu.t, edges)))
    y, A = np.concatenate(rows), np.vstack(cols)
    r = y - A @ _lstsq(A, y) if A.shape[1] else y
    floor = imu.noise2 * float(np.mean(1.0 / np.maximum(np.concatenate(n_samples), 1)))
    return float(np.sqrt(max(3.0 * float(np.mean(r**2)) - floor, 0.0)))


def at_camera_centre(t: np.ndarray, acc: np.ndarray, omega: np.ndarray, r: np.ndarray) -> np.ndarray:
    """The acceleration of the camera centre from an accelerometer at r (IMU frame, m)
    from it: a_imu = a_cam + alpha x r + omega x (omega x r) on a rigid body (omega the
    unbiased gyro, alpha its derivative, central differences). GTSAM's body_P_sensor
    corrects only the centripetal term; at a hand's 10-20 rad/s^2 the tangential one
    is the larger (0.5-1 m/s^2 at 5 cm). alpha is differenced within each gap-free
    stretch of the IMU, never across a gap."""
    parts = stretches(t)
    if len(parts) == 1:
        alpha = np.gradient(omega, t, axis=0)
    else:
        alpha = np.zeros_like(omega)
        for s in parts:
            if s.stop - s.start > 1:
                alpha[s] = np.gradient(omega[s], t[s], axis=0)
    return acc - np.cross(alpha, r) - np.cross(omega, np.cross(omega, r))
