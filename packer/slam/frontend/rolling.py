"""The phone's rolling shutter, taken out of the tracked corners before SfM.

A phone sensor reads its rows one after another: row y of a frame is exposed
(y / H - 1/2) * readout after the frame's time stamp (the middle row). A hand
turning at 3 rad/s with a 20 ms readout moves the image ~25 px between the top and
the bottom row, so every frame is sheared and stretched by an amount that follows
the motion. SfM assumes one pose per frame: it bends the whole model to explain
the shear (the rotations disagree with the gyro by 10-100%, the focal length drifts,
bench/results/slam_hard.csv), and no scale fixes that.

The correction is model-free: each corner's own image motion (the tracker measures
it every frame) says where it was at the frame time, p - v * (y / H - 1/2) * readout.
It needs no camera-IMU rotation and holds for translation as well as rotation.

The readout itself is not in the app's export and differs between phones and video
modes, so it is measured (`estimate_readout`): on the busiest 3 s of the session a
small SfM is run for three candidate readouts and the one whose rotations agree best
with the gyro wins (the vertex of a hyperbola through the three). A global shutter comes out at
0-3 ms, and the correction then moves a corner by a fraction of a pixel."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from packer.imu_gaps import find_gaps
from packer.slam.frontend.tracks import Tracks

if TYPE_CHECKING:
    from pathlib import Path

    from packer.session import Imu, Session
    from packer.slam.inertial.imu_align import ImuAlignment
    from packer.slam.mapping.colmap import SfmOptions
    from packer.slam.options import SlamOptions

READOUTS = (0.0, 0.01, 0.02, 0.03)  # s, candidate readouts (phones: 0 for a global shutter, ~5-33 ms rolling)
WINDOW_S = 3.0  # seconds of the session the readout is measured on
MIN_SHIFT_PX = 0.5  # below this RMS edge displacement at the largest candidate, the readout cannot matter
MIN_READOUT = 0.002  # s: a measured readout below this is read as a global shutter (the search resolves ~1 ms;
# on a global-shutter session 0.6 ms moved the scale 0.08%, 2.7 ms 0.4%)


def _filled(points: np.ndarray, velocity: np.ndarray) -> np.ndarray:
    """Velocities with the unknown ones (NaN: corners found at this keyframe) taken
    from a quadratic flow field fitted to the known ones (a camera's rotation moves
    the image smoothly; the parallax of translation is the smaller part)."""
    v = velocity.astype(np.float64).copy()
    bad = ~np.all(np.isfinite(v), axis=1)
    if not bad.any():
        return v
    good = ~bad
    if good.sum() < 12:
        v[bad] = np.nanmedian(v[good], axis=0) if good.any() else 0.0
        return v
    x, y = points[:, 0] / 240.0 - 1.0, points[:, 1] / 180.0 - 1.0  # about [-1, 1] on 480x360: conditioning only
    A = np.column_stack([np.ones_like(x), x, y, x * x, x * y, y * y])
    coef, *_ = np.linalg.lstsq(A[good], v[good], rcond=None)
    v[bad] = A[bad] @ coef
    return v


def corrected(tracks: Tracks, readout: float, fps: float) -> Tracks:
    """`tracks` with every observation moved to where a global shutter at the frame
    time would have seen it (module docstring). readout in s; 0 returns `tracks`."""
    if readout <= 0 or not tracks.velocity or tracks.height <= 0:
        return tracks
    pts = [(p - readout_shift(p, v, tracks.height, readout, fps)).astype(np.float32)
           for p, v in zip(tracks.points, tracks.velocity)]
    return dataclasses.replace(tracks, points=pts)


def readout_shift(points: np.ndarray, velocity: np.ndarray, height: int, readout: float, fps: float) -> np.ndarray:
    """(n,2) px each corner moved while its row waited to be read: the image velocity
    (`_filled`) times the row's delay from the frame time, (y / height - 1/2) readout.
    Taken off to correct a track; added back (to first order) to find the corner in
    the image as recorded (`revisits`)."""
    dt_frames = (points[:, 1] / height - 0.5) * readout * fps  # this row's delay, in frames
    return _filled(points, velocity) * dt_frames[:, None]


def edge_shift_px(tracks: Tracks, readout: float, fps: float) -> float:
    """RMS displacement the correction would make at the top and bottom rows: the
    size of the effect a readout could have on this session."""
    v = np.concatenate([x[np.all(np.isfinite(x), axis=1)] for x in tracks.velocity] or [np.zeros((0, 2))])
    if not len(v):
        return 0.0
    return float(np.sqrt(np.mean(np.sum(v**2, axis=1)))) * 0.5 * readout * fps


def _rates(tracks: Tracks) -> np.ndarray:
    """Median image speed (px per frame) of each keyframe's corners."""
    return np.array([float(np.median(np.linalg.norm(v[np.all(np.isfinite(v), axis=1)], axis=1)))
                     if np.isfinite(v).all(axis=1).any() else 0.0 for v in tracks.velocity])


def busiest_window(times: np.ndarray, rates: np.ndarray, seconds: float = WINDOW_S) -> tuple[int, int]:
    """[a, b) keyframe index range of about `seconds` whose image motion (`rates`, one
    per keyframe) is largest: where a rolling shutter shows most."""
    n = len(times)
    if n == 0 or times[-1] - times[0] <= seconds:
        return 0, n
    c = np.concatenate([[0.0], np.cumsum(rates)])
    best, best_ab = -1.0, (0, n)
    b = 0
    for a in range(n):
        while b < n and times[b] - times[a] < seconds:
            b += 1
        if c[b] - c[a] > best:
            best, best_ab = c[b] - c[a], (a, b)
    return best_ab


def estimate_readout(tracks: Tracks, fps: float, disagreement: Callable[[Tracks, int, int], float],
                     candidates: Sequence[float] = READOUTS) -> tuple[float, dict[str, float]]:
    """(readout in s, {candidate ms: gyro disagreement}) on the busiest window:
    `disagreement(tracks, a, b)` maps the corrected tracks of that window (keyframes
    [a, b)) to the gyro-vs-SfM rotation residual over the rotation rate (inf: no model).

    The disagreement grows about linearly on either side of the true readout over a
    floor (bench: 0.5-0.8% at the truth, 3-6% 10 ms away), so three SfMs suffice: the
    two middle candidates' better side decides the third, and `_tip` places the minimum."""
    a, b = busiest_window(np.asarray(tracks.keyframes, np.float64) / fps, _rates(tracks))
    win = tracks.subset(a, b)
    if edge_shift_px(win, max(candidates), fps) < MIN_SHIFT_PX:
        return 0.0, {}
    r = sorted(candidates)
    cost: dict[float, float] = {}
    for c in (r[1], r[2]):
        cost[c] = disagreement(corrected(win, c, fps), a, b)
    third = r[0] if cost[r[1]] <= cost[r[2]] else r[3]
    cost[third] = disagreement(corrected(win, third, fps), a, b)
    curve = {f"{1000 * c:.0f}": round(v, 5) for c, v in sorted(cost.items())}
    xs = sorted(cost)
    ys = np.array([cost[x] for x in xs])
    i = int(np.argmin(ys))
    if not np.isfinite(ys[i]):
        return 0.0, curve
    if not np.all(np.isfinite(ys)):
        return float(xs[i]), curve
    r0 = _tip(np.asarray(xs, np.float64), ys)
    return (0.0 if r0 < MIN_READOUT else r0), curve


def _tip(x: np.ndarray, y: np.ndarray) -> float:
    """The readout where sqrt(c^2 + m^2 (r - r0)^2) through the three points (x, y) is
    lowest, within [x0, x2]: the disagreement is the RMS of what the rolling shutter
    leaves (growing linearly with the readout's error) and of everything else (c), so
    y^2 is a parabola in r whose vertex is r0. Near a global shutter the floor c is as
    large as the shutter's share and a V through the points put the tip at 2-3 ms for
    a true 0 (seen: the scale then moved 0.4%, to 3.2 std); the parabola in y^2 does not."""
    y2 = np.asarray(y, np.float64) ** 2
    A, B, _C = np.polyfit(np.asarray(x, np.float64), y2, 2)
    if A <= 0:
        return float(x[int(np.argmin(y))])
    return float(np.clip(-B / (2 * A), x[0], x[-1]))


class WindowSfm:
    """`disagreement(window_tracks, a, b)` for `estimate_readout`: SfM on keyframes
    [a, b) (`rel`: their image names; `times`: their frame times), then the gyro
    alignment's residual over the rotation rate; inf when SfM or the alignment fails
    or registers less than 80% of the window. Keeps the best alignment: the camera-IMU
    rotation, clock offset and gyro bias the main SfM's gyro prior needs."""

    def __init__(self, image_dir: Path, rel: list[str], times: np.ndarray,
                 intrinsics: tuple[float, float, float, float] | None, sfm: SfmOptions, imu: Imu,
                 max_offset: float | None):
        self.image_dir, self.rel, self.times, self.intrinsics = image_dir, rel, times, intrinsics
        self.sfm, self.imu, self.max_offset = sfm, imu, max_offset
        self.best: tuple[float, ImuAlignment, list[float]] | None = None  # (cost, alignment, SfM camera)

    def __call__(self, win: Tracks, a: int, b: int) -> float:
        from packer.slam.inertial.imu_align import AlignmentError, align_imu
        from packer.slam.mapping.colmap import SfmError, reconstruct

        try:
            model = reconstruct(self.image_dir, self.rel[a:b], self.intrinsics, self.sfm, tracks=win)
        except SfmError:
            return float("inf")
        idx, T = model.registered(self.rel[a:b], np.arange(b - a))
        if len(idx) < 0.8 * (b - a):
            return float("inf")
        try:
            al = align_imu(self.times[a:b][idx], T[:, :3, :3], self.imu.t, self.imu.gyro, max_offset=self.max_offset)
        except AlignmentError:
            return float("inf")
        cost = float(al.residual / max(al.rotation_rms, 1e-9))
        if self.best is None or cost < self.best[0]:
            self.best = (cost, al, list(model.camera))
        return cost


def shutter_free(session: Session, opts: SlamOptions, imu: Imu | None, tracks: Tracks, rel: list[str],
                 kpos: np.ndarray, stages: Callable[[str], None]
                 ) -> tuple[Tracks, float | None, dict, ImuAlignment | None]:
    """(tracks corrected for the readout and carrying the gyro's rotations, the readout
    or None when unknown, the measurement's curve, the gyro aligned on the best window
    SfM when one ran: a start for `gyro_repair` that owes nothing to the main model). The readout is `[slam]
    rolling_shutter` when given, else measured against the gyro (`estimate_readout`);
    with `[slam] gyro_prior` (experimental) the window SfMs that measure it also align
    the gyro, whose rotations then guide the main SfM (`gyro_prior.py`). Without an
    IMU the tracks are left as they are (or corrected for a readout given)."""
    if imu is None:
        r = opts.rolling_shutter
        return (tracks, None, {}, None) if r is None else (corrected(tracks, r, session.fps), r, {}, None)
    stages("features (rolling shutter)")
    win = WindowSfm(session.path / "rgb", rel, session.timestamps[kpos], session.intrinsics, opts.sfm_options(), imu,
                    opts.max_imu_offset)
    curve: dict = {}
    if opts.rolling_shutter is None:
        readout, curve = estimate_readout(tracks, session.fps, win)
    else:
        readout = opts.rolling_shutter
    fixed = corrected(tracks, readout, session.fps)
    if win.best is None and opts.gyro_prior:  # no search ran (little motion, or the readout was given): align once
        a, b = busiest_window(session.timestamps[kpos], _rates(fixed))
        win(fixed.subset(a, b), a, b)
    if win.best is not None and opts.gyro_prior and not find_gaps(imu.t):  # (no gyro turn known across an IMU gap)
        from packer.slam.inertial.gyro_prior import drop_off_gyro, gyro_rotations

        fixed = dataclasses.replace(fixed, rotations=gyro_rotations(imu, win.best[1], session.timestamps[kpos]))
        fixed = drop_off_gyro(fixed, win.best[2])
    return fixed, readout, curve, None if win.best is None else win.best[1]
