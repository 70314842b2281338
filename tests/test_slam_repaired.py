"""The repair in parts (`packer.slam.repair.repaired`): which stretches a repaired model left
out are mapped alone, and how parts in their own units are joined in one world, on
small problems with known truth (the pipeline's route through it is in the bench:
every-effect seeds 10 and 40, whose re-mapped model splits)."""
from __future__ import annotations

import numpy as np
import pytest

from packer.slam.mapping.colmap import SfmModel
from packer.slam.repair.gyro_repair import RepairFailed
from packer.slam.repair.repaired import join_parts, left_out
from packer.slam.rotations import so3_exp, umeyama
from packer.slam.scale.viba_scale import join_rel_std

STEP = 6  # frames per keyframe (0.1 s at 60 fps)


@pytest.mark.parametrize(("placed", "n", "expected"), [
    (np.arange(50, 98), 101, [(0, 56)]),  # seed 40: the later half registered
    (np.arange(0, 47), 101, [(41, 101)]),  # the earlier half
    (np.arange(25, 70), 101, [(0, 31), (64, 101)]),  # a middle part: both ends mapped alone
    (np.arange(17, 44), 101, [(38, 101)]),  # 17 left out before it: too short to map alone
    (np.arange(5, 90), 101, []),
    (np.arange(0), 101, []),  # nothing placed: nothing to map the rest with
])
def test_the_stretches_left_out_are_mapped_with_some_of_the_placed_keyframes(placed, n, expected):
    assert left_out(placed, n, min_part=20, overlap=6) == expected


def _truth(n: int = 60, n_points: int = 40, seed: int = 0) -> dict:
    """Keyframes every 0.1 s on a path at constant velocity (the join across a gap is
    then exact), turning as a hand does, and points around it."""
    rng = np.random.default_rng(seed)
    t = 0.1 * np.arange(n)
    c = np.array([0.2, -0.1, 0.05]) + t[:, None] * np.array([0.3, 0.1, -0.2])
    R = so3_exp(np.column_stack([0.3 * np.sin(t), 0.2 * np.cos(1.3 * t), 0.1 * t]))
    return {"times": np.arange(n * STEP) / 60.0, "pos": STEP * np.arange(n), "c": c, "R": R,
            "X": rng.uniform(-2, 2, (n_points, 3)) + np.array([0, 0, 3.0])}


def _part(tr: dict, ks: np.ndarray, pts: np.ndarray, s: float, o: np.ndarray) -> tuple:
    """A part's (frame positions, camera-to-world, model) in its own units: x = (world - o) / s,
    each keyframe seeing every one of `pts`."""
    T = np.tile(np.eye(4), (len(ks), 1, 1))
    T[:, :3, :3], T[:, :3, 3] = tr["R"][ks], (tr["c"][ks] - o) / s
    R_cw = np.swapaxes(T[:, :3, :3], -1, -2)
    obs_image = np.repeat(np.arange(len(ks)), len(pts))
    obs_point = np.tile(np.arange(len(pts)), len(ks))
    m = SfmModel(names=[f"{int(tr['pos'][k]):06d}.jpg" for k in ks], R_cw=R_cw,
                 t_cw=-np.einsum("nij,nj->ni", R_cw, T[:, :3, 3]), reprojection_error=0.5, n_points=len(pts),
                 median_depth=3.0, camera=[400.0, 240.0, 180.0, 0.0], check_R_wc=T[:, :3, :3] + 0.0,
                 points_xyz=(tr["X"][pts] - o) / s, obs_image=obs_image.astype(np.int32),
                 obs_point=obs_point.astype(np.int32),
                 obs_xy=np.column_stack([obs_image, obs_point]).astype(np.float32))  # tags, to follow them
    return tr["pos"][ks], T, m


@pytest.mark.parametrize("later", [range(33, 60), range(27, 60)], ids=["a gap of 0.5 s", "4 keyframes shared"])
def test_parts_in_their_own_units_join_in_the_first_ones_units_with_their_points(later):
    tr = _truth()
    early, late = np.arange(0, 31), np.array(list(later))
    s_a, s_b = 0.05, 0.08  # metres per unit of each part
    a = _part(tr, early, np.arange(0, 25), s_a, np.array([1.0, 2.0, 3.0]))
    b = _part(tr, late, np.arange(15, 40), s_b, np.array([-4.0, 0.5, 1.0]))
    pos, T, m, how, joins = join_parts(tr["times"], [b, a], [s_b, s_a])  # the repaired (later) part comes first

    ks = np.union1d(early, late)
    np.testing.assert_array_equal(pos, tr["pos"][ks])
    world = T[:, :3, 3] * s_a  # in metres, one offset from the truth
    np.testing.assert_allclose(world - world[0], tr["c"][ks] - tr["c"][ks[0]], atol=1e-9)
    np.testing.assert_allclose(T[:, :3, :3], tr["R"][ks], atol=1e-12)
    np.testing.assert_allclose(m.check_R_wc, tr["R"][ks], atol=1e-12)
    assert m.names == [f"{int(p):06d}.jpg" for p in pos]
    # every observation still names its own image and point, and the point sits where it does
    for part, ids in ((a, np.arange(0, 25)), (b, np.arange(15, 40))):
        rows = np.flatnonzero(np.isin(np.array(m.names)[m.obs_image], part[2].names))
        rows = rows[np.isin(m.obs_point[rows], np.arange(25) + (0 if part is a else 25))]
        assert len(rows) == len(part[2].obs_image)
        tag_img, tag_pt = m.obs_xy[rows, 0].astype(int), m.obs_xy[rows, 1].astype(int)
        assert [m.names[i] for i in m.obs_image[rows]] == [part[2].names[i] for i in tag_img]
        got = m.points_xyz[m.obs_point[rows]] * s_a - (world[0] - tr["c"][ks[0]])
        np.testing.assert_allclose(got, tr["X"][ids[tag_pt]], atol=1e-9)
    assert joins == (31,)  # the later part's first keyframe of its own
    assert how[1] == "the first" and ("gap" in how[0] if later.start == 33 else "4 shared" in how[0])
    R_wc = np.swapaxes(m.R_cw, -1, -2)
    np.testing.assert_allclose(-np.einsum("nij,nj->ni", R_wc, m.t_cw), T[:, :3, 3], atol=1e-12)


def test_a_part_that_neither_shares_nor_follows_is_not_joined():
    tr = _truth()
    a = _part(tr, np.arange(0, 30), np.arange(10), 0.05, np.zeros(3))
    b = _part(tr, np.array([0]), np.arange(10, 20), 0.05, np.zeros(3))
    c = _part(tr, np.array([40]), np.arange(10, 20), 0.05, np.zeros(3))
    with pytest.raises(RepairFailed, match="neither shares keyframes"):
        join_parts(tr["times"], [a, c], [0.05, 0.05])  # one keyframe after the gap: no velocity
    pos, _T, _m, how, joins = join_parts(tr["times"], [a, b], [0.05, 0.05])
    assert len(pos) == 30 and "1 shared" in how[1] and joins == ()


def test_the_std_a_join_adds_is_the_scale_an_offset_there_moves():
    """`join_rel_std` against the scale of a similarity fit recomputed with the later
    part moved by the offset along the direction it names."""
    rng = np.random.default_rng(3)
    c = np.cumsum(rng.normal(0, 0.02, (80, 3)), axis=0)
    j, d = 50, 0.01
    after = np.arange(80) >= j
    std = join_rel_std(c, (after,), d)
    dev = c - c.mean(0)
    g = dev[j:].sum(0)
    moved = c.copy()
    moved[j:] += d * g / np.linalg.norm(g)
    s, _R, _t = umeyama(c, moved)
    assert std > 0.001 and abs(s - 1) == pytest.approx(std, rel=0.02)
    assert join_rel_std(c, (), d) == 0.0
    assert join_rel_std(c, (after, after), d) == pytest.approx(std * np.sqrt(2))
    # a part the IMU placed between two the images tie: its offset moves it alone
    middle = (np.arange(80) >= 30) & (np.arange(80) < 50)
    g = dev[middle].sum(0)
    moved = c.copy()
    moved[middle] += d * g / np.linalg.norm(g)
    s, _R, _t = umeyama(c, moved)
    assert abs(s - 1) == pytest.approx(join_rel_std(c, (middle,), d), rel=0.02)


def test_a_part_placed_across_a_longer_gap_gets_a_larger_offset():
    """`join_offsets`: JOIN_OFFSET up to JOIN_GAP, then in proportion to the gap; per-join
    offsets in `join_rel_std` add in quadrature like equal ones."""
    from packer.slam.repair.repaired import JOIN_GAP, JOIN_OFFSET, join_offsets

    ts = np.array([0.0, 0.1, 0.2, 0.2 + JOIN_GAP / 2, 0.3 + JOIN_GAP / 2, 0.4 + 2.5 * JOIN_GAP, 0.5 + 2.5 * JOIN_GAP])
    assert join_offsets(ts, (3, 5)) == pytest.approx((JOIN_OFFSET, JOIN_OFFSET * (2 * JOIN_GAP + 0.1) / JOIN_GAP))
    c = np.column_stack([np.linspace(0, 1, 7), np.sin(np.arange(7.0)), np.zeros(7)])
    at3, at5 = np.arange(7) >= 3, np.arange(7) >= 5
    assert join_rel_std(c, (at3, at5), (0.02, 0.02)) == pytest.approx(join_rel_std(c, (at3, at5), 0.02))
    one = join_rel_std(c, (at5,), 0.05)
    assert join_rel_std(c, (at3, at5), (0.0, 0.05)) == pytest.approx(one)
