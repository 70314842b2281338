"""`transfer pull`: fetch files back (best checkpoint, logs) with resume + verify.

Mirror of upload: the remote sha256 is computed on the remote first, each
file lands in `NAME.part` locally (resumed from its size), is hashed here,
retried once from zero on a mismatch, and renamed into place. A file already
here with the same sha256 is skipped.

    with transfer.connect(cluster) as remote:
        transfer.pull.pull(remote, ["outputs/run1/best.pt", "outputs/run1/logs"], Path("outputs"))
"""
from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardship.errors import Exit, RemoteError, ShardshipError
from shardship.hashing import sha256_file
from shardship.progress import bar as progress_bar
from transfer.hashing import sha256_many
from transfer.remote import Remote

PART = ".part"


@dataclass
class PullOutcome:
    remote_path: str
    local_path: Path
    bytes: int
    received: int = 0
    resumed_from: int = 0
    skipped: bool = False
    retried: bool = False


def expand(remote: Remote, paths: list[str]) -> list[tuple[str, str, int]]:
    """(absolute remote path, local relative path, size) for files, walking directories."""
    out: list[tuple[str, str, int]] = []
    for p in paths:
        full = remote.path(p)
        st = remote.stat(full)
        if st is None:
            raise ShardshipError(f"{remote.label}: {full} does not exist", code=Exit.REMOTE)
        base = posixpath.basename(full.rstrip("/")) or "root"
        if not st.is_dir:
            out.append((full, base, st.size))
            continue
        stack = [(full, base)]
        while stack:
            d, rel = stack.pop()
            for name, est in sorted(remote.listdir(d).items()):
                if est.is_dir:
                    stack.append((posixpath.join(d, name), posixpath.join(rel, name)))
                else:
                    out.append((posixpath.join(d, name), posixpath.join(rel, name), est.size))
    return out


def _safe_local(dest: Path, rel: str) -> Path:
    parts = [x for x in rel.split("/") if x not in ("", ".")]
    if any(x == ".." for x in parts):
        raise ShardshipError(f"refusing remote path {rel!r}: contains '..'")
    return dest.joinpath(*parts)


def pull(remote: Remote, paths: list[str], dest: str | Path, *, progress: bool | None = None) -> list[PullOutcome]:
    """Fetch `paths` (files or directories, relative to remote.root unless absolute) into `dest`."""
    dest = Path(dest)
    files = expand(remote, paths)
    hashes = sha256_many(remote, [f[0] for f in files]) if files else {}
    outcomes: list[PullOutcome] = []
    todo: list[tuple[str, Path, int, str, PullOutcome]] = []
    for full, rel, size in files:
        local = _safe_local(dest, rel)
        o = PullOutcome(full, local, size)
        outcomes.append(o)
        if local.is_file() and local.stat().st_size == size and sha256_file(local) == hashes[full]:
            o.skipped = True
            continue
        todo.append((full, local, size, hashes[full], o))
    total = sum(size - _part_size(local, size) for _, local, size, _, _ in todo)
    with progress_bar(total, "pull", enabled=progress, bytes_=True) as bar:
        for full, local, size, digest, o in todo:
            _fetch_one(remote, full, local, size, digest, o, bar)
    return outcomes


def _part_size(local: Path, size: int) -> int:
    part = local.with_name(local.name + PART)
    try:
        n = part.stat().st_size
    except FileNotFoundError:
        return 0
    return n if n <= size else 0


def _fetch_one(remote: Remote, full: str, local: Path, size: int, digest: str, o: PullOutcome, bar: Any) -> None:
    local.parent.mkdir(parents=True, exist_ok=True)
    part = local.with_name(local.name + PART)
    offset = _part_size(local, size)
    o.resumed_from = offset
    for attempt in (1, 2):
        try:
            o.received += remote.get(full, part, offset, callback=bar.update)
        except OSError as e:
            raise RemoteError(f"{remote.label}: reading {full} failed: {e}; rerun to resume") from None
        if sha256_file(part) == digest:
            break
        if attempt == 2:
            part.unlink(missing_ok=True)
            raise ShardshipError(f"{local}: sha256 differs from {remote.label}:{full} twice; removed the partial file",
                                 code=Exit.PARTIAL)
        o.retried = True
        bar.total = (bar.total or 0) + size
        offset = 0
    os.replace(part, local)
