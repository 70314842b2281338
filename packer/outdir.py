"""The packed out dir's rules, in one place, for `packer pack` and `packer verify`:

- one writer: `packer pack` holds an flock on `.packer.lock` (the kernel drops it
  when the process ends, even by SIGKILL), a second one is refused;
- index.json never names a file that is not there: a file leaves the out dir only
  after an index.json that does not name it has been saved (`Publisher.save`), so a
  kill between the two leaves a stray file the next save removes, never a dangling name;
- a kept shard is what index.json says: same stat as when it was last checked
  (size, mtime, ctime, inode: any rewrite changes one of them), or same sha256.
"""
from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from packer.lockfile import LOCK, locked  # noqa: F401  (re-exported: pack takes it from here)
from shardship.format import index as manifest
from shardship.format.check import Problem, check_files
from shardship.hashing import sha256_file
from shardship.units import human

#: the names packer gives shards (shard_prefix + -NNNN-<content hash>.tar; older packs: -NNNN.tar)
#: and their compressed copies: the only files a save may sweep away
SHARD_FILE = re.compile(r".+-[0-9a-f]{6}-[0-9]{4}(-[0-9a-f]{8})?\.tar(\.zst)?")
#: index.json key: name -> [size, mtime_ns, ctime_ns, inode] when the file last
#: matched its sha256 here (local bookkeeping; readers ignore it)
STAT_KEY = "local_stat"


# ---------------------------------------------------------------------------
# saving index.json, then deleting what it no longer names
# ---------------------------------------------------------------------------


def named(index: dict[str, Any]) -> set[str]:
    """Every file name index.json promises (shards and their .tar.zst)."""
    out = set()
    for sh in index["shards"]:
        out.add(sh["name"])
        if sh.get("compressed"):
            out.add(sh["compressed"]["name"])
    return out


class Publisher:
    """The out dir's index.json as saved on disk. Deleting shard files happens only
    here, right after a save, and only for files the saved index does not name."""

    def __init__(self, out: Path, index: dict[str, Any], finalise: Callable[[dict[str, Any]], None]):
        self.out, self.index, self.finalise = out, index, finalise
        self.saved = named(index)  # what the index.json on disk names
        stats = index.get(STAT_KEY)
        index[STAT_KEY] = stats if isinstance(stats, dict) else {}

    @property
    def stats(self) -> dict[str, Any]:
        return self.index[STAT_KEY]

    def save(self) -> None:
        """Save index.json (OSError when it cannot be written: the old one stays),
        then remove the shard files it does not name (removed sessions, older
        versions, .tar.zst no longer used, leftovers of a killed run)."""
        keep = named(self.index)
        self.index[STAT_KEY] = {k: v for k, v in self.stats.items() if k in keep}
        self.finalise(self.index)
        manifest.save(self.out, self.index)
        self.saved = keep
        self.sweep()

    def sweep(self) -> None:
        for p in self.out.iterdir():
            if SHARD_FILE.fullmatch(p.name) and p.name not in self.saved:
                p.unlink(missing_ok=True)

    def discard(self, names: set[str]) -> None:
        """Remove files written this run that the saved index does not name (a save
        that failed after they were renamed into place)."""
        for n in names - self.saved:
            (self.out / n).unlink(missing_ok=True)


def disk_error(e: OSError, out: Path, what: str = "shards") -> str:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        free = free_bytes(out)
        return (f"{out}: disk full while writing {what} ({human(free)} free); the partial files were removed "
                "and finished sessions are kept: free space or pass --out on a larger disk, then re-run")
    return f"{out}: {e.strerror or e}"


def free_bytes(path: Path) -> int:
    try:
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize
    except OSError:
        return 0


# ---------------------------------------------------------------------------
# is a kept file what index.json says?
# ---------------------------------------------------------------------------


def _stat(path: Path) -> list[int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def remember(out: Path, stats: dict[str, Any], names: list[str]) -> None:
    """Record the stat of files just written (their sha256 is the one in the index)."""
    for n in names:
        st = _stat(out / n)
        if st is not None:
            stats[n] = st


def file_ok(out: Path, ref: dict[str, Any], stats: dict[str, Any]) -> bool:
    """Is `ref` ({name, bytes, sha256}) there with those bytes? Stat first (no read);
    when the stat differs from the last check, hash it and remember the new stat."""
    name = ref["name"]
    st = _stat(out / name)
    if st is None or st[0] != ref["bytes"]:
        return False
    if stats.get(name) == st:
        return True
    if sha256_file(out / name) != ref["sha256"]:
        stats.pop(name, None)
        return False
    stats[name] = st
    return True


def shards_ok(out: Path, entry: dict[str, Any] | None, index: dict[str, Any], stats: dict[str, Any]) -> bool:
    """A kept session's .tar shards are all there, intact."""
    if not entry:
        return False
    by_name = {s["name"]: s for s in index["shards"]}
    return all(n in by_name and file_ok(out, by_name[n], stats) for n in entry["shards"])


# ---------------------------------------------------------------------------
# packer verify
# ---------------------------------------------------------------------------


def verify(out: Path, *, quick: bool = False) -> list[Problem]:
    """The out dir against its index.json (shardship.format.check decides), plus
    shard files index.json does not name. Raises ShardshipError without an index."""
    idx = manifest.read(out)
    sizes = {e.name: e.stat().st_size for e in os.scandir(out) if e.is_file(follow_symlinks=False)}
    problems = check_files(idx, sizes, None if quick else (lambda n: sha256_file(out / n)), compressed=True)
    promised = named(idx.doc)
    for name in sorted(sizes):
        if SHARD_FILE.fullmatch(name) and name not in promised:
            problems.append(Problem(name, "unlisted", "not named by index.json (left by an interrupted run)"))
    return problems
