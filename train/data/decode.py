"""Per-sample decoding on the hot path: JPEG -> uint8 HxWx3, sample JSON -> arrays.

Both have a fast path for what the packer writes and fall back to the general
one for anything else:

- JPEG, first choice: simplejpeg (libjpeg-turbo's TurboJPEG API) decodes straight
  into the batch's slot (`buffer=`): ~1.4x PIL's fastest path below on the
  2-core bench VM, and no copy out. Used once a test image decodes to exactly
  what `Image.open` gives in this process, as every fast path here.
- JPEG, without simplejpeg: `Image.open` parses every marker segment (quantisation and Huffman
  tables) in Python before libjpeg-turbo sees the data, ~100 us of a ~250 us
  decode at 224x224. When a cheap scan of the header finds a 3-component frame of
  the expected size, the bytes go straight to PIL's (pillow-simd's) C JPEG
  decoder. `decode_jpeg_into` goes one step further: PIL keeps RGB as 4 bytes a
  pixel, and getting an (H, W, 3) array out of it (`tobytes`, a join, then the
  copy into the batch) cost ~100 us a frame; instead the decoder writes into a
  per-thread RGBX buffer PIL maps (`Image.core.map_buffer`) and OpenCV drops the
  fourth byte straight into the batch array (~10 us; OpenCV kept to one thread,
  see `_cv2`). Measured on 224x224 frames
  on the 2-core bench VM: ~300 us a frame against ~440 us. Without OpenCV (a
  cluster env built around torch alone) the direct path is used. Once per process
  each fast path is checked against `Image.open` on a test image; if this PIL
  build behaves differently, it is never used.
- JSON: the packer writes compact JSON; `action`, `action_mask` and `proprio` are
  located by key and parsed by numpy in C. The element count is checked; any
  surprise (spaces, nulls, other layout) falls back to `json.loads`."""
from __future__ import annotations

import io
import json
import threading
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from PIL import Image

if TYPE_CHECKING:
    from PIL._imaging import ImagingDecoder

_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_fast_jpeg_ok: bool | None = None  # per process
_mapped_ok: bool | None = None  # per process: decode_jpeg_into's mapped path checked
_simple_ok: bool | None = None  # per process: simplejpeg present and equal to Image.open
_scratch = threading.local()  # per thread: the RGBX buffer the mapped decoder writes
_cv2_mod: Any = None  # OpenCV once imported (and set to one thread) by _cv2()


def jpeg_frame(buf: bytes | memoryview) -> tuple[int, int, int] | None:
    """(width, height, components) from the JPEG's SOF segment, or None."""
    n = len(buf)
    if n < 4 or buf[0] != 0xFF or buf[1] != 0xD8:
        return None
    i = 2
    while i + 4 <= n:
        if buf[i] != 0xFF:
            return None
        m = buf[i + 1]
        if m == 0xFF:  # fill byte
            i += 1
            continue
        if m == 0x01 or 0xD0 <= m <= 0xD8:  # markers without a length
            i += 2
            continue
        if m in _SOF:
            if i + 10 > n:
                return None
            return (buf[i + 7] << 8) | buf[i + 8], (buf[i + 5] << 8) | buf[i + 6], buf[i + 9]
        if m in (0xDA, 0xD9):  # scan data or end before any frame header
            return None
        i += 2 + ((buf[i + 2] << 8) | buf[i + 3])
    return None


def _jpeg_into_core(jpg: bytes | memoryview, core: Any, width: int, height: int) -> None:
    """Run PIL's C JPEG decoder on the whole buffer into a core image (RGB layout)."""
    # PIL types this as the C decoder or a Python PyDecoder (whose stub takes bytes only);
    # "jpeg" is always the C one, which reads any buffer, memoryview included
    dec = cast("ImagingDecoder", Image._getdecoder("RGB", "jpeg", ("RGB", "")))
    dec.setimage(core, (0, 0, width, height))
    try:
        n, err = dec.decode(jpg)
    finally:
        dec.cleanup()
    if n >= 0 or err < 0:  # the decoder wanted more data, or failed
        raise OSError(f"JPEG data is truncated or corrupt (decoder status {n}, {err})")


def _decode_direct(jpg: bytes | memoryview, width: int, height: int) -> np.ndarray:
    core = Image.core.new("RGB", (width, height))
    _jpeg_into_core(jpg, core, width, height)
    return np.asarray(Image.Image()._new(core))


def _decode_general(jpg: bytes | memoryview) -> np.ndarray:
    with Image.open(io.BytesIO(jpg), formats=("JPEG",)) as im:
        rgb = im if im.mode == "RGB" else im.convert("RGB")
        return np.asarray(rgb)


def _test_jpeg() -> bytes:
    """A 40x24 noise JPEG: what each fast path is checked on against Image.open."""
    img = (np.random.default_rng(0).random((24, 40, 3)) * 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def _check_fast_path() -> bool:
    """Does the direct decoder give exactly what Image.open gives, in this PIL?"""
    data = _test_jpeg()
    try:
        return jpeg_frame(data) == (40, 24, 3) and np.array_equal(_decode_direct(data, 40, 24), _decode_general(data))
    except Exception:  # noqa: BLE001 - any failure means: use the general path
        return False


def _rgbx(width: int, height: int) -> np.ndarray:
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.shape[:2] != (height, width):
        buf = _scratch.buf = np.empty((height, width, 4), dtype=np.uint8)
    return buf


def _cv2() -> Any:
    """OpenCV, set to one thread in the first process that decodes (the parent,
    via `prepare`, before DataLoader workers fork): the workers are the reader's
    parallelism, and a worker never touches OpenCV's thread settings itself
    (calling setNumThreads in a forked worker hung every epoch here, the pool
    state inherited from the parent). Process-wide: a process that decodes
    frames with the reader runs OpenCV on one thread."""
    global _cv2_mod
    if _cv2_mod is None:
        import cv2

        cv2.setNumThreads(1)
        _cv2_mod = cv2
    return _cv2_mod


def _decode_mapped(jpg: bytes | memoryview, out: np.ndarray) -> None:
    """Decode into this thread's RGBX buffer (PIL's own pixel layout, mapped, so no
    copy out of PIL), then drop the X byte into `out` (H, W, 3) with OpenCV."""
    cv2 = _cv2()
    height, width = out.shape[:2]
    rgbx = _rgbx(width, height)
    core = Image.core.map_buffer(rgbx, (width, height), "raw", 0, ("RGBX", width * 4, 1))
    _jpeg_into_core(jpg, core, width, height)
    cv2.cvtColor(rgbx, cv2.COLOR_RGBA2RGB, dst=out)


def _check_mapped_path() -> bool:
    """Does the mapped decoder give exactly what Image.open gives, here (PIL build, OpenCV present)?"""
    try:
        _cv2()
    except ImportError:
        return False
    data = _test_jpeg()
    out = np.zeros((24, 40, 3), dtype=np.uint8)
    try:
        _decode_mapped(data, out)
        return bool(np.array_equal(out, _decode_general(data)))
    except Exception:  # noqa: BLE001 - any failure means: use the other paths
        return False


def _check_simplejpeg() -> bool:
    """Is simplejpeg here, and does it decode the test image exactly as Image.open does?"""
    try:
        import simplejpeg
    except ImportError:
        return False
    data = _test_jpeg()
    out = np.zeros((24, 40, 3), dtype=np.uint8)
    try:
        simplejpeg.decode_jpeg(data, colorspace="RGB", buffer=out)
        return bool(np.array_equal(out, _decode_general(data)))
    except Exception:  # noqa: BLE001 - any failure means: use the other paths
        return False


def _decode_simple(jpg: bytes | memoryview, out: np.ndarray) -> None:
    import simplejpeg

    simplejpeg.decode_jpeg(jpg, colorspace="RGB", buffer=out)


def prepare() -> None:
    """Run the fast-path checks (importing OpenCV) in this process: call it before
    DataLoader workers fork, so each inherits the answer instead of importing cv2
    itself (~0.6 s of CPU here, per worker and per epoch: workers fork anew every
    epoch)."""
    global _mapped_ok, _fast_jpeg_ok, _simple_ok
    if _simple_ok is None:
        _simple_ok = _check_simplejpeg()
    if _fast_jpeg_ok is None:
        _fast_jpeg_ok = _check_fast_path()
    if _mapped_ok is None:
        _mapped_ok = _check_mapped_path()


def decode_jpeg_into(jpg: bytes | memoryview, out: np.ndarray) -> None:
    """Decode an RGB JPEG of out's size into `out` (H, W, 3) uint8, C-contiguous:
    the reader's batch slot. Raises OSError/ValueError for data PIL cannot decode,
    ValueError when the image has another size."""
    global _mapped_ok, _simple_ok
    height, width = out.shape[:2]
    if _simple_ok is None:
        _simple_ok = _check_simplejpeg()
    if _mapped_ok is None:
        _mapped_ok = _check_mapped_path()
    fits = out.flags.c_contiguous and jpeg_frame(jpg) == (width, height, 3)
    if _simple_ok and fits:
        _decode_simple(jpg, out)
        return
    if _mapped_ok and fits:
        _decode_mapped(jpg, out)
        return
    arr = decode_jpeg(jpg, width, height)
    if arr.shape != out.shape:
        raise ValueError(f"image is {arr.shape[1]}x{arr.shape[0]}, index.json says {width}x{height}")
    out[...] = arr


def decode_jpeg(jpg: bytes | memoryview, width: int, height: int) -> np.ndarray:
    """uint8 (H, W, 3) RGB. Raises OSError/ValueError for data PIL cannot decode."""
    global _fast_jpeg_ok
    if _fast_jpeg_ok is None:
        _fast_jpeg_ok = _check_fast_path()
    if _fast_jpeg_ok and jpeg_frame(jpg) == (width, height, 3):
        return _decode_direct(jpg, width, height)
    return _decode_general(jpg)


def _numbers(js: bytes, key: bytes, nested: bool) -> np.ndarray | None:
    i = js.find(key)
    if i < 0:
        return None
    j = i + len(key)
    if js[j:j + 1] != b"[":
        return None
    end = js.find(b"]]" if nested else b"]", j)
    if end < 0:
        return None
    seg = js[j:end].replace(b"[", b" ").replace(b"]", b" ")
    if not seg.strip():
        return np.zeros(0, dtype=np.float64)
    return np.fromstring(seg, dtype=np.float64, sep=",")  # text mode: parsed in C


def sample_arrays(js: bytes, horizon: int, action_dim: int, joints: int, with_pose: bool = False) -> dict[str, Any]:
    """{"action": (T, D), "action_mask": (T,) | None, "proprio": (J,) | None,
    "joints_mask": (T,) | None} as float32, and "joints_valid" (False where frame t's
    joints are not known: no glove, or it was silent then); `with_pose` adds
    "pose" (4, 4) float64 (what the relative proprio needs). Raises ValueError when the JSON does not
    fit the index's shapes."""
    a = _numbers(js, b'"action":', nested=True)
    m = _numbers(js, b'"action_mask":', nested=False)
    p = _numbers(js, b'"proprio":', nested=False) if joints else np.zeros(0)
    jv = b'"joints_valid":false' not in js  # packed by the packer as compact JSON
    pose = _numbers(js, b'"pose":', nested=True) if with_pose else None
    if (a is not None and a.size == horizon * action_dim and m is not None and m.size == horizon
            and p is not None and p.size == joints and (not with_pose or (pose is not None and pose.size == 16))):
        fast: dict[str, Any] = {"action": a.astype(np.float32).reshape(horizon, action_dim),
                                "action_mask": m.astype(np.float32), "proprio": p.astype(np.float32),
                                "joints_valid": jv, "joints_mask": _joints_mask(js, horizon)}
        if pose is not None:
            fast["pose"] = pose.reshape(4, 4)
        return fast
    d = json.loads(js)
    if d.get("action") is None:
        raise ValueError("action is null but index.json says has_action")
    out: dict[str, Any] = {"action": np.asarray(d["action"], dtype=np.float32).reshape(horizon, action_dim)}
    mask = d.get("action_mask")
    out["action_mask"] = None if mask is None else np.asarray(mask, dtype=np.float32).reshape(horizon)
    prop = d.get("proprio")
    out["proprio"] = None if not joints or prop is None else np.asarray(prop, dtype=np.float32).reshape(joints)
    out["joints_valid"] = d.get("joints_valid", True) is not False
    jm = d.get("joints_mask")
    out["joints_mask"] = None if jm is None else np.asarray(jm, dtype=np.float32).reshape(horizon)
    if with_pose:
        if d.get("pose") is None:
            raise ValueError("pose is null but index.json says has_action")
        out["pose"] = np.asarray(d["pose"], dtype=np.float64).reshape(4, 4)
    return out


def _joints_mask(js: bytes, horizon: int) -> np.ndarray | None:
    """The chunk steps whose joints are known ("joints_mask", written only where the
    glove went silent within the chunk), else None (every step's joints known)."""
    if b'"joints_mask":' not in js:
        return None
    jm = _numbers(js, b'"joints_mask":', nested=False)
    if jm is None or jm.size != horizon:
        raise ValueError(f"joints_mask has {0 if jm is None else jm.size} steps, not {horizon}")
    return jm.astype(np.float32)
