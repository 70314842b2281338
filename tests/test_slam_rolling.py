"""The rolling shutter taken out of the tracks (`packer/slam/frontend/rolling.py`): the
correction itself, the readout search, and one real fast-motion session with a
20 ms readout through `packer slam` at the defaults (refused before the correction:
its model disagreed with the gyro)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from packer.slam.frontend import rolling
from packer.slam.frontend.tracks import Tracks


def _tracks(points: list[np.ndarray], velocity: list[np.ndarray]) -> Tracks:
    return Tracks(keyframes=list(range(0, 6 * len(points), 6)), points=points,
                  ids=[np.arange(len(p)) for p in points], velocity=velocity, height=360)


def test_each_corner_moves_back_by_its_own_motion_times_its_rows_delay():
    p = np.array([[100.0, 0.0], [200.0, 180.0], [300.0, 360.0]], np.float32)
    v = np.array([[6.0, 0.0], [6.0, 0.0], [0.0, -3.0]], np.float32)  # px per frame
    out = rolling.corrected(_tracks([p], [v]), readout=0.02, fps=60.0)
    # row 0 is read 10 ms before the middle row (0.6 frame at 60 fps), row 360 10 ms after: a corner
    # moving up 3 px per frame was 1.8 px lower at the frame time
    expect = np.array([[100 + 6 * 0.6, 0.0], [200.0, 180.0], [300.0, 360 + 3 * 0.6]])
    np.testing.assert_allclose(out.points[0], expect, atol=1e-4)
    assert rolling.corrected(_tracks([p], [v]), 0.0, 60.0).points[0] is p  # a global shutter: untouched


def test_a_corner_found_at_this_keyframe_takes_the_flow_around_it():
    rng = np.random.default_rng(0)
    p = rng.uniform([0, 0], [480, 360], (60, 2)).astype(np.float32)
    v = np.column_stack([4.0 + 0.01 * p[:, 0], -2.0 + 0.005 * p[:, 1]]).astype(np.float32)  # a smooth field
    truth = v.copy()
    v[:5] = np.nan  # new corners: no motion measured yet
    out = rolling.corrected(_tracks([p], [v]), 0.03, 60.0).points[0]
    want = p - truth * ((p[:, 1] / 360 - 0.5) * 0.03 * 60)[:, None]
    np.testing.assert_allclose(out, want, atol=1e-3)


def test_the_busiest_window_is_where_the_image_moves_most():
    t = np.arange(100) / 10.0
    rates = np.ones(100)
    rates[60:80] = 10.0
    a, b = rolling.busiest_window(t, rates, seconds=3.0)
    assert a <= 60 and b >= 80 and t[b - 1] - t[a] < 3.0
    assert rolling.busiest_window(t[:20], rates[:20], seconds=3.0) == (0, 20)  # shorter than the window: all


@pytest.mark.parametrize("true_ms, floor", [(0.0, 0.008), (0.0, 0.010), (7.0, 0.008), (17.0, 0.005),
                                            (20.0, 0.008), (26.0, 0.008)])
def test_the_readout_search_finds_the_bottom_of_the_curve(true_ms: float, floor: float):
    """The gyro disagreement is the RMS of what the readout's error leaves (linear in
    it: ~3% per 10 ms) and of a floor; three evaluations place its bottom. The floors
    are the bench's: near a global shutter (0.01 at 0 ms) the curve is flat there,
    and a V fitted through it said 2.7 ms for a true 0."""
    rng = np.random.default_rng(1)
    p = rng.uniform([0, 0], [480, 360], (80, 2)).astype(np.float32)
    tr = _tracks([p] * 30, [np.full((80, 2), 8.0, np.float32)] * 30)
    seen: list[float] = []

    def disagreement(win: Tracks, a: int, b: int) -> float:
        shift = float(np.abs(win.points[0][0, 0] - p[0, 0]))  # how far this candidate moved row y0's corner
        readout = shift / (8.0 * abs(p[0, 1] / 360 - 0.5) * 60.0)
        seen.append(readout)
        return float(np.hypot(floor, 3.0 * (readout - true_ms / 1000)))

    got, curve = rolling.estimate_readout(tr, 60.0, disagreement)
    assert len(seen) == 3 and len(curve) == 3
    assert abs(got - true_ms / 1000) < 0.0005, (got, curve)


def test_no_readout_is_measured_when_the_image_barely_moves():
    p = np.array([[240.0, 10.0]] * 40, np.float32)
    tr = _tracks([p] * 10, [np.full((40, 2), 0.01, np.float32)] * 10)

    def disagreement(win: Tracks, a: int, b: int) -> float:
        raise AssertionError("no SfM should run: a readout cannot matter here")

    assert rolling.estimate_readout(tr, 60.0, disagreement) == (0.0, {})


@pytest.mark.slow
def test_fast_motion_with_a_rolling_shutter_is_accepted_at_the_defaults(tmp_path: Path):
    """20 ms readout on real hand speeds: refused before ("shape is distorted", the
    model 2-6% off the gyro); now the readout is found and the scale holds."""
    from packer.effects import CameraEffects
    from packer.synth import synth_session
    from tests.test_slam_hard import _errors, _slam_cli

    d = synth_session(tmp_path / "raw", "session_2026-02-01_100000", 420, 3, motion="fast",
                      effects=CameraEffects(rolling_shutter=0.020), imu_offset=0.25)
    r = _slam_cli(tmp_path / "raw")
    assert r.returncode == 0, r.stdout + r.stderr
    e = _errors(d)
    info = json.loads((d / "metadata.json").read_text())["shardship"]
    assert e["scale_err"] < 0.02 and e["scale_err"] < 3 * info["scale_rel_std"], (e, info["scale_rel_std"])
    assert e["ate"] < 0.01 and e["rot_deg"] < 1.0, e
    assert abs(info["rolling_shutter"] - 0.020) < 0.004, info["rolling_shutter_curve"]


def test_a_corner_new_at_a_keyframe_takes_its_motion_to_the_next_frame():
    from packer.slam.frontend.tracks import _fill_forward

    v = np.array([[1.0, 2.0], [np.nan, np.nan], [np.nan, np.nan]], np.float32)
    ids = np.array([10, 11, 12])
    _fill_forward(v, ids, live_ids=np.array([10, 12, 13]), step=np.array([[9.0, 9.0], [3.0, -4.0], [7.0, 7.0]]))
    np.testing.assert_allclose(v[0], [1.0, 2.0])  # measured from the frame before: kept
    assert np.isnan(v[1]).all()  # died before the next frame: the flow field fills it later
    np.testing.assert_allclose(v[2], [3.0, -4.0])
