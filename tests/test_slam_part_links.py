"""`part_links`: a KLT track that crosses a join ties its two parts in the images."""
from __future__ import annotations

import numpy as np

from packer.slam.frontend.tracks import Tracks
from packer.slam.mapping.colmap import SfmModel
from packer.slam.mapping.part_links import (
    imu_joins,
    link_parts,
    observation_tracks,
    point_tracks,
    segments,
    shared_points,
)


def _tracks() -> Tracks:
    """Four keyframes (frames 0, 6, 12, 18); tracks 7 and 9 seen in all four, 5 in the first two."""
    pts = {7: (100.5, 50.25), 9: (200.0, 80.75), 5: (30.5, 30.5)}
    ids = [[7, 9, 5], [7, 9, 5], [7, 9], [7, 9]]
    return Tracks(keyframes=[0, 6, 12, 18],
                  points=[np.array([[pts[i][0] + k, pts[i][1]] for i in row], np.float32) for k, row in enumerate(ids)],
                  ids=[np.array(row, np.int64) for row in ids],
                  velocity=[np.zeros((len(r), 2), np.float32) for r in ids], height=360)


def _model(tr: Tracks, obs: list[tuple[int, int, int]], n_points: int) -> SfmModel:
    """(image, point, track) observations at the track's pixel in that keyframe."""
    xy = [tr.points[i][list(tr.ids[i]).index(t)] for i, _p, t in obs]
    return SfmModel(names=[f"{k}.jpg" for k in range(4)], R_cw=np.tile(np.eye(3), (4, 1, 1)), t_cw=np.zeros((4, 3)),
                    reprojection_error=0.5, n_points=n_points, median_depth=1.0,
                    points_xyz=np.arange(3.0 * n_points).reshape(-1, 3),
                    obs_image=np.array([i for i, _p, _t in obs], np.int32),
                    obs_point=np.array([p for _i, p, _t in obs], np.int32), obs_xy=np.array(xy, np.float32))


def test_each_observation_is_found_on_its_track_and_a_point_keeps_only_one_track():
    tr = _tracks()
    m = _model(tr, [(0, 0, 7), (1, 0, 7), (0, 1, 9), (1, 1, 5)], 2)
    ids = observation_tracks(m.obs_image, m.obs_xy, np.array([0, 6, 12, 18]), tr)
    assert ids.tolist() == [7, 7, 9, 5]
    assert point_tracks(m.obs_point, ids, 2).tolist() == [7, -1]  # point 1 mixes two tracks: it ties nothing
    moved = observation_tracks(m.obs_image, m.obs_xy + 0.5, np.array([0, 6, 12, 18]), tr)
    assert (moved == -1).all()
    assert segments(4, (2,)).tolist() == [0, 0, 1, 1]


def test_one_track_in_two_parts_becomes_one_point_seen_across_the_join():
    tr = _tracks()
    # part A (images 0, 1): points 0 (track 7) and 1 (track 9); part B (images 2, 3): point 2 (track 7)
    m = _model(tr, [(0, 0, 7), (1, 0, 7), (0, 1, 9), (1, 1, 9), (2, 2, 7), (3, 2, 7)], 3)
    linked = link_parts(m, np.array([0, 6, 12, 18]), tr, (2,))
    # track 7 merged, track 9's pixels in part B added to point 1: both parts see both points
    assert shared_points(linked.obs_image, linked.obs_point, segments(4, (2,))).tolist() == [[2, 2], [2, 2]]
    assert shared_points(m.obs_image, m.obs_point, segments(4, (2,))).tolist() == [[0, 0], [0, 0]]  # 2 views each
    assert len(linked.points_xyz) == 2
    assert np.array_equal(linked.points_xyz, m.points_xyz[:2])  # the first part's point keeps its place
    per_point = {p: sorted(linked.obs_image[linked.obs_point == p].tolist()) for p in range(2)}
    assert per_point == {0: [0, 1, 2, 3], 1: [0, 1, 2, 3]}
    img, pt = linked.obs_image, linked.obs_point
    for i, p, xy in zip(img, pt, linked.obs_xy):  # every observation is its track's pixel there
        t = 7 if p == 0 else 9
        assert np.array_equal(xy, tr.points[i][list(tr.ids[i]).index(t)])


def test_without_a_join_or_a_shared_track_nothing_changes():
    tr = _tracks()
    m = _model(tr, [(0, 0, 5), (1, 0, 5), (2, 1, 7), (3, 1, 7)], 2)
    same = link_parts(m, np.array([0, 6, 12, 18]), tr, ())  # one part, no track seen twice: nothing to merge
    for f in ("points_xyz", "obs_image", "obs_point", "obs_xy"):
        assert np.array_equal(getattr(same, f), getattr(m, f)), f
    # track 5 is not seen after the join; point 1 (track 7, part B) gains its part-A pixels: that one link
    linked = link_parts(m, np.array([0, 6, 12, 18]), tr, (2,))
    assert shared_points(linked.obs_image, linked.obs_point, segments(4, (2,)))[0, 1] == 1
    assert sorted(linked.obs_image[linked.obs_point == 0].tolist()) == [0, 1]


def test_the_imu_places_only_the_pieces_the_images_do_not_tie():
    """Four parts (images 0-1, 2-3, 4-5, 6-7; joins at 2, 4, 6)."""
    seg = segments(8, (2, 4, 6))
    none = np.zeros((4, 4), int)
    chain = imu_joins(none, (2, 4, 6), seg, 10)  # nothing tied: each join moves everything after it
    assert [j for j, _m in chain] == [2, 4, 6]
    assert [m.tolist() for _j, m in chain] == [[i >= j for i in range(8)] for j in (2, 4, 6)]
    tied = none.copy()
    tied[0, 2] = tied[2, 0] = 12  # part 2 seen again from part 0: part 1 floats alone, part 3 follows part 2
    out = imu_joins(tied, (2, 4, 6), seg, 10)
    assert [j for j, _m in out] == [2, 6]
    assert out[0][1].tolist() == [False, False, True, True, False, False, False, False]
    assert out[1][1].tolist() == [False] * 6 + [True, True]
    tied[1, 3] = tied[3, 1] = 9  # under the threshold: no change
    assert [j for j, _m in imu_joins(tied, (2, 4, 6), seg, 10)] == [2, 6]
    tied[1, 2] = tied[2, 1] = 10
    assert imu_joins(tied, (2, 4, 6), seg, 10)[0][1].tolist() == [False] * 6 + [True, True]
