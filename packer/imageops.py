"""Decode -> resize -> encode one frame. Runs in worker processes, so it takes
plain arguments, touches no global state and returns bytes (cheap to pickle)."""
from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass

from PIL import Image

CROPS = ("squash", "center")


@dataclass(frozen=True)
class ResizeSpec:
    size: int = 224
    crop: str = "squash"
    quality: int = 90


def crop_box(width: int, height: int, crop: str) -> tuple[int, int, int, int] | None:
    """The source box to resize from: whole frame (squash) or the centred square."""
    if crop == "squash":
        return None
    if crop == "center":
        side = min(width, height)
        left, top = (width - side) // 2, (height - side) // 2
        return (left, top, left + side, top + side)
    raise ValueError(f"unknown crop {crop!r}: use one of {', '.join(CROPS)}")


def rescale_intrinsics(
    k: tuple[float, float, float, float], width: int, height: int, spec: ResizeSpec
) -> list[float]:
    """fx fy cx cy for the packed image: shift by the crop, scale by the resize."""
    fx, fy, cx, cy = k
    box = crop_box(width, height, spec.crop)
    left, top, right, bottom = box if box else (0, 0, width, height)
    sx, sy = spec.size / (right - left), spec.size / (bottom - top)
    return [fx * sx, fy * sy, (cx - left) * sx, (cy - top) * sy]


def resize_jpeg(data: bytes, spec: ResizeSpec) -> tuple[bytes, tuple[int, int]]:
    """JPEG bytes in, JPEG bytes of spec.size x spec.size out (+ the source size).
    Phone JPEGs decode to RGB already; converting only other modes skips a full-frame
    copy."""
    im: Image.Image = Image.open(io.BytesIO(data))
    src_size = im.size
    if im.mode != "RGB":
        im = im.convert("RGB")
    # Pillow sets its module-level filter constants in a loop (invisible to type checkers);
    # Image.Resampling would need Pillow >= 9.1, which older pillow-simd releases predate
    out = im.resize((spec.size, spec.size), Image.BILINEAR, box=crop_box(*src_size, spec.crop))  # type: ignore[attr-defined]
    im.close()  # frees the decoded frame's buffer now, for the encode below to reuse
    buf = io.BytesIO()
    out.save(buf, format="JPEG", quality=spec.quality)
    return buf.getvalue(), src_size


def process_frame(task: tuple[str, ResizeSpec]) -> tuple[bytes | None, bytes | None, str | None]:
    """Worker entry: (path, spec) -> (jpeg, sha256 of the source file, error).
    The digest feeds the session fingerprint (the file is in memory here anyway).
    Errors are returned, not raised, so one corrupt frame is reported with its
    file name instead of tearing down the pool."""
    path, spec = task
    try:
        with open(path, "rb") as f:
            data = f.read()
        jpg, _size = resize_jpeg(data, spec)
        return jpg, hashlib.sha256(data).digest(), None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        return None, None, f"cannot decode JPEG ({e})"


def process_frames(paths: list[str], spec: ResizeSpec) -> list[tuple[bytes | None, bytes | None, str | None]]:
    """Worker entry for a chunk of frames (one task and one result message per
    chunk, not per frame)."""
    return [process_frame((p, spec)) for p in paths]
