"""Scale without an IMU: an ArUco marker of known size, or one known distance.

Marker: OpenCV detects the marker in each registered keyframe and solves its pose
(PnP, IPPE for squares); with the marker's rotation averaged in the SfM frame, each
frame's translation is re-solved, which places the camera centre in metres in the
marker frame. A similarity (Umeyama) from the SfM camera centres to those metric
centres gives the scale; frames whose residual is far above the median (a bad
detection) are dropped and the fit is repeated.

Known distance: the user says the camera centres of two frames are D metres apart."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from packer.slam.rotations import umeyama


class MarkerError(ValueError):
    """The marker/known-distance scale cannot be computed; str() is the reason."""


@dataclass
class MarkerScale:
    scale: float
    residual: float  # RMS metres of the sim(3) fit
    rel_std: float  # approximate std(s)/s
    n_frames: int  # frames used in the final fit
    n_detected: int
    marker_id: int


def _aruco_dict(name: str):
    import cv2

    if not hasattr(cv2.aruco, name):
        raise MarkerError(f"unknown ArUco dictionary {name!r} (e.g. DICT_4X4_50, DICT_6X6_250)")
    return cv2.aruco.getPredefinedDictionary(getattr(cv2.aruco, name))


def detect_marker_corners(
    image_paths: Sequence[Path], dictionary: str = "DICT_4X4_50", marker_id: int | None = None
) -> tuple[dict[int, np.ndarray], int]:
    """{position in image_paths: (4,2) corner pixels (OpenCV convention)} of one
    marker, and its id (the one seen most often unless `marker_id` is given)."""
    import cv2

    params = cv2.aruco.DetectorParameters()
    # sub-pixel corners: contour corners are biased by ~0.5 px, ~1% of scale at 100 px
    params.cornerRefinementMethod = cv2.aruco.CORNER_REFINE_SUBPIX
    det = cv2.aruco.ArucoDetector(_aruco_dict(dictionary), params)
    seen: dict[int, dict[int, np.ndarray]] = {}
    for i, p in enumerate(image_paths):
        img = cv2.imread(str(p), cv2.IMREAD_GRAYSCALE)
        if img is None:
            continue
        corners, ids, _rej = det.detectMarkers(img)
        if ids is None:
            continue
        for c, mid in zip(corners, ids.ravel()):
            if marker_id is None or int(mid) == marker_id:
                seen.setdefault(int(mid), {})[i] = c.reshape(4, 2).astype(np.float64)
    if not seen:
        return {}, -1 if marker_id is None else marker_id
    best = max(seen, key=lambda k: len(seen[k]))
    return seen[best], best


def _camera_matrix(intrinsics: tuple[float, float, float, float]) -> np.ndarray:
    fx, fy, cx, cy = intrinsics
    # COLMAP pixel centres are at +0.5, OpenCV's at 0: shift the principal point.
    return np.array([[fx, 0, cx - 0.5], [0, fy, cy - 0.5], [0, 0, 1.0]])


def _marker_points(size: float) -> np.ndarray:
    h = size / 2.0
    return np.array([[-h, h, 0], [h, h, 0], [h, -h, 0], [-h, -h, 0]], dtype=np.float64)


def _translation_given_rotation(R_cm: np.ndarray, obj: np.ndarray, rays: np.ndarray) -> np.ndarray:
    """t minimising the cross-product residuals ray_k x (R X_k + t) = 0 (linear in t)."""
    A = np.vstack([hat_row for r in rays for hat_row in _skew(r)])
    b = np.concatenate([-_skew(r) @ (R_cm @ X) for r, X in zip(rays, obj)])
    return np.linalg.lstsq(A, b, rcond=None)[0]


def _skew(v: np.ndarray) -> np.ndarray:
    return np.array([[0.0, -v[2], v[1]], [v[2], 0.0, -v[0]], [-v[1], v[0], 0.0]])


def marker_camera_centres(
    image_paths: Sequence[Path],
    intrinsics: tuple[float, float, float, float],
    marker_size: float,
    dictionary: str = "DICT_4X4_50",
    marker_id: int | None = None,
    R_wc: np.ndarray | None = None,
) -> tuple[dict[int, np.ndarray], int]:
    """{position in image_paths: camera centre (3,) in the marker frame, metres} for
    every image where the marker is seen, and the marker id used.

    Per-frame PnP (IPPE) of a small, nearly fronto-parallel square has a poorly
    determined rotation, which moves the camera centre sideways by centimetres. With
    the SfM camera-to-world rotations `R_wc` (one per image) the marker's rotation in
    the SfM world is a constant: average it over the frames, then re-solve each
    frame's translation with its rotation fixed (linear), which leaves only the
    well-determined part of PnP."""
    import cv2

    corners, mid = detect_marker_corners(image_paths, dictionary, marker_id)
    K = _camera_matrix(intrinsics)
    obj = _marker_points(marker_size)
    Kinv = np.linalg.inv(K)
    poses: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for i, c in corners.items():
        ok, rvec, tvec = cv2.solvePnP(obj, c, K, None, flags=cv2.SOLVEPNP_IPPE_SQUARE)
        if ok:
            poses[i] = (cv2.Rodrigues(rvec)[0], tvec.ravel())
    if R_wc is not None and len(poses) >= 3:
        R_wm = _average_rotation([R_wc[i] @ R for i, (R, _t) in poses.items()])
        out = {}
        for i in poses:
            R_cm = R_wc[i].T @ R_wm
            rays = (np.column_stack([corners[i], np.ones(4)]) @ Kinv.T)
            t = _translation_given_rotation(R_cm, obj, rays)
            out[i] = -R_cm.T @ t
        return out, mid
    return {i: -R.T @ t for i, (R, t) in poses.items()}, mid


def _average_rotation(Rs: list[np.ndarray], iters: int = 3, max_deg: float = 5.0) -> np.ndarray:
    """Chordal mean of rotations, re-computed without those more than `max_deg` off
    (a flipped IPPE solution)."""
    Rs_a = np.asarray(Rs)
    keep = np.ones(len(Rs_a), bool)
    M = np.eye(3)
    for _ in range(iters):
        U, _S, Vt = np.linalg.svd(Rs_a[keep].sum(0))
        M = U @ np.diag([1.0, 1.0, np.sign(np.linalg.det(U @ Vt))]) @ Vt
        ang = np.degrees(np.arccos(np.clip((np.trace(np.swapaxes(Rs_a, 1, 2) @ M, axis1=1, axis2=2) - 1) / 2, -1, 1)))
        new = ang <= max(max_deg, float(np.median(ang)) * 3)
        if new.sum() < 3 or np.array_equal(new, keep):
            break
        keep = new
    return M


def scale_from_marker(
    sfm_centres: np.ndarray, marker_centres: np.ndarray, min_frames: int = 5, max_rel_std: float = 0.02,
    marker_id: int = -1, n_detected: int | None = None,
) -> MarkerScale:
    """Sim(3) fit of SfM camera centres (N,3) to metric marker-frame centres (N,3)."""
    n = len(sfm_centres)
    if n < min_frames:
        raise MarkerError(f"marker seen in only {n} registered keyframes; need {min_frames}")
    keep = np.ones(n, bool)
    for _ in range(3):
        s, R, t = umeyama(sfm_centres[keep], marker_centres[keep])
        r = np.linalg.norm(s * sfm_centres @ R.T + t - marker_centres, axis=1)
        med = float(np.median(r[keep]))
        new = r <= max(3.0 * 1.4826 * med, 1e-6)
        if new.sum() < min_frames or np.array_equal(new, keep):
            break
        keep = new
    s, R, t = umeyama(sfm_centres[keep], marker_centres[keep])
    r = np.linalg.norm(s * sfm_centres[keep] @ R.T + t - marker_centres[keep], axis=1)
    rms = float(np.sqrt(np.mean(r**2)))
    spread = float(np.sqrt(np.mean(np.sum((marker_centres[keep] - marker_centres[keep].mean(0)) ** 2, axis=1))))
    rel = rms / (spread * np.sqrt(max(int(keep.sum()) - 3, 1))) if spread > 0 else float("inf")
    if rel > max_rel_std:
        raise MarkerError(
            f"marker scale poorly constrained (+-{rel:.1%}, need <= {max_rel_std:.0%}): the camera moved "
            f"{spread * 100:.1f} cm RMS around the marker with {rms * 100:.1f} cm fit error"
        )
    return MarkerScale(
        float(s), rms, float(rel), int(keep.sum()), n_detected if n_detected is not None else n, marker_id
    )


def parse_known_distance(text: str) -> tuple[int, int, float]:
    """'A:B:METRES' -> (frame A, frame B, metres)."""
    parts = text.replace(",", ":").split(":")
    try:
        a, b, d = int(parts[0]), int(parts[1]), float(parts[2])
        if len(parts) != 3:
            raise ValueError
    except (ValueError, IndexError):
        raise MarkerError(f"--known-distance takes FRAME_A:FRAME_B:METRES (e.g. 0:240:0.35), got {text!r}") from None
    if a == b or not d > 0 or not np.isfinite(d):
        raise MarkerError(f"--known-distance needs two different frames and a positive distance, got {text!r}")
    return a, b, d


def scale_from_known_distance(c_a: np.ndarray, c_b: np.ndarray, metres: float) -> float:
    """Scale making the SfM distance between two camera centres equal `metres`."""
    d = float(np.linalg.norm(np.asarray(c_a) - np.asarray(c_b)))
    if d <= 1e-12:
        raise MarkerError("the two --known-distance frames have the same SfM camera centre")
    return metres / d
