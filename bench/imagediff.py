"""How far `packer pack`'s decode path (packer.imageops: libjpeg-turbo through
simplejpeg) moves the packed images from the
plain Pillow path (full decode, resize, encode), against what one more JPEG q90
re-encode of the same packed images moves them: the bar the issue sets.

Both are measured on the decoded packed images (what the trainer sees), per
channel: PSNR over all frames' pixels and the largest absolute difference."""
from __future__ import annotations

import io
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from packer import imageops
from packer.imageops import ResizeSpec, resize_jpeg


@contextmanager
def pillow_only() -> Iterator[None]:
    """packer.imageops as it runs without simplejpeg installed (the old path)."""
    saved = imageops.simplejpeg
    imageops.simplejpeg = None
    try:
        yield
    finally:
        imageops.simplejpeg = saved


def _pixels(jpg: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(jpg)).convert("RGB"), dtype=np.int16)


def _q90(jpg: bytes) -> bytes:
    buf = io.BytesIO()
    Image.open(io.BytesIO(jpg)).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def _stats(a: list[np.ndarray], b: list[np.ndarray]) -> dict[str, Any]:
    """Per channel R,G,B: PSNR (dB, inf when identical) and max abs error."""
    d = np.stack(a) - np.stack(b)
    mse = (d.astype(np.float64) ** 2).reshape(-1, 3).mean(axis=0)
    psnr = [round(10 * math.log10(255 ** 2 / m), 2) if m > 0 else math.inf for m in mse]
    return {"psnr_db": psnr, "max_abs": [int(x) for x in np.abs(d).reshape(-1, 3).max(axis=0)]}


def image_difference(frames: list[Path], spec: ResizeSpec) -> dict[str, Any]:
    """{new_vs_old: ..., q90_reencode: ..., identical_bytes: n, frames: n, decoder: ...}."""
    blobs = [p.read_bytes() for p in frames]
    new = [resize_jpeg(b, spec)[0] for b in blobs]
    with pillow_only():
        old = [resize_jpeg(b, spec)[0] for b in blobs]
    old_px = [_pixels(j) for j in old]
    return {"frames": len(blobs), "identical_bytes": sum(a == b for a, b in zip(new, old)),
            "decoder": "simplejpeg" if imageops.simplejpeg else "Pillow (no simplejpeg)",
            "new_vs_old": _stats([_pixels(j) for j in new], old_px),
            "q90_reencode": _stats([_pixels(_q90(j)) for j in old], old_px)}
