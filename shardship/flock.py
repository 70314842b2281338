"""Lock files that do not outlive their holder: flock'ed while held, removed on release.

A lock file left behind after a command ends (`.packer.lock`, `outputs/.lock`) is noise
the user wonders about. Removing it on release is safe only if a process that opened the
old file just before the unlink notices it locked a name no longer in the directory:
`acquire` re-checks the inode after the flock and retries on the new file."""
from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path


class LockHeld(Exception):
    """Another process holds the lock; `content` is what it wrote into the file (its pid...)."""

    def __init__(self, content: bytes) -> None:
        super().__init__("lock held")
        self.content = content


def _same(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except OSError:
        return False


def acquire(path: Path) -> int:
    """Open `path` (created if absent) and take flock(LOCK_EX | LOCK_NB) on it; the fd.
    Raises LockHeld when another process holds it, OSError when the file system cannot."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            content = os.pread(fd, 4096, 0)
            os.close(fd)
            raise LockHeld(content) from None
        except BaseException:
            os.close(fd)
            raise
        if _same(fd, path):
            return fd
        os.close(fd)  # the holder released (and removed) it between our open and our flock


def release(fd: int, path: Path) -> None:
    """Remove the lock file (still ours: same inode) and drop the lock."""
    if _same(fd, path):
        with contextlib.suppress(OSError):
            os.unlink(path)
    os.close(fd)
