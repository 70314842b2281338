"""Sensor streams synthesised from a trajectory: IMU (200 Hz) and gripper encoders.

The IMU follows the StackCapture convention: accelerometer in g with gravity
REMOVED (linear acceleration, i.e. what CoreMotion calls userAcceleration), gyro in
rad/s, both in the device (IMU) frame. The IMU is rigidly rotated from the camera by
`R_imu_cam` (v_imu = R_imu_cam v_cam) with no lever arm (IMU at the optical centre).

Clock convention: imu_time = frame_time + offset. An IMU sample stamped tau
measures the motion at frame-clock time tau - offset.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packer.synth.trajectory import GRAVITY, Trajectory, so3_exp

IMU_RATE = 200.0
ENCODER_RATE = 100.0
ENCODER_KEYS = ("index_mcp", "index_pip", "three_finger_mcp", "three_finger_pip")

# A phone's back camera in landscape: camera x -> -y_imu, camera y -> -x_imu,
# camera z -> -z_imu (a proper rotation, det +1); each session adds a few degrees.
_P_IMU_CAM = np.array([[0.0, -1.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, -1.0]])


@dataclass(frozen=True)
class ImuModel:
    R_imu_cam: np.ndarray  # (3,3)
    offset: float  # s, imu_time = frame_time + offset
    accel_bias: np.ndarray  # (3,) g
    gyro_bias: np.ndarray  # (3,) rad/s
    accel_noise: float  # g, white noise std per sample
    gyro_noise: float  # rad/s, per sample


def make_imu_model(rng: np.random.Generator, offset: float) -> ImuModel:
    tilt = rng.normal(0.0, 1.0, 3)
    tilt *= np.deg2rad(rng.uniform(2.0, 5.0)) / np.linalg.norm(tilt)
    return ImuModel(
        R_imu_cam=_P_IMU_CAM @ so3_exp(tilt),
        offset=float(offset),
        accel_bias=rng.uniform(-0.01, 0.01, 3),
        gyro_bias=rng.uniform(-0.005, 0.005, 3),
        accel_noise=0.002,
        gyro_noise=0.0015,
    )


def imu_timestamps(duration: float, offset: float, duration_factor: float = 1.0) -> np.ndarray:
    """IMU-clock stamps on a regular 200 Hz grid covering the frame span (plus 50 ms
    either side, as a phone starts the IMU a little early), shortened to
    `duration_factor` of the video when asked (a session whose IMU stops early)."""
    start = offset - 0.05
    stop = offset + duration * duration_factor + (0.05 if duration_factor >= 1.0 else 0.0)
    j0, j1 = int(np.ceil(start * IMU_RATE)), int(np.floor(stop * IMU_RATE))
    return np.arange(j0, j1 + 1, dtype=np.float64) / IMU_RATE


def synth_imu(
    rng: np.random.Generator, traj: Trajectory, model: ImuModel, tau: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(accel g, gyro rad/s), each (N,3) in the IMU frame at IMU-clock stamps tau:
    exact values from the trajectory function plus constant bias and white noise."""
    t = tau - model.offset
    R_wc = traj.rotation(t)
    a_world = traj.acceleration(t)  # m/s^2, gravity excluded
    a_cam = np.einsum("nji,nj->ni", R_wc, a_world)  # R_wc^T a
    accel = (a_cam @ model.R_imu_cam.T) / GRAVITY
    gyro = traj.angular_velocity(t) @ model.R_imu_cam.T
    accel = accel + model.accel_bias + rng.normal(0.0, model.accel_noise, accel.shape)
    gyro = gyro + model.gyro_bias + rng.normal(0.0, model.gyro_noise, gyro.shape)
    return accel, gyro


def synth_encoders(rng: np.random.Generator, duration: float) -> tuple[np.ndarray, np.ndarray]:
    """(t (N,), values (N,4)) on the frame clock at 100 Hz: a gripper that opens and
    closes smoothly (tanh-squashed slow sinusoid); the four joints follow the grip
    with their own range, lag and a little sensor noise. Radians."""
    t = np.arange(0.0, duration + 1e-9, 1.0 / ENCODER_RATE)
    f = rng.uniform(0.25, 0.5)
    phase = rng.uniform(0, 2 * np.pi)
    cols = []
    for j in range(len(ENCODER_KEYS)):
        lag = 0.03 * j
        grip = 0.5 + 0.5 * np.tanh(3.0 * np.sin(2 * np.pi * f * (t - lag) + phase))
        lo, span = rng.uniform(0.05, 0.25), rng.uniform(0.7, 1.3)
        cols.append(lo + span * grip + rng.normal(0.0, 0.003, t.shape))
    return t, np.stack(cols, axis=1)
