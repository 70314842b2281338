"""Where the shards go: one interface, two implementations.

`Remote` is the small set of operations upload, pull, quota and the job
submitter need. `SSHRemote` does them over ONE Fabric `Connection` (one MFA
prompt per command, one SFTP session reused for every file); `LocalRemote`
does them on a local directory (`local:PATH`), so the demo and the fast tests
run the same upload code without SSH.

Paths given to a Remote are relative to `root` (the cluster's `remote_dir`)
unless absolute. Commands are argv lists; `SSHRemote` quotes every argument
with `shlex.quote` (the remote side always runs them through a shell),
`LocalRemote` runs them with no shell at all.

Typical use (also for submitting jobs over the same connection):

    with transfer.connect(cluster) as remote:
        remote.write_file("jobs/train.sbatch", script.encode())
        res = remote.run(["sbatch", "jobs/train.sbatch"], cwd=".")
        res.check("sbatch")            # raises RemoteError with stderr on failure
        print(res.stdout)
"""
from __future__ import annotations

import abc
import contextlib
import functools
import io
import os
import posixpath
import shlex
import socket
import stat as stat_mod
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Iterator, Sequence

from shardship.errors import RemoteError

#: Read/write block for streaming files; SFTP splits it into 32 KiB requests.
CHUNK = 1024 * 1024

#: paramiko channel window / max packet for the SFTP session (what we *receive*:
#: matters for pull). Upload speed is bounded by the server's window (OpenSSH:
#: 2 MiB) and by how many write requests are in flight (pipelined SFTP).
SFTP_WINDOW_SIZE = 64 * 1024 * 1024
SFTP_MAX_PACKET_SIZE = 32 * 1024
#: Data per SFTP write request. The protocol promises 32 KiB; OpenSSH's sftp-server
#: takes up to 255 KiB (its limits@openssh.com max-write-length), and fewer, larger
#: requests cut paramiko's per-request Python overhead (bench/upload.py).
SFTP_WRITE_DEFAULT = 32 * 1024
SFTP_WRITE_OPENSSH = 252 * 1024

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

    def check(self, what: str | None = None) -> "RunResult":
        """Raise RemoteError (one line: host, command, exit code, last stderr line) unless ok."""
        if self.returncode != 0:
            last = (self.stderr.strip().splitlines() or self.stdout.strip().splitlines() or [""])[-1]
            name = what or self.argv[0]
            raise RemoteError(f"{self.where}: `{name}` failed with exit code {self.returncode}: {last[:300]}")
        return self


@dataclass(frozen=True)
class FileStat:
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


def _decode(b: bytes) -> str:
    return b.decode("utf-8", "replace")


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
        st = self.stat(path)
        return None if st is None else st.size

    def exists(self, path: str) -> bool:
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

    # -- hashing and space ---------------------------------------------------
    def sha256(self, path: str) -> str:
        """sha256 of a remote file, computed on the remote (no bytes come back)."""
        return self.sha256_many([path])[self.path(path)]

    def sha256_many(self, paths: Sequence[str]) -> dict[str, str]:
        from transfer.hashing import remote_sha256

        return remote_sha256(self, [self.path(p) for p in paths])

    def quota(self, path: str | None = None):
        """Live quota and usage for `path` (default root): see transfer.quota.live_quota."""
        from transfer.quota import live_quota

        return live_quota(self, path or self.root)

    def free(self, path: str | None = None) -> int | None:
        """Bytes that may still be written under `path` (quota and filesystem), None if unknown."""
        q = self.quota(path)
        return None if q is None else q.headroom_bytes

    # -- lifetime ------------------------------------------------------------
    def close(self) -> None:  # noqa: B027 (optional)
        """Release the connection (idempotent)."""

    def __enter__(self) -> "Remote":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.label}:{self.root}>"


# ---------------------------------------------------------------------------
# local:PATH
# ---------------------------------------------------------------------------


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
            where = self.home
            while not os.path.isdir(where) and where != os.path.dirname(where):
                where = os.path.dirname(where)
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
        where = self.home
        while not os.path.isdir(where) and where != os.path.dirname(where):
            where = os.path.dirname(where)
        try:
            p = subprocess.Popen(args, cwd=where, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL)
        except FileNotFoundError:
            return _DeadProcess()
        return _LocalProcess(p)

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


# ---------------------------------------------------------------------------
# SSH via Fabric
# ---------------------------------------------------------------------------


def _lost_connection_is_remote_error(fn: Callable) -> Callable:
    """SFTP calls on a dropped connection raise paramiko/EOF/socket errors: make them
    the one-line RemoteError (exit 4) the CLIs print, saying a rerun resumes."""

    @functools.wraps(fn)
    def wrapper(self: "SSHRemote", *args: Any, **kwargs: Any) -> Any:
        import paramiko

        try:
            return fn(self, *args, **kwargs)
        except (paramiko.SSHException, EOFError) as e:
            raise RemoteError(f"{self.label}: connection lost ({e or type(e).__name__}); rerun to resume") from None
        except OSError as e:
            if self.alive:
                raise
            raise RemoteError(f"{self.label}: connection lost ({e}); rerun to resume") from None

    return wrapper


class SSHRemote(Remote):
    """One Fabric `Connection` (already open) + one lazily opened SFTP session."""

    def __init__(self, conn: Any, remote_dir: str = "shardship", python: str = "python3", label: str | None = None,
                 window_size: int = SFTP_WINDOW_SIZE, max_packet_size: int = SFTP_MAX_PACKET_SIZE):
        self.conn = conn
        self.python = python
        self.window_size = window_size
        self.max_packet_size = max_packet_size
        self.label = label or f"{conn.user}@{conn.original_host}"
        self._sftp: Any = None
        self._lock = threading.Lock()
        version = str(getattr(self.transport, "remote_version", "") or "")
        self.write_request_size = SFTP_WRITE_OPENSSH if "OpenSSH" in version else SFTP_WRITE_DEFAULT
        self.home = self.sftp.normalize(".")
        self.root = posixpath.normpath(posixpath.join(self.home, remote_dir))

    @property
    def transport(self) -> Any:
        return self.conn.client.get_transport()

    @property
    def alive(self) -> bool:
        """Whether the SSH connection is still up."""
        t = self.transport
        return bool(t is not None and t.is_active())

    @property
    def sftp(self) -> Any:
        """The one SFTP session of this connection (opened on first use)."""
        if self._sftp is None:
            import paramiko

            try:
                self._sftp = paramiko.SFTPClient.from_transport(
                    self.transport, window_size=self.window_size, max_packet_size=self.max_packet_size
                )
            except (paramiko.SSHException, EOFError, OSError) as e:
                raise RemoteError(f"{self.label}: cannot open an SFTP session ({e}); is sftp enabled on the server?") \
                    from None
            if self._sftp is None:
                raise RemoteError(f"{self.label}: the server refused the SFTP subsystem")
        return self._sftp

    # -- commands ------------------------------------------------------------
    def command_line(self, argv: Sequence[str], cwd: str | None = None) -> str:
        """The exact string sent to the remote shell: every argument shlex-quoted."""
        args = [str(a) for a in argv]
        if args and args[0] == "python3":
            args[0] = self.python
        line = shlex.join(args)
        if cwd is not None:
            line = f"cd {shlex.quote(self.path(cwd))} && {line}"  # absolute: never starts with "-"
        return line

    def run(self, argv: Sequence[str], *, cwd: str | None = None, stdin: bytes | None = None,
            timeout: float | None = None) -> RunResult:
        import paramiko

        line = self.command_line(argv, cwd)
        try:
            chan = self.transport.open_session()
        except (paramiko.SSHException, EOFError, OSError, AttributeError) as e:
            raise RemoteError(f"{self.label}: connection lost ({e or type(e).__name__}); rerun the command") from None
        try:
            if timeout is not None:
                chan.settimeout(timeout)
            chan.exec_command(line)
            err_buf = io.BytesIO()

            def read_err() -> None:
                with contextlib.suppress(Exception):
                    while True:
                        b = chan.recv_stderr(65536)
                        if not b:
                            break
                        err_buf.write(b)

            t_err = threading.Thread(target=read_err, daemon=True)
            t_err.start()
            if stdin:
                t_in = threading.Thread(target=lambda: (chan.sendall(stdin), chan.shutdown_write()), daemon=True)
                t_in.start()
            else:
                chan.shutdown_write()
            out = io.BytesIO()
            while True:
                b = chan.recv(65536)
                if not b:
                    break
                out.write(b)
            code = chan.recv_exit_status()
            t_err.join(timeout=30)
        except socket.timeout:
            raise RemoteError(f"{self.label}: `{argv[0]}` did not finish within {timeout}s") from None
        except (paramiko.SSHException, EOFError, OSError) as e:
            raise RemoteError(f"{self.label}: connection lost during `{argv[0]}` ({e}); rerun the command") from None
        finally:
            chan.close()
        return RunResult(tuple(str(a) for a in argv), code, _decode(out.getvalue()), _decode(err_buf.getvalue()),
                         self.label)

    def start(self, argv: Sequence[str]) -> Process:
        import paramiko

        try:
            chan = self.transport.open_session()
            chan.exec_command(self.command_line(argv))
        except (paramiko.SSHException, EOFError, OSError, AttributeError) as e:
            raise RemoteError(f"{self.label}: connection lost ({e or type(e).__name__}); rerun the command") from None
        return _ChannelProcess(chan)

    # -- files ---------------------------------------------------------------
    def _errors(self, what: str, path: str) -> contextlib.AbstractContextManager:
        return _sftp_errors(self.label, what, path)

    @_lost_connection_is_remote_error
    def stat(self, path: str) -> FileStat | None:
        full = self.path(path)
        try:
            st = self.sftp.stat(full)
        except FileNotFoundError:
            return None
        except OSError as e:
            if getattr(e, "errno", None) == 2:
                return None
            raise RemoteError(f"{self.label}: stat {full}: {e}") from None
        return FileStat(st.st_size or 0, float(st.st_mtime or 0), stat_mod.S_ISDIR(st.st_mode or 0))

    @_lost_connection_is_remote_error
    def listdir(self, path: str = "") -> dict[str, FileStat]:
        full = self.path(path)
        try:
            attrs = self.sftp.listdir_attr(full)
        except FileNotFoundError:
            return {}
        except OSError as e:
            if getattr(e, "errno", None) == 2:
                return {}
            raise RemoteError(f"{self.label}: list {full}: {e}") from None
        return {a.filename: FileStat(a.st_size or 0, float(a.st_mtime or 0), stat_mod.S_ISDIR(a.st_mode or 0))
                for a in attrs}

    @contextlib.contextmanager
    def open_write(self, path: str, offset: int = 0) -> Iterator[BinaryIO]:
        import paramiko

        full = self.path(path)
        with self._errors("write", full):
            f = self.sftp.open(full, "r+b" if offset else "wb")
        try:
            f.set_pipelined(True)  # don't wait for each write's ack
            f.MAX_REQUEST_SIZE = self.write_request_size  # per file object, not paramiko-wide
            if offset:
                f.truncate(offset)
                f.seek(offset)
            try:
                yield f
            except (paramiko.SSHException, EOFError) as e:
                raise RemoteError(f"{self.label}: connection lost while writing {full} ({e or type(e).__name__}); "
                                  f"rerun to resume") from None
            with self._errors("write", full):
                f.flush()
                _drain_write_acks(f)
                # Every write is acked, so the bytes are in the file: send CLOSE without
                # waiting for its reply (the next request on this session reads and drops
                # it). One round trip less per shard; callers verify size and sha256.
                f._close(async_=True)
        finally:
            with contextlib.suppress(Exception):
                f.close()

    @contextlib.contextmanager
    def open_read(self, path: str, offset: int = 0) -> Iterator[BinaryIO]:
        import paramiko

        full = self.path(path)
        with self._errors("read", full):
            f = self.sftp.open(full, "rb")
        try:
            with self._errors("read", full):
                size = f.stat().st_size
                if offset:
                    f.seek(offset)
                if size and size > offset:
                    f.prefetch(size)  # many read requests in flight
            try:
                yield f
            except (paramiko.SSHException, EOFError) as e:
                raise RemoteError(f"{self.label}: connection lost while reading {full} ({e or type(e).__name__}); "
                                  f"rerun to resume") from None
        finally:
            with contextlib.suppress(Exception):
                f.close()

    @_lost_connection_is_remote_error
    def rename(self, src: str, dst: str) -> None:
        s, d = self.path(src), self.path(dst)
        try:
            self.sftp.posix_rename(s, d)  # posix-rename@openssh.com: atomic replace
            return
        except OSError as e:
            err: Exception = e
        except Exception as e:  # server without the extension
            err = e
        res = self.run(["mv", "-f", "--", s, d])
        if not res.ok:
            raise RemoteError(f"{self.label}: rename {s} -> {d}: {err}; mv: {res.stderr.strip()[:200]}")

    @_lost_connection_is_remote_error
    def remove(self, path: str, missing_ok: bool = True) -> None:
        full = self.path(path)
        try:
            self.sftp.remove(full)
        except FileNotFoundError:
            if not missing_ok:
                raise RemoteError(f"{self.label}: {full} does not exist") from None
        except OSError as e:
            if getattr(e, "errno", None) == 2 and missing_ok:
                return
            raise RemoteError(f"{self.label}: remove {full}: {e}") from None

    @_lost_connection_is_remote_error
    def mkdir(self, path: str = "", parents: bool = True) -> None:
        full = self.path(path)
        st = self.stat(full)
        if st is not None:
            if not st.is_dir:
                raise RemoteError(f"{self.label}: {full} exists and is not a directory")
            return
        if parents:
            parent = posixpath.dirname(full)
            if parent and parent != full:
                self.mkdir(parent, parents=True)
        try:
            self.sftp.mkdir(full)
        except OSError as e:
            if self.stat(full) is None:  # lost a race with ourselves is fine
                raise RemoteError(f"{self.label}: mkdir {full}: {e}") from None

    def close(self) -> None:
        with self._lock:
            if self._sftp is not None:
                with contextlib.suppress(Exception):
                    self._sftp.close()
                self._sftp = None
            with contextlib.suppress(Exception):
                self.conn.close()


class _LocalProcess(Process):
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


class _DeadProcess(Process):
    """A command that could not start (exit 127, like a shell)."""

    def write(self, data: bytes) -> None:
        pass

    def readline(self) -> bytes:
        return b""

    def close(self) -> int:
        return 127


class _ChannelProcess(Process):
    def __init__(self, chan: Any):
        self.chan = chan
        self.buf = b""

    def write(self, data: bytes) -> None:
        try:
            self.chan.sendall(data)
        except OSError:
            pass  # closed by the other side: readline() will say so

    def readline(self) -> bytes:
        while b"\n" not in self.buf:
            chunk = self.chan.recv(65536)
            if not chunk:
                out, self.buf = self.buf, b""
                return out
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line + b"\n"

    def close(self) -> int:
        with contextlib.suppress(Exception):
            self.chan.shutdown_write()
        try:
            return self.chan.recv_exit_status()
        finally:
            self.chan.close()


def _drain_write_acks(f: Any) -> None:
    """Wait for every pipelined write's ack and raise the first error (ENOSPC, EDQUOT...).

    paramiko registers pipelined writes without their file object, so `close()`
    neither waits for those acks nor sees their errors: a full disk would pass
    silently. The pending request ids are in the file's `_reqs` deque."""
    reqs = getattr(f, "_reqs", None)
    first: BaseException | None = None
    while reqs:
        try:
            f.sftp._read_response(reqs.popleft())
        except OSError as e:  # keep draining: the later acks are on the wire too
            first = first or e
    if first is not None:
        raise first


@contextlib.contextmanager
def _sftp_errors(label: str, what: str, path: str) -> Iterator[None]:
    import paramiko

    try:
        yield
    except FileNotFoundError:
        raise RemoteError(f"{label}: {what} {path}: no such file or directory") from None
    except PermissionError:
        raise RemoteError(f"{label}: {what} {path}: permission denied") from None
    except (paramiko.SSHException, EOFError) as e:
        raise RemoteError(f"{label}: connection lost during {what} {path} ({e}); rerun to resume") from None


def local_home(host: str) -> str:
    """PATH of a `local:PATH` host."""
    return host[len("local:"):] or "."
