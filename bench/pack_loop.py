"""The user's own packing script, `stack/scripts/pack_for_scc.py` in
corneliusgruss/stack, step for step: the baseline `packer pack` is measured
against. Same imports (numpy and tqdm included: the script imports them, so its
start-up pays for them), same session selection (folders named session_* with
an rgb/), per session one tar with metadata.json, poses.json, encoders.json and
calib.txt added by tarfile, then every rgb/*.jpg in name order opened with PIL,
resized straight to 224x224 bilinear (no convert), saved as JPEG q85 and added
as <session>/rgb/<name>; at the end the raw size without video/imu, by rglob.

    python bench/pack_loop.py RAW OUT

Re-stated here rather than copied; bench/pack.py times it as a subprocess
against `python -m packer pack`."""
from __future__ import annotations

import argparse
import io
import json  # noqa: F401  (imported by the user's script: part of its start-up)
import tarfile
from pathlib import Path

import numpy as np  # noqa: F401  (likewise)
from PIL import Image
from tqdm import tqdm

FILES = ("metadata.json", "poses.json", "encoders.json", "calib.txt")


def pack_session(session: Path, out: Path, size: int = 224) -> float | None:
    """One session into out/<name>.tar; its size in MB."""
    rgb = session / "rgb"
    if not rgb.exists():
        print(f"  {session.name}: no rgb/ directory, skipping")
        return None
    tar_path = out / f"{session.name}.tar"
    with tarfile.open(tar_path, "w") as tar:
        for name in FILES:
            if (session / name).exists():
                tar.add(str(session / name), arcname=f"{session.name}/{name}")
        for frame in sorted(rgb.glob("*.jpg")):
            im = Image.open(frame).resize((size, size), Image.BILINEAR)  # type: ignore[attr-defined]
            buf = io.BytesIO()
            im.save(buf, format="JPEG", quality=85)
            buf.seek(0)
            info = tarfile.TarInfo(name=f"{session.name}/rgb/{frame.name}")
            info.size = len(buf.getvalue())
            tar.addfile(info, buf)
    return tar_path.stat().st_size / 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("raw", type=Path)
    ap.add_argument("out", type=Path)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    sessions = sorted(d for d in a.raw.iterdir()
                      if d.is_dir() and d.name.startswith("session_") and (d / "rgb").exists())
    print(f"Packing {len(sessions)} sessions to {a.out}")
    total = 0.0
    for s in tqdm(sessions, desc="Packing"):
        mb = pack_session(s, a.out)
        if mb is not None:
            total += mb
    orig = sum(f.stat().st_size for s in sessions for f in s.rglob("*")
               if f.is_file() and f.name not in ("video.mov", "imu.json")) / 1e6
    print(f"Original (no video/imu): {orig:.0f} MB, packed: {total:.0f} MB")


if __name__ == "__main__":
    main()
