"""The streaming reader: an IterableDataset that yields ready-made batches.

Each DataLoader worker computes its own list of batches from (seed, epoch,
consumed, rank, world_size, worker, num_workers) (see partition.py). A batch's
labels come from the label table parsed once (train.data.labels); its images
are the distinct frames the batch's observation windows need, each read once
(neighbours in one `pread`, train.data.shardio) and decoded once straight into
its slot of a preallocated batch (train.data.decode), then copied to the
other slots that show the same frame. Workers share nothing and take no locks;
the index and the labels are numpy arrays inherited from the parent.

`images` says what a batch carries: "decode" (uint8 pixels, decoded here),
"bytes" (the distinct frames' JPEG bytes, for a decoder on the device:
train.data.frames), or "none" (labels only: the frames come from a cache).

Shards are checked against index.json (size, then sha256) once per shard per
process; `verify_shards` does it in the parent before workers fork, so workers
inherit the result."""
from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from packer.actions import POSE_DIMS
from shardship.errors import ShardshipError
from shardship.pil import cache_image_buffers
from train.data import decode, labels, obs, partition
from train.data.batch import BufferRing, alloc, alloc_batch, assemble
from train.data.decode import decode_jpeg_into
from train.data.index import ShardIndex
from train.data.normalize import make_normalizer, obs_summary
from train.data.shardio import MAX_OPEN_SHARDS, ShardFiles, verify_shard, verify_shards

IMAGES = ("decode", "bytes", "none")


class ShardDataset(IterableDataset):
    """Batches of `batch_size` samples for one DDP rank, in stream order.

    With `obs_horizon` N (the trainer passes its model preset's: 2 = frames t-1
    and t for small/base/stack, 1 for tiny; see
    train.data.obs for how the window is read and what happens at a session's
    start), yields dicts of CPU tensors:
      image   (B, N, 3, H, W) uint8   JPEG pixels as stored, oldest step first (a
                                      channels-last view: `.contiguous()` for NCHW memory)
      proprio (B, N, 9+J) float32     each step's pose relative to frame t (3 position,
                                      6-D rotation) and its J joints
      obs_mask (B, N) float32         1 = real frame, 0 = repeated (before the session's start)
    With `obs_horizon=None` (the single-frame layout shardship had first):
      image   (B, H, W, 3) uint8      channels last
      proprio (B, J) float32          joints at the frame
    and in both:
      action  (B, T, D) float32       action chunk (FORMAT.md)
      action_mask (B, T) float32      1 = real step, 0 = padded past session end
      joints_valid (B,) float32       0 = frame t's joints unknown (no glove, or it was silent then:
                                      its joints are placeholders)
      joint_mask (B, J) float32       0 = a joint its session never read (it only read -1)
      joints_mask (B, T) float32      0 = that step's joints not known (the glove was silent then)
      weight  (B,) float32            1 = counts, 0 = tail padding (tail="pad")
      index   (B,) int64              sample indices into the ShardIndex
      position (B,) int64             positions in the epoch stream (-1 = pad)

    `edges`: "mask" trains on every frame (padded steps masked), "inside" only on
    frames whose observation window and action chunk stay inside the session.
    `normalize`: None yields raw units (the trainer's model normalises on the
    device and keeps the map in its checkpoint); "minmax" or "zscore" yields
    action and proprio normalised with index.json's statistics
    (train.data.normalize; `self.normalizer` maps predictions back)."""

    def __init__(self, index: ShardIndex, batch_size: int, rank: int = 0, world_size: int = 1, seed: int = 0,
                 window: int = 8, tail: str = "drop", verify: bool = True, obs_horizon: int | None = None,
                 edges: str = "mask", normalize: str | None = None, run_length: int = 1, images: str = "decode"):
        super().__init__()
        if batch_size < 1:
            raise ShardshipError(f"batch_size must be >= 1 (got {batch_size})")
        if tail not in partition.TAILS:
            raise ValueError(f"tail must be one of {partition.TAILS}")
        if obs_horizon is not None and int(obs_horizon) < 1:
            raise ShardshipError(f"obs_horizon must be >= 1 (got {obs_horizon})")
        if images not in IMAGES:
            raise ValueError(f"images must be one of {IMAGES}")
        self.index = index
        self.obs_horizon = None if obs_horizon is None else int(obs_horizon)
        self.edges = edges
        self.anchors = obs.anchors(index, self.obs_horizon, edges)
        self.n_samples = int(len(self.anchors))
        self.normalizer = (make_normalizer(index.stats, normalize, index.action_dim, index.proprio_dim,
                                           self.obs_horizon) if normalize else None)
        self.batch_size = int(batch_size)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.seed = int(seed)
        self.window = int(window)
        self.run_length = max(1, int(run_length))
        self.tail = tail
        self.images = images
        self.epoch = 0
        self.consumed = 0
        self._counts = np.bincount(index.shard[self.anchors], minlength=index.n_shards).astype(np.int64)
        decode.prepare()  # here, before workers fork: they inherit it
        self.files = ShardFiles(index, verify)
        self._labels: labels.Labels | None = None
        # batches written into a ring of reused buffers (train.data.batch.BufferRing): only for a
        # consumer that uses each batch once and lets it go (the trainer sets it, a list of batches must not)
        self.reuse_buffers = False
        self._ring: BufferRing | None = None
        self._bytes_ring: BufferRing | None = None
        pstats = (index.stats or {}).get("proprio") or {}
        mean = pstats.get("mean") or []
        self._proprio_fill = np.asarray(mean if len(mean) == index.proprio_dim else np.zeros(index.proprio_dim),
                                        dtype=np.float32)
        self._joint_fill = np.zeros(index.proprio_dim, np.float32)
        if self.obs_horizon is not None:  # masked joints: the mean, 0 once normalised
            fill = obs_summary(index.stats, self.obs_horizon, index.proprio_dim)["mean"][POSE_DIMS:]
            self._joint_fill = (self.normalizer.proprio_offset[POSE_DIMS:] if self.normalizer is not None
                                else fill.astype(np.float32))

    @property
    def labels(self) -> labels.Labels:
        """Every sample's labels, parsed on first use (`make_loader` asks before workers fork)."""
        if self._labels is None:
            self._labels = labels.read_labels(self.index, self.files.verify)
        return self._labels

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Reader position: the same three integers on every rank (plus what they
        count: the sample set, its fingerprint and which windows were kept)."""
        return {"seed": self.seed, "epoch": self.epoch, "consumed": self.consumed,
                "n_samples": self.n_samples, "fingerprint": self.index.fingerprint(), "windows": self._windows()}

    def _windows(self) -> str:
        return f"obs={self.obs_horizon},edges={self.edges}"

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Continue from a saved position. Returns False (and starts the saved epoch
        from its beginning) when the sample set changed since (re-pack)."""
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        same = (state.get("n_samples") == self.n_samples
                and state.get("fingerprint", self.index.fingerprint()) == self.index.fingerprint()
                and state.get("windows", self._windows()) == self._windows())
        self.consumed = int(state["consumed"]) if same else 0
        return same

    def set_state(self, epoch: int, consumed: int = 0) -> None:
        if not 0 <= consumed <= self.n_samples:
            raise ValueError(f"consumed={consumed} outside 0..{self.n_samples}")
        self.epoch, self.consumed = int(epoch), int(consumed)

    def steps_per_epoch(self) -> int:
        return partition.steps_left(self.n_samples, 0, self.world_size, self.batch_size, self.tail)

    def __len__(self) -> int:
        """Batches this rank still gets in the current epoch (same on every rank)."""
        return partition.steps_left(self.n_samples, self.consumed, self.world_size, self.batch_size, self.tail)

    # ------------------------------------------------------------- iteration
    def my_batches(self, worker: int = 0, num_workers: int = 1) -> np.ndarray:
        batches = partition.rank_batches(self.n_samples, self.consumed, self.world_size, self.rank,
                                         self.batch_size, self.tail)
        return partition.worker_batches(batches, worker, num_workers)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        cache_image_buffers()
        self._ring = BufferRing() if self.reuse_buffers and info is not None else None
        self._bytes_ring = BufferRing() if self.reuse_buffers and info is not None else None
        order = self.order()
        for positions in self.my_batches(worker, num_workers):
            yield self.load_batch(order, positions)

    def order(self) -> np.ndarray:
        """This epoch's permutation of the dataset's positions (partition.epoch_order)."""
        return partition.epoch_order(self._counts, self.seed, self.epoch, self.window, self.run_length)

    def frames_of(self, order: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                           np.ndarray]:
        """(samples (B,), valid (B,), frames (B, N), obs_mask (B, N)): the batch's
        samples (a padded position repeats a real one), the sample indices of each
        one's observation steps (N = 1 for the single-frame layout) and which
        steps are real frames (0 = a repeat before the run's start)."""
        valid = positions >= 0
        filled = positions.copy()
        filled[~valid] = positions[valid][0] if valid.any() else 0
        samples = self.anchors[order[filled]]
        if self.obs_horizon is None:
            return samples, valid, samples[:, None], np.ones((len(samples), 1), np.float32)
        frames, obs_mask = obs.window(self.index, samples, self.obs_horizon)
        return samples, valid, frames, obs_mask

    def load_batch(self, order: np.ndarray, positions: np.ndarray) -> dict[str, torch.Tensor]:
        """The batch at `positions` of the epoch `order`: labels, and images as `self.images` says."""
        samples, valid, frames, obs_mask = self.frames_of(order, positions)
        b = len(samples)
        w, h = self.index.image_size
        if self.obs_horizon is None:
            lab = labels.single_frame(self.labels, samples, self._proprio_fill)
            shape: tuple[int, ...] = (b, h, w, 3)
        else:
            lab = labels.window(self.labels, samples, frames, self._joint_fill)
            if self.normalizer is not None:
                lab["action"] = self.normalizer.normalize_action(lab["action"])
                lab["proprio"] = self.normalizer.normalize_proprio(lab["proprio"])
            shape = (b, self.obs_horizon, h, w, 3)
        t_img, t_prop, t_act, t_mask, t_jv, *tail = alloc_batch(
            self.index, shape if self.images == "decode" else (*shape[:-3], 0, 0, 3), lab["proprio"].shape,
            self._ring)
        for t, k in ((t_prop, "proprio"), (t_act, "action"), (t_mask, "action_mask"), (t_jv, "joints_valid"),
                     (tail[4], "joints_mask")):
            t.numpy()[...] = lab[k]
        extra: dict[str, torch.Tensor] = {"joint_mask": torch.from_numpy(self.index.joint_mask(samples))}
        if self.obs_horizon is not None:
            tail[3].numpy()[...] = obs_mask
            extra["obs_mask"] = tail[3]
        if self.images == "decode":
            self.decode_frames(frames, t_img.numpy().reshape(-1, h, w, 3))
            if self.obs_horizon is not None:
                t_img = t_img.permute(0, 1, 4, 2, 3)
        elif self.images == "bytes":
            extra.update(self.frame_bytes(frames))
        else:
            extra["frames"] = torch.from_numpy(frames)  # for a cache (train.data.cache) to gather
        out = {**assemble(t_img, t_prop, t_act, t_mask, t_jv, tail, valid, samples, positions), **extra}
        if self.images != "decode":
            del out["image"]
        return out

    def decode_frames(self, frames: np.ndarray, out: np.ndarray) -> None:
        """Decode each distinct frame of `frames` (B, N) once into its first slot of
        `out` (B*N, H, W, 3), then copy it to the other slots that show it."""
        uniq, first, inverse = np.unique(frames.ravel(), return_index=True, return_inverse=True)
        for i, k, jpg in zip(uniq.tolist(), first.tolist(), self.files.read_frames(uniq.tolist()), strict=True):
            self.decode_image(i, jpg, out[k])
        src = first[inverse]
        dup = np.flatnonzero(src != np.arange(len(src)))
        if len(dup):
            out[dup] = out[src[dup]]

    def frame_bytes(self, frames: np.ndarray) -> dict[str, torch.Tensor]:
        """The distinct frames' JPEG bytes, concatenated ("jpeg", "jpeg_offsets": U+1),
        which of them each slot shows ("frame_slots": the shape of `frames`) and
        their sample indices ("jpeg_samples", to name one that does not decode)."""
        uniq, inverse = np.unique(frames.ravel(), return_inverse=True)
        jpgs = self.files.read_frames(uniq.tolist())
        sizes = np.array([len(j) for j in jpgs], np.int64)
        t_bytes, t_off, t_slots, t_uniq = alloc([((int(sizes.sum()),), torch.uint8), ((len(jpgs) + 1,), torch.int64),
                                                 (frames.shape, torch.int64), ((len(jpgs),), torch.int64)],
                                                self._bytes_ring)
        off = t_off.numpy()
        off[0] = 0
        np.cumsum(sizes, out=off[1:])
        flat = t_bytes.numpy()
        for j, a in zip(jpgs, off[:-1].tolist(), strict=True):
            flat[a:a + len(j)] = np.frombuffer(j, np.uint8)
        t_slots.numpy()[...] = inverse.reshape(frames.shape)
        t_uniq.numpy()[...] = uniq
        return {"jpeg": t_bytes, "jpeg_offsets": t_off, "frame_slots": t_slots, "jpeg_samples": t_uniq}

    # -------------------------------------------------------------- decoding
    def decode_image(self, i: int, jpg: memoryview, out: np.ndarray) -> None:
        try:
            decode_jpeg_into(jpg, out)
        except (OSError, ValueError, SyntaxError) as e:
            raise self.bad(i, f"JPEG does not decode ({e})") from None

    def bad(self, i: int, reason: str) -> ShardshipError:
        return self.files.bad(i, reason)

    def close(self) -> None:
        self.files.close()


def make_loader(dataset: ShardDataset, num_workers: int, pin_memory: bool = False,
                seed: int | None = None) -> DataLoader:
    """A DataLoader over already-batched items; workers are forked per epoch so
    each picks up the dataset's current (epoch, consumed). `seed` gives the loader
    its own generator: creating an iterator then draws nothing from the global
    torch RNG, so a resumed run's random stream matches an uninterrupted one."""
    dataset.labels  # noqa: B018 - parsed here, before the workers fork: they share it
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    # fork (Linux): workers share the parent's index pages and its verified-shard
    # cache; Python 3.14 would otherwise default to forkserver and re-hash shards
    ctx = "fork" if num_workers > 0 and sys.platform.startswith("linux") else None
    return DataLoader(
        dataset,
        batch_size=None,
        num_workers=num_workers,
        pin_memory=pin_memory,
        prefetch_factor=2 if num_workers > 0 else None,
        persistent_workers=False,
        generator=gen,
        multiprocessing_context=ctx,
    )


def unwrap_worker_error(err: ShardshipError) -> ShardshipError:
    """DataLoader re-raises a worker's exception with the worker traceback folded
    into the message; keep the one line the user needs."""
    text = str(err)
    if "Original Traceback" not in text:
        return err
    last = [ln for ln in text.strip().splitlines() if ln.strip()][-1]
    _, _, msg = last.partition(": ")
    return ShardshipError(msg or last, code=err.code)


def sample_keys(index: ShardIndex, indices: torch.Tensor | np.ndarray) -> list[str]:
    return [index.key(int(i)) for i in np.asarray(indices).tolist()]


__all__ = ["MAX_OPEN_SHARDS", "ShardDataset", "make_loader", "verify_shard", "verify_shards", "unwrap_worker_error",
           "sample_keys"]
