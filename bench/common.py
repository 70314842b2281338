"""What every benchmark row carries: the machine and the software it ran on."""
from __future__ import annotations

import csv
import os
import platform
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(next(ln for ln in open("/proc/meminfo") if ln.startswith("MemTotal")).split()[1])
        mem = f", {kb / 1024**2:.0f} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    return f"{os.cpu_count()} cores {cpu}{mem}"


def write_csv(path: Path, rows: list[dict], command: str | None = None) -> Path:
    """`rows` as a CSV at `path`, every row stamped with the `command` that made it when given."""
    if command is not None:
        for r in rows:
            r["command"] = command
    path.parent.mkdir(parents=True, exist_ok=True)
    fields: list[str] = []
    for r in rows:
        fields += [k for k in r if k not in fields]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    return path


@contextmanager
def baseline_worktree(ref: str, dest: Path) -> Iterator[tuple[Path | None, str]]:
    """`ref` checked out as a detached git worktree at `dest`, removed on exit:
    (its path, its short revision), or (None, why not) when it cannot be checked out."""
    r = subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(dest), ref],
                       capture_output=True, text=True)
    if r.returncode != 0:
        yield None, f"no baseline: git worktree add {ref} failed: {r.stderr.strip()[-300:]}"
        return
    try:
        rev = subprocess.run(["git", "-C", str(dest), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        yield dest, rev.stdout.strip()
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(dest)], capture_output=True)
