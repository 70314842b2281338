"""The tracks' rotation chain (`packer.slam.mapping.rotation_chain`): the second try's start when
every gyro alignment on a model is wrong."""
from __future__ import annotations

import numpy as np

from packer.slam.frontend.tracks import Tracks
from packer.slam.mapping.rotation_chain import bearings, chain_rotations, pair_rotation
from packer.slam.rotations import so3_exp, so3_log

CAM = [330.0, 240.0, 180.0, 0.0]


def _project(R_wc: np.ndarray, c: np.ndarray, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pixels of world points X seen by a camera at c (camera-to-world R_wc), and which are in front."""
    Xc = (X - c) @ R_wc
    front = Xc[:, 2] > 0.1
    uv = CAM[0] * Xc[:, :2] / Xc[:, 2:3] + CAM[1:3]
    inside = front & (uv[:, 0] > 0) & (uv[:, 0] < 480) & (uv[:, 1] > 0) & (uv[:, 1] < 360)
    return uv, inside


def _hand(n: int, seed: int, gone: range = range(0), step: float = 0.05) -> tuple[Tracks, np.ndarray]:
    """Keyframes 0.1 s apart of a hand turning ~1.5 rad/s and moving ~0.5 m/s in a room
    1.5-3 m away; in the keyframes `gone` nothing is tracked (a blank wall)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(3000, 3))
    X *= rng.uniform(1.5, 3.0, (3000, 1)) / np.linalg.norm(X, axis=1, keepdims=True)
    R, c = [np.eye(3)], [np.zeros(3)]
    w = rng.normal(size=3)
    for _ in range(n - 1):
        w = 0.8 * w + 0.2 * rng.normal(size=3)
        R.append(R[-1] @ so3_exp((0.15 * w / np.linalg.norm(w))[None])[0])
        c.append(c[-1] + step * rng.normal(size=3))
    ids, pts = [], []
    for k in range(n):
        uv, ok = _project(R[k], c[k], X)
        ok &= np.abs(rng.normal(size=len(X))) < 9 if k not in gone else np.zeros(len(X), bool)
        ids.append(np.flatnonzero(ok))
        pts.append(uv[ok] + rng.normal(0, 0.3, (int(ok.sum()), 2)))
    return Tracks(list(range(n)), pts, ids, [np.zeros((len(i), 2)) for i in ids]), np.array(R)


def test_a_pairs_rotation_comes_back_from_its_bearings_when_the_camera_only_turns():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(50, 3))
    a /= np.linalg.norm(a, axis=1, keepdims=True)
    R = so3_exp(np.array([[0.1, -0.2, 0.15]]))[0]
    b = a @ R.T
    b[:5] = rng.normal(size=(5, 3))  # five tracks that moved on their own
    b /= np.linalg.norm(b, axis=1, keepdims=True)
    assert np.degrees(np.linalg.norm(so3_log((pair_rotation(a, b) @ R.T)[None])[0])) < 0.01


def _pair_errors(step: float) -> tuple[np.ndarray, np.ndarray]:
    """(each pair's rotation error, its true turn), degrees."""
    tracks, R = _hand(60, 1, step=step)
    idx, chain = chain_rotations(tracks, CAM)
    assert list(idx) == list(range(60))
    rel_true = np.swapaxes(R[:-1], -1, -2) @ R[1:]
    rel = np.swapaxes(chain[:-1], -1, -2) @ chain[1:]
    err = np.degrees(np.linalg.norm(so3_log(np.swapaxes(rel_true, -1, -2) @ rel), axis=1))
    return err, np.degrees(np.linalg.norm(so3_log(rel_true), axis=1))


def test_the_chain_follows_a_turning_hand_and_a_moving_one_to_its_parallax():
    err, turn = _pair_errors(0.0)
    assert np.median(turn) > 5 and np.max(err) < 0.1  # only turning: exact to the pixel noise
    err, turn = _pair_errors(0.05)  # 5 cm per keyframe at 1.5-3 m: ~1-2 deg of parallax leaks into each pair
    assert np.median(err) < 0.3 * np.median(turn) and np.median(err) < 2.5, (np.median(err), np.median(turn))


def test_the_chain_keeps_its_longest_unbroken_run():
    tracks, _R = _hand(40, 2, gone=range(12, 14))
    idx, chain = chain_rotations(tracks, CAM)
    assert list(idx) == list(range(14, 40)) and chain.shape == (26, 3, 3)


def test_bearings_are_unit_rays_through_the_principal_point():
    v = bearings(np.array([[240.0, 180.0], [570.0, 180.0]]), CAM)
    assert np.allclose(v[0], [0, 0, 1]) and np.allclose(np.linalg.norm(v, axis=1), 1)
    assert np.isclose(np.degrees(np.arctan2(v[1, 0], v[1, 2])), 45)
