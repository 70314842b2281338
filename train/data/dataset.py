"""The streaming reader: an IterableDataset that yields ready-made batches.

Each DataLoader worker computes its own list of batches from (seed, epoch,
consumed, rank, world_size, worker, num_workers) (see partition.py), then for
each sample does one positional read (`os.pread`, the jpg and json members are
adjacent in the tar) and decodes the JPEG with PIL (pillow-simd) straight into a
preallocated batch array. Workers share nothing and take no locks; the index is
numpy arrays inherited from the parent.

Shards are checked against index.json (size, then sha256) once per shard per
process; `verify_shards` does it in the parent before workers fork, so workers
inherit the result. A shard whose hash differs is refused by name; a shard that is
shorter than its members say raises a ShardshipError instead of blocking."""
from __future__ import annotations

import os
import sys
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from packer.actions import POSE_DIMS
from shardship.errors import ShardshipError
from shardship.hashing import sha256_file
from shardship.pil import cache_image_buffers
from train.data import decode, obs, partition
from train.data.batch import alloc_batch, assemble
from train.data.decode import decode_jpeg_into, sample_arrays
from train.data.index import ShardIndex
from train.data.normalize import make_normalizer, obs_summary

MAX_OPEN_SHARDS = 32
_HASH_CHUNK = 4 << 20

# path -> (size, mtime_ns, inode, sha256) of shards this process has hashed.
_VERIFIED: dict[str, tuple[int, int, int, str]] = {}


def _stat_key(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns, st.st_ino


def verify_shard(index: ShardIndex, s: int) -> None:
    """Size then sha256 of shard `s` against the manifest; cached per process."""
    path = index.shard_path(s)
    name = index.shard_names[s]
    expected_sha = index.shard_sha256[s]
    try:
        key = _stat_key(path)
    except FileNotFoundError:
        zst = path.with_name(path.name + ".zst")
        hint = (f"only {zst.name} is here: unpack it (`zstd -d {zst.name}`, or re-run `transfer upload`)"
                if zst.exists() else "re-run `transfer upload` or `packer pack`")
        raise ShardshipError(f"shard {name} listed in {index.root / 'index.json'} is missing: {hint}") from None
    cached = _VERIFIED.get(str(path))
    if cached is not None and cached[:3] == key and cached[3] == expected_sha:
        return
    size = key[0]
    expected_size = int(index.shard_bytes[s])
    if size != expected_size:
        what = "truncated" if size < expected_size else "larger than expected"
        raise ShardshipError(f"shard {name}: {size} bytes on disk, index.json says {expected_size} ({what}): "
                             "re-upload it (`transfer upload`) or re-pack")
    got = sha256_file(path, bufsize=_HASH_CHUNK)
    if got != expected_sha:
        raise ShardshipError(f"shard {name}: sha256 {got[:16]}... does not match index.json ({expected_sha[:16]}...): "
                             "the file is corrupt or from another pack; re-upload it (`transfer upload`) or re-pack")
    _VERIFIED[str(path)] = (*key, got)


def verify_shards(index: ShardIndex, progress: bool = False) -> None:
    """Check every shard once in this process (before DataLoader workers fork)."""
    from shardship.progress import bar

    b = bar(index.n_shards, "verify shards", "shard", None if progress else False, leave=False)
    for s in range(index.n_shards):
        verify_shard(index, s)
        b.update(1)
    b.close()


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
                 edges: str = "mask", normalize: str | None = None):
        super().__init__()
        if batch_size < 1:
            raise ShardshipError(f"batch_size must be >= 1 (got {batch_size})")
        if tail not in partition.TAILS:
            raise ValueError(f"tail must be one of {partition.TAILS}")
        if obs_horizon is not None and int(obs_horizon) < 1:
            raise ShardshipError(f"obs_horizon must be >= 1 (got {obs_horizon})")
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
        self.tail = tail
        self.verify = verify
        self.epoch = 0
        self.consumed = 0
        self._counts = np.bincount(index.shard[self.anchors], minlength=index.n_shards).astype(np.int64)
        decode.prepare()  # here, before workers fork: they inherit it
        self._fds: OrderedDict[int, int] = OrderedDict()
        pstats = (index.stats or {}).get("proprio") or {}
        mean = pstats.get("mean") or []
        self._proprio_fill = np.asarray(mean if len(mean) == index.proprio_dim else np.zeros(index.proprio_dim),
                                        dtype=np.float32)
        if self.obs_horizon is not None:  # masked joints: the mean, 0 once normalised
            fill = obs_summary(index.stats, self.obs_horizon, index.proprio_dim)["mean"][POSE_DIMS:]
            self._joint_fill = (self.normalizer.proprio_offset[POSE_DIMS:] if self.normalizer is not None
                                else fill.astype(np.float32))

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

    def __getstate__(self) -> dict[str, Any]:
        d = self.__dict__.copy()
        d["_fds"] = OrderedDict()  # file descriptors never cross a process boundary
        return d

    # ------------------------------------------------------------- iteration
    def my_batches(self, worker: int = 0, num_workers: int = 1) -> np.ndarray:
        batches = partition.rank_batches(self.n_samples, self.consumed, self.world_size, self.rank,
                                         self.batch_size, self.tail)
        return partition.worker_batches(batches, worker, num_workers)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        cache_image_buffers()
        order = partition.epoch_order(self._counts, self.seed, self.epoch, self.window)
        for positions in self.my_batches(worker, num_workers):
            yield self.load_batch(order, positions)

    def load_batch(self, order: np.ndarray, positions: np.ndarray) -> dict[str, torch.Tensor]:
        """Read and decode the samples at `positions` of the epoch `order`."""
        ix = self.index
        valid = positions >= 0
        filled = positions.copy()
        filled[~valid] = positions[valid][0] if valid.any() else 0
        samples = self.anchors[order[filled]]
        if self.obs_horizon is not None:
            return self._load_obs_batch(samples, valid, positions)
        b = len(samples)
        w, h = ix.image_size
        t_img, t_prop, t_act, t_mask, t_jv, *tail = alloc_batch(ix, (b, h, w, 3), (b, ix.proprio_dim))
        images, proprio, action, mask = t_img.numpy(), t_prop.numpy(), t_act.numpy(), t_mask.numpy()
        jvalid, jmask = t_jv.numpy(), tail[4].numpy()
        proprio[...] = 0
        mask[...] = 1
        jmask[...] = 1
        for i, si in enumerate(samples.tolist()):
            jpg, js = self._read(si)
            self.decode_image(si, jpg, images[i])
            jvalid[i] = self._decode_json(si, js, proprio[i], action[i], mask[i], jmask[i])
        self.check_finite(samples, action=action, proprio=proprio)
        return {**assemble(t_img, t_prop, t_act, t_mask, t_jv, tail, valid, samples, positions),
                "joint_mask": torch.from_numpy(ix.joint_mask(samples))}

    def _load_obs_batch(self, samples: np.ndarray, valid: np.ndarray,
                        positions: np.ndarray) -> dict[str, torch.Tensor]:
        """The obs_horizon layout (class docstring): N frames per sample, relative proprio."""
        ix = self.index
        assert self.obs_horizon is not None
        n = self.obs_horizon
        idx, obs_mask = obs.window(ix, samples, n)
        b = len(samples)
        w, h = ix.image_size
        t_img, t_prop, t_act, t_mask, t_jv, *tail = alloc_batch(ix, (b, n, h, w, 3),
                                                                  (b, n, POSE_DIMS + ix.proprio_dim))
        images, proprio, action, mask, jvalid, jmask = (t.numpy() for t in (t_img, t_prop, t_act, t_mask, t_jv,
                                                                             tail[4]))
        mask[...] = 1
        jmask[...] = 1
        for i in range(b):
            jvalid[i] = obs.load_window(self, idx[i], images[i], proprio[i], action[i], (mask[i], jmask[i]),
                                        self._joint_fill)
        self.check_finite(samples, action=action, proprio=proprio)
        if self.normalizer is not None:
            action[...] = self.normalizer.normalize_action(action)
            proprio[...] = self.normalizer.normalize_proprio(proprio)
        tail[3].numpy()[...] = obs_mask
        return {**assemble(t_img.permute(0, 1, 4, 2, 3), t_prop, t_act, t_mask, t_jv, tail, valid, samples, positions),
                "obs_mask": tail[3], "joint_mask": torch.from_numpy(ix.joint_mask(samples))}

    # -------------------------------------------------------------- file I/O
    def _fd(self, s: int) -> int:
        fd = self._fds.get(s)
        if fd is not None:
            self._fds.move_to_end(s)
            return fd
        if self.verify:
            verify_shard(self.index, s)
        try:
            fd = os.open(self.index.shard_path(s), os.O_RDONLY)
        except FileNotFoundError:
            raise ShardshipError(f"shard {self.index.shard_names[s]} disappeared from {self.index.root}: "
                                 "re-upload it (`transfer upload`)") from None
        self._fds[s] = fd
        if len(self._fds) > MAX_OPEN_SHARDS:
            _, old = self._fds.popitem(last=False)
            os.close(old)
        return fd

    def _read(self, i: int) -> tuple[memoryview, memoryview]:
        """(jpg bytes, json bytes) of sample `i`: one pread when the members are adjacent."""
        ix = self.index
        s = int(ix.shard[i])
        fd = self._fd(s)
        jo, jn, so, sn = int(ix.jpg_offset[i]), int(ix.jpg_size[i]), int(ix.json_offset[i]), int(ix.json_size[i])
        lo, hi = min(jo, so), max(jo + jn, so + sn)
        if hi - lo <= jn + sn + 4096:  # adjacent members: one read
            buf = os.pread(fd, hi - lo, lo)
            if len(buf) < hi - lo:
                raise self._truncated(fd, s, i, hi)
            mv = memoryview(buf)
            return mv[jo - lo:jo - lo + jn], mv[so - lo:so - lo + sn]
        out = []
        for off, n in ((jo, jn), (so, sn)):
            buf = os.pread(fd, n, off)
            if len(buf) < n:
                raise self._truncated(fd, s, i, off + n)
            out.append(memoryview(buf))
        return out[0], out[1]

    def read_many(self, idx: list[int]) -> list[tuple[memoryview, memoryview]]:
        """(jpg, json) of samples `idx` (ascending): one pread when they sit in one
        shard close together (an observation window), else one per sample."""
        ix = self.index
        s = int(ix.shard[idx[0]])
        if len(idx) == 1 or any(int(ix.shard[i]) != s for i in idx):
            return [self._read(i) for i in idx]
        lo = min(int(ix.jpg_offset[idx[0]]), int(ix.json_offset[idx[0]]))
        hi = max(int(ix.jpg_offset[i] + ix.jpg_size[i]) for i in idx)
        hi = max(hi, max(int(ix.json_offset[i] + ix.json_size[i]) for i in idx))
        if hi - lo > int(sum(ix.jpg_size[i] + ix.json_size[i] for i in idx)) + 4096 * len(idx):
            return [self._read(i) for i in idx]
        fd = self._fd(s)
        buf = os.pread(fd, hi - lo, lo)
        if len(buf) < hi - lo:
            raise self._truncated(fd, s, idx[-1], hi)
        mv = memoryview(buf)
        out = []
        for i in idx:
            jo, so = int(ix.jpg_offset[i]) - lo, int(ix.json_offset[i]) - lo
            out.append((mv[jo:jo + int(ix.jpg_size[i])], mv[so:so + int(ix.json_size[i])]))
        return out

    def _truncated(self, fd: int, s: int, i: int, need: int) -> ShardshipError:
        """A read came up short: say which file is wrong. The shard shorter than
        index.json says -> re-upload the shard; the shard as long as index.json says
        but a sample reaching past it -> index.json is inconsistent -> re-pack."""
        name, expected = self.index.shard_names[s], int(self.index.shard_bytes[s])
        size = os.fstat(fd).st_size
        if size < expected:
            return ShardshipError(f"shard {name} is truncated: {size} bytes on disk, index.json says {expected}: "
                                  "re-upload the shard (`transfer upload`)")
        return ShardshipError(f"{self.index.root / 'index.json'}: sample {self.index.key(i)} needs bytes up to {need} "
                              f"of shard {name}, which has the {size} bytes index.json gives it: index.json is "
                              "inconsistent; re-run `packer pack`")

    def decode_image(self, i: int, jpg: memoryview, out: np.ndarray) -> None:
        try:
            decode_jpeg_into(jpg, out)
        except (OSError, ValueError, SyntaxError) as e:
            raise self.bad(i, f"JPEG does not decode ({e})") from None

    def _decode_json(self, i: int, js: memoryview, proprio: np.ndarray, action: np.ndarray,
                     mask: np.ndarray, jmask: np.ndarray) -> float:
        """Fill one sample's arrays; returns 1.0 when its joints are real, 0.0 when
        masked (no glove): its proprio is then the dataset mean (0 once normalised)."""
        try:
            d = sample_arrays(bytes(js), action.shape[0], action.shape[1], proprio.shape[0])
        except (ValueError, TypeError, UnicodeDecodeError, AttributeError) as e:
            raise self.bad(i, f"sample JSON does not match index.json ({e})") from None
        action[...] = d["action"]
        if d["action_mask"] is not None:
            mask[...] = d["action_mask"]
        if d["joints_mask"] is not None:
            jmask[...] = d["joints_mask"]
        if not d["joints_valid"]:
            proprio[...] = self._proprio_fill
            return 0.0
        if d["proprio"] is not None:
            proprio[...] = d["proprio"]
        return 1.0

    def check_finite(self, samples: np.ndarray, **arrays: np.ndarray) -> None:
        """A NaN/inf in a sample would turn the weights into NaN: refuse it here, by
        its key, before it reaches a gradient (and so a checkpoint). One check per
        batch (arrays lead with the batch axis, `samples` names their rows)."""
        for name, batch in arrays.items():
            if not np.isfinite(batch).all():
                first = [int(x) for x in np.argwhere(~np.isfinite(batch))[0]]
                i, a, at = int(samples[first[0]]), batch[first[0]], tuple(first[1:])
                s = int(self.index.shard[i])
                raise ShardshipError(
                    f"shard {self.index.shard_names[s]}: sample {self.index.key(i)}: {name}{list(at)} is "
                    f"{a[at]}: the session's poses/joints hold NaN or inf; fix or drop the session, re-run "
                    "`packer pack`")

    def bad(self, i: int, reason: str) -> ShardshipError:
        s = int(self.index.shard[i])
        return ShardshipError(f"shard {self.index.shard_names[s]}: sample {self.index.key(i)}: {reason}; re-pack")

    def close(self) -> None:
        while self._fds:
            _, fd = self._fds.popitem()
            os.close(fd)


def make_loader(dataset: ShardDataset, num_workers: int, pin_memory: bool = False,
                seed: int | None = None) -> DataLoader:
    """A DataLoader over already-batched items; workers are forked per epoch so
    each picks up the dataset's current (epoch, consumed). `seed` gives the loader
    its own generator: creating an iterator then draws nothing from the global
    torch RNG, so a resumed run's random stream matches an uninterrupted one."""
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


__all__ = ["ShardDataset", "make_loader", "verify_shard", "verify_shards", "unwrap_worker_error", "sample_keys"]
