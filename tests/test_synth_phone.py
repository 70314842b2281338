"""`packer synth`'s phone build (`PhoneRig`: the IMU off the optical centre, a later
first frame, an off-centre principal point), its vigorous motion and its photo room:
what the hard profiles fast-phone and photos render, checked against their truth."""
from __future__ import annotations

import json

import numpy as np
import pytest

from packer.effects import PHONE_RIGS, PROFILES, CameraEffects, PhoneRig
from packer.session import load_imu, load_session
from packer.synth import synth_session, truth
from packer.synth.trajectory import make_vigorous_trajectory


def test_the_default_phone_draws_nothing_and_a_rig_draws_per_seed(tmp_path):
    """No rig: the truth has no phone_rig and the IMU starts 10-40 ms before frame 0 as
    before; the fast-phone rig: a lever arm of 4-8 cm, 0.05-0.3 s more lead, a principal
    point 7.5-15 px off the centre that calib.txt carries, all from the seed."""
    plain = synth_session(tmp_path / "a", "session_2026-01-01_120000", 30, seed=3)
    assert "phone_rig" not in json.loads((plain / "synth_truth.json").read_text())
    rig = PHONE_RIGS["fast-phone"]
    d = synth_session(tmp_path / "b", "session_2026-01-01_120000", 30, seed=3, rig=rig)
    again = synth_session(tmp_path / "c", "session_2026-01-01_120000", 30, seed=3, rig=rig)
    tr = truth(d)
    ph = tr["phone_rig"]
    assert 0.5 * rig.lever_arm <= np.linalg.norm(ph["lever_arm"]) <= rig.lever_arm
    assert rig.imu_lead[0] <= ph["imu_lead"] <= rig.imu_lead[1]
    assert 0.5 * rig.principal_offset <= np.hypot(*ph["principal_offset"]) <= rig.principal_offset
    assert tr["frame0_epoch"] - tr["capture_start_epoch"] >= 0.010 + ph["imu_lead"] - 1e-9
    cx, cy = (float(v) for v in (d / "calib.txt").read_text().split()[2:])
    assert abs(cx - 240 - ph["principal_offset"][0]) < 1e-3 and abs(cy - 180 - ph["principal_offset"][1]) < 1e-3
    assert (d / "imu.json").read_bytes() == (again / "imu.json").read_bytes()
    assert (d / "rgb" / "000010.jpg").read_bytes() == (again / "rgb" / "000010.jpg").read_bytes()
    assert (d / "imu.json").read_bytes() != (plain / "imu.json").read_bytes()  # the lever arm moves the samples


def test_vigorous_motion_is_as_fast_as_the_session_made_elsewhere():
    """~1 g peaks, ~2.5-3.5 rad/s, 26-34 m in 30 s (that session: ~1 g, ~2.5 rad/s, 39 m)."""
    for seed in range(4):
        traj = make_vigorous_trajectory(np.random.default_rng(seed), np.zeros(3), np.array([0.0, 0.9, -0.5]))
        t = np.arange(0.0, 30.0, 0.005)
        a = np.linalg.norm(traj.acceleration(t), axis=1) / 9.80665
        w = np.linalg.norm(traj.angular_velocity(t[::10]), axis=1)
        path = float(np.sum(np.linalg.norm(np.diff(traj.position(t), axis=0), axis=1)))
        assert 0.8 < a.max() < 1.5 and np.median(a) > 0.25, (seed, a.max())
        assert 2.3 < w.max() < 4.0, (seed, w.max())
        assert 20 < path < 45, (seed, path)


def test_a_vigorous_hands_samples_carry_no_gravity(tmp_path):
    """The app's userAcceleration: the median |a| of a vigorous hand nears 0.5 g, but
    in one frame (the gyro's) the samples average out (no gravity's constant 1 g)."""
    motion, fx = PROFILES["fast-phone"]
    d = synth_session(tmp_path, "session_2026-01-01_120000", 300, seed=8, motion=motion, effects=fx,
                      rig=PHONE_RIGS["fast-phone"])
    imu = load_imu(load_session(d))
    from packer.slam.inertial.imu_align import ImuTrack
    from packer.slam.scale.scale import GRAVITY, detect_accel_mode

    assert np.median(np.linalg.norm(imu.accel, axis=1)) > 0.35
    assert detect_accel_mode(imu.accel, ImuTrack(imu.t, imu.accel * GRAVITY, imu.gyro)) == "removed"


def test_the_photo_room_is_papered_with_photographs(tmp_path):
    pytest.importorskip("skimage")
    from packer.synth.photos import load_photos, photo_texture

    assert len(load_photos()) >= 12
    tex = photo_texture(np.random.default_rng(0), 300, 500, 0.004)  # 1.2 x 2 m of wall
    assert tex.shape == (300, 500, 3) and tex.std() > 30
    motion, fx = PROFILES["photos"]
    assert fx.photos and fx.glove and not fx.low_texture
    d = synth_session(tmp_path, "session_2026-01-01_120000", 10, seed=3, motion=motion, effects=fx,
                      rig=PHONE_RIGS["photos"])
    tr = json.loads((d / "synth_truth.json").read_text())
    assert tr["camera_effects"]["photos"] is True and "phone_rig" in tr
    # and the effects of every earlier session describe themselves as before (no photos key)
    assert "photos" not in CameraEffects(glove=True).describe() and not PhoneRig().any


def test_without_scikit_image_the_photo_room_says_what_to_install(monkeypatch):
    import importlib.resources

    from packer.synth import photos
    from shardship.errors import ShardshipError

    def missing(name):
        raise ModuleNotFoundError(name)

    photos.load_photos.cache_clear()
    monkeypatch.setattr(importlib.resources, "files", missing)
    with pytest.raises(ShardshipError, match="pip install scikit-image"):
        photos.load_photos()
    photos.load_photos.cache_clear()
