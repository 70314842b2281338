"""Which sessions train and which are held out for validation: one function, so
the trainer and `packer report` (which shows the split before a GPU hour is spent)
agree by construction. Pure: names in, names out."""
from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from shardship.errors import ShardshipError

VAL_FRACTION = 0.1  # [train] val_fraction's default
SEED = 0  # [train] seed's default


def split_sessions(names: Sequence[str], val_fraction: float, seed: int,
                   val_sessions: Sequence[str] | None = None) -> tuple[list[str], list[str]]:
    """(train, val) session names. Explicit `val_sessions` win; otherwise a stable
    hash of (seed, name) picks ceil(fraction * n) sessions, so adding a session
    later does not reshuffle which old ones are held out. One session: no val."""
    names = sorted(names)
    if val_sessions:
        unknown = [v for v in val_sessions if v not in names]
        if unknown:
            raise ShardshipError(f"val_sessions: {', '.join(unknown)} not in the index (have: {', '.join(names)})")
        val = sorted(val_sessions)
    elif val_fraction <= 0 or len(names) < 2:
        val = []
    else:
        n_val = min(len(names) - 1, max(1, int(np.ceil(val_fraction * len(names)))))
        ranked = sorted(names, key=lambda n: hashlib.sha256(f"{seed}:{n}".encode()).hexdigest())
        val = sorted(ranked[:n_val])
    train = [n for n in names if n not in val]
    if not train:
        raise ShardshipError("every session is held out for validation: lower val_fraction or val_sessions")
    return train, val
