"""A long session mapped in overlapping parts (packer/slam/mapping/chunks.py): the parts cover
every keyframe, a join recovers the similarity between two parts from their shared
points, a join the shared cameras contradict is refused (a separate model, never
glued on), and on a real reconstruction the memory of a long session stays that of
one part while the scale stays right."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from packer.slam.mapping.chunks import ChunkOptions, chunk_ranges, join
from packer.slam.mapping.colmap import SfmModel
from packer.slam.rotations import make_pose, so3_exp

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("n,chunk,overlap", [(901, 400, 40), (3001, 400, 40), (401, 400, 40), (1000, 100, 20),
                                             (120, 100, 10)])
def test_parts_cover_every_keyframe_share_the_overlap_and_stay_under_the_size(n: int, chunk: int, overlap: int) -> None:
    r = chunk_ranges(n, chunk, overlap)
    assert r[0][0] == 0 and r[-1][1] == n
    assert all(b - a <= chunk for a, b in r)
    assert all(r[i][1] - r[i + 1][0] == overlap for i in range(len(r) - 1))
    sizes = [b - a for a, b in r]
    assert max(sizes) - min(sizes) <= 1  # about equal: no 5-keyframe tail mapped on its own


def test_a_session_within_one_part_is_not_split() -> None:
    assert chunk_ranges(400, 400, 40) == [(0, 400)]
    assert chunk_ranges(5000, 0, 40) == [(0, 5000)]
    with pytest.raises(ValueError, match="overlap"):
        chunk_ranges(1000, 100, 60)


def _scene(rng: np.random.Generator, n_cams: int = 30, n_pts: int = 300,
           step: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """Camera-to-world poses along a short path looking at +z, and points in front."""
    poses = np.stack([make_pose(so3_exp(rng.normal(0, 0.05, 3)),
                                np.array([step * i, 0.2 * step * i + rng.normal(0, step), 0.0]))
                      for i in range(n_cams)])
    pts = rng.uniform([-1.5, -1.0, 2.0], [2.0, 1.0, 4.0], (n_pts, 3))
    return poses, pts


def _model(names: list[str], c2w: np.ndarray, pts: np.ndarray, pt_ids: np.ndarray) -> SfmModel:
    """An SfmModel seeing `pts` (ids `pt_ids` in the scene) from every camera. A
    keypoint's position stands for its identity (in the real thing both parts are
    given the same tracked corners of a shared keyframe): (point id, frame number)."""
    R_cw = np.swapaxes(c2w[:, :3, :3], 1, 2)
    t_cw = -np.einsum("nij,nj->ni", R_cw, c2w[:, :3, 3])
    obs_i, obs_p, obs_xy = [], [], []
    for i, name in enumerate(names):
        obs_i += [i] * len(pts)
        obs_p += list(range(len(pts)))
        obs_xy.append(np.stack([pt_ids + 0.25, np.full(len(pts), int(name[:6]) + 0.5)], axis=1))
    return SfmModel(names=names, R_cw=R_cw, t_cw=t_cw, reprojection_error=0.3, n_points=len(pts), median_depth=3.0,
                    camera=[300.0, 240.0, 180.0, 0.0], points_xyz=pts, obs_image=np.array(obs_i, np.int32),
                    obs_point=np.array(obs_p, np.int32), obs_xy=np.concatenate(obs_xy).astype(np.float32))


def _similar(poses: np.ndarray, pts: np.ndarray, s: float, R: np.ndarray,
             t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Poses and points in the frame x' = s R x + t (what a part's own SfM frame is)."""
    out = poses.copy()
    out[:, :3, :3] = R @ poses[:, :3, :3]
    out[:, :3, 3] = s * poses[:, :3, 3] @ R.T + t
    return out, s * pts @ R.T + t


def _two_parts(rng: np.random.Generator, noise: float = 0.0, step: float = 0.05):
    """Keyframes 0-19 in the scene's frame and 8-29 (12 shared) in a similar one,
    each camera with `noise` (m) of its own error, as two SfM runs give."""
    poses, pts = _scene(rng, step=step)
    noisy = poses.copy()
    noisy[:, :3, 3] += rng.normal(0, noise, (len(poses), 3))
    ids = np.arange(len(pts))
    names = [f"{i:06d}.jpg" for i in range(len(poses))]
    a = _model(names[:20], poses[:20], pts, ids)
    R = so3_exp(np.array([0.3, -0.2, 0.5]))
    pb, xb = _similar(noisy[8:], pts, 0.37, R, np.array([1.0, -2.0, 0.5]))
    b = _model(names[8:], pb, xb, ids)
    return poses, a, b


def test_a_join_brings_the_second_part_into_the_first_ones_frame() -> None:
    poses, a, b = _two_parts(np.random.default_rng(0), noise=0.002)
    merged, stats = join(a, b, ChunkOptions())
    assert stats["joined"] and stats["shared_keyframes"] == 12, stats
    assert stats["scale"] == pytest.approx(1 / 0.37, rel=0.01)
    assert merged.names == [f"{i:06d}.jpg" for i in range(30)]
    np.testing.assert_allclose(merged.camera_to_world()[:, :3, 3], poses[:, :3, 3], atol=0.01)
    np.testing.assert_allclose(merged.camera_to_world()[:, :3, :3], poses[:, :3, :3], atol=1e-6)
    np.testing.assert_allclose(merged.points_xyz[300:], merged.points_xyz[:300], atol=0.01)  # b's points land on a's
    # each keyframe's observations come from one part only: none counted twice in the bundle adjustment
    assert np.all(np.bincount(merged.obs_image, minlength=30) == 300)


def test_a_join_the_shared_cameras_contradict_is_refused() -> None:
    _poses, a, b = _two_parts(np.random.default_rng(1))
    # the second part bent its first shared cameras 0.1 m (in the scene's metres) aside: a wrong model of
    # that stretch, which no similarity maps onto the first part's
    moved = b.camera_to_world()
    moved[:6, :3, 3] += np.array([0.0, 0.1 * 0.37, 0.0])
    b.R_cw = np.swapaxes(moved[:, :3, :3], 1, 2)
    b.t_cw = -np.einsum("nij,nj->ni", b.R_cw, moved[:, :3, 3])
    same, stats = join(a, b, ChunkOptions())
    assert not stats["joined"] and "disagree" in stats["why"], stats
    assert same is a


def test_a_join_on_cameras_that_barely_move_is_refused() -> None:
    _poses, a, b = _two_parts(np.random.default_rng(2), step=0.0005)  # 6 mm over the shared stretch, 3 m away
    _same, stats = join(a, b, ChunkOptions())
    assert not stats["joined"] and "barely move" in stats["why"], stats


def test_parts_that_share_too_few_keyframes_are_not_joined() -> None:
    _poses, a, b = _two_parts(np.random.default_rng(3))
    keep = [i for i, n in enumerate(b.names) if int(n[:6]) >= 15]  # 5 shared left
    b = replace(b, names=[b.names[i] for i in keep], R_cw=b.R_cw[keep], t_cw=b.t_cw[keep])
    _same, stats = join(a, b, ChunkOptions())
    assert not stats["joined"] and stats["shared_keyframes"] == 5 and "need 10" in stats["why"], stats


_PEAK = r"""
import json, sys
from packer.slam import SlamOptions, slam_session
r = slam_session(sys.argv[1], SlamOptions(force=True, progress=False, chunk_keyframes=int(sys.argv[2]),
                                          chunk_overlap=20, threads=1))
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
print(json.dumps({"status": r.status, "message": r.message, "peak_mb": hwm / 1024,
                  "parts": (r.info or {}).get("sfm_parts")}))
"""


def _slam_peak(session: Path, chunk: int) -> dict:
    out = subprocess.run([sys.executable, "-c", _PEAK, str(session), str(chunk)], capture_output=True, text=True,
                         cwd=ROOT, timeout=600, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_long_session_maps_in_parts_in_the_memory_of_one_part_with_the_right_scale(tmp_path: Path) -> None:
    """30 s (301 keyframes) in parts of at most 100, against 10 s (101 keyframes,
    one part) of the same world: the long one's peak must be the short one's, where
    mapping it whole takes ~330 MB against ~200 (tests fail on a tree without parts)."""
    from bench.slam_hard import accuracy
    from packer.synth import synth_session

    short = synth_session(tmp_path / "s", "session_2026-02-01_100000", 600, seed=3)
    long = synth_session(tmp_path / "l", "session_2026-02-01_110000", 1800, seed=3)
    p_short = _slam_peak(short, 120)
    p_long = _slam_peak(long, 120)
    assert p_short["status"] == "ok" and p_short["parts"] is None, p_short
    assert p_long["status"] == "ok" and "mapped in 3 parts" in p_long["message"], p_long
    assert all(p["joined"] for p in p_long["parts"][1:]), p_long["parts"]
    assert p_long["peak_mb"] <= 1.15 * p_short["peak_mb"] + 20, (p_long["peak_mb"], p_short["peak_mb"])
    acc = accuracy(long, long)
    assert abs(acc["scale_error_pct"]) < 1.0 and acc["ate_pct"] < 0.5 and acc["rot_rms_deg"] < 0.5, acc


def _parts_check(bend: float) -> dict:
    """`_part_scales` on a 60 s session mapped in two parts whose second half the
    join got `bend` too large (continuous at the join, as a join's scale error is)."""
    from packer.session import Imu
    from packer.slam.inertial.imu_align import align_imu
    from packer.slam.options import SlamOptions
    from packer.slam.scale.scale import solve_scale
    from packer.slam.scale.scale_methods import _part_scales
    from tests.scale_sim import Config, session

    s = session(Config("hand 60 s", duration=60.0, amp=1.0), seed=4, draw=0)
    p, kt = s["p"].copy(), s["kt"]
    join = np.searchsorted(kt, 30.0)
    p[join:] = p[join] + (1.0 + bend) * (p[join:] - p[join])
    al = align_imu(kt, s["R"], s["imu_t"], s["gyr"])
    whole = solve_scale(kt, p, s["R"], s["imu_t"], s["acc"], s["gyr"], offset=al.offset, R_ic=al.R_ic,
                        gyro_bias=al.gyro_bias)
    return _part_scales(whole.scale, [(0.0, 32.0), (28.0, 60.0)], kt, p, s["R"],
                        Imu(s["imu_t"], s["acc"], s["gyr"]), al, SlamOptions(), 0.0)


def test_the_parts_own_imu_scales_show_what_a_join_got_wrong() -> None:
    good, bent = _parts_check(0.0), _parts_check(0.04)
    assert good["parts_scale_spread"] < 0.005, good
    # a 4% bend: the parts' scales straddle the whole's, ~2% each side, and the std grows by about that
    assert 0.012 < bent["parts_scale_spread"] < 0.03, bent
    assert bent["part_scales"][0] > 1.01 and bent["part_scales"][1] < 0.99, bent
    assert bent["parts_rel_std"] == pytest.approx(bent["parts_scale_spread"] / np.sqrt(2))


@pytest.mark.parametrize("kw,says", [({"chunk_keyframes": 50}, "chunk_keyframes must be 0 (never split) or >= 100"),
                                     ({"chunk_overlap": 200}, "chunk_overlap must be 10..199 keyframes"),
                                     ({"chunk_overlap": 5}, "chunk_overlap must be 10..199 keyframes")])
def test_bad_part_settings_are_refused_with_what_is_allowed(kw: dict, says: str) -> None:
    from packer.slam.options import SlamOptions
    from shardship.errors import ShardshipError

    with pytest.raises(ShardshipError, match=re.escape(says)):
        SlamOptions(**kw).validate()
    SlamOptions(chunk_keyframes=0, chunk_overlap=5).validate()  # never split: the overlap is not used
