"""The process around a training step: random streams (seeded, saved and restored
for exact resume), mixed precision, batches onto the device, and the signals a
scheduler (or ctrl-C) sends."""
from __future__ import annotations

import json
import os
import random
import signal
import socket
import sys
from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shardship import flock
from shardship.errors import ShardshipError
from train import ddp
from train.data.dataset import unwrap_worker_error

BATCH_KEYS = ("image", "proprio", "action", "action_mask", "weight", "joints_valid", "joint_mask", "joints_mask")


# ------------------------------------------------------------------ random streams
def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state(device: torch.device) -> dict[str, Any]:
    """This rank's random streams (torch, numpy, python, CUDA): a checkpoint holds
    every rank's, so a resumed run draws the same noise and augmentations."""
    st: dict[str, Any] = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if device.type == "cuda":
        st["cuda"] = torch.cuda.get_rng_state(device)
    return st


def set_rng_state(st: Mapping[str, Any], device: torch.device) -> None:
    torch.set_rng_state(st["torch"])
    np.random.set_state(st["numpy"])
    random.setstate(st["python"])
    if device.type == "cuda" and "cuda" in st:
        torch.cuda.set_rng_state(st["cuda"], device)


# ------------------------------------------------------------------ device and precision
def configure_device(device: torch.device) -> None:
    """TF32 matmuls and cuDNN autotuning on GPUs: free speed for this model."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True


def amp_dtype(device: torch.device, enabled: bool) -> torch.dtype | None:
    """bf16 on GPUs that support it, fp16 (with loss scaling) on older ones, none on CPU."""
    if not enabled or device.type != "cuda":
        return None
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def autocast(device: torch.device, dtype: torch.dtype | None) -> torch.autocast:
    """Autocast to `dtype` (from amp_dtype); a no-op context when it is None."""
    return torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)


def make_scaler(enabled: bool) -> Any:
    """A GradScaler (only fp16 needs one: a disabled scaler passes through)."""
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler("cuda", enabled=enabled)
    return torch.cuda.amp.GradScaler(enabled=enabled)  # torch < 2.3


def to_device(batch: Mapping[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """The model's inputs of a reader batch on `device` (bookkeeping keys stay behind)."""
    nb = device.type == "cuda"
    return {k: batch[k].to(device, non_blocking=nb) for k in BATCH_KEYS if k in batch}


def batches(loader: Any) -> Generator[dict[str, torch.Tensor], None, None]:
    """The loader's batches; a DataLoader worker's error comes out as the original
    one-line error rather than torch's wrapped traceback. Closing the generator
    shuts the loader's workers down."""
    it = iter(loader)
    while True:
        try:
            yield next(it)
        except StopIteration:
            return
        except ShardshipError as e:
            raise unwrap_worker_error(e) from None


# ------------------------------------------------------------------ stop signals
class StopFlag:
    """SIGTERM / SIGUSR1 (scheduler warnings before the wall clock) and SIGINT
    (ctrl-C; torchrun passes it on to every rank) -> finish the step, checkpoint,
    stop. The flag is all-reduced so all ranks stop together. A second SIGINT
    stops at once (KeyboardInterrupt): the CLI then says whether a checkpoint exists."""

    SIGNALS = ("SIGTERM", "SIGUSR1", "SIGINT")

    def __init__(self) -> None:
        self.reason: str | None = None
        self._old: dict[int, Any] = {}

    def install(self) -> None:
        for name in self.SIGNALS:
            sig = getattr(signal, name, None)
            if sig is not None:
                try:
                    self._old[sig] = signal.signal(sig, self._handle)
                except ValueError:  # not the main thread (train() called from a library)
                    pass

    def _handle(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT and self.reason == "SIGINT":
            raise KeyboardInterrupt  # ctrl-C twice: stop now, without the checkpoint
        self.reason = signal.Signals(signum).name

    def restore(self) -> None:
        for sig, h in self._old.items():
            signal.signal(sig, h)


# ------------------------------------------------------------------ one run per output dir
_LOCK_FD = -1  # this process's OutputLock fd, which a forked child (a DataLoader worker) closes


def _close_lock_in_child() -> None:
    """A fork shares the lock's open file, so a DataLoader worker that outlives a
    SIGKILLed rank 0 (forked just as the kill came) would hold the lock on until
    its watchdog noticed, and the restart would be refused: the child drops it."""
    global _LOCK_FD
    if _LOCK_FD >= 0:
        try:
            os.close(_LOCK_FD)
        except OSError:
            pass
        _LOCK_FD = -1


os.register_at_fork(after_in_child=_close_lock_in_child)


class OutputLock:
    """OUT/.lock, flock'ed for a whole `train run`: a second run into the same
    directory is refused instead of interleaving checkpoints. The kernel drops
    the lock when the holder dies (even SIGKILL): nothing stale to clean up.

    Only global rank 0 takes it (`take_output_lock`): the ranks of one torchrun
    job share it, and with OUT on a shared file system (several nodes) a second
    job's rank 0 is refused wherever it runs (NFS/Lustre pass flock on as a
    cluster-wide lock). The file holds the holder's pid and host, for the message."""

    NAME = ".lock"

    def __init__(self, fd: int, path: Path) -> None:
        self.fd, self.path = fd, path

    @classmethod
    def take(cls, out: Path) -> OutputLock | None:
        out.mkdir(parents=True, exist_ok=True)
        path = out / cls.NAME
        try:
            fd = flock.acquire(path)
        except flock.LockHeld as e:
            holder = _holder(e.content)
            raise ShardshipError(f"another `train run` (pid {holder.get('pid', '?')}, host {holder.get('host', '?')}) "
                                 f"is writing {out}: wait for it, stop it, or use another --out") from None
        except OSError as e:  # a file system without locks (ENOLCK): say so, train unguarded
            print(f"warning: cannot lock {path} ({e.strerror}): nothing stops a second `train run` into {out}",
                  file=sys.stderr)
            return None
        me = json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, me + b"\n", 0)
        global _LOCK_FD
        _LOCK_FD = fd
        return cls(fd, path)

    def release(self) -> None:
        """Drop the lock and remove the file (shardship.flock: a run that locked the old
        file just before the unlink notices and locks the new one)."""
        global _LOCK_FD
        if self.fd >= 0:
            if _LOCK_FD == self.fd:
                _LOCK_FD = -1
            flock.release(self.fd, self.path)
            self.fd = -1


def _holder(content: bytes) -> dict[str, Any]:
    try:
        d = json.loads(content or b"{}")
    except ValueError:
        return {}
    return d if isinstance(d, dict) else {}


def take_output_lock(d: ddp.Dist, out: Path) -> OutputLock | None:
    """Rank 0 takes OUT's lock; every rank learns whether it did, so a refused
    job stops on all of its ranks with the same line."""
    lock, err = None, None
    if d.is_main:
        try:
            lock = OutputLock.take(out)
        except ShardshipError as e:
            err = str(e)
    if d.distributed:
        err = d.all_gather_object(err)[0]
    if err:
        raise ShardshipError(err)
    return lock
