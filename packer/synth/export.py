"""The last step: move the assembled session into place, as a folder or as the
app's auto-zip export (`<name>.zip` + the `<name>.metadata.json` sidecar).

The session is built under a temporary name and only renamed (os.replace) once
complete, so a killed run never leaves a half-written session that looks whole.
The zip's bytes are deterministic so tests can compare exports by hash."""
from __future__ import annotations

import math
import os
import shutil
import zipfile
from datetime import datetime, timezone
from pathlib import Path


def zip_folder(folder: Path, dst: Path, name: str, epoch: float) -> None:
    """`folder` zipped with `name/` as its one top folder, deterministic bytes:
    sorted members, directory entries, a fixed timestamp (the capture's start)."""
    dt = datetime.fromtimestamp(math.floor(epoch), tz=timezone.utc)
    date_time = (max(dt.year, 1980), dt.month, dt.day, dt.hour, dt.minute, dt.second)
    entries: list[tuple[str, Path | None]] = [(f"{name}/", None)]
    for p in sorted(folder.rglob("*"), key=lambda q: q.relative_to(folder).as_posix()):
        rel = p.relative_to(folder).as_posix()
        entries.append((f"{name}/{rel}/", None) if p.is_dir() else (f"{name}/{rel}", p))
    with zipfile.ZipFile(dst, "w") as zf:
        for arc, member in entries:
            zi = zipfile.ZipInfo(arc, date_time)
            zi.create_system = 3
            if member is None:
                zi.external_attr = (0o40755 << 16) | 0x10
                zi.compress_type = zipfile.ZIP_STORED
                zf.writestr(zi, b"")
            else:
                zi.external_attr = 0o100644 << 16
                stored = member.suffix.lower() in (".jpg", ".jpeg", ".mov")
                zi.compress_type = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
                zf.writestr(zi, member.read_bytes(), compresslevel=None if stored else 6)


def publish(tmp: Path, out_dir: Path, name: str, export: str, md_bytes: bytes, capture_start: float) -> Path:
    """Replace any previous `out_dir/name` with the finished `tmp` folder (or its
    zip export, which also drops the folder) and return the session's path."""
    final = out_dir / name
    if final.exists():
        shutil.rmtree(final)
    if export == "zip":
        zpath = out_dir / f"{name}.zip"
        part = out_dir / f".{name}.zip.synth-tmp"
        zip_folder(tmp, part, name, capture_start)
        os.replace(part, zpath)
        (out_dir / f"{name}.metadata.json").write_bytes(md_bytes)
        shutil.rmtree(tmp)
        return zpath
    os.replace(tmp, final)
    return final
