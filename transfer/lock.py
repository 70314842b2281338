"""One upload at a time per remote_dir: a lock next to the shards.

The lock is a symbolic link `REMOTE/.shardship-upload.lock` whose target text
is its holder, {"host", "pid", "since"}: `ln -s` creates it atomically and
fails when it exists, and `readlink` reads who holds it, so there is never a
lock without its owner (an O_EXCL file would be empty for a moment). Released
at the end of the upload (only if it is still ours). A lock left by a killed
upload from THIS host (its pid is gone) is stale and taken over; one from
another host is reported with what to do, exit code 4.
"""
from __future__ import annotations

import json
import os
import shlex
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from shardship.errors import RemoteError
from transfer.remote import Remote

LOCK = ".shardship-upload.lock"

_ACQUIRE = 'if ln -s -- "$1" "$2" 2>/dev/null; then echo; else readlink -- "$2" || echo "?"; fi\n'
_RELEASE = 'if [ "$(readlink -- "$2" 2>/dev/null)" = "$1" ]; then rm -f -- "$2"; fi\n'


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    since: float

    @classmethod
    def me(cls) -> Holder:
        return cls(socket.gethostname(), os.getpid(), time.time())

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        try:
            obj = json.loads(text)
            return cls(str(obj["host"]), int(obj["pid"]), float(obj["since"]))
        except (ValueError, KeyError, TypeError):
            return None

    def text(self) -> str:
        return json.dumps({"host": self.host, "pid": self.pid, "since": int(self.since)}, separators=(",", ":"))

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"host {self.host}, pid {self.pid}, since {when}"

    def dead_here(self) -> bool:
        """Its process was on this host and is gone, or is this very process (an earlier upload
        here lost its connection before releasing): the lock is stale."""
        if self.host != socket.gethostname():
            return False
        if self.pid == os.getpid():
            return True
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


class UploadLock:
    """acquire() (idempotent) / release(); `say` tells about a stale lock taken over."""

    def __init__(self, remote: Remote, say: Callable[[str], None]):
        self.remote = remote
        self.say = say
        self.me = Holder.me()
        self.held = False

    @property
    def path(self) -> str:
        return self.remote.path(LOCK)

    def _try(self) -> str:
        """"" when acquired, else the current holder's text."""
        res = self.remote.sh(_ACQUIRE, self.me.text(), self.path)
        if not res.ok:
            res.check("ln -s (upload lock)")
        return res.stdout.strip()

    def acquire(self) -> None:
        if self.held:
            return
        other = self._try()
        holder = Holder.parse(other)
        if other and holder is not None and holder.dead_here():
            self.remote.sh(_RELEASE, other, self.path)  # only if it is still that stale one
            self.say(f"{self.remote.label}: removed a stale upload lock of pid {holder.pid} "
                     f"(no upload running as that pid on this host)")
            other = self._try()
            holder = Holder.parse(other)
        if other:
            who = holder.describe() if holder is not None else f"holder {other[:80]!r}"
            raise RemoteError(f"{self.remote.label}: another upload ({who}) holds {self.path}; wait for it to "
                              f"finish, or remove it if that upload is dead (`rm {shlex.quote(self.path)}` on "
                              f"the cluster) and rerun")
        self.held = True

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        try:
            self.remote.sh(_RELEASE, self.me.text(), self.path)
        except (RemoteError, OSError):
            pass  # connection gone: a rerun from this host takes the stale lock over
