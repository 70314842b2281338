"""The shards from your own training loop: everything README "Use the shards from
your own training loop" shows, importable from one place.

    from train.api import load_index, open_dataset, make_loader, load_policy

`open_dataset` is `ShardDataset` with the user's defaults (2 frames, windows
inside the session, actions min-max to [-1, 1], proprio z-scored) and a session
filter; `load_policy` turns a shardship checkpoint into a callable policy. The
reader's position (`ds.state_dict()` / `ds.load_state_dict()`) is three integers,
so saving it next to your own checkpoint resumes the data stream exactly, on any
number of ranks."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from train.checkpoint import load_checkpoint
from train.data import ShardDataset, ShardIndex, load_index, make_loader, split_sessions, verify_shards
from train.data.normalize import Normalizer, make_normalizer
from train.model import DiffusionPolicy

__all__ = ["Normalizer", "ShardDataset", "ShardIndex", "load_index", "load_policy", "make_loader",
           "make_normalizer", "open_dataset", "split_sessions", "verify_shards"]


def open_dataset(data: str | Path | ShardIndex, batch_size: int, *, obs_horizon: int | None = 2,
                 normalize: str | None = "minmax", edges: str = "inside", sessions: Sequence[str] | None = None,
                 rank: int = 0, world_size: int = 1, seed: int = 0, tail: str = "drop",
                 verify: bool = True) -> ShardDataset:
    """A reader over a packed directory (or an already loaded index), for one of
    `world_size` ranks. Each item is a whole batch (a dict of tensors, ShardDataset's
    docstring lists them), so wrap it in `make_loader(ds, num_workers)`, not a
    DataLoader with its own batch_size. `sessions` keeps only those sessions (your
    train/validation split; `split_sessions` makes one). Shards are checked against
    index.json (size, sha256) here, once, before DataLoader workers fork.

    After each epoch call `ds.set_state(ds.epoch + 1)`; after each step add the
    global batch to `ds.consumed` (or keep the counts yourself) so `ds.state_dict()`
    says where to resume."""
    index = data if isinstance(data, ShardIndex) else load_index(data)
    if sessions is not None:
        index = index.select_sessions(list(sessions))
    if verify:
        verify_shards(index)
    return ShardDataset(index, batch_size, rank=rank, world_size=world_size, seed=seed, tail=tail,
                        obs_horizon=obs_horizon, edges=edges, normalize=normalize)


def load_policy(path: str | Path, device: str | torch.device = "cpu", ema: bool = True) -> DiffusionPolicy:
    """The policy a `train run` checkpoint holds (EMA weights by default), in eval
    mode on `device`. Call `policy.sample(batch["image"], batch["proprio"])` with a
    batch from a reader built with the checkpoint's `obs_horizon`
    (`policy.cfg["obs_horizon"]`) and `normalize=None`: the policy takes raw units
    and returns action chunks (B, T, D) in raw units, because the checkpoint
    carries its own normaliser."""
    ck = load_checkpoint(Path(path))
    policy = DiffusionPolicy(ck["model_config"])
    policy.load_state_dict(ck["ema"]["module"] if ema else ck["model"])
    return policy.to(device).eval()
