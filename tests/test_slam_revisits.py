"""`revisits`: the same corner seen again from another part, found by descriptor and
verified on the gyro's rotation."""
from __future__ import annotations

import numpy as np

from packer.slam.frontend.tracks import Tracks
from packer.slam.mapping.revisits import MIN_INLIERS, candidate_pairs, mutual_matches, renamed, verified
from packer.slam.rotations import so3_exp


def test_keyframes_are_paired_across_parts_or_far_apart_in_time_when_they_look_the_same_way():
    yaw = np.radians([0, 5, 40, 3, 80, 42])
    R = so3_exp(np.column_stack([np.zeros(6), yaw, np.zeros(6)]))
    seg = np.array([0, 0, 0, 1, 1, 1])
    pairs = candidate_pairs(R, seg, 15.0)
    assert (0, 3) in pairs and (1, 3) in pairs and (2, 5) in pairs
    assert all(seg[a] != seg[b] for a, b in pairs)  # within a part only with the times given
    assert not any(4 in p for p in pairs)  # 80 deg: nothing looks that way
    ts = np.array([0.0, 0.5, 1.0, 3.0, 3.5, 4.0])
    one = candidate_pairs(R, np.zeros(6, np.int64), 15.0, ts, 2.0)
    assert (0, 3) in one and (2, 5) in one and (0, 1) not in one  # 0.5 s apart: the tracks tie those already


def test_mutual_matches_pass_the_ratio_test_both_ways_and_skip_empty_descriptors():
    rng = np.random.default_rng(1)
    da = rng.normal(size=(30, 128)).astype(np.float32)
    perm = rng.permutation(30)
    db = da[perm] + rng.normal(0, 0.05, (30, 128)).astype(np.float32)
    m = mutual_matches(da, db)
    assert len(m) == 30 and np.array_equal(perm[m[:, 1]], m[:, 0])
    da[3] = 0  # a corner at the border: no descriptor
    assert 3 not in mutual_matches(da, db)[:, 0]
    twin = np.vstack([db, db[:1]])  # two equally good candidates: ambiguous, dropped
    assert perm[0] not in mutual_matches(da, twin)[:, 0]


def test_matches_are_verified_on_the_known_rotation():
    rng = np.random.default_rng(2)
    X = np.column_stack([rng.uniform(-1, 1, 60), rng.uniform(-0.7, 0.7, 60), rng.uniform(2, 4, 60)])
    R = so3_exp(np.array([[0.02, 0.1, -0.03]]))[0]  # cam_b from cam_a
    t = np.array([0.3, 0.0, 0.05])
    xa = X / X[:, 2:]
    Xb = X @ R.T + t
    xb = Xb / Xb[:, 2:]
    xb[:15, :2] = xb[rng.permutation(15), :2] + 0.05  # a quarter matched wrong
    ok = verified(xa, xb, R, 400.0, np.random.default_rng(0))
    assert ok[15:].all() and ok[:15].sum() <= 2
    assert not verified(xa[:MIN_INLIERS - 1], xb[:MIN_INLIERS - 1], R, 400.0, np.random.default_rng(0)).any()


def test_renamed_tracks_carry_the_id_of_the_corner_they_are():
    tr = Tracks(keyframes=[0, 6], points=[np.zeros((2, 2), np.float32)] * 2,
                ids=[np.array([4, 9]), np.array([9, 11])], velocity=[np.zeros((2, 2), np.float32)] * 2, height=360)
    assert renamed(tr, {}) is tr
    assert [r.tolist() for r in renamed(tr, {11: 4, 9: 4}).ids] == [[4, 4], [4, 4]]
