"""The one local file hash: shards, uploads, the reader's verification."""
from __future__ import annotations

import hashlib
import os


def sha256_file(path: str | os.PathLike, limit: int | None = None, bufsize: int = 1 << 20) -> str:
    """sha256 of a file, or of its first `limit` bytes (a resumed upload's .part)."""
    h = hashlib.sha256()
    left = limit
    with open(path, "rb") as f:
        while left is None or left > 0:
            b = f.read(bufsize if left is None else min(bufsize, left))
            if not b:
                break
            h.update(b)
            if left is not None:
                left -= len(b)
    return h.hexdigest()
