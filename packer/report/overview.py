"""The dataset at a glance: which sessions are packed, refused or skipped (and
why), how much video, the train/validation split, size against the quota, the
warnings grouped by kind. Numbers only (index.json, the raw folder listing, the
config); the figures come per session."""
from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from shardship.errors import ShardshipError
from shardship.split import SEED, VAL_FRACTION, split_sessions
from shardship.units import human

# a warning's kind: its text with the numbers and joint names taken out, so
# "index_mcp: 12 of 900 readings are read errors" and "index_pip: 3 of 900 ..." group
_NUMBER = re.compile(r"[-+]?\d+(\.\d+)?%?")
_JOINT = re.compile(r"\b(index|three_finger)_(mcp|pip)\b")


def warning_kind(text: str) -> str:
    head = _JOINT.sub("<joint>", text)
    if head.startswith("<joint>: "):  # "index_mcp: 12 of 900 readings ..." names the joint first
        head = "<joint> " + head[len("<joint>: "):]
    head = re.split(r"[(:;]", head, maxsplit=1)[0].strip()
    return _NUMBER.sub("N", head).strip(" ,.") or text


def group_warnings(sessions: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """[{kind, count, sessions, entries: [(session, text)]}], the most frequent kind first."""
    groups: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for name, entry in sorted(sessions.items()):
        for w in entry.get("warnings") or []:
            groups[warning_kind(str(w))].append((name, str(w)))
    return [{"kind": k, "count": len(v), "sessions": len({n for n, _ in v}), "entries": v}
            for k, v in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))]


def skipped_sessions(raw: Path | None, packed: set[str], refused: set[str]) -> dict[str, str]:
    """Sessions in the raw folder that index.json neither packed nor refused."""
    if raw is None or not raw.is_dir():
        return {}
    out: dict[str, str] = {}
    folders = {p.name for p in raw.iterdir() if p.is_dir() and not p.name.startswith(".")}
    for name in sorted(folders - packed - refused):
        out[name] = f"in {raw} but not in index.json: not packed yet (run `packer pack`)"
    for z in sorted(raw.glob("*.zip")):
        if z.stem not in folders | packed | refused:
            out[z.stem] = f"{z.name} not unpacked yet (`packer check` or `packer pack` unpacks it)"
    return out


def split(names: list[str], train_cfg: dict[str, Any]) -> tuple[list[str], list[str], str]:
    """(train, val, note) as `train run` will split with this config's [train]."""
    frac = float(train_cfg.get("val_fraction", VAL_FRACTION))
    seed = int(train_cfg.get("seed", SEED))
    try:
        tr, va = split_sessions(names, frac, seed, train_cfg.get("val_sessions") or None)
    except ShardshipError as e:
        return sorted(names), [], f"[train] split not possible: {e}"
    how = "val_sessions" if train_cfg.get("val_sessions") else f"val_fraction {frac:g}, seed {seed}"
    return tr, va, f"as `train run` splits with [train] {how}"


def overview(index: dict[str, Any], raw: Path | None, train_cfg: dict[str, Any],
             budget: dict[str, Any] | None) -> dict[str, Any]:
    sessions: dict[str, dict[str, Any]] = index.get("sessions") or {}
    failed: dict[str, str] = index.get("failed") or {}
    skipped = skipped_sessions(raw, set(sessions), set(failed))
    names = sorted(sessions)
    tr, va, split_note = split(names, train_cfg)
    seconds = sum(_seconds(e) for e in sessions.values())
    totals = index.get("totals") or {}
    packed_bytes = int(totals.get("packed_bytes") or sum(int(e.get("packed_bytes", 0)) for e in sessions.values()))
    return {
        "n_packed": len(names), "n_refused": len(failed), "n_skipped": len(skipped),
        "refused": sorted(failed.items()), "skipped": sorted(skipped.items()),
        "frames": sum(int(e.get("frames", 0)) for e in sessions.values()),
        "samples": int(totals.get("samples") or 0),
        "minutes": seconds / 60.0,
        "train": tr, "val": va, "split_note": split_note,
        "raw_size": human(int(totals.get("raw_bytes") or 0)), "packed_size": human(packed_bytes),
        "packed_bytes": packed_bytes, "budget": budget,
        "warnings": group_warnings(sessions),
        "n_warnings": sum(len(e.get("warnings") or []) for e in sessions.values()),
        "options": index.get("options") or {},
        "created": index.get("created"),
    }


def _seconds(entry: dict[str, Any]) -> float:
    fps = float(entry.get("fps") or 0)
    return float(entry.get("frames", 0)) / fps if fps > 0 else 0.0
