"""The Remote interface: what upload, pull, status and the job submitter may ask
of "the other side", and the generic operations built on it.

A backend implements only the abstract primitives (run, start, stat, listdir,
open_write/open_read, rename, remove, mkdir); put/get, read_file/write_file,
size/exists and `sh` are written once here on top of them, so LocalRemote and
SSHRemote cannot drift apart in what those mean. Hashing and quota are NOT
methods: they are functions over a Remote (transfer.hashing, transfer.quota),
so this module imports neither and they can import it.

Paths given to a Remote are relative to `root` (the cluster's `remote_dir`)
unless absolute. Commands are argv lists, never shell strings.
"""
from __future__ import annotations

import abc
import contextlib
import os
import posixpath
import shlex
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

from shardship.errors import RemoteError

#: Read/write block for streaming files; SFTP splits it into 32 KiB requests.
CHUNK = 1024 * 1024

Callback = Callable[[int], None]  # called with the number of new bytes moved


@dataclass(frozen=True)
class RunResult:
    """What a remote command did. `stdout`/`stderr` are decoded text (UTF-8, replace)."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    where: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def check(self, what: str | None = None) -> RunResult:
        """Raise RemoteError (one line: host, command, exit code, last stderr line) unless ok."""
        if self.returncode != 0:
            last = (self.stderr.strip().splitlines() or self.stdout.strip().splitlines() or [""])[-1]
            name = what or self.argv[0]
            raise RemoteError(f"{self.where}: `{name}` failed with exit code {self.returncode}: {last[:300]}")
        return self


@dataclass(frozen=True)
class FileStat:
    """What `stat`/`listdir` report: enough for resume (size) and cheap
    re-verification (mtime), without a backend-specific stat object."""

    size: int
    mtime: float
    is_dir: bool = False


class Process(abc.ABC):
    """A long-running remote command with pipes (see `Remote.start`): lets one process
    serve many requests instead of paying a process start per request."""

    @abc.abstractmethod
    def write(self, data: bytes) -> None:
        """Send bytes to its stdin."""

    @abc.abstractmethod
    def readline(self) -> bytes:
        """One line of its stdout (b"" at end of output)."""

    @abc.abstractmethod
    def close(self) -> int:
        """Close stdin, wait, return the exit code."""


class PipeProcess(Process):
    """A local subprocess with pipes behind the Process interface: the command itself
    (LocalRemote) or the `ssh` that runs it on its own channel (OpenSSHRemote)."""

    def __init__(self, p: subprocess.Popen):
        self.p = p

    def write(self, data: bytes) -> None:
        try:
            self.p.stdin.write(data)  # type: ignore[union-attr]
            self.p.stdin.flush()  # type: ignore[union-attr]
        except BrokenPipeError:
            pass  # it exited: readline() will say so

    def readline(self) -> bytes:
        return self.p.stdout.readline()  # type: ignore[union-attr]

    def close(self) -> int:
        with contextlib.suppress(OSError):
            self.p.stdin.close()  # type: ignore[union-attr]
        return self.p.wait()


def _decode(b: bytes) -> str:
    """Command output as text: a stray non-UTF-8 byte must not hide the error message."""
    return b.decode("utf-8", "replace")


def shell_line(argv: Sequence[str], python: str, cwd: str | None = None) -> str:
    """The one string an SSH backend sends to the remote login shell (which always parses
    it): every argument `shlex.quote`d, "python3" replaced by the cluster's python, and
    `cd ABSOLUTE && ` in front when a working directory is given."""
    args = [str(a) for a in argv]
    if args and args[0] == "python3":
        args[0] = python
    line = shlex.join(args)
    if cwd is not None:
        line = f"cd {shlex.quote(cwd)} && {line}"  # absolute: never starts with "-"
    return line


class Remote(abc.ABC):
    """The operations transfer (and the job submitter) need on the other side."""

    #: "user@host" or "local:PATH": used in every message.
    label: str
    #: absolute path of the cluster's remote_dir (need not exist yet)
    root: str
    #: absolute path of the remote home
    home: str
    #: python interpreter on the remote side (cluster `python`, default python3)
    python: str
    #: how many files `transfer upload` may send at once (each on its own channel)
    streams: int = 1

    # -- paths -------------------------------------------------------------
    def path(self, *parts: str) -> str:
        """Absolute remote path: `parts` joined under root (an absolute part wins)."""
        return posixpath.normpath(posixpath.join(self.root, *parts)) if parts else self.root

    # -- commands ----------------------------------------------------------
    @abc.abstractmethod
    def run(self, argv: Sequence[str], *, cwd: str | None = None, stdin: bytes | None = None,
            timeout: float | None = None) -> RunResult:
        """Run argv on the remote; `cwd` is relative to root unless absolute (default: home).
        Never raises for a non-zero exit: call `.check()`."""

    def sh(self, script: str, *args: str, cwd: str | None = None, timeout: float | None = None) -> RunResult:
        """Run a FIXED sh script with `args` as $1, $2, ... The script goes on stdin
        (`sh -s -- ARGS`): arguments are never pasted into it, and the login shell
        (bash, or csh on some clusters) never parses its newlines."""
        return self.run(["sh", "-s", "--", *args], cwd=cwd, stdin=script.encode(), timeout=timeout)

    @abc.abstractmethod
    def start(self, argv: Sequence[str]) -> Process:
        """Start argv (from the home directory) with stdin/stdout pipes; stderr is discarded."""

    # -- files ---------------------------------------------------------------
    @abc.abstractmethod
    def stat(self, path: str) -> FileStat | None:
        """Size/mtime of a file or directory, None when it does not exist."""

    def size(self, path: str) -> int | None:
        """Bytes in `path`, None when missing (resume offsets, post-upload size checks)."""
        st = self.stat(path)
        return None if st is None else st.size

    def exists(self, path: str) -> bool:
        """Whether `path` exists (file or directory): one stat, no listing."""
        return self.stat(path) is not None

    @abc.abstractmethod
    def listdir(self, path: str = "") -> dict[str, FileStat]:
        """Entries of a directory with their stats, in one round trip ({} when missing)."""

    @abc.abstractmethod
    def open_write(self, path: str, offset: int = 0) -> contextlib.AbstractContextManager[BinaryIO]:
        """Open for writing at `offset` (0: create/truncate; >0: the file must exist)."""

    @abc.abstractmethod
    def open_read(self, path: str, offset: int = 0) -> contextlib.AbstractContextManager[BinaryIO]:
        """Open for reading from `offset` (read-ahead where the transport supports it)."""

    @abc.abstractmethod
    def rename(self, src: str, dst: str) -> None:
        """Atomic rename that replaces `dst` (POSIX rename semantics)."""

    @abc.abstractmethod
    def remove(self, path: str, missing_ok: bool = True) -> None:
        """Delete a file."""

    @abc.abstractmethod
    def mkdir(self, path: str = "", parents: bool = True) -> None:
        """Create a directory (and its parents); existing is fine."""

    def put(self, local: str | os.PathLike, path: str, offset: int = 0, callback: Callback | None = None,
            throttle: Callable[[int], None] | None = None) -> int:
        """Copy local file -> remote `path`, starting at byte `offset` of both (resume).
        Returns the bytes sent. `callback(n)` after each block; `throttle(n)` may sleep."""
        sent = 0
        with open(local, "rb") as src, self.open_write(path, offset) as dst:
            src.seek(offset)
            while True:
                block = src.read(CHUNK)
                if not block:
                    break
                if throttle:
                    throttle(len(block))
                dst.write(block)
                sent += len(block)
                if callback:
                    callback(len(block))
        return sent

    def get(self, path: str, local: str | os.PathLike, offset: int = 0, callback: Callback | None = None) -> int:
        """Copy remote `path` -> local file, starting at `offset` (resume). Returns bytes read."""
        got = 0
        mode = "r+b" if offset else "wb"
        with self.open_read(path, offset) as src, open(local, mode) as dst:
            dst.seek(offset)
            dst.truncate()
            while True:
                block = src.read(CHUNK)
                if not block:
                    break
                dst.write(block)
                got += len(block)
                if callback:
                    callback(len(block))
        return got

    def read_file(self, path: str) -> bytes:
        """A whole (small) file: bookkeeping JSON, logs. Shards go through `get`."""
        with self.open_read(path) as f:
            return f.read()

    def write_file(self, path: str, data: bytes, atomic: bool = True) -> None:
        """Write a whole (small) file; atomic: temp file next to it + rename."""
        full = self.path(path)
        self.mkdir(posixpath.dirname(full))
        if not atomic:
            with self.open_write(full) as f:
                f.write(data)
            return
        tmp = posixpath.join(posixpath.dirname(full), f".{posixpath.basename(full)}.{os.getpid()}.tmp")
        try:
            with self.open_write(tmp) as f:
                f.write(data)
            self.rename(tmp, full)
        except BaseException:
            with contextlib.suppress(Exception):
                self.remove(tmp)
            raise

    # -- lifetime ------------------------------------------------------------
    def close(self) -> None:  # noqa: B027 (optional)
        """Release the connection (idempotent)."""

    def __enter__(self) -> Remote:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.label}:{self.root}>"

