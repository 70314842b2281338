"""Decode -> resize -> encode one frame. Runs in worker processes, so it takes
plain arguments, touches no global state and returns bytes (cheap to pickle).

The decode goes through libjpeg-turbo's TurboJPEG API (simplejpeg, a PyPI wheel
with its own libjpeg-turbo: no system library to install) when it is
importable: the same accurate IDCT and fancy upsampling as Pillow's JPEG
plugin, so the packed bytes are identical, without Pillow's per-scanline
unpacking into its own buffer (~30% less decode CPU measured here). The pixels
are mapped into a Pillow image without a copy; Pillow resizes and encodes as
before. Without simplejpeg, or for a frame it will not take (CMYK, a
recoverable libjpeg warning), Pillow decodes as it always did, and reports the
error of a broken frame in its own words.

DCT scaling (decoding at n/8 of the size) is not used, measured on 480x360
phone frames (bench/imagediff.py, docs in bench/pack.py): 5/8, the largest
factor that covers 224 from 360, decoded ~40% slower than the full size (its
5x5 luma and 10x10 chroma IDCTs are plain C, the 8x8 one is SIMD); 1/2, cheap
but only for sizes <= 180, moved the packed images to ~34 dB PSNR from the full
decode's, far more than a q90 re-encode does (~45 dB)."""
from __future__ import annotations

import io
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

try:
    import simplejpeg
except (ImportError, ValueError):  # optional: Pillow decodes (ValueError: built for another numpy ABI)
    simplejpeg = None  # type: ignore[assignment]

CROPS = ("squash", "center")
# start-of-frame markers (baseline, extended, progressive, lossless, ...): all but DHT, JPG, DAC
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_NO_LENGTH = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM, RSTn: markers without a segment


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


def jpeg_size(path: str | Path) -> tuple[int, int] | None:
    """(width, height) from a JPEG's start-of-frame header, without decoding: the
    segments before it are skipped by their lengths (a few hundred bytes read, once
    per session), so a session's real frame size is known at load time. None where
    the file is no JPEG or ends first: `check_jpeg` says what is wrong with it."""
    try:
        with open(path, "rb") as f:
            if f.read(2) != b"\xff\xd8":
                return None
            while True:
                head = f.read(2)
                if len(head) < 2 or head[0] != 0xFF:
                    return None
                marker = head[1]
                while marker == 0xFF:  # fill bytes before a marker
                    b = f.read(1)
                    if not b:
                        return None
                    marker = b[0]
                if marker in _NO_LENGTH:
                    continue
                seg = f.read(2)
                if marker in (0xD9, 0xDA) or len(seg) < 2 or int.from_bytes(seg, "big") < 2:
                    return None  # end of image or start of scan before any frame header; truncated
                if marker in _SOF:  # segment: precision, height, width, components
                    body = f.read(5)
                    if len(body) < 5:
                        return None
                    return int.from_bytes(body[3:5], "big"), int.from_bytes(body[1:3], "big")
                f.seek(int.from_bytes(seg, "big") - 2, io.SEEK_CUR)
    except OSError:
        return None


def frame_size_problem(first: Path, declared: Any, expected: tuple[int, int]) -> tuple[str, str] | None:
    """(file, reason) where a session's frames are not the landscape `expected` size
    that packing (intrinsics, crops) and SLAM assume, or metadata.json's rgbResolution
    (`declared`, as read) disagrees with them; None where they fit. Said at load time,
    so a portrait capture fails in a line instead of after minutes of SLAM with advice
    that does not apply. `first` is the first frame: its header gives the real size."""
    w, h = expected
    name = f"{first.parent.name}/{first.name}"
    found = jpeg_size(first)
    said = (tuple(declared) if isinstance(declared, list) and len(declared) == 2
            and all(type(v) is int for v in declared) else None)
    size = found or said  # the frames' own header first; rgbResolution where it is unreadable
    if size is not None and size != expected:
        what = "portrait " if size[0] < size[1] else ""
        todo = (f"record it again with the phone held in landscape, or rotate every frame and calib.txt to {w}x{h}"
                if size == (h, w) else f"resize every frame to {w}x{h} and scale calib.txt with it")
        file, found_in = (name, "") if found else ("metadata.json", "rgbResolution says ")
        return file, (f"{found_in}{what}frames of {size[0]}x{size[1]}, but packing and SLAM need the app's landscape "
                      f"{w}x{h}: {todo}")
    if said is not None and found is not None and said != found:
        return "metadata.json", (f"rgbResolution [{said[0]}, {said[1]}] disagrees with the frames ({name} is "
                                 f"{found[0]}x{found[1]}): set it to [{found[0]}, {found[1]}] or re-export the session")
    return None


def _decode_turbo(data: bytes) -> Image.Image | None:
    """The frame through simplejpeg, as an RGBX image sharing its pixels, or None
    where Pillow must decide: simplejpeg missing, or a frame it refuses."""
    if simplejpeg is None:
        return None
    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        if colorspace not in ("YCbCr", "Gray"):
            return None  # CMYK/YCCK: Pillow's conversion differs from simplejpeg's
        if width * height > (Image.MAX_IMAGE_PIXELS or width * height):
            return None  # Pillow's decompression-bomb check decides
        # RGBX: Pillow's own pixel layout, so frombuffer maps the array instead of copying it;
        # the accurate IDCT and upsampling Pillow uses (simplejpeg defaults to the fast ones)
        px = simplejpeg.decode_jpeg(data, "RGBX", fastdct=False, fastupsample=False)
    except ValueError:
        return None
    return Image.frombuffer("RGBX", (width, height), px, "raw", "RGBX", 0, 1)


def decode(data: bytes) -> Image.Image:
    """A frame as an RGB (or RGBX) image: simplejpeg where it can, else Pillow.
    Phone JPEGs decode to RGB already; converting only other modes skips a
    full-frame copy."""
    im = _decode_turbo(data)
    if im is None:
        im = Image.open(io.BytesIO(data))
        if im.mode != "RGB":
            im = im.convert("RGB")
    return im


def resize_jpeg(data: bytes, spec: ResizeSpec) -> tuple[bytes, tuple[int, int]]:
    """JPEG bytes in, JPEG bytes of spec.size x spec.size out (+ the source size)."""
    im = decode(data)
    src_size = im.size
    # Pillow sets its module-level filter constants in a loop (invisible to type checkers);
    # Image.Resampling would need Pillow >= 9.1, which older pillow-simd releases predate
    out = im.resize((spec.size, spec.size), Image.BILINEAR, box=crop_box(*src_size, spec.crop))  # type: ignore[attr-defined]
    im.close()  # frees the decoded frame's buffer now, for the encode below to reuse
    buf = io.BytesIO()
    out.save(buf, format="JPEG", quality=spec.quality)
    return buf.getvalue(), src_size


def frame_digest(data: bytes) -> bytes:
    """What the content fingerprint keeps of a source frame: CRC-32 and length
    (12 bytes). A changed frame changes it (but for a 2^-32 chance per frame); the
    CRC is ~2x cheaper than sha256 here, and nothing trusts it against a forger:
    it only decides whether to re-encode."""
    return zlib.crc32(data).to_bytes(4, "big") + len(data).to_bytes(8, "big")


def process_frame(task: tuple[str, ResizeSpec]) -> tuple[bytes | None, bytes | None, str | None]:
    """Worker entry: (path, spec) -> (jpeg, frame_digest of the source file, error).
    The digest feeds the session fingerprint (the file is in memory here anyway).
    Errors are returned, not raised, so one corrupt frame is reported with its
    file name instead of tearing down the pool."""
    path, spec = task
    try:
        with open(path, "rb") as f:
            data = f.read()
        jpg, _size = resize_jpeg(data, spec)
        return jpg, frame_digest(data), None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        return None, None, f"cannot decode JPEG ({e})"


def process_frames(paths: list[str], spec: ResizeSpec) -> list[tuple[bytes | None, bytes | None, str | None]]:
    """Worker entry for a chunk of frames (one task and one result message per
    chunk, not per frame)."""
    return [process_frame((p, spec)) for p in paths]
