"""Feature tracks through the video with pyramidal Lucas-Kanade (KLT), the
front-end of visual-inertial odometry (VINS-Mono, OpenVINS) instead of SIFT.

Why: the frames come from a 60 fps video, so consecutive keyframes differ by a
few pixels. Detecting and describing SIFT in every keyframe and matching every
pair by brute force (the COLMAP way for unordered photos) cost ~60% of the SLAM
stage; following corners from one keyframe to the next costs a few milliseconds,
and a track *is* the correspondence across every keyframe that sees it.

Corners are followed through every frame (a hand turning at 2-3 rad/s moves the
image ~15 px per frame, which LK finds; between candidates 0.1 s apart it was ~80 px,
where the tracks died). At every candidate each track is followed back to the last
candidate frame and must land where it was (`fb_max_px`; one backward LK per 0.1 s
instead of one per frame, and a slide that builds up over the interval counts in
full), and each frame's brightness is matched to the last (auto-exposure). New corners
(Shi-Tomasi) are detected away from live tracks, above an absolute strength floor
(`min_eigen`): on a plain surface the relative quality level alone keeps the best of
the grain, whose tracks slide while passing the forward-backward check.

At each keyframe two checks run that a frame-to-frame check cannot: a track off the
epipolar geometry (F by RANSAC) against the last keyframe and the one
`epipolar_back` before it stops there (it slid, or moves on its own like a finger);
a track that stayed put in the image while the scene moved moves with the camera (the
glove, its mount): it is dropped with its whole history and its place masked, since
with little rotation between keyframes a point fixed in the image fits any essential
matrix and would tie the model to the camera. COLMAP's geometric verification
(RANSAC on the essential matrix) then removes what is left.

Keyframes are chosen by parallax: a candidate is taken every `candidate_step`
frames, and kept when its tracks moved (median) at least `min_parallax_px` since
the last keyframe, or `max_gap` candidates were skipped already, or too few
tracks survived.
A pause in the hand motion therefore costs no keyframes (and no mapping time).
Where tracks are scarce (a plain wall, blurred, the glove over a quarter of the view),
the frame halfway to the next candidate becomes a keyframe too when it shares fewer
than `scarce_shared` tracks with the last one: 0.1 s apart, such a pair kept 9-13
corners, under the 15 a keyframe pair needs in COLMAP's view graph, and the model
split there (every-effect bench seeds; 0.05 s apart, they keep 15 or more)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class TrackOptions:
    max_tracks: int = 400  # live corners kept per frame
    min_distance: int = 8  # px between corners
    quality: float = 0.001  # Shi-Tomasi quality level (relative to the best corner; min_eigen is the real floor)
    min_eigen: float = 0.001  # absolute floor on a corner's smaller eigenvalue (cv2.cornerMinEigenVal, 7x7):
    # a plain table's grain stays under 0.0005, real corners sit above 0.005
    win: int = 15  # LK window (px)
    levels: int = 3  # LK pyramid levels
    fb_max_px: float = 1.0  # forward-backward consistency
    min_parallax_px: float = 16.0  # median track motion that makes a candidate a keyframe
    max_gap: int = 1  # candidates: at most this many skipped in a row
    min_survival: float = 0.7  # keep a keyframe when fewer of its tracks survive
    epipolar_px: float = 2.0  # a track off the epipolar line (F by RANSAC) by more at a keyframe stops there
    epipolar_back: int = 3  # ... checked against the last keyframe and this many back (a longer baseline)
    static_px: float = 1.0  # a track that moved less than this between keyframes ...
    static_scene_px: float = 8.0  # ... while the median track moved more, moves with the camera (glove, mount)
    static_votes: int = 2  # keyframes at which it did so before it is dropped (and its place masked)
    scarce_shared: int = 60  # halfway between candidates, a frame sharing fewer live tracks with the last keyframe
    # becomes a keyframe too (0 = never): a plain stretch keeps each keyframe pair over COLMAP's 15 shared corners
    mask: np.ndarray | None = None  # (H, W) uint8, 0 = never detect corners here (the user's mask)


@dataclass
class _Live:
    """What the tracker carries from frame to frame."""

    pts: np.ndarray
    ids: np.ndarray
    next_id: int
    history: list[tuple[np.ndarray, np.ndarray]]  # the last keyframes' (ids, pts), newest last
    votes: dict[int, int]
    bad: set[int]  # moved with the camera: every observation goes
    static_mask: np.ndarray  # 255 where corners may be detected


@dataclass
class Tracks:
    """Keyframes and what each sees: `points[k]` (n_k, 2) pixel positions in COLMAP's
    convention (pixel centre at +0.5), `ids[k]` (n_k,) track ids."""

    keyframes: list[int] = field(default_factory=list)  # positions into the frame list given
    points: list[np.ndarray] = field(default_factory=list)
    ids: list[np.ndarray] = field(default_factory=list)
    velocity: list[np.ndarray] = field(default_factory=list)  # (n_k, 2) image motion, px per frame, from the
    # frame before (a corner found at this keyframe: to the frame after; NaN if it died there): what a rolling
    # shutter smears (`rolling.py`)
    height: int = 0  # frame rows
    rotations: np.ndarray | None = None  # (K,3,3) camera-to-world from the gyro when known (`gyro_prior.py`):
    # the verified pairs' relative rotations are written from them

    def subset(self, a: int, b: int) -> Tracks:
        """Keyframes [a, b)."""
        return Tracks(self.keyframes[a:b], self.points[a:b], self.ids[a:b], self.velocity[a:b], self.height,
                      None if self.rotations is None else self.rotations[a:b])

    def index(self) -> dict[int, int]:
        """{frame position: its index among these keyframes} (models name keyframes by frame)."""
        return {int(k): i for i, k in enumerate(self.keyframes)}

    def matches(self, a: int, b: int) -> np.ndarray:
        """(m, 2) uint32 keypoint index pairs between keyframes a and b (shared tracks)."""
        _common, ia, ib = np.intersect1d(self.ids[a], self.ids[b], assume_unique=True, return_indices=True)
        return np.stack([ia, ib], axis=1).astype(np.uint32)


def read_gray(path: Path) -> np.ndarray:
    """A frame as 8-bit grey; OSError naming the file when it does not decode."""
    import cv2

    img = cv2.imread(str(path), cv2.IMREAD_GRAYSCALE)
    if img is None:
        raise OSError(f"{path}: not a readable image")
    return img


def _detect(img: np.ndarray, pts: np.ndarray, n: int, opt: TrackOptions, allowed: np.ndarray) -> np.ndarray:
    """Up to n new corners at least min_distance from the live points, where
    `allowed` is non-zero, and strong in absolute terms (`min_eigen`): on a plain
    surface the relative quality level alone keeps the best of the grain, whose
    tracks slide."""
    import cv2

    if n <= 0:
        return np.zeros((0, 2), np.float32)
    mask = allowed.copy()
    for x, y in pts.astype(int):
        cv2.circle(mask, (int(x), int(y)), opt.min_distance, 0, -1)
    c = cv2.goodFeaturesToTrack(img, n, opt.quality, opt.min_distance, mask=mask, blockSize=7)
    if c is None:
        return np.zeros((0, 2), np.float32)
    c = c.reshape(-1, 2).astype(np.float32)
    if opt.min_eigen > 0:
        eig = cv2.cornerMinEigenVal(img, 7, ksize=3)
        c = c[eig[c[:, 1].astype(int), c[:, 0].astype(int)] >= opt.min_eigen]
    return c


def _lk(a: np.ndarray, b: np.ndarray, pts: np.ndarray, opt: TrackOptions,
        init: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Pyramidal LK of `pts` from image a to b (from `init` in b when given):
    (positions in b, found and inside the frame)."""
    import cv2

    if len(pts) == 0:
        return pts, np.zeros(0, bool)
    crit = (cv2.TERM_CRITERIA_EPS | cv2.TERM_CRITERIA_COUNT, 20, 0.03)
    p0 = pts.reshape(-1, 1, 2).astype(np.float32)
    guess = None if init is None else init.reshape(-1, 1, 2).astype(np.float32).copy()
    flags = 0 if init is None else cv2.OPTFLOW_USE_INITIAL_FLOW
    p1, st, _ = cv2.calcOpticalFlowPyrLK(a, b, p0, guess, winSize=(opt.win, opt.win),  # type: ignore[call-overload,arg-type]
                                         maxLevel=opt.levels, criteria=crit, flags=flags)
    h, w = b.shape
    p1 = p1.reshape(-1, 2)
    inside = (p1[:, 0] >= 0) & (p1[:, 1] >= 0) & (p1[:, 0] <= w - 1) & (p1[:, 1] <= h - 1)
    return p1, (st.ravel() == 1) & inside


def _back_check(cur: np.ndarray, live_pts: np.ndarray, live_ids: np.ndarray,
                anchor: tuple[np.ndarray, np.ndarray, np.ndarray], opt: TrackOptions) -> np.ndarray:
    """Forward-backward over the last candidate interval: each live track followed
    back from `cur` to the anchor frame (starting at where it was there) must land
    within `fb_max_px` of it. One backward LK per candidate instead of one per frame,
    and a slide that builds up over the interval counts in full. Returns the keep mask."""
    img, a_ids, a_pts = anchor
    keep = np.zeros(len(live_ids), bool)
    _c, ia, ib = np.intersect1d(live_ids, a_ids, assume_unique=True, return_indices=True)
    if len(ia):
        back, ok = _lk(cur, img, live_pts[ia], opt, init=a_pts[ib])
        keep[ia] = ok & (np.linalg.norm(back - a_pts[ib], axis=1) < opt.fb_max_px)
    return keep


def _gain_matched(prev: np.ndarray, cur: np.ndarray) -> np.ndarray:
    """`cur` scaled to `prev`'s mean brightness: auto-exposure changes the whole
    frame's gain between frames, which LK (brightness constancy) reads as motion."""
    m0, m1 = float(prev.mean()), float(cur.mean())
    if m1 <= 1.0 or abs(m0 / m1 - 1.0) < 0.01:
        return cur
    return np.clip(cur.astype(np.float32) * (m0 / m1) + 0.5, 0, 255).astype(np.uint8)


def _epipolar_outliers(ids: np.ndarray, pts: np.ndarray, history: list[tuple[np.ndarray, np.ndarray]],
                       opt: TrackOptions) -> np.ndarray:
    """Ids of live tracks off the epipolar geometry (fundamental matrix by RANSAC,
    `epipolar_px`) between now and the last keyframe, and the keyframe
    `epipolar_back` before it: what slid along an edge or a plain patch, or moves on
    its own (the fingers), drifts off the lines the rigid scene keeps to."""
    import cv2

    out: list[np.ndarray] = []
    for back in sorted({1, opt.epipolar_back}):
        if len(history) < back:
            continue
        k_ids, k_pts = history[-back]
        _c, ia, ib = np.intersect1d(ids, k_ids, assume_unique=True, return_indices=True)
        if len(ia) < 15 or np.median(np.linalg.norm(pts[ia] - k_pts[ib], axis=1)) < 2.0:
            continue  # too few, or too little motion for F to say anything
        thr = opt.epipolar_px * np.sqrt(back)  # LK's drift grows along a track
        _F, inl = cv2.findFundamentalMat(k_pts[ib], pts[ia], cv2.FM_RANSAC, thr, 0.999)
        if inl is not None:
            out.append(ids[ia][inl.ravel() == 0])
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def _static(ids: np.ndarray, pts: np.ndarray, ref: tuple[np.ndarray, np.ndarray], opt: TrackOptions) -> np.ndarray:
    """Ids that stayed put in the image while the scene moved: they move with the
    camera (the glove, the mount), fit any essential matrix when the camera mostly
    turns, and would tie the reconstruction to the camera."""
    _c, ia, ib = np.intersect1d(ids, ref[0], assume_unique=True, return_indices=True)
    if len(ia) < 10:
        return np.zeros(0, np.int64)
    d = np.linalg.norm(pts[ia] - ref[1][ib], axis=1)
    if float(np.median(d)) < opt.static_scene_px:
        return np.zeros(0, np.int64)
    return ids[ia][d < opt.static_px]


def track_keyframes(paths: Sequence[Path], candidate_step: int, opt: TrackOptions | None = None) -> Tracks:
    """Track corners through every frame of `paths` and choose keyframes among every
    `candidate_step`-th frame (and the last one) by parallax (module docstring).
    Following every frame keeps a corner's motion between two LK calls at a hand's
    ~15 px per frame, where 0.1 s steps asked LK to find it ~80 px away."""
    opt = opt or TrackOptions()
    n = len(paths)
    cand = set(range(0, n, candidate_step)) | {n - 1}
    half = {c + candidate_step // 2 for c in cand} - cand if opt.scarce_shared and candidate_step >= 2 else set()
    out = Tracks()
    prev = read_gray(paths[0])
    allowed = np.full(prev.shape, 255, np.uint8) if opt.mask is None else opt.mask.copy()
    pts = _detect(prev, np.zeros((0, 2)), opt.max_tracks, opt, allowed)
    live = _Live(pts, np.arange(len(pts)), len(pts), [], {}, set(), allowed)
    out.height = int(prev.shape[0])
    _keyframe(out, live, 0, np.full_like(live.pts, np.nan))
    anchor = (prev, live.ids.copy(), live.pts.copy())  # the last candidate frame, for the backward check
    skipped = 0
    for i in range(1, n):
        cur = _gain_matched(prev, read_gray(paths[i]))
        p1, good = _lk(prev, cur, live.pts, opt)
        step = (p1 - live.pts)[good]  # this frame's image motion, for the rolling-shutter correction
        live.pts, live.ids = p1[good], live.ids[good]
        _fill_forward(out.velocity[-1], out.ids[-1], live.ids, step)  # corners new at the last keyframe
        prev = cur
        if i not in cand and i not in half:
            continue
        good = _back_check(cur, live.pts, live.ids, anchor, opt)
        scarce = i in half and _shared(live.ids[good], live.history[-1][0]) < opt.scarce_shared
        if i not in cand and not scarce:
            continue  # enough shared: wait for the candidate (the backward check then spans the whole interval)
        live.pts, live.ids, step = live.pts[good], live.ids[good], step[good]
        anchor = (cur, live.ids.copy(), live.pts.copy())
        ref_ids, ref_pts = live.history[-1]
        _c, ia, ib = np.intersect1d(live.ids, ref_ids, assume_unique=True, return_indices=True)
        parallax = float(np.median(np.linalg.norm(live.pts[ia] - ref_pts[ib], axis=1))) if len(ia) else np.inf
        survived = len(ia) / max(len(ref_ids), 1)
        take = (scarce or i == n - 1 or parallax >= opt.min_parallax_px or skipped >= opt.max_gap
                or survived < opt.min_survival or len(ia) < 0.5 * opt.max_tracks)
        if not take:
            skipped += 1
            continue
        kept = _prune(live, opt)
        step = step[kept]
        new = _detect(cur, live.pts, opt.max_tracks - len(live.pts), opt, live.static_mask)
        live.pts = np.vstack([live.pts, new]) if len(new) else live.pts
        live.ids = np.concatenate([live.ids, np.arange(live.next_id, live.next_id + len(new))])
        live.next_id += len(new)
        step = np.vstack([step, np.full((len(new), 2), np.nan, np.float32)]) if len(new) else step
        _keyframe(out, live, i, step)
        anchor = (cur, live.ids.copy(), live.pts.copy())
        skipped = 0
    return without(out, live.bad)


def _shared(ids: np.ndarray, ref_ids: np.ndarray) -> int:
    return len(np.intersect1d(ids, ref_ids, assume_unique=True))


def _fill_forward(velocity: np.ndarray, ids: np.ndarray, live_ids: np.ndarray, step: np.ndarray) -> None:
    """A keyframe's corners without a measured motion (found there: NaN) take their
    motion to the next frame, where they have one (in place)."""
    unknown = ~np.isfinite(velocity[:, 0])
    if not unknown.any():
        return
    _c, ia, ib = np.intersect1d(ids[unknown], live_ids, assume_unique=True, return_indices=True)
    velocity[np.nonzero(unknown)[0][ia]] = step[ib]


def _prune(live: _Live, opt: TrackOptions) -> np.ndarray:
    """At a keyframe: drop tracks off the epipolar geometry from now on, and tracks
    that stayed put while the scene moved with their whole history (their place is
    masked for detection): at once when the epipolar check also rejects them, else
    after `static_votes` keyframes. Returns the keep mask over the tracks given."""
    import cv2

    drop = set(int(v) for v in _epipolar_outliers(live.ids, live.pts, live.history, opt))
    for v in (int(x) for x in _static(live.ids, live.pts, live.history[-1], opt)):
        live.votes[v] = live.votes.get(v, 0) + 1
        if live.votes[v] >= opt.static_votes or v in drop:
            live.bad.add(v)  # never was a scene point: its whole history goes
            x, y = live.pts[live.ids == v][0]
            cv2.circle(live.static_mask, (int(x), int(y)), 2 * opt.min_distance, 0, -1)
    drop |= live.bad
    keep = ~np.isin(live.ids, np.fromiter(drop, np.int64)) if drop else np.ones(len(live.ids), bool)
    live.pts, live.ids = live.pts[keep], live.ids[keep]
    return keep


def _keyframe(out: Tracks, live: _Live, pos: int, step: np.ndarray) -> None:
    out.keyframes.append(pos)
    out.points.append(live.pts.astype(np.float32) + 0.5)  # OpenCV pixel centres are integers, COLMAP's at +0.5
    out.ids.append(live.ids.astype(np.int64))
    out.velocity.append(step.astype(np.float32))
    live.history = (live.history + [(live.ids.copy(), live.pts.copy())])[-8:]  # epipolar_back <= 8


def without(tracks: Tracks, bad: set[int]) -> Tracks:
    """`tracks` with every observation of a dropped track removed, also from the
    keyframes before it was found out."""
    if not bad:
        return tracks
    b = np.fromiter(bad, np.int64)
    out = Tracks(list(tracks.keyframes), height=tracks.height, rotations=tracks.rotations)
    for p, i, v in zip(tracks.points, tracks.ids, tracks.velocity):
        keep = ~np.isin(i, b)
        out.points.append(p[keep])
        out.ids.append(i[keep])
        out.velocity.append(v[keep])
    return out
