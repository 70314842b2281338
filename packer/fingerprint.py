"""What makes a packed session stale: any byte of its inputs or any pack option.

Two levels, so a re-run is cheap and copying raw data around never forces a
re-pack: a stat signature (names, sizes, mtimes: no reads) decides most re-runs;
when it differs, the content fingerprint (sha256 of the small input files, CRC-32
and length of every frame: packer.imageops.frame_digest) decides. On the first
pack the frame digests come from the worker processes, which read each frame
anyway, so fingerprinting costs no extra pass over the data."""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from packer.imageops import frame_digest
from packer.session import Session

INPUT_FILES = ("poses.json", "encoders.json", "calib.txt", "metadata.json")


def _header(options: dict[str, Any], format_version: int) -> bytes:
    return json.dumps({"options": options, "format": format_version}, sort_keys=True).encode()


def stat_signature(
    session: Session, keep: Sequence[int] | np.ndarray, options: dict[str, Any], format_version: int
) -> str:
    h = hashlib.sha256(_header(options, format_version))
    for name in INPUT_FILES:
        p = session.file(name)
        st = p.stat() if p.exists() else None
        h.update(f"{name}\0{st.st_size if st else -1}\0{st.st_mtime_ns if st else -1}\0".encode())
    stats = session.frame_stats()
    for i in keep:
        size, mtime = stats[i]
        h.update(f"{int(session.frames[i])}\0{size}\0{mtime}\0".encode())
    return h.hexdigest()


def file_digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def content_fingerprint(session: Session, keep: Sequence[int] | np.ndarray, options: dict[str, Any],
                        format_version: int, frame_digests: Iterable[bytes] | None = None) -> str:
    """sha256 over options + small input files + the kept frames' digests
    (frame_digest; read here unless `frame_digests`, one per kept frame, are given)."""
    h = hashlib.sha256(_header(options, format_version))
    for name in INPUT_FILES:
        p = session.file(name)
        h.update(name.encode() + b"\0")
        if p.exists():
            h.update(file_digest(p.read_bytes()))
    if frame_digests is None:
        frame_digests = (frame_digest(session.frame_paths[i].read_bytes()) for i in keep)
    for i, d in zip(keep, frame_digests, strict=True):
        h.update(f"{int(session.frames[i])}\0".encode())
        h.update(d)
    return h.hexdigest()
