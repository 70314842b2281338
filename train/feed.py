"""How one rank's training batches reach its device, and how that was chosen.

Three ways, by `[train] cache` and `[train] decode` (train.data.cache says
what each costs):

- cached: the frames were decoded once into a FrameCache; each batch's labels
  are indexed from the label table and its images gathered from the cache, in
  this process (no DataLoader workers, no JPEG decoding per step);
- streaming, decoded by the workers: the DataLoader workers read and decode;
- streaming, decoded on the device: the workers only read the JPEG bytes, the
  GPU decodes them (nvJPEG, train.data.frames); on a CPU device this process
  decodes them, with the workers' decoder (the same pixels).

All three yield the same batches for the same (seed, epoch, consumed): the
order, the samples and the labels come from the same partition and label
table, the pixels from the same decoder (nvJPEG's may differ by a level)."""
from __future__ import annotations

import sys
from collections.abc import Generator
from dataclasses import dataclass

import torch

from train.config import TrainConfig
from train.data import cache as frame_cache
from train.data.dataset import ShardDataset, make_loader
from train.data.frames import decode_batch, nvjpeg_available
from train.ddp import Dist
from train.runtime import batches


@dataclass
class Feed:
    """One rank's way of feeding its device (module docstring)."""

    mode: str  # "gpu cache" | "host cache" | "streaming" | "streaming, decoded on the device"
    why: str  # one line: what was chosen and why
    device: torch.device
    num_workers: int
    cache: frame_cache.FrameCache | None = None
    on_device: bool = False  # streaming with JPEG decode on the device

    def epoch(self, ds: ShardDataset, seed: int | None = None) -> Generator[dict[str, torch.Tensor], None, None]:
        """The rest of `ds`'s current epoch, batch by batch (closing it stops the workers).
        The workers write into a ring of reused buffers (train.data.batch.BufferRing):
        use each batch, or copy it, before asking for the next one but two."""
        if self.cache is not None:
            yield from cached_epoch(ds, self.cache, self.device)
            return
        ds.images = "bytes" if self.on_device else "decode"
        ds.reuse_buffers = True
        gen = batches(make_loader(ds, self.num_workers, self.device.type == "cuda", seed=seed))
        try:
            for b in gen:
                yield decode_batch(b, ds.index.image_size, self.device, ds.obs_horizon is not None, ds.bad) \
                    if self.on_device else b
        finally:
            gen.close()


def cached_epoch(ds: ShardDataset, cache: frame_cache.FrameCache,
                 device: torch.device) -> Generator[dict[str, torch.Tensor], None, None]:
    """`ds`'s batches (labels only, images="none") with their frames from `cache`."""
    ds.images = "none"
    order = ds.order()
    for positions in ds.my_batches(0, 1):
        b = ds.load_batch(order, positions)
        img = cache.gather(b.pop("frames").numpy(), device)  # (B, N, H, W, 3)
        b["image"] = img.permute(0, 1, 4, 2, 3) if ds.obs_horizon is not None else img[:, 0]
        yield b


def open_feed(ds: ShardDataset, cfg: TrainConfig, device: torch.device, d: Dist | None = None,
              progress: bool = False, say: bool = True) -> Feed:
    """Choose (every rank the same) and set up the way `ds` feeds `device`; fills
    the cache when one is chosen, with a progress line. `say`: print the choice."""
    nbytes = frame_cache.cache_bytes(ds)
    where, why = frame_cache.choose(cfg.cache, nbytes, device)
    if d is not None and d.distributed:  # the weakest choice of all ranks: off < host < gpu
        rank_of = {"off": 0, "host": 1, "gpu": 2}
        picks = d.all_gather_object((where, why))
        where, why = min(picks, key=lambda p: rank_of[p[0]])
    on_device = cfg.decode == "device" or (cfg.decode == "auto" and nvjpeg_available(device))
    feed = Feed(mode="streaming", why=why, device=device, num_workers=int(cfg.num_workers), on_device=on_device)
    if where != "off":
        ds.labels  # noqa: B018 - parsed before the long decode, so a bad sample stops the run at once
        feed.cache = frame_cache.build(ds, where, device, d, progress=progress)
        feed.mode = f"{where} cache"
        feed.why = f"{why}; decoded in {feed.cache.seconds:.0f} s"
    elif on_device:
        feed.mode = "streaming, decoded on the device"
        if not nvjpeg_available(device):
            feed.why += f" (JPEGs decoded by this process: no nvJPEG on {device})"
    if say and (d is None or d.is_main):
        print(f"frames: {feed.mode}: {feed.why}", file=sys.stderr, flush=True)
    return feed
