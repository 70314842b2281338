"""`--solver viba`: the visual-inertial bundle adjustment (packer/slam/inertial/viba.py).

The pure parts (rolling-shutter correction, the structure's re-indexing) on
constructed data; the solver end to end on real renders and real pycolmap, as
`packer slam --solver viba` runs it, against the truth. The sweep over seeds is
bench/viba.py (bench/results/viba.md)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from packer.effects import PROFILES
from packer.slam.inertial.viba_inputs import keyframe_structure, rolling_shutter_correct
from packer.slam.mapping.colmap import SfmModel
from packer.slam.rotations import so3_exp
from packer.synth import synth_session, truth
from tests.test_slam_hard import REASONS, _errors, _slam_cli, assert_never_wrong

CAMERA = [400.0, 240.0, 180.0, 0.0]  # f, cx, cy, k1 (480 x 360)


def _rolling_view(P: np.ndarray, omega: np.ndarray, readout: float) -> np.ndarray:
    """Pixels of camera-frame points P (N,3) seen by a rolling shutter turning at
    omega (rad/s, camera frame): row v is read at (v/H - 1/2) readout, when the
    camera has turned by Exp(omega dt), so the row depends on itself (iterated)."""
    f, cx, cy = CAMERA[:3]
    v = cy + f * P[:, 1] / P[:, 2]
    for _ in range(20):
        dt = (v / (2 * cy) - 0.5) * readout
        Q = np.stack([so3_exp(omega * d).T @ p for p, d in zip(P, dt)])
        v = cy + f * Q[:, 1] / Q[:, 2]
    return np.column_stack([cx + f * Q[:, 0] / Q[:, 2], v])


def test_rolling_shutter_correction_puts_observations_back_at_the_frame_time():
    """A camera turning at 2 rad/s with a 20 ms readout moves the top and bottom rows
    by ~15 px against each other; corrected, what remains is second order."""
    rng = np.random.default_rng(0)
    P = np.column_stack([rng.uniform(-1.0, 1.0, 200), rng.uniform(-0.7, 0.7, 200), rng.uniform(1.5, 3.0, 200)])
    f, cx, cy = CAMERA[:3]
    still = np.column_stack([cx + f * P[:, 0] / P[:, 2], cy + f * P[:, 1] / P[:, 2]])
    omega = np.array([0.8, -1.5, 1.0])
    seen = _rolling_view(P, omega, 0.020)
    before = np.abs(seen - still).max()
    fixed = rolling_shutter_correct(seen, np.tile(omega, (len(P), 1)), CAMERA, 0.020)
    after = np.abs(fixed - still).max()
    assert before > 5.0, before
    assert after < 0.05 * before, (before, after)
    assert np.allclose(rolling_shutter_correct(seen, np.tile(omega, (len(P), 1)), CAMERA, 0.0), seen)


def test_the_structure_follows_the_keyframe_order_and_drops_other_images():
    """COLMAP sorts images by name; the pipeline's poses are in time order: every
    observation must name the keyframe of its own image, and images the pipeline
    did not keep must not leak in."""
    m = SfmModel(names=["b.jpg", "a.jpg", "c.jpg"], R_cw=np.tile(np.eye(3), (3, 1, 1)), t_cw=np.zeros((3, 3)),
                 reprojection_error=0.0, n_points=2, median_depth=1.0, points_xyz=np.zeros((2, 3)),
                 obs_image=np.array([0, 1, 2, 1], np.int32), obs_point=np.array([0, 0, 1, 1], np.int32),
                 obs_xy=np.arange(8, dtype=np.float32).reshape(4, 2))
    s = keyframe_structure(m, ["a.jpg", "b.jpg"])  # c.jpg not among the keyframes
    assert s.obs_image.tolist() == [1, 0, 0]
    assert s.obs_point.tolist() == [0, 0, 1]
    assert s.obs_xy[:, 0].tolist() == [0.0, 2.0, 6.0]


def _slam_viba(raw: Path) -> subprocess.CompletedProcess:
    return _slam_cli(raw, "--solver", "viba")


@pytest.mark.slow
@pytest.mark.parametrize("profile, seed", [("low-texture", 1), ("fast", 3)])
def test_viba_gives_the_scale_within_its_std(tmp_path: Path, profile: str, seed: int):
    """A plain room (the windowed solve refuses or mis-states it: its SfM rotations
    disagree with the gyro) and fast hand motion: accepted, within 2% and 3 reported
    std of the truth, the poses the refined ones, the camera's focal length refined."""
    motion, fx = PROFILES[profile]
    d = synth_session(tmp_path / "raw", "session_2026-02-01_100000", 420, seed, motion=motion, effects=fx,
                      imu_offset=0.25)
    r = _slam_viba(tmp_path / "raw")
    assert r.returncode == 0, r.stdout + r.stderr
    e = _errors(d)
    info = json.loads((d / "metadata.json").read_text())["shardship"]
    assert info["solver"] == "viba"
    assert e["scale_err"] < 0.02 and e["scale_err"] < 3 * info["scale_rel_std"], (e, info["scale_rel_std"])
    assert e["ate"] < 0.01, e
    assert e["rot_deg"] < 1.0, e
    assert abs(info["viba_camera"][0] / truth(d)["intrinsics"][0] - 1) < 0.01, info["viba_camera"]
    assert info["viba_imu_chi2"] < 2.0 and info["viba_inliers"] > 0.8, info


@pytest.mark.slow
def test_viba_refuses_a_wrong_model_in_one_line(tmp_path: Path):
    """Every effect at once on fast motion: accepted only within 2% and 3 std,
    else refused with one line naming a reason the README explains."""
    motion, fx = PROFILES["all"]
    d = synth_session(tmp_path / "raw", "session_2026-02-01_100000", 420, 5, motion=motion, effects=fx,
                      imu_offset=0.25)
    r = _slam_viba(tmp_path / "raw")
    assert_never_wrong(d, r, REASONS + ("still disagree",))
    assert "Cheirality" not in r.stdout + r.stderr


@pytest.mark.parametrize("excitation, words", [(1.2, "place the path too loosely"), (0.05, "more translation")])
def test_a_scale_left_uncertain_says_more_translation_only_when_the_imu_saw_little_motion(excitation: float,
                                                                                          words: str):
    """After the bundle adjustment a scale over the std limit is refused; "record with
    more translation" is the fix only where the IMU saw little motion (a 9 m hand path
    with few features needs texture, not more travel)."""
    from packer.session import Session
    from packer.slam.inertial.viba import VibaOptions, VibaResult
    from packer.slam.options import SlamOptions
    from packer.slam.scale.viba_scale import _check
    from shardship.errors import SessionError

    s = Session(Path("/data/raw/session_2026-03-01_100000"), "session_2026-03-01_100000", np.arange(3), [],
                np.arange(3) / 60.0, "index/fps", 60.0, None)
    r = VibaResult(T_wc=np.tile(np.eye(4), (3, 1, 1)), scale=0.05, rel_std=0.03, imu_chi2=0.1, visual_chi2=0.5,
                   reprojection_rms=0.6, inlier_fraction=0.99, n_points=500, n_observations=5000,
                   accel_bias=np.zeros(3), gyro_bias=np.zeros(3), seconds=1.0, camera=CAMERA)
    opts = SlamOptions(progress=False)
    with pytest.raises(SessionError) as e:
        _check(s, opts, VibaOptions(), r, 0.03, excitation)
    assert e.value.path == "imu.json" and words in e.value.reason and "\n" not in e.value.reason, e.value.reason
    assert ("more translation" in e.value.reason) == (excitation < 5 * opts.scale_options.min_excitation)
    _check(s, opts, VibaOptions(), r, 0.015, excitation)  # within the limit: no refusal
    if excitation >= 5 * opts.scale_options.min_excitation:  # parts the IMU alone joined make most of the std
        with pytest.raises(SessionError) as e:
            _check(s, opts, VibaOptions(), r, 0.021, excitation, joins=2, join_std=0.018)
        assert "broke into 3 parts" in e.value.reason and "+-1.8%" in e.value.reason, e.value.reason
        with pytest.raises(SessionError) as e:
            _check(s, opts, VibaOptions(), r, 0.021, excitation, joins=1, join_std=0.005)
        assert "parts" not in e.value.reason and words in e.value.reason, e.value.reason


def test_a_rolling_shutter_correction_adds_its_term_to_the_std_in_proportion_up_to_a_phone_readout():
    """`model_rel_std`: the terms add in quadrature; the readout's grows with the readout
    the observations were corrected for, up to READOUT_REF, and is nothing without one
    (a global shutter, or none measured)."""
    from packer.slam.scale.viba_scale import READOUT_REF, READOUT_REL_STD, model_rel_std

    assert model_rel_std(0.003, 0.004, 0.0, READOUT_REL_STD) == pytest.approx(0.005)
    full = model_rel_std(0.0, 0.0015, READOUT_REF, READOUT_REL_STD)
    assert full == pytest.approx(np.hypot(0.0015, READOUT_REL_STD))
    assert model_rel_std(0.0, 0.0015, 2 * READOUT_REF, READOUT_REL_STD) == pytest.approx(full)
    half = model_rel_std(0.0, 0.0, READOUT_REF / 2, READOUT_REL_STD)
    assert half == pytest.approx(READOUT_REL_STD / 2)
    assert model_rel_std(0.0, 0.0015, READOUT_REF, 0.0) == pytest.approx(0.0015)  # a repaired model: no term
