"""Every sample's labels, parsed once: the sample JSON columns as numpy arrays.

The reader used to parse each sample's JSON every time a batch held it (and the
earlier frames of a window once more): ~14% of a worker's time, plus ~5% for
the relative proprio sample by sample. Here the columns are read once, when the
dataset is first iterated (in the parent, before DataLoader workers fork: they
share the pages), and a batch's labels are a few fancy-indexing operations.
The JSON members are small (~1 KB), so reading them all costs one pread each:
~2 s for 60,000 samples here.

Non-finite values (a NaN pose or joint would turn the weights into NaN) are
refused once, naming the first sample, before any step."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packer.actions import IDENTITY6, POSE_DIMS, rot6d
from shardship.errors import ShardshipError
from shardship.progress import bar
from train.data.decode import sample_arrays
from train.data.index import ShardIndex
from train.data.shardio import ShardFiles


@dataclass
class Labels:
    """Per sample i of the index (all float32 but pose):"""

    action: np.ndarray  # (N, T, D) the action chunk
    action_mask: np.ndarray  # (N, T) 1 = real step
    joints: np.ndarray  # (N, J) the glove's joints at the frame (raw units; placeholders where not valid)
    joints_valid: np.ndarray  # (N,) bool: the frame's joints are known
    joints_mask: np.ndarray  # (N, T) 1 = that chunk step's joints are known
    pose: np.ndarray  # (N, 4, 4) float64 camera pose


def read_labels(index: ShardIndex, verify: bool = True, progress: bool = False) -> Labels:
    """Parse every sample's JSON member of `index` into a Labels table (its own
    file descriptors, closed when done: the parent process keeps none open)."""
    files = ShardFiles(index, verify)
    try:
        return _read(files, progress)
    finally:
        files.close()


def _read(files: ShardFiles, progress: bool) -> Labels:
    ix = files.index
    n, t, d, j = ix.n_samples, ix.horizon, ix.action_dim, ix.proprio_dim
    lab = Labels(action=np.empty((n, t, d), np.float32), action_mask=np.ones((n, t), np.float32),
                 joints=np.zeros((n, j), np.float32), joints_valid=np.ones(n, bool),
                 joints_mask=np.ones((n, t), np.float32), pose=np.empty((n, 4, 4), np.float64))
    b = bar(n, "read labels", "sample", None if (progress and n >= 20_000) else False, leave=False)
    for i in range(n):
        js = files.read_json(i)
        try:
            a = sample_arrays(js, t, d, j, with_pose=True)
        except (ValueError, TypeError, UnicodeDecodeError, AttributeError) as e:
            raise files.bad(i, f"sample JSON does not match index.json ({e})") from None
        lab.action[i] = a["action"]
        if a["action_mask"] is not None:
            lab.action_mask[i] = a["action_mask"]
        if a["joints_mask"] is not None:
            lab.joints_mask[i] = a["joints_mask"]
        if a["proprio"] is not None:
            lab.joints[i] = a["proprio"]
        lab.joints_valid[i] = a["joints_valid"]
        lab.pose[i] = a["pose"]
        if i % 4096 == 4095:
            b.update(4096)
    b.close()
    _check_finite(files, lab)
    return lab


def _check_finite(files: ShardFiles, lab: Labels) -> None:
    """Refuse a NaN/inf in a sample's action, pose or (valid) joints, by its key."""
    ix = files.index
    for name, arr in (("action", lab.action), ("pose", lab.pose),
                      ("proprio", np.where(lab.joints_valid[:, None], lab.joints, 0.0))):
        bad = ~np.isfinite(arr.reshape(len(arr), -1)).all(axis=1)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            s = int(ix.shard[i])
            raise ShardshipError(
                f"shard {ix.shard_names[s]}: sample {ix.key(i)}: {name} holds NaN or inf: the session's "
                "poses/joints hold NaN or inf; fix or drop the session, re-run `packer pack`")


def single_frame(lab: Labels, samples: np.ndarray, fill: np.ndarray) -> dict[str, np.ndarray]:
    """The single-frame layout's labels of `samples` (B,): proprio (B, J) is the
    frame's joints, `fill` (the dataset mean) where they are not known."""
    jv = lab.joints_valid[samples]
    return {"proprio": np.where(jv[:, None], lab.joints[samples], fill).astype(np.float32),
            "action": lab.action[samples], "action_mask": lab.action_mask[samples],
            "joints_valid": jv.astype(np.float32), "joints_mask": lab.joints_mask[samples]}


def window(lab: Labels, samples: np.ndarray, idx: np.ndarray, joint_fill: np.ndarray) -> dict[str, np.ndarray]:
    """The observation layout's labels: `idx` (B, N) are each sample's steps (its
    own index last). proprio (B, N, 9 + J): each step's pose relative to frame t
    (train.data.obs), then its joints (`joint_fill` where not known)."""
    same = idx == samples[:, None]
    jv = lab.joints_valid[idx]
    joints = np.where(jv[..., None], lab.joints[idx], joint_fill)
    rel = relative_poses(lab.pose[samples], lab.pose[idx], same)
    return {"proprio": np.concatenate([rel, joints], axis=-1).astype(np.float32),
            "action": lab.action[samples], "action_mask": lab.action_mask[samples],
            "joints_valid": lab.joints_valid[samples].astype(np.float32), "joints_mask": lab.joints_mask[samples]}


def relative_poses(ref: np.ndarray, poses: np.ndarray, same: np.ndarray) -> np.ndarray:
    """(B, N, 9): poses (B, N, 4, 4) relative to ref (B, 4, 4) as the action
    chunks have them (position R_t^T (p - p_t), rot6d(R_t^T R)); rows where
    `same` (frame t itself, or a repeat of it) are exactly 0 and rot6d(I)."""
    rt = np.transpose(ref[:, :3, :3], (0, 2, 1))
    pos = np.einsum("bij,bkj->bki", rt, poses[..., :3, 3] - ref[:, None, :3, 3])
    rot = rot6d(np.einsum("bij,bkjl->bkil", rt, poses[..., :3, :3]))
    out = np.concatenate([pos, rot], axis=-1)
    out[same, :3] = 0.0
    out[same, 3:POSE_DIMS] = IDENTITY6
    return out
