"""JPEG bytes -> pixels outside the DataLoader workers: on the GPU with nvJPEG
(`torchvision.io.decode_jpeg(..., device="cuda")`) where torchvision can, else
on the CPU with the reader's own decoder (train.data.decode), which gives the
same pixels the workers give.

Used for `[train] decode = "device"` (the workers only read bytes: a batch holds
the distinct frames' JPEG bytes and which frame each slot shows, see
ShardDataset.frame_bytes) and for filling the frame cache on a GPU. nvJPEG's
pixels may differ from libjpeg-turbo's by a level here and there (its IDCT is
not libjpeg's); the CPU path is exact."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from train.data.decode import decode_jpeg_into

_nvjpeg: Any = None  # torchvision.io.decode_jpeg once found, False when it is not there


class FrameError(ValueError):
    """JPEG number `k` of a decode_many call does not decode."""

    def __init__(self, k: int, why: Exception) -> None:
        super().__init__(f"JPEG does not decode ({why})")
        self.k = k


def nvjpeg_available(device: torch.device) -> bool:
    """True on a CUDA device with a torchvision whose decode_jpeg runs there."""
    global _nvjpeg
    if device.type != "cuda":
        return False
    if _nvjpeg is None:
        try:
            from torchvision.io import decode_jpeg

            _nvjpeg = decode_jpeg
        except Exception:  # noqa: BLE001 - no torchvision, or one built for another torch
            _nvjpeg = False
    return bool(_nvjpeg)


def decode_many(jpegs: Sequence[memoryview | bytes], size: tuple[int, int], device: torch.device,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """(U, H, W, 3) uint8 on `device` of the JPEGs (`size` = (width, height)),
    nvJPEG on CUDA where available, else decoded on this CPU (into `out`'s
    memory when given: a CPU tensor of the right shape)."""
    w, h = size
    if nvjpeg_available(device):
        data = [torch.frombuffer(bytearray(j), dtype=torch.uint8) for j in jpegs]
        imgs = _nvjpeg(data, device=device)  # list of (3, H, W)
        return torch.stack(imgs).permute(0, 2, 3, 1).contiguous()
    host = out if out is not None else torch.empty((len(jpegs), h, w, 3), dtype=torch.uint8)
    arr = host.numpy()
    for k, j in enumerate(jpegs):
        try:
            decode_jpeg_into(j, arr[k])
        except (OSError, ValueError, SyntaxError) as e:
            raise FrameError(k, e) from None
    return host if device.type == "cpu" else host.to(device, non_blocking=True)


def decode_batch(batch: dict[str, torch.Tensor], size: tuple[int, int], device: torch.device,
                 layout_obs: bool, bad: Callable[[int, str], Exception]) -> dict[str, torch.Tensor]:
    """A reader batch of JPEG bytes ("jpeg", "jpeg_offsets", "frame_slots") with
    its "image" decoded on `device`: (B, N, 3, H, W) for the observation layout,
    (B, H, W, 3) for the single-frame one, exactly as the workers' batches.
    `bad(sample, reason)` makes the error for a frame that does not decode."""
    off = batch["jpeg_offsets"].numpy()
    flat = batch["jpeg"].numpy()
    jpegs = [flat[a:b].data for a, b in zip(off[:-1].tolist(), off[1:].tolist(), strict=True)]
    try:
        frames = decode_many(jpegs, size, device)
    except FrameError as e:
        raise bad(int(batch["jpeg_samples"][e.k]), str(e)) from None
    except RuntimeError as e:  # nvJPEG
        raise bad(int(batch["jpeg_samples"][0]), f"a JPEG of this batch does not decode ({e})") from None
    slots = batch["frame_slots"].to(frames.device)
    img = frames[slots]  # (B, N, H, W, 3)
    out = {k: v for k, v in batch.items() if k not in ("jpeg", "jpeg_offsets", "frame_slots", "jpeg_samples")}
    out["image"] = img.permute(0, 1, 4, 2, 3) if layout_obs else img[:, 0]
    return out
