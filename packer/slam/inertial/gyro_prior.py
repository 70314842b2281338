"""The gyro's relative rotations as the SfM's two-view rotations.

A plain room with the glove covering a quarter of the view leaves some keyframe
pairs with only ~20 shared corners. COLMAP's two-view geometry from so few is
sometimes wrong, and GLOMAP's rotation averaging then puts a keyframe 20-30 deg off
(bench: every-effect sessions refused at 50-120% gyro disagreement). The gyro
measures exactly that rotation. Once the camera-IMU rotation, clock offset and gyro
bias are known (aligned on a small SfM of 3 s, `rolling.WindowSfm`), each verified
pair's relative pose is written from the gyro: the rotation integrated between the
two keyframes, the translation's direction solved from the pair's inlier matches
with that rotation fixed (as VINS-Mono's gyro-aided two-point step does). GLOMAP
then averages these (its own decomposition is switched off); bundle adjustment still
refines every rotation from the images, so the final model's gyro check stays a
check of the images. Measured on an every-effect session (seed 3): the worst
keyframe-to-keyframe rotation error fell from 27 deg to 2.0 deg."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from packer.session import Imu
    from packer.slam.inertial.imu_align import ImuAlignment


def gyro_rotations(imu: Imu, al: ImuAlignment, times: np.ndarray) -> np.ndarray:
    """(K,3,3) camera-to-world rotations at frame `times` from the gyro alone (its
    own world: one rotation away from the SfM's, which relative poses do not see)."""
    from packer.slam.inertial.imu_align import gyro_orientation

    return gyro_orientation(imu.t - al.offset, imu.gyro - al.gyro_bias, times) @ al.R_ic


def translation_direction(xa: np.ndarray, xb: np.ndarray, R: np.ndarray) -> np.ndarray:
    """Unit t of cam_b-from-cam_a = (R, t) from bearings xa, xb (N,3) with R known:
    each match says t . ((R xa) x xb) = 0, so t is the direction least in the span of
    those normals; its sign puts most points in front of both cameras. Near zero
    translation (a pure turn) any direction fits, and GLOMAP does not lean on it."""
    Rxa = xa @ R.T
    n = np.cross(Rxa, xb)
    if len(n) < 2:
        return np.array([0.0, 0.0, 1.0])
    _w, V = np.linalg.eigh(n.T @ n)
    t = V[:, 0]
    # depths: lb xb = la R xa + t, least squares per match; the sign with more positive depths wins
    A = np.stack([Rxa, -xb], axis=2)  # (N,3,2)
    AtA = np.einsum("nij,nik->njk", A, A)
    Atb = np.einsum("nij,i->nj", A, -t)
    ok = np.abs(np.linalg.det(AtA)) > 1e-12
    lam = np.linalg.solve(AtA[ok], Atb[ok][..., None])[..., 0] if ok.any() else np.zeros((0, 2))
    front = int(np.sum((lam[:, 0] > 0) & (lam[:, 1] > 0)))
    back = int(np.sum((lam[:, 0] < 0) & (lam[:, 1] < 0)))
    return t if front >= back else -t


def bearings(points: np.ndarray, intrinsics: tuple[float, float, float, float]) -> np.ndarray:
    """(N,3) normalised rays of pixel positions (COLMAP's convention, calib.txt's too)."""
    fx, fy, cx, cy = intrinsics
    return np.column_stack([(points[:, 0] - cx) / fx, (points[:, 1] - cy) / fy, np.ones(len(points))])


def undistorted_bearings(points: np.ndarray, camera: list[float]) -> np.ndarray:
    """(N,3) rays of pixel positions through a SIMPLE_RADIAL camera [f, cx, cy, k1]
    (x_d = x (1 + k1 r^2), inverted by fixed-point iteration)."""
    f, cx, cy = camera[0], camera[1], camera[2]
    k1 = camera[3] if len(camera) > 3 else 0.0
    xd, yd = (points[:, 0] - cx) / f, (points[:, 1] - cy) / f
    x, y = xd.copy(), yd.copy()
    for _ in range(20 if k1 else 0):
        s = 1.0 + k1 * (x * x + y * y)
        x, y = xd / s, yd / s
    return np.column_stack([x, y, np.ones(len(x))])


def epipolar_px(xa: np.ndarray, xb: np.ndarray, R: np.ndarray, t: np.ndarray, f: float) -> np.ndarray:
    """Distance (px) of each xb from its epipolar line under cam_b-from-cam_a = (R, t)."""
    line = np.cross(np.broadcast_to(t, xa.shape), xa @ R.T)
    return f * np.abs(np.sum(line * xb, axis=1)) / np.maximum(np.linalg.norm(line[:, :2], axis=1), 1e-12)


def pair_epipolar_px(ids_a: np.ndarray, xa: np.ndarray, ids_b: np.ndarray, xb: np.ndarray, R: np.ndarray, f: float
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(shared ids, each one's distance (px) from its epipolar line) for two keyframes
    under the gyro's rotation R and the translation that fits best. The translation
    is refitted twice without the worst third, so a quarter of the corners on the
    glove cannot tilt it. Empty when they share fewer than 8 corners."""
    _c, ia, ib = np.intersect1d(ids_a, ids_b, assume_unique=True, return_indices=True)
    if len(ia) < 8:
        return np.zeros(0, np.int64), np.zeros(0)
    a, b = xa[ia], xb[ib]
    use = np.ones(len(a), bool)
    for _ in range(3):
        t = translation_direction(a[use], b[use], R)
        err = epipolar_px(a, b, R, t, f)
        use = err <= max(np.quantile(err, 0.67), 0.5)
    return ids_a[ia], err


def off_the_gyro(ids_a: np.ndarray, xa: np.ndarray, ids_b: np.ndarray, xb: np.ndarray, R: np.ndarray, f: float,
                 max_px: float) -> np.ndarray:
    """Ids shared by two keyframes whose motion the gyro's rotation R and the best
    translation cannot explain (more than `max_px` off the epipolar line): corners on
    the glove or a finger (they stay put while the scene turns), or sliding on a plain
    patch. A corner whose rotational flow runs along its epipolar line (translation
    parallel to that flow) fits in that pair; 19 of 30 such corners were caught in one
    synthetic pair, the rest by the other pairs."""
    ids, err = pair_epipolar_px(ids_a, xa, ids_b, xb, R, f)
    return ids[err > max_px]


def gyro_fit_px(tracks, camera: list[float]) -> float:
    """How well the gyro's rotations (`tracks.rotations`) fit the tracks: the median over
    consecutive keyframe pairs of the median epipolar distance (px). A camera-IMU rotation
    or bias a few degrees off tilts every pair's epipolar lines; this picks the better of
    two calibrations without mapping either (`gyro_repair`)."""
    assert tracks.rotations is not None
    per_pair = []
    for k in range(1, len(tracks.keyframes)):
        R = tracks.rotations[k].T @ tracks.rotations[k - 1]
        _ids, err = pair_epipolar_px(tracks.ids[k - 1], undistorted_bearings(tracks.points[k - 1], camera),
                                     tracks.ids[k], undistorted_bearings(tracks.points[k], camera), R, camera[0])
        if len(err):
            per_pair.append(float(np.median(err)))
    return float(np.median(per_pair)) if per_pair else float("inf")


def drop_off_gyro(tracks, camera: list[float], max_px: float = 3.0, min_share: float = 0.5):
    """`tracks` without the tracks that are off the gyro's geometry (`off_the_gyro`)
    at `min_share` or more of the consecutive keyframe pairs they span: the whole
    track goes, since a corner on the glove was never a scene point."""
    from packer.slam.frontend.tracks import without

    assert tracks.rotations is not None
    votes: dict[int, int] = {}
    for k in range(1, len(tracks.keyframes)):
        R = tracks.rotations[k].T @ tracks.rotations[k - 1]
        xa = undistorted_bearings(tracks.points[k - 1], camera)
        xb = undistorted_bearings(tracks.points[k], camera)
        for v in off_the_gyro(tracks.ids[k - 1], xa, tracks.ids[k], xb, R, camera[0], max_px):
            votes[int(v)] = votes.get(int(v), 0) + 1
    if not votes:
        return tracks
    ids = np.concatenate(tracks.ids)
    u, n = np.unique(ids, return_counts=True)
    spans = dict(zip(u.tolist(), (n - 1).tolist()))  # consecutive pairs each track spans (it has no gaps)
    bad = {v for v, c in votes.items() if c >= min_share * max(spans.get(v, 1), 1)}
    return without(tracks, bad)
