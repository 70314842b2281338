"""Optional zstd shard compression. JPEG payloads barely compress, so `auto`
probes one shard first and compresses only when it saves enough to pay for the
cluster-side unpack (which briefly needs both files: see transfer's peak check)."""
from __future__ import annotations

import os
from pathlib import Path

import zstandard

from shardship.atomic import atomic_open
from shardship.hashing import sha256_file

WORTH_IT = 0.90  # compress only if .zst <= 90% of .tar
LEVEL = 9


def probe_ratio(path: Path, sample_bytes: int = 4 << 20) -> float:
    """Compressed/original size of the first few MB of one shard."""
    with open(path, "rb") as f:
        data = f.read(sample_bytes)
    if not data:
        return 1.0
    return len(zstandard.ZstdCompressor(level=LEVEL).compress(data)) / len(data)


def compress_shard(path: Path) -> dict:
    """Write `<shard>.zst` next to the shard (atomically); returns its manifest entry."""
    dst = path.with_name(path.name + ".zst")
    cctx = zstandard.ZstdCompressor(level=LEVEL, threads=min(4, os.cpu_count() or 1))
    with open(path, "rb") as src, atomic_open(dst, "wb") as out:
        cctx.copy_stream(src, out)
    return {"name": dst.name, "bytes": dst.stat().st_size, "sha256": sha256_file(dst)}


def decide(mode: str, first_shard: Path | None) -> tuple[bool, float | None]:
    """(use compression?, probed ratio) for mode 'auto' | 'zstd' | 'none'."""
    if mode == "none" or first_shard is None:
        return False, None
    ratio = probe_ratio(first_shard)
    if mode == "zstd":
        return True, ratio
    return ratio <= WORTH_IT, ratio
