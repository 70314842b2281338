"""The local side of an upload: which shard files index.json promises.

Reads `index.json` (docs/FORMAT.md) of a packed directory into `ShardFile`s
and checks what a remote command or path could trip over: a shard name must
be a plain file name (no `/`, no `..`, no leading `.`/`-` that could pose as
our temp files or an option). Shard *content* names (tar members) are checked
by `transfer.unpack`.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from shardship.errors import ShardshipError

INDEX = "index.json"
#: remote bookkeeping: name -> {size, mtime, sha256} of shards verified there
REMOTE_STATE = ".shardship-state.json"
PART = ".part"

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class FileRef:
    name: str
    bytes: int
    sha256: str


@dataclass(frozen=True)
class ShardFile:
    """One shard: the `.tar` the cluster must end up with, and optionally its `.tar.zst`."""

    name: str
    bytes: int
    sha256: str
    compressed: FileRef | None = None

    @property
    def ref(self) -> FileRef:
        return FileRef(self.name, self.bytes, self.sha256)


def check_name(name: object, where: str) -> str:
    """A shard name that is safe as a remote file name, or ShardshipError."""
    if not isinstance(name, str) or not name:
        raise ShardshipError(f"{where}: shard name {name!r} is not a file name")
    bad = None
    if "/" in name or "\\" in name or "\0" in name or "\n" in name:
        bad = "contains a path separator or control character"
    elif name in (".", "..") or name.startswith("."):
        bad = "starts with '.' (reserved for temp files)"
    elif name.startswith("-"):
        bad = "starts with '-'"
    elif name.endswith((PART, ".tmp")) or name in (INDEX, REMOTE_STATE):
        bad = "collides with a name transfer uses"
    if bad:
        raise ShardshipError(f"{where}: shard name {name!r} {bad}; re-pack with `packer pack`")
    return name


def _ref(d: object, where: str) -> FileRef:
    if not isinstance(d, dict):
        raise ShardshipError(f"{where}: expected an object with name/bytes/sha256")
    name = check_name(d.get("name"), where)
    size, digest = d.get("bytes"), d.get("sha256")
    if not isinstance(size, int) or size < 0:
        raise ShardshipError(f"{where}: {name}: 'bytes' must be a non-negative integer")
    if not isinstance(digest, str) or not _HEX64.match(digest):
        raise ShardshipError(f"{where}: {name}: 'sha256' must be 64 lowercase hex digits")
    return FileRef(name, size, digest)


def parse_index(data: bytes, where: str = INDEX) -> tuple[dict, list[ShardFile]]:
    """index.json bytes -> (the parsed object, its shards). Pure."""
    try:
        obj = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ShardshipError(f"{where}: not valid JSON ({e}); re-run `packer pack`") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("shards"), list):
        raise ShardshipError(f"{where}: no 'shards' list: not a shardship index (see docs/FORMAT.md)")
    shards: list[ShardFile] = []
    seen: set[str] = set()
    for i, s in enumerate(obj["shards"]):
        ref = _ref(s, f"{where}: shards[{i}]")
        comp = s.get("compressed")
        cref = _ref(comp, f"{where}: shards[{i}].compressed") if comp else None
        for n in (ref.name, cref.name if cref else None):
            if n is None:
                continue
            if n in seen:
                raise ShardshipError(f"{where}: shard name {n!r} appears twice")
            seen.add(n)
        shards.append(ShardFile(ref.name, ref.bytes, ref.sha256, cref))
    return obj, shards


def load_local(out_dir: Path) -> tuple[bytes, list[ShardFile]]:
    """Read `out_dir/index.json`; returns its raw bytes (sent as is) and the shards."""
    path = Path(out_dir) / INDEX
    if not path.is_file():
        raise ShardshipError(f"{path} not found: pack first (`make pack`) or pass --out DIR")
    data = path.read_bytes()
    _, shards = parse_index(data, str(path))
    return data, shards


def local_file(out_dir: Path, ref: FileRef) -> Path | None:
    """The local file for `ref` when it exists with the promised size, else None."""
    p = Path(out_dir) / ref.name
    try:
        return p if p.stat().st_size == ref.bytes else None
    except FileNotFoundError:
        return None
