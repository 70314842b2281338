"""Which sessions train and which are held out for validation: one function, so
the trainer and `packer report` (which shows the split before a GPU hour is spent)
agree by construction. Pure: names in, names out."""
from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence

import numpy as np

from shardship.errors import ShardshipError

VAL_FRACTION = 0.1  # [train] val_fraction's default
SEED = 0  # [train] seed's default
COPY = re.compile(r"^(?P<base>.+) \((?P<n>[0-9]+)\)$")  # `session_X (1)`: a second AirDrop/Finder copy


def original_name(name: str) -> str:
    """`session_X` for `session_X (2)`; any other name as it is."""
    m = COPY.match(name)
    return m.group("base") if m else name



def split_sessions(names: Sequence[str], val_fraction: float, seed: int,
                   val_sessions: Sequence[str] | None = None,
                   same: Mapping[str, str] | None = None) -> tuple[list[str], list[str]]:
    """(train, val) session names. Explicit `val_sessions` win; otherwise a stable
    hash of (seed, name) picks ceil(fraction * n) sessions, so adding a session
    later does not reshuffle which old ones are held out. One session: no val.

    Copies of one recording always land on the same side, so validation never
    scores a session that is also trained on: `session_X (1)` goes with
    `session_X` (the suffix a second AirDrop/Finder export gets), and names with
    the same `same[name]` (ShardIndex.session_content) go together. A held-out
    session brings its copies along."""
    names = sorted(names)
    group = _recordings(names, same or {})
    if val_sessions:
        unknown = [v for v in val_sessions if v not in names]
        if unknown:
            raise ShardshipError(f"val_sessions: {', '.join(unknown)} not in the index (have: {', '.join(names)})")
        held = {group[v] for v in val_sessions}
    elif val_fraction <= 0 or len(set(group.values())) < 2:
        held = set()
    else:
        recordings = sorted(set(group.values()))
        n_val = min(len(recordings) - 1, max(1, int(np.ceil(val_fraction * len(recordings)))))
        held = set(sorted(recordings, key=lambda n: hashlib.sha256(f"{seed}:{n}".encode()).hexdigest())[:n_val])
    val = [n for n in names if group[n] in held]
    train = [n for n in names if group[n] not in held]
    if not train:
        raise ShardshipError("every session is held out for validation: lower val_fraction or val_sessions")
    return train, val


def _recordings(names: list[str], same: Mapping[str, str]) -> dict[str, str]:
    """Each name -> the name standing for its recording: the first (sorted) name
    with its content key, else the name without a ` (N)` copy suffix when that
    name is there too, else itself."""
    first: dict[str, str] = {}
    out: dict[str, str] = {}
    present = set(names)
    for n in names:
        base = original_name(n) if original_name(n) in present else n
        key = same.get(n)
        out[n] = first.setdefault(key, base) if key else base
    return out
