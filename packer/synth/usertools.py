"""What the user's own scripts write into a session (stack/scripts/run_slam.py and
stack/scripts/calibrate_scale.py of the StackCapture repository), reproduced on a
synthetic session from its ground truth instead of from COLMAP:

run_slam.py (COLMAP on every 6th frame, then interpolation):
- poses.json = `json.dump(list, f, indent=2)` (Python layout: `"key": value`,
  2-space indent, no trailing newline) of, for every list position i in
  first..last, `{"timestamp": float(i) / 60.0, "rgbIndex": i, "depth": None,
  "transform": 4x4 nested list}`: camera-to-world, OpenCV axes, float64, in the
  reconstruction's arbitrary scale. `timestamp` is i/60 even for a 30 fps session,
  and i is the position in the SORTED LIST OF JPEG FILES, not the file's frame
  index: after a dropped frame (a gap) entry i shows file number i, whose real
  index is larger (the script's bug, kept);
- calib.txt = `f"{f:.4f} {f:.4f} {cx:.4f} {cy:.4f}"` from COLMAP's SIMPLE_RADIAL
  camera (no newline);
- metadata.json = `json.dump(meta, indent=2)` of the app's metadata with
  `slamProcessed` true and `poseCount` (keys keep the app's order).

calibrate_scale.py (when it succeeds): every translation multiplied by the factor,
poses.json rewritten the same way, metadata gets `scale_factor` (appended last).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from packer.synth.groundtruth import TRUTH_FILE
from packer.synth.trajectory import so3_exp, so3_log

__all__ = ["write_user_slam", "SFM_SCALE"]

SFM_SCALE = 0.3713  # metres per SfM unit of the (arbitrary) COLMAP reconstruction


def _interp_pose(Ta: np.ndarray, Tb: np.ndarray, a: float) -> np.ndarray:
    """run_slam.interpolate_poses between two keyframes: linear position, slerp rotation."""
    T = np.eye(4)
    T[:3, 3] = (1 - a) * Ta[:3, 3] + a * Tb[:3, 3]
    T[:3, :3] = Ta[:3, :3] @ so3_exp(a * so3_log(Ta[:3, :3].T @ Tb[:3, :3]))
    return T


def _scale_factor(scale: float | str | None, sfm_scale: float, truth_scale_error: float) -> float | None:
    """The factor calibrate_scale.py applied (None: it did not run or failed)."""
    if scale is None:
        return None
    if scale == "auto":
        return float(sfm_scale) * (1.0 + float(truth_scale_error))
    if isinstance(scale, (int, float)):
        return float(scale)
    raise ValueError(f"scale must be None, 'auto' or a number, got {scale!r}")


def _run_slam_entries(
    poses: np.ndarray, real_idx: list[int], first: int, last: int, subsample: int, sfm_scale: float
) -> list[dict[str, Any]]:
    """run_slam.py's poses.json entries for list positions first..last: keyframes
    exact (in SfM units), the poses between interpolated as the script does."""
    n_total = len(real_idx)

    def sfm_pose(pos: int) -> np.ndarray:
        T = poses[real_idx[pos]].copy()
        T[:3, 3] /= sfm_scale
        return T

    keys = [k for k in range(0, n_total, max(1, int(subsample)))]
    if keys[-1] != n_total - 1:
        keys.append(n_total - 1)
    keys = sorted({k for k in keys if first <= k <= last} | {first, last})
    out = []
    for i in range(first, last + 1):
        j = int(np.searchsorted(keys, i))
        if keys[j] == i:
            T = sfm_pose(i)
        else:
            a, b = keys[j - 1], keys[j]
            T = _interp_pose(sfm_pose(a), sfm_pose(b), (i - a) / (b - a))
        out.append({"timestamp": float(i) / 60.0, "rgbIndex": i, "depth": None, "transform": T.tolist()})
    return out


def _update_metadata(meta_path: Path, **fields: Any) -> None:
    """Re-read metadata.json, set `fields` (new keys go last), json.dump it back:
    what each script does, so key order matches theirs."""
    with open(meta_path) as f:
        meta = json.load(f)
    meta.update(fields)
    with open(meta_path, "w") as f:
        json.dump(meta, f, indent=2)


def _calibrate_session(d: Path, factor: float) -> None:
    """calibrate_scale.py's calibrate_session: scale every translation in
    poses.json by `factor`, rewrite it, and record `scale_factor` in metadata."""
    with open(d / "poses.json") as f:
        poses_raw = json.load(f)
    for e in poses_raw:
        T = np.array(e["transform"], dtype=np.float64).reshape(4, 4)
        T[:3, 3] *= factor
        e["transform"] = T.tolist()
    with open(d / "poses.json", "w") as f:
        json.dump(poses_raw, f, indent=2)
    _update_metadata(d / "metadata.json", scale_factor=factor)


def write_user_slam(
    session_dir: str | os.PathLike,
    first: int = 0,
    last: int | None = None,
    scale: float | str | None = None,
    *,
    truth_scale_error: float = 0.0,
    sfm_scale: float = SFM_SCALE,
    subsample: int = 1,
    colmap_intrinsics: tuple[float, float, float] | None = None,
    write_calib: bool = True,
) -> dict[str, Any]:
    """Write what run_slam.py (+ calibrate_scale.py) leave in `session_dir` (a
    synthetic session folder) and return what was applied.

    first, last: the registered range, as positions in the sorted list of JPEG files
    (inclusive; last=None: the last file).
    scale: None: calibrate_scale did not run or failed: positions are in SfM units
    (truth metres / sfm_scale), no scale_factor key. "auto": it succeeded with
    relative error `truth_scale_error`: factor = sfm_scale * (1 + truth_scale_error)
    (positions = truth metres * (1 + error)). A float: it succeeded with exactly
    that factor (positions = truth / sfm_scale * factor).
    sfm_scale: metres per unit of the arbitrary SfM reconstruction.
    subsample: 1 (default): every pose exact; 6 (the script's default): only
    keyframes (list positions 0, 6, 12, ... and the last file) are exact, the
    poses between are interpolated like the script does.
    colmap_intrinsics: (f, cx, cy) for calib.txt; None: the truth's (fx, cx, cy).

    Returns {"sfm_scale", "scale_factor" (None when uncalibrated), "metric_error"
    (written / true length - 1, None when uncalibrated), "frame_indices" (the real
    frame index each entry shows), "rgbIndex" (what the entries say)}."""
    d = Path(session_dir)
    if not d.is_dir():
        raise ValueError(f"{d}: the user's scripts run on a session folder (extract a .zip export first)")
    tr = json.loads((d / TRUTH_FILE).read_text())
    poses = np.asarray(tr["poses"], dtype=np.float64)
    files = sorted((d / "rgb").glob("*.jpg"))
    real_idx = [int(p.stem) for p in files]
    n_total = len(files)
    last = n_total - 1 if last is None else int(last)
    first = int(first)
    if not 0 <= first < last < n_total:
        raise ValueError(f"need 0 <= first < last < {n_total} (files), got {first}, {last}")
    factor = _scale_factor(scale, sfm_scale, truth_scale_error)

    out = _run_slam_entries(poses, real_idx, first, last, subsample, sfm_scale)
    with open(d / "poses.json", "w") as f:
        json.dump(out, f, indent=2)
    if write_calib:
        f_, cx, cy = colmap_intrinsics or (tr["intrinsics"][0], tr["intrinsics"][2], tr["intrinsics"][3])
        (d / "calib.txt").write_text(f"{f_:.4f} {f_:.4f} {cx:.4f} {cy:.4f}")
    _update_metadata(d / "metadata.json", slamProcessed=True, poseCount=len(out))
    if factor is not None:
        _calibrate_session(d, factor)

    return {
        "sfm_scale": float(sfm_scale),
        "scale_factor": factor,
        "metric_error": None if factor is None else factor / sfm_scale - 1.0,
        "frame_indices": [real_idx[i] for i in range(first, last + 1)],
        "rgbIndex": list(range(first, last + 1)),
    }
