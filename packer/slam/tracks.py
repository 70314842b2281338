"""Feature tracks through the video with pyramidal Lucas-Kanade (KLT), the
front-end of visual-inertial odometry (VINS-Mono, OpenVINS) instead of SIFT.

Why: the frames come from a 60 fps video, so consecutive keyframes differ by a
few pixels. Detecting and describing SIFT in every keyframe and matching every
pair by brute force (the COLMAP way for unordered photos) cost ~60% of the SLAM
stage; following corners from one keyframe to the next costs a few milliseconds,
and a track *is* the correspondence across every keyframe that sees it.

Each track is checked forward and backward (the point tracked back must land
within `fb_max_px` of where it started) so a corner that slid along an edge or
hit an occlusion is dropped rather than corrupting the geometry; COLMAP's
geometric verification (RANSAC on the essential matrix) then removes what is
left. New corners (Shi-Tomasi) are detected away from live tracks whenever fewer
than `max_tracks` survive.

Keyframes are chosen by parallax: a candidate is taken every `candidate_step`
frames, and kept when its tracks moved (median) at least `min_parallax_px` since
the last keyframe, or `max_gap` candidates were skipped already, or too few
tracks survived.
A pause in the hand motion therefore costs no keyframes (and no mapping time)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class TrackOptions:
    max_tracks: int = 400  # live corners kept per frame
    min_distance: int = 12  # px between corners
    quality: float = 0.01  # Shi-Tomasi quality level (relative to the best corner)
    win: int = 15  # LK window (px)
    levels: int = 3  # LK pyramid levels
    fb_max_px: float = 1.0  # forward-backward consistency
    min_parallax_px: float = 16.0  # median track motion that makes a candidate a keyframe
    max_gap: int = 1  # candidates: at most this many skipped in a row
    min_survival: float = 0.7  # keep a keyframe when fewer of its tracks survive


@dataclass
class Tracks:
    """Keyframes and what each sees: `points[k]` (n_k, 2) pixel positions in COLMAP's
    convention (pixel centre at +0.5), `ids[k]` (n_k,) track ids."""

    keyframes: list[int] = field(default_factory=list)  # positions into the frame list given
    points: list[np.ndarray] = field(default_factory=list)
    ids: list[np.ndarray] = field(default_factory=list)

    def matches(self, a: int, b: int) -> np.ndarray:
        """(m, 2) uint32 keypoint index pairs between keyframes a and b (shared tracks)."""
        _common, ia, ib = np.intersect1d(self.ids[a], self.ids[b], assume_unique=True, return_indices=True)
        return np.stack([ia, ib], axis=1).astype(np.uint32)


def _read_gray(path: Path) -> np.ndarray:
    import cv2

    img = cv2.imread(str(path), cv2.IMREAD_GRAYSCALE)
    if img is None:
        raise OSError(f"{path}: not a readable image")
    return img


def _detect(img: np.ndarray, pts: np.ndarray, n: int, opt: TrackOptions) -> np.ndarray:
    """Up to n new corners at least min_distance from the live points."""
    import cv2

    if n <= 0:
        return np.zeros((0, 2), np.float32)
    mask = np.full(img.shape, 255, np.uint8)
    for x, y in pts.astype(int):
        cv2.circle(mask, (int(x), int(y)), opt.min_distance, 0, -1)
    c = cv2.goodFeaturesToTrack(img, n, opt.quality, opt.min_distance, mask=mask, blockSize=7)
    return np.zeros((0, 2), np.float32) if c is None else c.reshape(-1, 2).astype(np.float32)


def _flow(prev: np.ndarray, cur: np.ndarray, pts: np.ndarray, opt: TrackOptions) -> tuple[np.ndarray, np.ndarray]:
    """LK from prev to cur and back: (new positions, good mask)."""
    import cv2

    if len(pts) == 0:
        return pts, np.zeros(0, bool)
    win, crit = (opt.win, opt.win), (cv2.TERM_CRITERIA_EPS | cv2.TERM_CRITERIA_COUNT, 20, 0.03)
    p0 = pts.reshape(-1, 1, 2).astype(np.float32)
    p1, st1, _ = cv2.calcOpticalFlowPyrLK(prev, cur, p0, None, winSize=win, maxLevel=opt.levels,  # type: ignore[call-overload]
                                          criteria=crit)
    back, st2, _ = cv2.calcOpticalFlowPyrLK(cur, prev, p1, None, winSize=win, maxLevel=opt.levels,  # type: ignore[call-overload]
                                            criteria=crit)
    fb = np.linalg.norm((back - p0).reshape(-1, 2), axis=1)
    h, w = cur.shape
    p1 = p1.reshape(-1, 2)
    inside = (p1[:, 0] >= 0) & (p1[:, 1] >= 0) & (p1[:, 0] <= w - 1) & (p1[:, 1] <= h - 1)
    good = (st1.ravel() == 1) & (st2.ravel() == 1) & (fb < opt.fb_max_px) & inside
    return p1, good


def track_keyframes(paths: Sequence[Path], candidate_step: int, opt: TrackOptions | None = None) -> Tracks:
    """Track corners through every `candidate_step`-th frame of `paths` (and the
    last one) and choose keyframes among them by parallax (module docstring)."""
    opt = opt or TrackOptions()
    cand = list(range(0, len(paths), candidate_step))
    if cand[-1] != len(paths) - 1:
        cand.append(len(paths) - 1)
    out = Tracks()
    img = _read_gray(paths[cand[0]])
    prev = img
    pts = _detect(img, np.zeros((0, 2)), opt.max_tracks, opt)
    ids = np.arange(len(pts))
    next_id = len(pts)
    ref_ids, ref_pts = ids, pts  # the last keyframe's tracks, for parallax
    _keep(out, cand[0], pts, ids)
    skipped = 0
    for n, c in enumerate(cand[1:], start=1):
        img = _read_gray(paths[c])
        cur = img
        p1, good = _flow(prev, cur, pts, opt)
        survived = float(good.mean()) if len(good) else 0.0
        pts, ids = p1[good], ids[good]
        _c, ia, ib = np.intersect1d(ids, ref_ids, assume_unique=True, return_indices=True)
        parallax = float(np.median(np.linalg.norm(pts[ia] - ref_pts[ib], axis=1))) if len(ia) else np.inf
        take = (n == len(cand) - 1 or parallax >= opt.min_parallax_px or skipped >= opt.max_gap
                or survived < opt.min_survival or len(ia) < 0.5 * opt.max_tracks)
        if take:
            new = _detect(img, pts, opt.max_tracks - len(pts), opt)
            pts = np.vstack([pts, new]) if len(new) else pts
            ids = np.concatenate([ids, np.arange(next_id, next_id + len(new))])
            next_id += len(new)
            _keep(out, c, pts, ids)
            ref_ids, ref_pts = ids, pts
            skipped = 0
        else:
            skipped += 1
        prev = cur
    return out


def _keep(out: Tracks, pos: int, pts: np.ndarray, ids: np.ndarray) -> None:
    out.keyframes.append(pos)
    out.points.append(pts.astype(np.float32) + 0.5)  # OpenCV pixel centres are integers, COLMAP's at +0.5
    out.ids.append(ids.astype(np.int64))
