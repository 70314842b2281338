"""A room covered in real photographs (`CameraEffects.photos`): brick, grass, gravel,
printed pages, posters and photos of things, from the sample images scikit-image
ships (scikit-image is a dev/bench dependency: the synthetic rooms of the tests and
the demo need none of it).

Why: our procedural texture (value noise and random shapes) is too kind to a corner
tracker; a session made outside the project in a room papered with photographs was
where the stage's scale leaned one way (all seven errors negative). Real photographs
bring repeated patterns (brick, gravel), fine stochastic texture (grass), text, and
smooth regions between strong edges (faces, objects)."""
from __future__ import annotations

import functools
import io

import cv2
import numpy as np
from PIL import Image

from shardship.errors import ShardshipError

PHOTOS = ("brick", "grass", "gravel", "page", "text", "coffee", "chelsea", "astronaut", "rocket", "camera",
          "coins", "motorcycle_left", "hubble_deep_field", "color", "ihc", "moon", "horse", "clock_motion")
_TILE_M = (0.25, 0.7)  # m, the printed size of one photograph on a surface


@functools.lru_cache(maxsize=1)
def load_photos() -> tuple[np.ndarray, ...]:
    """The photographs as (h, w, 3) uint8 RGB (grey ones converted); a one-line error
    naming the package when scikit-image is not installed."""
    try:
        import importlib.resources as resources

        folder = resources.files("skimage") / "data"
    except ModuleNotFoundError:
        raise ShardshipError("the photo room (--profile photos) needs scikit-image's sample photographs: "
                             "pip install scikit-image") from None
    out = []
    for name in PHOTOS:
        for ext in (".png", ".jpg"):
            p = folder / f"{name}{ext}"
            if p.is_file():  # PIL: OpenCV's libpng prints a warning for one of them
                with Image.open(io.BytesIO(p.read_bytes())) as im:
                    out.append(np.asarray(im.convert("RGB")))
                break
    if len(out) < 6:
        raise ShardshipError(f"the photo room: only {len(out)} of scikit-image's sample photographs found in "
                             f"{folder} (reinstall scikit-image)")
    return tuple(out)


def photo_texture(rng: np.random.Generator, h: int, w: int, texel: float) -> np.ndarray:
    """(h, w, 3) uint8: the surface papered with photographs, each printed 0.25-0.7 m
    wide (a random crop, flip and tint), edge to edge."""
    photos = load_photos()
    out = np.empty((h, w, 3), np.uint8)
    y = 0
    while y < h:
        row = max(2, int(rng.uniform(*_TILE_M) / texel))
        x = 0
        while x < w:
            col = max(2, int(rng.uniform(*_TILE_M) / texel))
            src = photos[int(rng.integers(len(photos)))]
            sh, sw = src.shape[:2]
            ch, cw = int(sh * rng.uniform(0.6, 1.0)), int(sw * rng.uniform(0.6, 1.0))
            y0, x0 = int(rng.integers(0, sh - ch + 1)), int(rng.integers(0, sw - cw + 1))
            crop = src[y0:y0 + ch, x0:x0 + cw]
            if rng.random() < 0.5:
                crop = crop[:, ::-1]
            tile = cv2.resize(crop, (col, row), interpolation=cv2.INTER_AREA).astype(np.float32)
            tile *= rng.uniform(0.8, 1.15, 3).astype(np.float32)
            hh, ww = min(row, h - y), min(col, w - x)
            out[y:y + hh, x:x + ww] = np.clip(tile[:hh, :ww], 0, 255).astype(np.uint8)
            x += col
        y += row
    return out
