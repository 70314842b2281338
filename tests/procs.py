"""The process table from /proc, for tests that watch what a command leaves running."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path


def children_by_parent(live_only: bool = False) -> dict[int, list[int]]:
    """{parent pid: its children's pids}; `live_only` leaves zombies out (a child
    that exited and waits to be reaped is not running)."""
    out: dict[int, list[int]] = defaultdict(list)
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if not (live_only and fields[0] == "Z"):
                out[int(fields[1])].append(int(d.name))
    return out
