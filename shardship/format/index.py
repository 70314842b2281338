"""index.json: the one file that says what a packed directory holds (docs/FORMAT.md).
Written last and atomically; anything it names exists, complete, with that sha256."""
from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path
from typing import Any

from shardship import __version__
from shardship.atomic import write_json
from shardship.errors import ShardshipError

INDEX = "index.json"
FORMAT = "shardship-index"
VERSION = 1
SAMPLE_FIELDS = ["key", "jpg_offset", "jpg_size", "json_offset", "json_size", "has_action"]


def empty(options: dict[str, Any], pil: str) -> dict[str, Any]:
    return {"format": FORMAT, "version": VERSION, "created": None, "tool": f"shardship {__version__}",
            "pil": pil, "options": options, "sample_fields": SAMPLE_FIELDS, "shards": [], "sessions": {},
            "failed": {}, "joints": [], "action_dim": None, "horizon": options.get("horizon"),
            "stats": {}, "totals": {}}


def load(directory: str | os.PathLike, *, required: bool = True) -> dict[str, Any] | None:
    p = Path(directory) / INDEX
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        if required:
            raise ShardshipError(f"{p} not found: run `packer pack` first, or point at a packed directory") from None
        return None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ShardshipError(f"{p} is not valid JSON ({e}); delete it and re-run `packer pack`") from None
    if data.get("format") != FORMAT:
        raise ShardshipError(f"{p} is not a shardship index (format {data.get('format')!r})")
    if data.get("version", 0) > VERSION:
        raise ShardshipError(f"{p} has format version {data['version']}; this shardship reads <= {VERSION}: upgrade")
    return data


def save(directory: str | os.PathLike, index: dict[str, Any]) -> None:
    index["created"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    index["totals"] = {
        "samples": sum(len(s["samples"]) for s in index["shards"]),
        "shards": len(index["shards"]),
        "raw_bytes": sum(s.get("raw_bytes", 0) for s in index["sessions"].values()),
        "packed_bytes": sum(s["bytes"] for s in index["shards"]),
    }
    write_json(Path(directory) / INDEX, index, indent=None)


def shard_paths(directory: str | os.PathLike, index: dict[str, Any]) -> list[Path]:
    return [Path(directory) / s["name"] for s in index["shards"]]
