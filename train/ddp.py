"""torchrun environment -> process group, device and rank helpers.

One process per GPU (or per CPU slot): torchrun sets RANK, WORLD_SIZE and
LOCAL_RANK; without them this is a single process and nothing is initialised.
Device: auto picks cuda, then mps, then cpu. Backend: nccl on CUDA, gloo
otherwise. Only rank 0 logs and writes checkpoints.
The data path needs no collective at all (see train/data/partition.py); the
trainer's collectives happen on steps every rank reaches (gradient all-reduce,
the periodic metrics/stop-flag all-reduce, validation, checkpoints)."""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from shardship.errors import ShardshipError
from train.config import DEVICES

TIMEOUT = datetime.timedelta(minutes=30)


@dataclass
class Dist:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str | None  # None: single process

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.distributed:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def all_gather_object(self, obj: Any) -> list[Any]:
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out


def env_ranks() -> tuple[int, int, int]:
    """(rank, world_size, local_rank) from the torchrun environment."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", str(rank)))
    except ValueError as e:
        raise ShardshipError(f"bad torchrun environment (RANK/WORLD_SIZE/LOCAL_RANK): {e}") from None
    if not 0 <= rank < world:
        raise ShardshipError(f"RANK={rank} outside WORLD_SIZE={world}: start with torchrun")
    return rank, world, local


def mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def device_kind(device: str = "auto") -> str:
    """"auto" -> cuda, then mps (Apple GPUs), then cpu; a named device is checked."""
    if device not in DEVICES:
        raise ShardshipError(f"device must be {', '.join(DEVICES)} (got {device!r})")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "mps" if mps_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ShardshipError("device=cuda but torch sees no GPU (CUDA_VISIBLE_DEVICES? a CPU-only torch build?)")
    if device == "mps" and not mps_available():
        raise ShardshipError("device=mps but torch sees no Apple GPU (macOS 12.3+ on Apple silicon, torch with MPS)")
    return device


def pick_device(device: str = "auto", local_rank: int = 0) -> torch.device:
    """The torch device for `device` (auto|cuda|mps|cpu); on CUDA the GPU of `local_rank`."""
    kind = device_kind(device)
    if kind != "cuda":
        return torch.device(kind)
    n = torch.cuda.device_count()
    if local_rank >= n:
        raise ShardshipError(f"LOCAL_RANK {local_rank} but only {n} GPU(s) visible: start torchrun with "
                             f"--nproc_per_node {n} (one process per GPU)")
    dev = torch.device("cuda", local_rank)
    torch.cuda.set_device(dev)
    return dev


def setup(device: str = "auto") -> Dist:
    """Pick the device and join the process group when torchrun started us:
    nccl on CUDA, gloo otherwise (MPS has no collective backend of its own)."""
    rank, world, local = env_ranks()
    dev = pick_device(device, local)
    use_cuda = dev.type == "cuda"
    backend = None
    if world > 1 and dev.type == "mps":
        raise ShardshipError("MPS runs one process (one Apple GPU, no collective backend): start without torchrun")
    if world > 1:
        backend = "nccl" if use_cuda else "gloo"
        if not dist.is_initialized():
            dist.init_process_group(backend=backend, timeout=TIMEOUT)
    return Dist(rank=rank, world_size=world, local_rank=local, device=dev, backend=backend)


def cleanup() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
