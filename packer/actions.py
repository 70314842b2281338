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


#: backward observation offsets whose statistics `packer pack` keeps (d = 0 is frame t
#: itself, d = 1 its predecessor, ...): a reader pools the first obs_horizon of them
OBS_STATS_STEPS = 4
IDENTITY6 = np.array([1.0, 0.0, 0.0, 0.0, 1.0, 0.0])  # rot6d of the identity


def relative_pose9(ref: np.ndarray, poses: np.ndarray) -> np.ndarray:
    """Poses (K,4,4) relative to `ref` (4,4), as the action chunks have them:
    position `R_ref^T (p - p_ref)`, then rot6d(`R_ref^T R`) -> (K, 9). The user's
    trainer computes the same (`T_ref^-1 T`, first two columns, column-major)."""
    rt = ref[:3, :3].T
    pos = (poses[:, :3, 3] - ref[:3, 3]) @ rt.T
    rel = np.einsum("ij,kjl->kil", rt, poses[:, :3, :3])
    return np.concatenate([pos, rot6d(rel)], axis=-1)


def obs_steps(poses: np.ndarray, joints: np.ndarray, n_obs: int) -> np.ndarray:
    """For every frame t of one posed run the observation proprio of frames
    t-d, d = n_obs-1 .. 0 (oldest first), relative to t: (N, n_obs, 9+J). Before
    the run's first frame the first frame repeats. Frame t itself is exactly zero
    position and rot6d(I) (not R^T R, which rounding leaves a ulp off)."""
    n = len(poses)
    d = np.arange(n_obs - 1, -1, -1)
    idx = np.maximum(np.arange(n)[:, None] - d[None, :], 0)  # (N, n_obs)
    r, p = poses[:, :3, :3], poses[:, :3, 3]
    rt = np.transpose(r, (0, 2, 1))
    pos = np.einsum("nij,nkj->nki", rt, p[idx] - p[:, None, :])
    rel = rot6d(np.einsum("nij,nkjl->nkil", rt, r[idx]))
    same = idx == np.arange(n)[:, None]
    pos[same] = 0.0
    rel[same] = IDENTITY6
    parts = [pos, rel]
    if joints.shape[1]:
        parts.append(joints[idx])
    return np.concatenate(parts, axis=-1)


def obs_stats(poses: np.ndarray | None, posed: np.ndarray, joints: np.ndarray, dims: np.ndarray,
              cut: np.ndarray | None = None, known: np.ndarray | None = None) -> list[RunningStats] | None:
    """Statistics of the relative observation proprio, one RunningStats per
    backward offset d = 0 .. OBS_STATS_STEPS-1 over every posed frame (each run
    repeating its first frame before its start, as the reader does; runs end at a
    gap, `cut`). `known` (N,): frames whose joints are real; a step on another frame
    adds its pose dimensions only (the reader fills its joints with the mean)."""
    if poses is None or not np.any(posed):
        return None
    out = [RunningStats(POSE_DIMS + joints.shape[1]) for _ in range(OBS_STATS_STEPS)]
    pose_dims, joint_dims = dims.copy(), dims.copy()
    pose_dims[POSE_DIMS:], joint_dims[:POSE_DIMS] = False, False
    for a, b in split_runs(posed, cut):
        steps = obs_steps(poses[a:b], joints[a:b], OBS_STATS_STEPS)  # oldest first
        for d in range(OBS_STATS_STEPS):
            rows = steps[:, OBS_STATS_STEPS - 1 - d]
            if known is None:
                out[d].add(rows, dims)
                continue
            out[d].add(rows, pose_dims)
            out[d].add(rows[np.asarray(known[a:b], bool)[np.maximum(np.arange(b - a) - d, 0)]], joint_dims)
    return out


def runs(flags: np.ndarray) -> list[tuple[int, int]]:
    """[start, stop) of every run of True in a 1-D bool array."""
    f = np.concatenate([[False], np.asarray(flags, bool), [False]])
    d = np.diff(f.astype(np.int8))
    return list(zip(np.nonzero(d == 1)[0].tolist(), np.nonzero(d == -1)[0].tolist()))


def split_runs(flags: np.ndarray, cut: np.ndarray | None = None) -> list[tuple[int, int]]:
    """`runs` of True, each also cut where `cut` (N-1,) is True between frames i and
    i+1 (a gap in time or numbering: nothing may span it)."""
    out = runs(flags)
    if cut is None or not np.any(cut):
        return out
    starts = np.nonzero(cut)[0] + 1
    pieces: list[tuple[int, int]] = []
    for a, b in out:
        inner = starts[(starts > a) & (starts < b)].tolist()
        edges = [a, *inner, b]
        pieces.extend(zip(edges[:-1], edges[1:]))
    return pieces


def segmented_chunks(poses: np.ndarray | None, posed: np.ndarray, joints: np.ndarray, horizon: int,
                     cut: np.ndarray | None = None) -> tuple[np.ndarray | None, np.ndarray]:
    """action_chunks over each run of frames that have a pose and follow each other
    (`split_runs`), so a chunk never reaches across a frame without one (a partial
    poses.json from another tool) nor across a gap (the camera dropped frames, a JPEG
    is missing): its steps there are masked like the steps past a session's end.
    Frames without a pose get zeros and mask 0; None when no frame has a pose."""
    n = len(posed)
    mask = np.zeros((n, horizon), np.uint8)
    if poses is None or not np.any(posed):
        return None, mask
    out = np.zeros((n, horizon, POSE_DIMS + joints.shape[1]))
    for a, b in split_runs(posed, cut):
        act, m = action_chunks(poses[a:b], joints[a:b], horizon)
        assert act is not None
        out[a:b], mask[a:b] = act, m
    return out, mask


def step_known(known: np.ndarray, posed: np.ndarray, horizon: int, cut: np.ndarray | None = None) -> np.ndarray:
    """(N, H) uint8: 1 where step k of frame t's chunk has its joints known (`known`
    (N,) per frame), over the same runs as `segmented_chunks` (past a run's end the
    step repeats the run's last frame, as the chunk does)."""
    n = len(posed)
    out = np.ones((n, horizon), np.uint8)
    k = np.arange(1, horizon + 1)
    for a, b in split_runs(posed, cut):
        jk = np.asarray(known[a:b], bool)
        out[a:b] = jk[np.minimum(np.arange(b - a)[:, None] + k[None, :], b - a - 1)]
    return out


class RunningStats:
    """Mergeable per-dimension count/sum/sumsq/min/max: each session keeps its own,
    so an unchanged session's statistics are reused without re-reading it. Counts are
    per dimension because a session without the glove adds its pose dimensions only."""

    def __init__(self, dim: int):
        self.n = np.zeros(dim, dtype=np.int64)
        self.s = np.zeros(dim)
        self.ss = np.zeros(dim)
        self.lo = np.full(dim, np.inf)
        self.hi = np.full(dim, -np.inf)

    def add(self, x: np.ndarray, dims: np.ndarray | None = None) -> None:
        """Add rows of x; `dims` (bool per dimension) limits which dimensions count."""
        x = x.reshape(-1, self.s.shape[0])
        if not len(x):
            return
        use = np.ones(self.s.shape[0], bool) if dims is None else np.asarray(dims, bool)
        self.n += len(x) * use
        self.s += np.where(use, x.sum(0), 0.0)
        self.ss += np.where(use, (x * x).sum(0), 0.0)
        self.lo = np.where(use, np.minimum(self.lo, x.min(0)), self.lo)
        self.hi = np.where(use, np.maximum(self.hi, x.max(0)), self.hi)

    def merge(self, other: RunningStats) -> None:
        self.n += other.n
        self.s += other.s
        self.ss += other.ss
        self.lo = np.minimum(self.lo, other.lo)
        self.hi = np.maximum(self.hi, other.hi)

    @property
    def count(self) -> int:
        """Rows seen by the dimension seen most."""
        return int(self.n.max()) if len(self.n) else 0

    def to_json(self) -> dict:
        seen = self.n > 0
        return {"n": self.n.tolist(), "sum": self.s.tolist(), "sumsq": self.ss.tolist(),
                "min": np.where(seen, self.lo, 0.0).tolist(), "max": np.where(seen, self.hi, 0.0).tolist()}

    @classmethod
    def from_json(cls, d: dict) -> RunningStats:
        r = cls(len(d["sum"]))
        r.n = np.broadcast_to(np.asarray(d["n"], dtype=np.int64), r.s.shape).copy()
        r.s, r.ss = np.array(d["sum"], dtype=np.float64), np.array(d["sumsq"], dtype=np.float64)
        if len(d.get("min") or []) == len(r.s):
            seen = r.n > 0
            r.lo = np.where(seen, np.array(d["min"], dtype=np.float64), np.inf)
            r.hi = np.where(seen, np.array(d["max"], dtype=np.float64), -np.inf)
        return r

    def summary(self) -> dict:
        """mean/std/min/max per dimension; a dimension nothing was seen for gets
        mean 0, std 1 (an identity normaliser) and min = max = 0."""
        if not self.count:
            return {"mean": [], "std": [], "min": [], "max": []}
        seen = self.n > 0
        n = np.maximum(self.n, 1)
        mean = np.where(seen, self.s / n, 0.0)
        var = np.where(seen, np.maximum(self.ss / n - mean * mean, 0.0), 1.0)
        return {"mean": mean.tolist(), "std": np.sqrt(var).tolist(), "min": np.where(seen, self.lo, 0.0).tolist(),
                "max": np.where(seen, self.hi, 0.0).tolist(), "count": self.n.tolist()}
