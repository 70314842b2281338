"""Multi-frame observations: which frames a sample's observation window holds
(the reader reads and decodes them, train.data.dataset; their relative proprio
is train.data.labels.window).

A sample is anchored at frame t; its observation steps are frames t-N+1 .. t
(oldest first) of the same session, found by position in the index: samples are
stored in frame order, so frame t-d is sample i-d whenever the run of posed
frames reaches back that far (`ShardIndex.run_before`).

At the start of a session (or of a run of posed frames) the missing earlier steps
repeat the run's first frame, so for N = 2 the first frame's t-1 is frame t
itself, and `obs_mask` says 0 for the repeated step. The user's trainer
(corneliusgruss/stack `StackDiffusionDataset`) never builds such a sample: its
windows start at t = N-1 and end where the action chunk would leave the session.
`edges="inside"` gives exactly that sample set (and is the trainer's default);
`edges="mask"` keeps every frame, repeated steps flagged by `obs_mask` and action
steps past the end by `action_mask`.

Proprio per step (13-D with the glove's 4 joints): the step's pose relative to
frame t (position `R_t^T (p_s - p_t)`, rotation rot6d(`R_t^T R_s`), the action
chunks' conventions, packer.actions), then the step's joints. Frame t itself is
exactly zero position and rot6d(I) = (1, 0, 0, 0, 1, 0)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from train.config import EDGES

if TYPE_CHECKING:
    from train.data.index import ShardIndex


def anchors(index: ShardIndex, obs_horizon: int | None, edges: str) -> np.ndarray:
    """The sample indices a dataset trains on (int64, shard-major). "mask": all;
    "inside": those whose observation window and whole action chunk lie inside
    their run of posed frames (no repeated step, no padded action step)."""
    if edges not in EDGES:
        raise ValueError(f"edges must be one of {EDGES} (got {edges!r})")
    if edges == "mask":
        return np.arange(index.n_samples, dtype=np.int64)
    back = max(1, obs_horizon or 1) - 1
    keep = (index.run_before >= back) & (index.run_after >= index.horizon)
    return np.flatnonzero(keep).astype(np.int64)


def window(index: ShardIndex, samples: np.ndarray, obs_horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """(B, N) sample indices of each sample's observation steps (oldest first;
    steps before the run's start repeat its first frame) and the (B, N) float32
    mask that is 0 for a repeated step."""
    d = np.arange(obs_horizon - 1, -1, -1, dtype=np.int64)[None, :]
    before = index.run_before[samples].astype(np.int64)[:, None]
    idx = samples[:, None] - np.minimum(d, before)
    return idx, (d <= before).astype(np.float32)
