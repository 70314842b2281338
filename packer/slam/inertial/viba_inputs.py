"""The visual-inertial bundle adjustment's inputs, prepared in numpy (no GTSAM):
the structure re-indexed to the pipeline's keyframes, which tracks to use, the
IMU's noise measured on its own samples, and observations moved to where a global
shutter would have seen them. Apart from `packer.slam.inertial.viba` so each reads alone
and so these can be tested without building a graph."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from packer.imu_gaps import second_differences

if TYPE_CHECKING:
    from packer.slam.mapping.colmap import SfmModel


def keyframe_structure(model: SfmModel, names: list[str]) -> SfmModel:
    """The model with its observations re-indexed to `names` (the registered
    keyframes in time order, the order of the poses the pipeline passes on);
    observations of images not in `names` are dropped."""
    where = {n: i for i, n in enumerate(names)}
    to_key = np.array([where.get(n, -1) for n in model.names], dtype=np.int64)
    kf = to_key[model.obs_image] if len(model.obs_image) else np.zeros(0, np.int64)
    ok = kf >= 0
    return dataclasses.replace(model, obs_image=kf[ok].astype(np.int32), obs_point=model.obs_point[ok],
                               obs_xy=model.obs_xy[ok])


def select_tracks(obs_image: np.ndarray, obs_point: np.ndarray, keep_images: np.ndarray, min_track: int,
                  max_points: int) -> np.ndarray:
    """Indices of the observations to use: those in `keep_images` (bool per image) of
    points seen there at least `min_track` times, the longest tracks first up to
    `max_points` (long tracks tie distant keyframes, which is what carries the scale)."""
    use = keep_images[obs_image]
    counts = np.bincount(obs_point[use], minlength=int(obs_point.max(initial=-1)) + 1)
    order = np.argsort(-counts, kind="stable")
    chosen = order[counts[order] >= min_track][:max_points]
    pick = np.zeros(len(counts), dtype=bool)
    pick[chosen] = True
    return np.nonzero(use & pick[obs_point])[0]


def imu_noise_densities(t: np.ndarray, accel: np.ndarray, gyro: np.ndarray) -> tuple[float, float]:
    """(accel m/s^2/sqrt(Hz), gyro rad/s/sqrt(Hz)) white-noise densities measured on
    the samples' second differences (the motion is smooth at 100-200 Hz, the noise is
    not), so the preintegration's covariance follows the phone rather than a guess."""
    dt = float(np.median(np.diff(t)))

    def density(x: np.ndarray) -> float:
        per_axis = float(np.mean(second_differences(t, x) ** 2)) / 6.0  # none across an IMU gap
        return float(np.sqrt(per_axis * dt))

    return density(accel), density(gyro)


def rolling_shutter_correct(xy: np.ndarray, omega_c: np.ndarray, camera: list[float], readout: float) -> np.ndarray:
    """Observations moved to where a global shutter at the frame time would have seen
    them: row v is read (v / H - 1/2) * readout after the frame time (H = 2 cy), and
    in that time the camera turned by omega_c dt (camera frame, from the gyro), which
    at 3 rad/s and 20 ms is ~25 px. To first order the bearing b' seen then is
    b = b' + dt omega x b' at the frame time; the translation's share (mm) is left.
    omega_c: (K,3) per observation."""
    f, cx, cy = camera[0], camera[1], camera[2]
    dt = (xy[:, 1] / (2.0 * cy) - 0.5) * readout
    x, y = (xy[:, 0] - cx) / f, (xy[:, 1] - cy) / f
    wx, wy, wz = omega_c[:, 0] * dt, omega_c[:, 1] * dt, omega_c[:, 2] * dt
    X, Y, Z = x + wy - wz * y, y + wz * x - wx, 1.0 + wx * y - wy * x
    return np.column_stack([cx + f * X / Z, cy + f * Y / Z])
