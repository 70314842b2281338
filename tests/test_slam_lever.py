"""The IMU off the optical centre (a phone's accelerometer sits a few cm from its
camera): the windowed solve's lever-arm columns and the adjustment's correction, on
exact IMU samples of a vigorous hand path (no rendering: pure and quick)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from packer.slam.inertial.viba import at_camera_centre
from packer.slam.scale.scale import ScaleOptions, solve_scale
from packer.synth.imu import ImuModel, imu_timestamps, make_imu_model, synth_imu
from packer.synth.trajectory import make_vigorous_trajectory

SFM_UNITS = 13.0  # SfM units per metre: the solve must find 1/13


def _session(seed: int, lever: tuple[float, float, float], noise: bool = True, seconds: float = 20.0):
    rng = np.random.default_rng(seed)
    traj = make_vigorous_trajectory(rng, np.zeros(3), np.array([0.0, 0.9, -0.5]))
    model = make_imu_model(rng, offset=100.0, lever_arm=lever)
    if not noise:
        model = dataclasses.replace(model, accel_noise=0.0, gyro_noise=0.0)
    tau = imu_timestamps(100.0 - 0.1, 100.0 + seconds, 0.002)
    accel, gyro = synth_imu(rng, traj, model, tau)
    key_ts = np.arange(0.0, seconds - 0.05, 0.1)
    T = traj.poses(key_ts)
    jitter = rng.normal(0.0, 0.001, (len(key_ts), 3))  # 1 mm of SfM jitter
    return traj, model, tau, accel, gyro, key_ts, SFM_UNITS * (T[:, :3, 3] + jitter), T[:, :3, :3]


def _solve(model: ImuModel, tau, accel, gyro, key_ts, centres, R_wc, lever_arm: bool):
    return solve_scale(key_ts, centres, R_wc, tau, accel, gyro, offset=model.offset, R_ic=model.R_imu_cam,
                       gyro_bias=model.gyro_bias, options=ScaleOptions(lever_arm=lever_arm))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_an_imu_off_the_optical_centre_is_found_and_the_scale_stays_right(seed):
    lever = (0.03, -0.06, 0.01)
    _traj, model, tau, accel, gyro, key_ts, centres, R_wc = _session(seed, lever)
    blind = _solve(model, tau, accel, gyro, key_ts, centres, R_wc, lever_arm=False)
    found = _solve(model, tau, accel, gyro, key_ts, centres, R_wc, lever_arm=True)
    assert found.lever_arm is not None and found.lever_arm_chi2 >= ScaleOptions().lever_arm_min_chi2
    assert np.allclose(found.lever_arm, lever, atol=0.003), found.lever_arm
    assert abs(found.scale * SFM_UNITS - 1.0) < 0.002
    assert abs(found.scale * SFM_UNITS - 1.0) <= 3 * found.rel_std
    # what the stage did before: the lever arm's acceleration read as motion, the scale off
    assert abs(blind.scale * SFM_UNITS - 1.0) > 0.003


@pytest.mark.parametrize("seed", [1, 2])
def test_an_imu_at_the_centre_keeps_the_answer_it_had(seed):
    """No lever arm: the three columns are not significant, so the solve is the one it was,
    to the digit (the sessions of every earlier bench keep their numbers)."""
    _traj, model, tau, accel, gyro, key_ts, centres, R_wc = _session(seed, (0.0, 0.0, 0.0))
    plain = _solve(model, tau, accel, gyro, key_ts, centres, R_wc, lever_arm=False)
    tried = _solve(model, tau, accel, gyro, key_ts, centres, R_wc, lever_arm=True)
    assert tried.lever_arm is None and 0 < tried.lever_arm_chi2 < ScaleOptions().lever_arm_min_chi2
    assert tried.scale == plain.scale and tried.rel_std == plain.rel_std


def test_the_adjustment_sees_the_camera_centre_acceleration():
    """`at_camera_centre` takes the lever arm's tangential and centripetal terms out of
    exact samples: what is left is what an IMU at the centre would have measured."""
    lever = (0.05, -0.04, 0.01)
    _t, model, tau, accel, gyro, *_ = _session(4, lever, noise=False)
    _t0, centre_model, tau0, accel0, _g0, *_ = _session(4, (0.0, 0.0, 0.0), noise=False)
    t = tau - model.offset
    omega = gyro - model.gyro_bias
    G = 9.80665
    raw = (accel - model.accel_bias) * G
    fixed = at_camera_centre(t, raw, omega, model.R_imu_cam @ np.asarray(lever))
    want = (accel0 - centre_model.accel_bias) * G
    inner = slice(2, -2)  # the ends' one-sided differences
    assert np.max(np.abs(raw - want)[inner]) > 0.3  # m/s^2: what the lever arm adds at these speeds
    assert np.max(np.abs(fixed - want)[inner]) < 0.02


def _solved(chi2: float, inliers: float, rms: float):
    from packer.slam.inertial.viba import VibaResult

    return VibaResult(T_wc=np.eye(4)[None], scale=1.0, rel_std=0.01, imu_chi2=chi2, visual_chi2=1.0,
                      reprojection_rms=rms, inlier_fraction=inliers, n_points=100, n_observations=1000,
                      accel_bias=np.zeros(3), gyro_bias=np.zeros(3), seconds=1.0, camera=[400.0, 240.0, 180.0, 0.0])


def test_a_refusal_names_the_side_that_does_not_fit():
    """Images that fit (or a model that turns with the gyro) and an IMU that does not:
    the IMU model is named and "more texture" is not said; images that do not fit get
    the scene's advice."""
    from packer.slam.inertial.viba import VibaOptions
    from packer.slam.scale.viba_scale import disagreement_reason

    vopt = VibaOptions()
    imu_side = disagreement_reason(_solved(21.0, 0.97, 0.4), vopt)
    assert "IMU chi^2/dof 21.00" in imu_side and "the scene is not the cause" in imu_side
    assert "texture" not in imu_side and "--scale marker" in imu_side
    turns = disagreement_reason(_solved(35.4, 0.66, 2.1), vopt, rotations_agree=0.02)
    assert "turns with the gyro (2% disagreement)" in turns and "texture" not in turns
    scene = disagreement_reason(_solved(3.0, 0.5, 2.5), vopt)
    assert "sliding features" in scene and "more texture" in scene


def test_a_vigorous_hand_is_not_read_as_gravity():
    """The app's userAcceleration has no gravity; a vigorous hand's median |a| reaches
    0.5 g (fast-phone seed 8), which the median-norm rule read as gravity (and fitted a
    gravity vector into it: 13-22% off). Turned into one frame by the gyro, gravity is a
    constant ~1 g and a hand's acceleration averages out: that tells them apart."""
    from packer.slam.inertial.imu_align import ImuTrack
    from packer.slam.scale.scale import GRAVITY, detect_accel_mode

    traj, model, tau, accel, gyro, *_ = _session(5, (0.03, -0.06, 0.01))
    t = tau - model.offset
    strong = accel * (0.6 / float(np.median(np.linalg.norm(accel, axis=1))))  # median |a| 0.6 g
    track = ImuTrack(t, strong * GRAVITY, gyro - model.gyro_bias)
    assert detect_accel_mode(strong) == "raw"  # the old rule, fooled
    assert detect_accel_mode(strong, track) == "removed"
    R_wc = traj.rotation(t)
    up = np.einsum("ij,nkj,k->ni", model.R_imu_cam, R_wc, np.array([0.0, 0.0, 1.0]))  # specific force of gravity
    raw = strong + up
    assert detect_accel_mode(raw, ImuTrack(t, raw * GRAVITY, gyro - model.gyro_bias)) == "raw"


def test_gravity_is_still_seen_over_a_long_session_with_a_drifting_gyro():
    """5 minutes of an accelerometer that carries gravity, the device turning about a
    tilted axis, integrated with a gyro 0.005 rad/s off (1.5 rad of drift): stretches of
    20 s keep gravity's ~1 g in view."""
    from packer.slam.inertial.imu_align import ImuTrack
    from packer.slam.scale.scale import GRAVITY, detect_accel_mode
    from packer.synth.trajectory import so3_exp

    t = np.arange(0.0, 300.0, 0.005)
    axis = np.array([0.3, 1.0, 0.2]) / np.linalg.norm([0.3, 1.0, 0.2])
    w = 0.4 * np.sin(0.5 * t)[:, None] * axis  # rad/s, back and forth
    angle = (0.8 * (1 - np.cos(0.5 * t)))[:, None] * axis  # its integral
    g_dev = np.stack([so3_exp(a).T @ np.array([0.0, 0.0, 1.0]) for a in angle])  # gravity's reaction, in g
    track = ImuTrack(t, g_dev * GRAVITY, w + 0.005)
    assert detect_accel_mode(g_dev, track) == "raw"
