"""A capture fault the pipeline must refuse: the phone held in portrait.

StackCapture's frames are landscape 480x360 (its capture connection keeps the
sensor's orientation), and packing and SLAM assume that size. A build that lets the
frames follow the phone's orientation writes 360x480 JPEGs, says so in
metadata.json's rgbResolution, and reports the intrinsics in those frames' pixels.
`portrait` turns a rendered (landscape) session folder into that session, so the
tests check that `packer check` and `packer pack` refuse it in one line instead of
packing it with the intrinsics of the wrong orientation."""
from __future__ import annotations

import json
from pathlib import Path

from PIL import Image

from packer.synth import swift_json
from packer.synth.frames import JPEG_QUALITY


def portrait(folder: Path) -> None:
    """Rotate every frame of `folder` a quarter turn clockwise (480x360 -> 360x480,
    the phone turned upright), set metadata.json's rgbResolution to [360, 480] and
    write calib.txt (and metadata's cameraIntrinsics) in the rotated frames' pixels:
    fx and fy swap, and the principal point turns with the image (cx' = H - cy,
    cy' = cx, in calib.txt's pixel-centre convention). The other files are untouched;
    synth_truth.json keeps the landscape camera (the pipeline never reads it)."""
    folder = Path(folder)
    size = None  # the landscape (width, height) the frames had
    for p in sorted((folder / "rgb").glob("*.jpg")):
        with Image.open(p) as im:
            size = im.size
            turned = im.transpose(Image.Transpose.ROTATE_270)  # 270 counter-clockwise: a quarter clockwise
        turned.save(p, format="JPEG", quality=JPEG_QUALITY)
    if size is None:
        raise ValueError(f"{folder}/rgb holds no frames to rotate")
    calib = folder / "calib.txt"
    k = None
    if calib.exists():
        fx, fy, cx, cy = (float(v) for v in calib.read_text().split())
        k = (fy, fx, size[1] - cy, cx)
        calib.write_text(" ".join(_swift_float(v) for v in k))
    md_path = folder / "metadata.json"
    if md_path.exists():
        md = json.loads(md_path.read_bytes())
        md["rgbResolution"] = [size[1], size[0]]
        if k is not None and "cameraIntrinsics" in md:
            md["cameraIntrinsics"] = dict(zip(("fx", "fy", "cx", "cy"), k))
        md_path.write_bytes(swift_json.dumps(md, float32_keys=("cameraIntrinsics",)))


def _swift_float(x: float) -> str:
    """calib.txt's numbers as the app interpolates them: Swift `Float.description`."""
    s = swift_json.format_float32(x)
    return s if any(c in s for c in ".eNI") else s + ".0"
