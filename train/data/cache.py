"""The decoded-frame cache: every frame of the training split decoded once, at
the start, and kept for the whole run; each batch is then built by index.

At 224x224 a frame is 150 KB decoded (the user's 35 sessions: ~9.5 GB), while
decoding it costs ~0.2-0.3 ms of a CPU core every time a batch needs it: with
the 4 cores a cluster gives per GPU, the decoder, not the GPU, would set the
pace. Where the frames live (`[train] cache`):

- "gpu": on the training device, one copy per rank; a batch is one gather there
  (no CPU work for pixels, no host-to-device copy). On a CPU device this is a
  private copy in the rank's memory.
- "host": the node's shared memory (/dev/shm), ONE copy that every rank on the
  node maps; a batch is gathered there and copied to the device.
- "off": the streaming reader (DataLoader workers decode every step).
- "auto": "gpu" where the frames fit in the GPU's free memory with room for the
  model, else "host" where they fit in the node's available memory (a job's
  memory limit counted: `train submit` adds the cache to the request) with
  room for the processes, else "off";
  every rank takes the same choice, and the run says which and why.

Row i of the cache is sample i of the training index (a window's earlier frames
are samples too), so a batch is `frames[window indices]`: the same pixels, labels
and order the streaming reader yields for the same (seed, epoch, step)."""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from shardship.errors import ShardshipError
from shardship.progress import bar
from shardship.units import human
from train import cachesize
from train.data.frames import FrameError, decode_many, nvjpeg_available
from train.data.shardio import ShardFiles, verify_shards

if TYPE_CHECKING:
    from train.data.dataset import ShardDataset
    from train.ddp import Dist

GPU_RESERVE = 8 << 30  # bytes of GPU memory left to the model, at least (or a fifth of the GPU)
HOST_MARGIN = 0.2  # of the node's available memory (and at least 4 GiB) left to the processes
CHUNK = 512  # frames decoded per task


def cache_bytes(ds: ShardDataset) -> int:
    """What caching `ds`'s frames takes (train.cachesize: what `packer budget` and the job's memory count)."""
    return cachesize.cache_bytes(ds.index.n_samples, *ds.index.image_size)


def host_available() -> int:
    """Bytes this process may still use on the node: MemAvailable, capped by a cgroup limit."""
    avail = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except OSError:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    cg = Path("/sys/fs/cgroup")
    for limit, usage in (("memory.max", "memory.current"), ("memory/memory.limit_in_bytes",
                                                            "memory/memory.usage_in_bytes")):
        try:
            lim, use = (cg / limit).read_text().strip(), int((cg / usage).read_text())
        except (OSError, ValueError):
            continue
        if lim.isdigit() and int(lim) < 1 << 60:
            avail = min(avail, int(lim) - use)
    return max(avail, 0)


def choose(setting: str, nbytes: int, device: torch.device) -> tuple[str, str]:
    """(where: "gpu" | "host" | "off", why: one line) for `[train] cache = setting`."""
    size = human(nbytes)
    if setting == "off":
        return "off", "cache = \"off\": frames decoded every step"
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        room = free - max(GPU_RESERVE, total // 5)
        if setting == "gpu" or (setting == "auto" and nbytes <= room):
            return "gpu", f"{size} of frames on {device} ({human(free)} free)"
    elif setting == "gpu":
        return "gpu", f"{size} of frames in this rank's memory (device {device.type})"
    avail = host_available()
    if setting == "host" or (setting == "auto" and nbytes <= avail - max(4 << 30, HOST_MARGIN * avail)):
        return "host", f"{size} of frames in the node's shared memory ({human(avail)} available)"
    where = "GPU or " if device.type == "cuda" else ""
    return "off", (f"cache = \"auto\": {size} of frames do not fit in {where}memory ({human(avail)} available on "
                   "the node): streaming from the shards")


class FrameCache:
    """(F, H, W, 3) uint8 frames, row = sample index, on `frames.device`."""

    RING = 3  # pinned staging buffers for a host cache feeding a GPU

    def __init__(self, frames: torch.Tensor, where: str, seconds: float) -> None:
        self.frames = frames
        self.where = where  # "gpu" | "host"
        self.seconds = seconds  # time taken to fill it
        self._rows = frames.numpy().reshape(len(frames), -1) if frames.device.type == "cpu" else None
        self._ring: list[tuple[torch.Tensor, torch.cuda.Event | None]] = [
            (torch.empty((0, 0), dtype=torch.uint8), None)] * self.RING
        self._turn = 0  # the ring's next slot

    def gather(self, idx: np.ndarray, device: torch.device) -> torch.Tensor:
        """(*idx.shape, H, W, 3) frames of sample indices `idx`, on `device`. On
        the host, rows are copied with numpy's take (memcpy per frame: ~8 GB/s here,
        where torch's advanced indexing of uint8 images ran at ~0.6 GB/s)."""
        shape = (*idx.shape, *self.frames.shape[1:])
        if self._rows is None:
            ix = torch.from_numpy(np.ascontiguousarray(idx, dtype=np.int64).ravel()).to(self.frames.device)
            return self.frames.index_select(0, ix).view(shape)
        flat = np.ascontiguousarray(idx, dtype=np.int64).ravel()
        if device.type != "cuda":
            return torch.from_numpy(np.take(self._rows, flat, axis=0)).view(shape)
        buf, k = self._staging(len(flat))
        np.take(self._rows, flat, axis=0, out=buf.numpy()[:len(flat)], mode="clip")
        out = buf[:len(flat)].to(device, non_blocking=True).view(shape)
        event = torch.cuda.Event()
        event.record()
        self._ring[k] = (buf, event)
        return out

    def _staging(self, n: int) -> tuple[torch.Tensor, int]:
        """(the ring's next pinned buffer, at least n frames, once the copy it last fed
        has finished; its slot)."""
        k = self._turn
        self._turn = (k + 1) % self.RING
        buf, event = self._ring[k]
        if event is not None:
            event.synchronize()
        if buf.shape[0] < n:
            buf = torch.empty((n, self.frames[0].numel()), dtype=torch.uint8).pin_memory()
        return buf, k


def build(ds: ShardDataset, where: str, device: torch.device, d: Dist | None = None,
          progress: bool = False) -> FrameCache:
    """Decode every frame of `ds.index` into a cache at `where` ("gpu" or "host")."""
    t0 = time.perf_counter()
    w, h = ds.index.image_size
    n = ds.index.n_samples
    if ds.files.verify:
        verify_shards(ds.index)  # once per process: free when the trainer did it already
    if where == "gpu":
        frames = torch.empty((n, h, w, 3), dtype=torch.uint8, device=device)
        _fill(ds, frames, device, progress)
    else:
        frames = _host_frames(ds, n, (h, w), d, progress)
    return FrameCache(frames, where, time.perf_counter() - t0)


def _host_frames(ds: ShardDataset, n: int, hw: tuple[int, int], d: Dist | None, progress: bool) -> torch.Tensor:
    """The frames in host memory: one /dev/shm segment per node where several ranks
    run there (the node's first rank fills it, the others map it), else this process's own."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    shm = Path("/dev/shm")
    if d is None or not d.distributed or local <= 1 or not shm.is_dir():
        frames = torch.empty((n, *hw, 3), dtype=torch.uint8)
        _fill(ds, frames, torch.device("cpu"), progress)
        return frames
    import torch.distributed as dist

    # named by the pid of this node's first rank: unique on the machine, also where two "nodes"
    # of a job, or two jobs with the same data, share one (GROUP_RANK: torchrun's node rank)
    group = os.environ.get("GROUP_RANK", "0")
    owners = d.all_gather_object((group, d.local_rank, os.getpid()))
    pid = next(p for g, r, p in owners if g == group and r == 0)
    path = shm / f"shardship-frames-{pid}-{ds.index.fingerprint()}-{hw[1]}x{hw[0]}"
    nbytes = n * hw[0] * hw[1] * 3
    try:
        if d.local_rank == 0:
            arr = np.memmap(path, dtype=np.uint8, mode="w+", shape=(n, *hw, 3))
            _fill(ds, torch.from_numpy(arr), torch.device("cpu"), progress)
        dist.barrier()
        if d.local_rank != 0:
            arr = np.memmap(path, dtype=np.uint8, mode="r+", shape=(n, *hw, 3))
        dist.barrier()  # every rank of the node has it mapped: the name can go
    except OSError as e:
        raise ShardshipError(f"cannot keep {human(nbytes)} of frames in {path} ({e.strerror}): set "
                             "[train] cache = \"gpu\" or \"off\"") from None
    finally:
        if d.local_rank == 0:
            path.unlink(missing_ok=True)
    return torch.from_numpy(arr)


def _fill(ds: ShardDataset, frames: torch.Tensor, device: torch.device, progress: bool) -> None:
    """Decode every sample's frame into `frames` (on `device`), CHUNK frames per
    task on all the CPU cores this process may use (the decoders release the GIL)."""
    n = len(frames)
    threads = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
    size = ds.index.image_size
    nv = nvjpeg_available(device)
    b = bar(n, "decode frames", "frame", None if progress else False)

    def task(a: int) -> int:
        files = ShardFiles(ds.index, verify=False)  # one per task: its own file descriptors
        try:
            jpgs = files.read_frames(list(range(a, min(a + CHUNK, n))))
            try:
                if device.type == "cpu":
                    decode_many(jpgs, size, device, out=frames[a:a + len(jpgs)])
                elif nv:
                    frames[a:a + len(jpgs)] = decode_many(jpgs, size, device)
                else:
                    frames[a:a + len(jpgs)].copy_(decode_many(jpgs, size, torch.device("cpu")))
            except FrameError as e:
                raise ds.bad(a + e.k, str(e)) from None
            except RuntimeError as e:  # nvJPEG
                raise ds.bad(a, f"a JPEG of samples {a}..{a + len(jpgs) - 1} does not decode ({e})") from None
            return len(jpgs)
        finally:
            files.close()

    with ThreadPoolExecutor(1 if nv else threads) as pool:
        for k in pool.map(task, range(0, n, CHUNK)):
            b.update(k)
    b.close()
