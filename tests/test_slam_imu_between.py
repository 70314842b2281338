"""Poses between keyframes from the IMU (`packer.slam.poses.imu_between`) on a fast hand
path of `packer.synth` with its exact IMU (200 Hz, bias, noise, a clock offset, a
camera-IMU rotation), keyframes every 0.1 s with a 0.4 s gap where some did not
register; against the cubic the stage drew before."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from packer.session import Imu
from packer.slam.poses.imu_between import ImuCalibration, imu_between
from packer.slam.poses.interpolate import INTERPOLATED, REGISTERED, interpolate_poses
from packer.slam.rotations import so3_log
from packer.synth.imu import make_imu_model
from packer.synth.trajectory import GRAVITY, make_fast_trajectory

FPS, RATE, OFFSET = 60.0, 200.0, 0.25


@pytest.fixture(scope="module")
def hand() -> dict:
    traj = make_fast_trajectory(np.random.default_rng(5), np.zeros(3), np.array([0.1, 0.7, -0.4]), duration=4.0)
    m = make_imu_model(np.random.default_rng(6), OFFSET)
    rng = np.random.default_rng(7)
    tf = np.arange(int(3.5 * FPS)) / FPS
    tau = np.arange(0.0, 3.4, 1 / RATE) + OFFSET  # the IMU stops before the last frames, as the app's may
    R_c = traj.rotation(tau - OFFSET)
    acc = np.einsum("nji,nj->ni", R_c, traj.acceleration(tau - OFFSET)) @ m.R_imu_cam.T / GRAVITY
    gyr = traj.angular_velocity(tau - OFFSET) @ m.R_imu_cam.T
    imu = Imu(tau, acc + m.accel_bias + rng.normal(0, m.accel_noise, acc.shape),
              gyr + m.gyro_bias + rng.normal(0, m.gyro_noise, gyr.shape))
    T = np.tile(np.eye(4), (len(tf), 1, 1))
    T[:, :3, :3], T[:, :3, 3] = traj.rotation(tf), traj.position(tf)
    key = [k for k in range(0, len(tf), 6) if not 90 <= k < 114]  # 1.5-1.9 s did not register
    cal = ImuCalibration(OFFSET, m.R_imu_cam, m.gyro_bias, 1.0, GRAVITY * m.accel_bias, True)
    return {"tf": tf, "T": T, "key": np.array(key), "imu": imu, "cal": cal}


def _errors(P: np.ndarray, T: np.ndarray, sel: np.ndarray) -> tuple[float, float]:
    """(position RMS mm, rotation RMS deg) of the frames `sel`."""
    pos = 1000 * np.sqrt(np.mean(np.sum((P[sel, :3, 3] - T[sel, :3, 3]) ** 2, axis=1)))
    dR = np.swapaxes(T[sel, :3, :3], -1, -2) @ P[sel, :3, :3]
    return float(pos), float(np.degrees(np.sqrt(np.mean(np.sum(so3_log(dR) ** 2, axis=1)))))


def test_frames_between_keyframes_follow_the_imu_through_a_gap(hand):
    tf, T, key, imu = hand["tf"], hand["T"], hand["key"], hand["imu"]
    cubic, flags = interpolate_poses(tf, tf[key], T[key])
    P = imu_between(tf, cubic, flags, tf[key], T[key], imu, hand["cal"])
    covered = (flags == INTERPOLATED) & (tf < tf[key][tf[key] <= imu.t[-1] - OFFSET][-1])
    gap = covered & (tf > tf[84]) & (tf < tf[114])
    pos_c, rot_c = _errors(cubic, T, gap)
    pos_i, rot_i = _errors(P, T, gap)
    # measured: the cubic 9.8 mm and 1.9 deg RMS in the gap, the IMU 0.03 mm and 0.003 deg
    assert rot_i < 0.02 and rot_i < rot_c / 10, (rot_i, rot_c)
    assert pos_i < 0.2 and pos_i < pos_c / 10, (pos_i, pos_c)
    rest = covered & ~gap  # 0.1 s apart: the cubic 0.3 mm and 0.18 deg, the IMU 0.01 mm and 0.002 deg
    assert _errors(P, T, rest)[1] < 0.02 and _errors(P, T, rest)[0] < 0.05
    np.testing.assert_array_equal(P[flags == REGISTERED], cubic[flags == REGISTERED])
    beyond = (flags == INTERPOLATED) & ~covered  # past the IMU's end: the cubic's, as before
    assert beyond.any()
    np.testing.assert_array_equal(P[beyond], cubic[beyond])


def test_a_raw_accelerometer_keeps_the_cubics_positions_and_takes_the_gyros_turns(hand):
    tf, T, key, imu = hand["tf"], hand["T"], hand["key"], hand["imu"]
    cubic, flags = interpolate_poses(tf, tf[key], T[key])
    P = imu_between(tf, cubic, flags, tf[key], T[key], imu, dataclasses.replace(hand["cal"], gravity_removed=False))
    np.testing.assert_array_equal(P[:, :3, 3], cubic[:, :3, 3])
    inside = (flags == INTERPOLATED) & (tf > tf[84]) & (tf < tf[114])
    assert _errors(P, T, inside)[1] < 0.1 < _errors(cubic, T, inside)[1]


def test_the_calibration_comes_from_the_metadata_or_not_at_all():
    assert ImuCalibration.from_info({"method": "marker"}) is None
    cal = ImuCalibration.from_info({"imu_offset": 1.5, "R_imu_cam": np.eye(3).tolist(), "gyro_bias": [0, 0, 0.1],
                                    "accel_sign": -1.0, "accel_bias": None, "accel_mode": "raw"})
    assert cal is not None and cal.offset == 1.5 and cal.accel_sign == -1.0 and not cal.gravity_removed
    assert cal.accel_bias is None and cal.gyro_bias[2] == 0.1
