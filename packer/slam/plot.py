"""`packer slam --plot`: top and side view of the metric trajectory, one PNG per session.

Views are along the trajectory's own principal axes (the SfM frame has no "up"),
so the top view shows the two directions of largest motion. Ground truth from a
synthetic session's synth_truth.json is drawn after a rigid (rotation +
translation, no scale) alignment: a scale error shows up as a size mismatch."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from packer.slam.rotations import umeyama

if TYPE_CHECKING:
    from packer.session import Session


def plot_session(session: Session, poses: np.ndarray, registered: np.ndarray, message: str, metric: bool) -> Path:
    """session/slam.png of the poses (the registered frames marked), truth drawn when known."""
    return plot_trajectory(session.path / "slam.png", poses[:, :3, 3], f"{session.name}: {message}",
                           truth=load_truth_positions(session.path, session.frames), metric=metric,
                           registered=registered)


def plot_stored(session: Session, message: str, metric: bool) -> Path | None:
    """`plot_session` of the poses a cached run left in poses.json (none marked registered)."""
    from packer.session import load_poses

    stored = load_poses(session)
    if not stored:
        return None
    poses = np.stack([stored[int(f)] for f in session.frames if int(f) in stored])
    if len(poses) != session.n_frames:
        return None
    return plot_session(session, poses, np.zeros(len(poses), bool), message, metric)


def load_truth_positions(session_dir: Path, frames: np.ndarray) -> np.ndarray | None:
    """Ground-truth camera centres (N,3) for `frames` from synth_truth.json, or None."""
    p = Path(session_dir) / "synth_truth.json"
    if not p.exists():
        return None
    import json

    try:
        d = json.loads(p.read_text())
        poses = np.asarray(d["poses"], dtype=np.float64)
        return poses[np.asarray(frames, dtype=np.int64), :3, 3]
    except (ValueError, KeyError, IndexError, OSError):
        return None


def plot_trajectory(path: Path, positions: np.ndarray, title: str, truth: np.ndarray | None = None,
                    metric: bool = True, registered: np.ndarray | None = None) -> Path:
    """Write a PNG with top and side views; returns `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    P = np.asarray(positions, dtype=np.float64)
    c = P.mean(0)
    _u, _s, Vt = np.linalg.svd(P - c, full_matrices=False)
    if Vt.shape[0] < 3:
        Vt = np.eye(3)
    Q = (P - c) @ Vt.T
    T = None
    if truth is not None and len(truth) == len(P):
        _sc, R, t = umeyama(truth, P, with_scale=False)
        T = (truth @ R.T + t - c) @ Vt.T
    unit = "m" if metric else "SfM units"
    fig, axes = plt.subplots(1, 2, figsize=(11, 5))
    for ax, (i, j), name in zip(axes, [(0, 1), (0, 2)], ["top view", "side view"]):
        if T is not None:
            ax.plot(T[:, i], T[:, j], "-", color="0.6", lw=2.5, label="ground truth (rigid alignment)")
        ax.plot(Q[:, i], Q[:, j], "-", color="C0", lw=1.2, label="estimate")
        if registered is not None and registered.any():
            ax.plot(Q[registered, i], Q[registered, j], ".", color="C0", ms=3, label="registered keyframes")
        ax.plot(Q[:1, i], Q[:1, j], "o", color="C2", label="start")
        ax.set_aspect("equal", adjustable="datalim")
        ax.set_xlabel(f"principal axis {i + 1} ({unit})")
        ax.set_ylabel(f"principal axis {j + 1} ({unit})")
        ax.set_title(name)
        ax.grid(True, alpha=0.3)
    axes[0].legend(loc="best", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)
    return path
