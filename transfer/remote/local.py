"""`local:PATH`: a directory on this machine standing in for the cluster home.

The demo and the fast tests run the very same upload/pull/submit code as
against a cluster, without SSH: this backend only implements the Remote
primitives with the os module and subprocesses (no shell, so arguments need
no quoting).
"""
from __future__ import annotations

import contextlib
import os
import posixpath
import stat as stat_mod
import subprocess
import sys
from collections.abc import Iterator, Sequence
from typing import BinaryIO

from shardship.errors import RemoteError
from transfer.remote.base import FileStat, PipeProcess, Process, Remote, RunResult, _decode


def local_home(host: str) -> str:
    """PATH of a `local:PATH` host."""
    return host[len("local:"):] or "."


def _existing_dir(path: str) -> str:
    """`path` or its nearest existing parent: the stand-in home may not exist yet,
    and a subprocess needs a real working directory."""
    while not os.path.isdir(path) and path != os.path.dirname(path):
        path = os.path.dirname(path)
    return path


class LocalRemote(Remote):
    """A directory on this machine standing in for the cluster home (`local:PATH`).

    Same operations, same upload code; commands run as subprocesses with no
    shell, and "python3" means the interpreter running shardship unless the
    cluster config names another."""

    def __init__(self, home: str | os.PathLike, remote_dir: str = "shardship", python: str = "python3"):
        self.home = os.path.abspath(os.path.expanduser(str(home)))
        self.root = posixpath.normpath(posixpath.join(self.home, remote_dir))
        self.python = sys.executable if python == "python3" else python
        self.label = f"local:{self.home}"

    def run(self, argv: Sequence[str], *, cwd: str | None = None, stdin: bytes | None = None,
            timeout: float | None = None) -> RunResult:
        argv = [str(a) for a in argv]
        if argv and argv[0] == "python3":
            argv[0] = self.python
        if cwd is not None:
            where = self.path(cwd)
            if not os.path.isdir(where):  # like `cd DIR && ...` failing over SSH
                return RunResult(tuple(argv), 1, "", f"cd: {where}: No such file or directory", self.label)
        else:  # the stand-in home may not exist yet: run from its nearest existing parent
            where = _existing_dir(self.home)
        try:
            p = subprocess.run(argv, cwd=where, input=stdin, capture_output=True, timeout=timeout)
        except FileNotFoundError as e:
            # like a shell: exit 127 for a command that does not exist
            return RunResult(tuple(argv), 127, "", f"{argv[0]}: not found ({e.strerror})", self.label)
        except subprocess.TimeoutExpired:
            raise RemoteError(f"{self.label}: `{argv[0]}` did not finish within {timeout}s") from None
        return RunResult(tuple(argv), p.returncode, _decode(p.stdout), _decode(p.stderr), self.label)

    def start(self, argv: Sequence[str]) -> Process:
        args = [str(a) for a in argv]
        if args and args[0] == "python3":
            args[0] = self.python
        try:
            p = subprocess.Popen(args, cwd=_existing_dir(self.home), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL)
        except FileNotFoundError:
            return _DeadProcess()
        return PipeProcess(p)

    def stat(self, path: str) -> FileStat | None:
        try:
            st = os.stat(self.path(path))
        except (FileNotFoundError, NotADirectoryError):
            return None
        return FileStat(st.st_size, st.st_mtime, stat_mod.S_ISDIR(st.st_mode))

    def listdir(self, path: str = "") -> dict[str, FileStat]:
        out: dict[str, FileStat] = {}
        try:
            it = os.scandir(self.path(path))
        except (FileNotFoundError, NotADirectoryError):
            return out
        with it:
            for e in it:
                with contextlib.suppress(FileNotFoundError):
                    st = e.stat()
                    out[e.name] = FileStat(st.st_size, st.st_mtime, stat_mod.S_ISDIR(st.st_mode))
        return out

    @contextlib.contextmanager
    def open_write(self, path: str, offset: int = 0) -> Iterator[BinaryIO]:
        full = self.path(path)
        f = open(full, "r+b" if offset else "wb")
        try:
            if offset:
                f.seek(offset)
                f.truncate()
            yield f  # type: ignore[misc]
            f.flush()
        finally:
            f.close()

    @contextlib.contextmanager
    def open_read(self, path: str, offset: int = 0) -> Iterator[BinaryIO]:
        with open(self.path(path), "rb") as f:
            f.seek(offset)
            yield f  # type: ignore[misc]

    def rename(self, src: str, dst: str) -> None:
        os.replace(self.path(src), self.path(dst))

    def remove(self, path: str, missing_ok: bool = True) -> None:
        try:
            os.unlink(self.path(path))
        except FileNotFoundError:
            if not missing_ok:
                raise

    def mkdir(self, path: str = "", parents: bool = True) -> None:
        full = self.path(path)
        if parents:
            os.makedirs(full, exist_ok=True)
        elif not os.path.isdir(full):
            os.mkdir(full)



class _DeadProcess(Process):
    """A command that could not start (exit 127, like a shell)."""

    def write(self, data: bytes) -> None:
        pass

    def readline(self) -> bytes:
        return b""

    def close(self) -> int:
        return 127

