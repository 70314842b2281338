"""The IMU stream synthesised from a trajectory (200 Hz CoreMotion deviceMotion).

The IMU follows the StackCapture convention: accelerometer in g with gravity
REMOVED (linear acceleration, i.e. what CoreMotion calls userAcceleration), gyro in
rad/s, both in the device (IMU) frame. The IMU is rigidly rotated from the camera by
`R_imu_cam` (v_imu = R_imu_cam v_cam) with no lever arm (IMU at the optical centre).

Clock convention: imu_time = frame_time + offset, where imu_time is the epoch
stamp the app writes and frame_time is seconds since frame 0, so `offset` is an
epoch (frame 0's epoch plus the IMU's extra latency). An IMU sample stamped tau
measures the motion at frame-clock time tau - offset.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packer.synth.trajectory import GRAVITY, Trajectory, so3_exp

IMU_RATE = 200.0

# A phone's back camera in landscape: camera x -> -y_imu, camera y -> -x_imu,
# camera z -> -z_imu (a proper rotation, det +1); each session adds a few degrees.
_P_IMU_CAM = np.array([[0.0, -1.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, -1.0]])


@dataclass(frozen=True)
class ImuModel:
    R_imu_cam: np.ndarray  # (3,3)
    offset: float  # s (epoch), imu_time = frame_time + offset
    accel_bias: np.ndarray  # (3,) g
    gyro_bias: np.ndarray  # (3,) rad/s
    accel_noise: float  # g, white noise std per sample
    gyro_noise: float  # rad/s, per sample
    lever_arm: tuple[float, float, float] = (0.0, 0.0, 0.0)  # m, the IMU's position in the camera frame


def make_imu_model(rng: np.random.Generator, offset: float,
                   lever_arm: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> ImuModel:
    tilt = rng.normal(0.0, 1.0, 3)
    tilt *= np.deg2rad(rng.uniform(2.0, 5.0)) / np.linalg.norm(tilt)
    return ImuModel(
        R_imu_cam=_P_IMU_CAM @ so3_exp(tilt),
        offset=float(offset),
        accel_bias=rng.uniform(-0.01, 0.01, 3),
        gyro_bias=rng.uniform(-0.005, 0.005, 3),
        accel_noise=0.002,
        gyro_noise=0.0015,
        lever_arm=lever_arm,
    )


def imu_timestamps(capture_start: float, stop: float, phase: float, duration_factor: float = 1.0) -> np.ndarray:
    """Epoch stamps (`Date().timeIntervalSince1970` in the CoreMotion handler) on a
    200 Hz grid from `capture_start + phase` (phase in [0, 5 ms): the first update
    after startRecordingIMU) up to `stop`, or, with `duration_factor` < 1, up to that
    fraction of the capture (a session whose IMU stops early)."""
    end = capture_start + (stop - capture_start) * duration_factor
    n = int(np.floor((end - capture_start - phase) * IMU_RATE + 1e-9)) + 1
    return capture_start + phase + np.arange(max(n, 0), dtype=np.float64) / IMU_RATE


def synth_imu(
    rng: np.random.Generator, traj: Trajectory, model: ImuModel, tau: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(accel g, gyro rad/s), each (N,3) in the IMU frame at IMU-clock stamps tau:
    exact values from the trajectory function plus constant bias and white noise. With a
    lever arm r the accelerometer is at the camera centre + R_wc r and measures
    a + alpha x r + omega x (omega x r) (alpha by a central difference of omega, 1 ms)."""
    t = tau - model.offset
    R_wc = traj.rotation(t)
    a_world = traj.acceleration(t)  # m/s^2, gravity excluded
    a_cam = np.einsum("nji,nj->ni", R_wc, a_world)  # R_wc^T a
    omega = traj.angular_velocity(t)
    if any(model.lever_arm):
        r = np.asarray(model.lever_arm)
        alpha = (traj.angular_velocity(t + 1e-3) - traj.angular_velocity(t - 1e-3)) / 2e-3
        a_cam = a_cam + np.cross(alpha, r) + np.cross(omega, np.cross(omega, r))
    accel = (a_cam @ model.R_imu_cam.T) / GRAVITY
    gyro = omega @ model.R_imu_cam.T
    accel = accel + model.accel_bias + rng.normal(0.0, model.accel_noise, accel.shape)
    gyro = gyro + model.gyro_bias + rng.normal(0.0, model.gyro_noise, gyro.shape)
    return accel, gyro
