"""SSH backend: every Remote operation over ONE Fabric `Connection`.

One connection means one MFA prompt per command; one SFTP session (opened on
first use) is reused for every file. Commands run on channels of the same
connection, each argument `shlex.quote`d because the remote side always runs
them through the login shell.

Most of the code here is SFTP tuning, measured with bench/upload.py: a large
receive window, pipelined writes with OpenSSH-sized requests, acks drained
once per file instead of per write, and CLOSE sent without waiting. Errors of a
dropped connection become one-line RemoteErrors (exit 4) saying a rerun resumes.

Typical use (also for submitting jobs over the same connection):

    with transfer.connect(cluster) as remote:
        remote.write_file("jobs/train.sbatch", script.encode())
        res = remote.run(["sbatch", "jobs/train.sbatch"], cwd=".")
        res.check("sbatch")            # raises RemoteError with stderr on failure
        print(res.stdout)
"""
from __future__ import annotations

import contextlib
import functools
import io
import posixpath
import stat as stat_mod
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, BinaryIO

from shardship.errors import RemoteError
from transfer.remote.base import FileStat, Process, Remote, RunResult, _decode, shell_line
from transfer.remote.keepalive import Watchdog, settings

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


def _lost_connection_is_remote_error(fn: Callable) -> Callable:
    """SFTP calls on a dropped connection raise paramiko/EOF/socket errors: make them
    the one-line RemoteError (exit 4) the CLIs print, saying a rerun resumes."""

    @functools.wraps(fn)
    def wrapper(self: SSHRemote, *args: Any, **kwargs: Any) -> Any:
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
        self.watchdog = Watchdog(self.transport, *settings(getattr(conn, "ssh_config", None))).start()
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
        return shell_line(argv, self.python, None if cwd is None else self.path(cwd))

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
        except TimeoutError:
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

    @property
    def stalled(self) -> bool:
        """The keepalives went unanswered and the connection was closed (transfer.remote.keepalive)."""
        return self.watchdog.stalled

    def __exit__(self, *exc: Any) -> None:
        self.close()
        if isinstance(exc[1], Exception) and self.stalled:  # whatever failed, failed because of that
            w = self.watchdog
            raise RemoteError(f"connection to {self.label} stalled (no answer to keepalives for {w.limit:g} s: "
                              f"ServerAliveInterval {w.interval:g} x ServerAliveCountMax "
                              f"{w.limit / w.interval:g}); rerun to resume") from None

    def close(self) -> None:
        self.watchdog.stop()
        with self._lock:
            if self._sftp is not None:
                with contextlib.suppress(Exception):
                    self._sftp.close()
                self._sftp = None
            with contextlib.suppress(Exception):
                self.conn.close()


class _ChannelProcess(Process):
    """A command on its own channel of the connection, behind the Process interface:
    stdout arrives in packets, so lines are reassembled here."""

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
    """paramiko's exceptions for a missing file, a refused one or a dropped connection
    -> one-line RemoteErrors naming the host, the operation and the path."""
    import paramiko

    try:
        yield
    except FileNotFoundError:
        raise RemoteError(f"{label}: {what} {path}: no such file or directory") from None
    except PermissionError:
        raise RemoteError(f"{label}: {what} {path}: permission denied") from None
    except (paramiko.SSHException, EOFError) as e:
        raise RemoteError(f"{label}: connection lost during {what} {path} ({e}); rerun to resume") from None

