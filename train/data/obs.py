"""Multi-frame observations: which frames a sample's observation window holds,
and how one window is read, decoded and turned into relative proprio.

A sample is anchored at frame t; its observation steps are frames t-N+1 .. t
(oldest first) of the same session, found by position in the index: samples are
stored in frame order, so frame t-d is sample i-d whenever the run of posed
frames reaches back that far (`ShardIndex.run_before`). A neighbour in the
previous shard is fine (a second read); neighbours in the same shard come from
one `pread` of the byte span they share with frame t.

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

from packer.actions import IDENTITY6, POSE_DIMS, relative_pose9
from train.config import EDGES
from train.data.decode import obs_arrays, sample_arrays

if TYPE_CHECKING:
    from train.data.dataset import ShardDataset
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


def relative_proprio(pose_t: np.ndarray, poses: np.ndarray, same: np.ndarray, joints: np.ndarray) -> np.ndarray:
    """(N, 9 + J) proprio of the steps relative to frame t; rows where `same`
    (frame t itself, or a repeat of it) are exactly zero position and rot6d(I)."""
    rel = relative_pose9(pose_t, poses)
    rel[same, :3] = 0.0
    rel[same, 3:POSE_DIMS] = IDENTITY6
    return np.concatenate([rel, joints], axis=-1)


def load_window(ds: ShardDataset, idx: np.ndarray, images: np.ndarray, proprio: np.ndarray, action: np.ndarray,
                masks: tuple[np.ndarray, np.ndarray], joint_fill: np.ndarray) -> float:
    """Fill one sample's arrays from its observation steps `idx` (the last is the
    anchor t): images (N, H, W, 3), proprio (N, 9+J), action (T, D), masks: the
    action mask and the steps' joints mask (T,) each.
    Returns 1.0 when frame t has real joints, 0.0 when masked (no glove): the
    joint part of proprio is then `joint_fill` (normalises to 0)."""
    ix = ds.index
    anchor = int(idx[-1])
    order = sorted(set(idx.tolist()))
    members = dict(zip(order, ds.read_many(order), strict=True))
    decoded: dict[int, int] = {}
    n_joints = ix.proprio_dim
    poses = np.empty((len(idx), 4, 4))
    joints = np.empty((len(idx), n_joints), dtype=np.float32)
    valid = 1.0
    for k, j in enumerate(idx.tolist()):
        if j in decoded:
            images[k] = images[decoded[j]]
        else:
            ds.decode_image(j, members[j][0], images[k])
            decoded[j] = k
        try:
            if j == anchor:
                d = sample_arrays(bytes(members[j][1]), action.shape[0], action.shape[1], n_joints,
                                  with_pose=True)
                pose, jnt, jv = d["pose"], d["proprio"], d["joints_valid"]
                action[...] = d["action"]
                if d["action_mask"] is not None:
                    masks[0][...] = d["action_mask"]
                if d["joints_mask"] is not None:
                    masks[1][...] = d["joints_mask"]
            else:
                pose, jnt, jv = obs_arrays(bytes(members[j][1]), n_joints)
        except (ValueError, TypeError, UnicodeDecodeError, AttributeError) as e:
            raise ds.bad(j, f"sample JSON does not match index.json ({e})") from None
        poses[k] = pose
        joints[k] = jnt if (jv and jnt is not None) else joint_fill
        if j == anchor and not jv:
            valid = 0.0
    proprio[...] = relative_proprio(poses[-1], poses, idx == anchor, joints)
    return valid  # finite values: checked per batch by the caller
