"""The local side of an upload: which shard files index.json promises.

Parsing and validating index.json (shard names safe as remote file names, sizes,
sha256, sample rows) is `shardship.format.index`'s job; this module keeps only
what transfer adds: the names of its own files next to the shards on the remote,
the raw index bytes (sent as is, so the remote copy is byte-identical) and which
promised files exist locally. Shard *content* names (tar members) are checked by
`transfer.unpack`.
"""
from __future__ import annotations

from pathlib import Path

from shardship.errors import ShardshipError
from shardship.format import index
from shardship.format.index import INDEX, FileRef
from shardship.format.index import Shard as ShardFile

__all__ = ["INDEX", "PART", "REMOTE_STATE", "FileRef", "ShardFile", "load_local", "local_file"]

#: remote bookkeeping: name -> {size, sig, sha256} of shards verified there (transfer.signature)
#: (starts with '.', which `index.check_name` never allows for a shard)
REMOTE_STATE = ".shardship-state.json"
#: a partly sent file is NAME.part (a suffix `index.RESERVED_SUFFIXES` keeps shards off)
PART = ".part"


def load_local(out_dir: Path) -> tuple[bytes, list[ShardFile]]:
    """Read `out_dir/index.json`; returns its raw bytes (sent as is) and the
    validated shards."""
    path = Path(out_dir) / INDEX
    if not path.is_file():
        raise ShardshipError(f"{path} not found: pack first (`make pack`) or pass --out DIR")
    data = path.read_bytes()
    return data, list(index.parse(data, str(path)).shards)


def local_file(out_dir: Path, ref: FileRef) -> Path | None:
    """The local file for `ref` when it exists with the promised size, else None."""
    p = Path(out_dir) / ref.name
    try:
        return p if p.stat().st_size == ref.bytes else None
    except FileNotFoundError:
        return None
