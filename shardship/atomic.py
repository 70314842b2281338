"""Crash-safe file writes: write to a temp file in the same directory, fsync,
rename. A reader (or a resumed run) sees the old file or the new one, never half."""
from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

TMP_SUFFIX = ".tmp"


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb") -> Iterator[BinaryIO]:
    """Yield a file object; on clean exit it replaces `path` atomically, on error
    the temp file is removed and `path` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
    os.fchmod(fd, _mode_for(path))  # mkstemp makes 0600; keep the file's mode or the umask default
    try:
        with os.fdopen(fd, mode) as f:
            yield f  # type: ignore[misc]
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)


def _mode_for(path: Path) -> int:
    try:
        return path.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_open(path, "wb") as f:
        f.write(data)


def write_json(path: str | os.PathLike, obj: Any, indent: int | None = 1) -> None:
    write_bytes(path, (json.dumps(obj, indent=indent, allow_nan=False) + "\n").encode())


def remove_stale_temps(directory: str | os.PathLike) -> int:
    """Delete temp files a killed run left behind; returns how many."""
    n = 0
    d = Path(directory)
    if not d.is_dir():
        return 0
    for p in d.iterdir():
        if p.name.startswith(".") and p.name.endswith(TMP_SUFFIX):
            p.unlink(missing_ok=True)
            n += 1
    return n


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) and SIGTERM back for a short critical section, such as
    "rename the shards into place, then save the index that names them": an
    interrupt between the two would leave files no index names. A signal that
    arrives meanwhile is recorded and acted on right after (KeyboardInterrupt, or
    the SIGTERM re-sent with its own handler back). Handlers, not a signal mask:
    a mask holds only the calling thread, and the kernel may hand the signal to
    another (a worker pool's result thread). Outside the main thread: no deferral."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    old = {sig: signal.signal(sig, lambda signum, _frame: pending.append(signum))
           for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        if signal.SIGTERM in pending:
            os.kill(os.getpid(), signal.SIGTERM)
        if signal.SIGINT in pending:
            raise KeyboardInterrupt
