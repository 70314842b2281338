"""The out dir lock of `packer pack` (one process packs a directory at a time).

Its own module, importing nothing but the standard library, because the CLI asks
`held_by_another` before it starts encoding early, and that happens before numpy
and the rest of the packer are imported."""
from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from shardship.errors import Exit, ShardshipError
from shardship.flock import LockHeld, acquire, release

LOCK = ".packer.lock"


def held_by_another(out: Path) -> bool:
    """Does another process hold the out dir right now? (A probe: the lock is not
    kept. `packer pack` asks before it starts encoding early, so a second pack into
    a busy directory is refused at once instead of after minutes of CPU.)"""
    try:
        fd = os.open(out / LOCK, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False  # no lock file: nobody has packed here
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


@contextmanager
def locked(out: Path) -> Iterator[int]:
    """Hold the out dir for this process; yields the lock's fd (pool workers close
    their inherited copy). Raises ShardshipError (exit 2) when another pack holds it.
    The lock file is removed when the pack ends, failed or not (shardship.flock)."""
    try:
        fd = acquire(out / LOCK)
    except LockHeld as e:
        pid = e.content[:32].decode(errors="replace").strip() or "?"
        raise ShardshipError(f"another `packer pack` (pid {pid}) is using {out}; wait for it or stop it",
                             Exit.USAGE) from None
    except OSError as e:
        raise ShardshipError(f"{out / LOCK}: cannot create the lock file ({e.strerror}): "
                             "check the permissions of the out dir") from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield fd
    finally:
        release(fd, out / LOCK)
