"""The bench's earlier baseline loop (kept as a second row): one process, one tar
per session, per frame decode -> convert("RGB") -> resize 224x224 bilinear ->
JPEG q85. The convert() is a full-frame copy the user's own script
(bench/pack_loop.py) does not make, so this loop is slower than the user's.

    python bench/pack_loop_convert.py RAW OUT"""
from __future__ import annotations

import io
import sys
import tarfile
from pathlib import Path

from PIL import Image


def reference_loop(raw: Path, out: Path) -> int:
    """Pack every session folder under `raw` (its rgb/*.jpg) into out/<session>.tar."""
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    for session in sorted(p for p in raw.iterdir() if (p / "rgb").is_dir()):
        with tarfile.open(out / f"{session.name}.tar", "w") as tf:
            for p in sorted((session / "rgb").glob("*.jpg")):
                im = Image.open(p).convert("RGB").resize((224, 224), Image.BILINEAR)  # type: ignore[attr-defined]
                buf = io.BytesIO()
                im.save(buf, format="JPEG", quality=85)
                data = buf.getvalue()
                ti = tarfile.TarInfo(f"{session.name}/{p.stem}.jpg")
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
                n += 1
    return n


if __name__ == "__main__":
    print(reference_loop(Path(sys.argv[1]), Path(sys.argv[2])))
