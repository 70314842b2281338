"""What makes a packed session stale: any byte of its inputs or any pack option.
Content hashes (not mtimes), so copying raw data around does not force a re-pack."""
from __future__ import annotations

import hashlib
import json
from typing import Any

from packer.session import Session

INPUT_FILES = ("poses.json", "encoders.json", "calib.txt", "metadata.json")


def session_fingerprint(session: Session, options: dict[str, Any], format_version: int) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"options": options, "format": format_version}, sort_keys=True).encode())
    for name in INPUT_FILES:
        p = session.file(name)
        h.update(name.encode() + b"\0")
        if p.exists():
            h.update(hashlib.sha256(p.read_bytes()).digest())
    for idx, p in zip(session.frames, session.frame_paths):
        h.update(f"{int(idx)}\0".encode())
        with open(p, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()
