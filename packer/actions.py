"""Action chunks: what the policy must predict from one frame, made self-contained
so a shuffled stream never needs a sample's neighbours. Pure numpy."""
from __future__ import annotations

import numpy as np

POSE_DIMS = 9  # 3 position + 6-D rotation


def rot6d(r: np.ndarray) -> np.ndarray:
    """First two columns of rotation matrices (..., 3, 3) -> (..., 6), column-major.
    Continuous, unlike Euler angles or quaternions (Zhou et al. 2019)."""
    return np.concatenate([r[..., :, 0], r[..., :, 1]], axis=-1)


def action_chunks(
    poses: np.ndarray | None, joints: np.ndarray | None, horizon: int
) -> tuple[np.ndarray | None, np.ndarray]:
    """For every frame t the next `horizon` steps relative to t.

    poses: (N,4,4) camera-to-world or None; joints: (N,J) or None.
    Returns actions (N, H, 9+J) or None when there are no poses, and a mask (N, H)
    that is 0 where t+k ran past the end (padded by repeating the last frame)."""
    n = len(poses) if poses is not None else (len(joints) if joints is not None else 0)
    k = np.arange(1, horizon + 1)
    idx = np.minimum(np.arange(n)[:, None] + k[None, :], n - 1)  # (N, H)
    mask = (np.arange(n)[:, None] + k[None, :] <= n - 1).astype(np.uint8)
    if poses is None:
        return None, mask
    r, p = poses[:, :3, :3], poses[:, :3, 3]
    rt = np.transpose(r, (0, 2, 1))  # R_t^T
    dp = p[idx] - p[:, None, :]  # (N,H,3) world
    pos = np.einsum("nij,nhj->nhi", rt, dp)
    rel = np.einsum("nij,nhjk->nhik", rt, r[idx])
    parts = [pos, rot6d(rel)]
    if joints is not None and joints.shape[1]:
        parts.append(joints[idx])
    return np.concatenate(parts, axis=-1), mask


class RunningStats:
    """Mergeable per-dimension count/sum/sumsq/min/max: each session keeps its own,
    so an unchanged session's statistics are reused without re-reading it."""

    def __init__(self, dim: int):
        self.n = 0
        self.s = np.zeros(dim)
        self.ss = np.zeros(dim)
        self.lo = np.full(dim, np.inf)
        self.hi = np.full(dim, -np.inf)

    def add(self, x: np.ndarray) -> None:
        x = x.reshape(-1, self.s.shape[0])
        if not len(x):
            return
        self.n += len(x)
        self.s += x.sum(0)
        self.ss += (x * x).sum(0)
        self.lo = np.minimum(self.lo, x.min(0))
        self.hi = np.maximum(self.hi, x.max(0))

    def merge(self, other: "RunningStats") -> None:
        self.n += other.n
        self.s += other.s
        self.ss += other.ss
        self.lo = np.minimum(self.lo, other.lo)
        self.hi = np.maximum(self.hi, other.hi)

    def to_json(self) -> dict:
        return {"n": self.n, "sum": self.s.tolist(), "sumsq": self.ss.tolist(),
                "min": self.lo.tolist() if self.n else [], "max": self.hi.tolist() if self.n else []}

    @classmethod
    def from_json(cls, d: dict) -> "RunningStats":
        r = cls(len(d["sum"]))
        r.n, r.s, r.ss = d["n"], np.array(d["sum"]), np.array(d["sumsq"])
        if r.n:
            r.lo, r.hi = np.array(d["min"]), np.array(d["max"])
        return r

    def summary(self) -> dict:
        if not self.n:
            return {"mean": [], "std": [], "min": [], "max": []}
        mean = self.s / self.n
        var = np.maximum(self.ss / self.n - mean * mean, 0.0)
        return {"mean": mean.tolist(), "std": np.sqrt(var).tolist(), "min": self.lo.tolist(), "max": self.hi.tolist()}
