"""torchrun environment -> process group, device and rank helpers.

One process per GPU (or per CPU slot): torchrun sets RANK, WORLD_SIZE and
LOCAL_RANK; without them this is a single process and nothing is initialised.
Backend: nccl on CUDA, gloo on CPU. Only rank 0 logs and writes checkpoints.
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


def setup(device: str = "auto") -> Dist:
    """Pick the device and join the process group when torchrun started us."""
    rank, world, local = env_ranks()
    if device not in ("auto", "cpu", "cuda"):
        raise ShardshipError(f"device must be auto, cpu or cuda (got {device!r})")
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if use_cuda:
        if not torch.cuda.is_available():
            raise ShardshipError("device=cuda but torch sees no GPU (CUDA_VISIBLE_DEVICES? a CPU-only torch build?)")
        n = torch.cuda.device_count()
        if local >= n:
            raise ShardshipError(f"LOCAL_RANK {local} but only {n} GPU(s) visible: start torchrun with "
                                 f"--nproc_per_node {n} (one process per GPU)")
        dev = torch.device("cuda", local)
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    backend = None
    if world > 1:
        backend = "nccl" if use_cuda else "gloo"
        if not dist.is_initialized():
            dist.init_process_group(backend=backend, timeout=TIMEOUT)
    return Dist(rank=rank, world_size=world, local_rank=local, device=dev, backend=backend)


def cleanup() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
