"""OpenSSH backend: every Remote operation as an `ssh` channel of ONE master connection.

Why beside the Fabric backend: paramiko cannot use an OpenSSH ControlMaster, so
with it every command is a new login (a Duo prompt each); and its per-packet
Python cost kept uploads under scp's speed. Here the login happens once per
cluster per day (transfer.remote.master) and the bytes never pass through
Python: each sender thread keeps one channel to a small receiver on the remote
(transfer.remote.programs), the kernel copies each file into that channel's pipe
(sendfile) and the master reads the pipe; the receiver writes the file and, on
the same channel, hashes it as it is on disk. Several senders run at once, each
channel with its own window (`streams`), which is what a long link needs.

Metadata (stat, listdir, rename, remove, mkdir) goes to one small python
service on the remote (one process, one channel, one round trip per call); the
program arrives on stdin, paths as JSON, so nothing is pasted into a command
line. Commands are `shlex.join`ed argv, run by the remote login shell as with
Fabric; nothing is built by string concatenation.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any, BinaryIO

from shardship.errors import RemoteError
from transfer.remote.base import CHUNK, Callback, FileStat, PipeProcess, Process, Remote, RunResult, _decode, shell_line
from transfer.remote.master import Master
from transfer.remote.programs import BOOT_BINARY, BOOT_TEXT, FS_SERVICE, RECEIVER

#: parallel `put`s the uploader may run over the master (each channel has its own window).
#: Each sender holds one channel (its receiver), plus one for metadata: 7 of the 10
#: sessions per connection sshd allows by default (MaxSessions), leaving room for the
#: odd command (unpack, quota) and for the user's own sessions on a shared ControlPath.
STREAMS = 6

_WRITE = 'cat > "$1"'
_APPEND = 'truncate -s "$2" -- "$1" && cat >> "$1"'
_READ = 'exec tail -c +"$2" -- "$1"'


class OpenSSHRemote(Remote):
    """The cluster through the OpenSSH client and its ControlMaster (already running)."""

    streams = STREAMS

    def __init__(self, master: Master, remote_dir: str = "shardship", python: str = "python3"):
        self.master = master
        self.python = python
        self.label = master.label
        self.user = master.user
        self._lock = threading.Lock()
        self._fs: subprocess.Popen | None = None
        self._idle: list[subprocess.Popen] = []  # receiver channels not in use
        self.home = str(self._call("home"))
        self.root = os.path.normpath(os.path.join(self.home, remote_dir))

    @property
    def alive(self) -> bool:
        """Whether the master connection is still up."""
        try:
            return self.master.alive()
        except (OSError, subprocess.SubprocessError):
            return False

    def _popen(self, argv: Sequence[str], cwd: str | None = None, stdin: Any = subprocess.PIPE,
               stdout: Any = subprocess.PIPE, stderr: Any = subprocess.PIPE) -> subprocess.Popen:
        line = shell_line(argv, self.python, None if cwd is None else self.path(cwd))
        return subprocess.Popen(self.master.argv(line), stdin=stdin, stdout=stdout, stderr=stderr)

    def _lost(self, what: str, detail: str = "") -> RemoteError:
        stalled = self.master.stalled()
        if stalled:
            return RemoteError(stalled)
        tail = f" ({detail.strip().splitlines()[-1][:200]})" if detail.strip() else ""
        return RemoteError(f"{self.label}: connection lost during {what}{tail}; rerun to resume")

    # -- commands ------------------------------------------------------------
    def run(self, argv: Sequence[str], *, cwd: str | None = None, stdin: bytes | None = None,
            timeout: float | None = None) -> RunResult:
        p = self._popen(argv, cwd)
        try:
            out, err = p.communicate(stdin or b"", timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            raise RemoteError(f"{self.label}: `{argv[0]}` did not finish within {timeout}s") from None
        if p.returncode == 255 and not self.alive:
            raise self._lost(f"`{argv[0]}`", _decode(err))
        return RunResult(tuple(str(a) for a in argv), p.returncode, _decode(out), _decode(err), self.label)

    def start(self, argv: Sequence[str]) -> Process:
        return PipeProcess(self._popen(argv, stderr=subprocess.DEVNULL))

    # -- metadata: one remote python serving requests ----------------------------
    def _call(self, op: str, path: str | None = None, **kw: Any) -> Any:
        req = (json.dumps({"op": op, "p": path, **kw}) + "\n").encode()
        with self._lock:
            if self._fs is None or self._fs.poll() is not None:
                self._fs = self._popen(["python3", "-u", "-c", BOOT_TEXT], stderr=subprocess.DEVNULL)
                req = (json.dumps(FS_SERVICE) + "\n").encode() + req
            fs = self._fs
            try:
                fs.stdin.write(req)  # type: ignore[union-attr]
                fs.stdin.flush()  # type: ignore[union-attr]
                line = fs.stdout.readline()  # type: ignore[union-attr]
            except OSError:
                line = b""
            if not line:
                code = fs.wait()
                self._fs = None
                if code == 127:
                    raise RemoteError(f"{self.label}: {self.python} not found on the remote: set python = \"...\" "
                                      f"in [cluster.NAME] or transport = \"paramiko\"")
                raise self._lost(f"{op} {path or ''}".strip())
        ans = json.loads(line)
        if "e" in ans:
            why = "no such file or directory" if ans.get("n") == errno.ENOENT else ans["e"]
            raise RemoteError(f"{self.label}: {op} {path}: {why}")
        return ans["r"]

    def stat(self, path: str) -> FileStat | None:
        r = self._call("stat", self.path(path))
        return None if r is None else FileStat(int(r[0]), float(r[1]), bool(r[2]))

    def listdir(self, path: str = "") -> dict[str, FileStat]:
        return {n: FileStat(int(r[0]), float(r[1]), bool(r[2]))
                for n, r in self._call("list", self.path(path)).items()}

    def rename(self, src: str, dst: str) -> None:
        self._call("rename", self.path(src), d=self.path(dst))

    def remove(self, path: str, missing_ok: bool = True) -> None:
        self._call("remove", self.path(path), ok=missing_ok)

    def mkdir(self, path: str = "", parents: bool = True) -> None:
        self._call("mkdir", self.path(path), parents=parents)

    # -- file data: through OpenSSH only -----------------------------------------
    def _writer(self, full: str, offset: int, stdin: Any) -> subprocess.Popen:
        if offset:
            return self._popen(["sh", "-c", _APPEND, "sh", full, str(offset)], stdin=stdin, stdout=subprocess.DEVNULL)
        return self._popen(["sh", "-c", _WRITE, "sh", full], stdin=stdin, stdout=subprocess.DEVNULL)

    def _check_write(self, p: subprocess.Popen, err: bytes, full: str) -> None:
        if p.returncode == 0:
            return
        text = _decode(err).strip()
        if p.returncode == 255 and not self.alive:
            raise self._lost(f"write {full}", text)
        last = (text.splitlines() or [f"exit code {p.returncode}"])[-1]
        code = errno.ENOSPC if "No space left" in last else (errno.EDQUOT if "quota" in last.lower() else 0)
        raise OSError(code, f"{self.label}: write {full}: {last[:200]}")

    @contextlib.contextmanager
    def _receiver(self) -> Iterator[subprocess.Popen]:
        """An idle receiver channel (programs.RECEIVER), or a new one: each sender thread
        holds one while it sends or hashes, so a shard costs no process start and no
        channel open on either side, and there are never more than `streams` of them."""
        rx = None
        with self._lock:
            while self._idle and rx is None:
                rx = self._idle.pop()
                if rx.poll() is not None:
                    rx = None
        if rx is None:
            rx = self._popen(["python3", "-u", "-c", BOOT_BINARY], stderr=subprocess.DEVNULL)
            rx.stdin.write((json.dumps(RECEIVER) + "\n").encode())  # type: ignore[union-attr]
        done = False
        try:
            yield rx
            done = True
        finally:
            if done and rx.poll() is None:
                with self._lock:
                    self._idle.append(rx)
            else:  # out of step or gone: never reused
                with contextlib.suppress(OSError):
                    rx.kill()
                rx.wait()

    def _ask(self, rx: subprocess.Popen, what: str) -> dict:
        line = rx.stdout.readline()  # type: ignore[union-attr]
        if not line:
            code = rx.wait()
            if code == 127:
                raise RemoteError(f"{self.label}: {self.python} not found on the remote: set python = \"...\" "
                                  f"in [cluster.NAME] or transport = \"paramiko\"")
            raise self._lost(what)
        return json.loads(line)

    def put(self, local: str | os.PathLike, path: str, offset: int = 0, callback: Callback | None = None,
            throttle: Callable[[int], None] | None = None) -> int:
        """Bytes [offset, end) of `local` into remote `path` over this thread's receiver:
        the kernel copies the file into the pipe (sendfile), the master reads the pipe."""
        full = self.path(path)
        with self._receiver() as rx, open(local, "rb") as src:
            end = os.fstat(src.fileno()).st_size
            n = max(end - offset, 0)
            try:
                rx.stdin.write((json.dumps({"p": full, "o": offset, "n": n}) + "\n").encode())  # type: ignore
                rx.stdin.flush()  # type: ignore[union-attr]
                pos = offset
                while pos < end:
                    # charge the bytes the pipe took (after the copy: throttle sleeps off what was
                    # charged before), not the ones asked for: sendfile into a pipe moves ~64 KiB a
                    # call, and charging CHUNK (1 MiB) before each gave 1/15 of --bwlimit
                    k = _copy(src.fileno(), rx.stdin.fileno(), pos, min(CHUNK, end - pos))  # type: ignore
                    if throttle:
                        throttle(k)
                    pos += k
                    if callback:
                        callback(k)
            except BrokenPipeError:  # the channel or the master went away: _ask says which
                pass
            ans = self._ask(rx, f"write {full}")
        if "e" in ans:
            raise OSError(ans.get("n") or 0, f"{self.label}: write {full}: {ans['e']}")
        return n

    def sha256_here(self, path: str) -> tuple[str, int]:
        """(sha256, size) of a remote file as it is on disk, hashed by this thread's
        receiver: no channel of its own (sshd allows 10 sessions per connection)."""
        full = self.path(path)
        with self._receiver() as rx:
            try:
                rx.stdin.write((json.dumps({"h": full}) + "\n").encode())  # type: ignore[union-attr]
                rx.stdin.flush()  # type: ignore[union-attr]
            except BrokenPipeError:
                pass
            ans = self._ask(rx, f"sha256 {full}")
        if "e" in ans:
            raise RemoteError(f"{self.label}: cannot hash {full}: {ans['e']}")
        return str(ans["h"]), int(ans["s"])

    @contextlib.contextmanager
    def open_write(self, path: str, offset: int = 0) -> Iterator[BinaryIO]:
        full = self.path(path)
        p = self._writer(full, offset, subprocess.PIPE)
        try:
            yield _Stream(p.stdin, lambda: self._lost(f"write {full}"))  # type: ignore[misc,arg-type]
        except BaseException:
            p.kill()
            p.wait()
            raise
        p.stdin.close()  # type: ignore[union-attr]
        err = p.stderr.read()  # type: ignore[union-attr]
        p.wait()
        self._check_write(p, err, full)

    @contextlib.contextmanager
    def open_read(self, path: str, offset: int = 0) -> Iterator[BinaryIO]:
        full = self.path(path)
        p = self._popen(["sh", "-c", _READ, "sh", full, str(offset + 1)], stdin=subprocess.DEVNULL)
        try:
            yield p.stdout  # type: ignore[misc]
            p.stdout.read()  # type: ignore[union-attr]
        except BaseException:
            p.kill()
            p.wait()
            raise
        err = p.stderr.read()  # type: ignore[union-attr]
        code = p.wait()
        if code != 0:
            text = _decode(err).strip()
            if code == 255 and not self.alive:
                raise self._lost(f"read {full}", text)
            if "No such file" in text:
                raise RemoteError(f"{self.label}: read {full}: no such file or directory")
            raise RemoteError(f"{self.label}: read {full}: {(text.splitlines() or ['exit ' + str(code)])[-1][:200]}")

    # -- lifetime: the master stays (ControlPersist); `transfer disconnect` ends it ----
    def close(self) -> None:
        with self._lock:
            procs = [p for p in (self._fs, *self._idle) if p is not None]
            self._fs, self._idle = None, []
        for p in procs:
            with contextlib.suppress(OSError):
                p.stdin.close()  # type: ignore[union-attr]
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _copy(src: int, dst: int, pos: int, count: int) -> int:
    """Up to `count` bytes of file `src` at `pos` into pipe `dst`: sendfile where the
    kernel can (Linux), else a read and a write."""
    try:
        return os.sendfile(dst, src, pos, count) or _short(pos)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSOCK, errno.EOPNOTSUPP):
            raise
    data = os.pread(src, count, pos)
    if not data:
        _short(pos)
    view = memoryview(data)
    while view:
        view = view[os.write(dst, view):]
    return len(data)


def _short(pos: int) -> int:
    raise OSError(errno.EIO, f"the local file ended at byte {pos} while being sent (changed during the upload?)")


class _Stream:
    """ssh's stdin pipe as a writable file: a broken pipe is a lost connection."""

    def __init__(self, pipe: IO[bytes], lost: Callable[[], RemoteError]):
        self.pipe, self.lost = pipe, lost

    def write(self, data: bytes) -> int:
        try:
            return self.pipe.write(data)
        except BrokenPipeError:
            raise self.lost() from None

    def flush(self) -> None:
        with contextlib.suppress(BrokenPipeError):
            self.pipe.flush()
