"""Keepalives that notice a frozen server (OpenSSH's ServerAliveInterval/CountMax).

paramiko's own `Transport.set_keepalive` sends packets that want no reply, so a
server that stops answering (a hung login node, a suspended sshd, a NAT that
silently dropped the flow) leaves every read waiting forever. Here a daemon
thread sends `keepalive@openssh.com` WITH want-reply every `interval` seconds
(any reply, even "unknown request", proves the server is alive); when no reply
has come for `interval * count_max` seconds the transport is closed, which ends
every blocked read and write with an error, and `stalled` says why.
"""
from __future__ import annotations

import threading
import time
from typing import Any

DEFAULT_INTERVAL = 15.0  # seconds, unless ~/.ssh/config sets ServerAliveInterval
DEFAULT_COUNT_MAX = 3  # OpenSSH's default ServerAliveCountMax


def settings(ssh_config: Any) -> tuple[float, int]:
    """(interval, count_max) from an ssh config dict; interval 0 means off (as in OpenSSH)."""
    cfg = ssh_config or {}
    try:
        interval = float(cfg.get("serveraliveinterval", DEFAULT_INTERVAL))
    except (TypeError, ValueError):
        interval = DEFAULT_INTERVAL
    try:
        count = max(int(cfg.get("serveralivecountmax", DEFAULT_COUNT_MAX)), 1)
    except (TypeError, ValueError):
        count = DEFAULT_COUNT_MAX
    return interval, count


class Watchdog:
    """Probe the server every `interval` s; close `transport` after `interval * count_max` s of silence."""

    def __init__(self, transport: Any, interval: float, count_max: int):
        self.transport = transport
        self.interval = interval
        self.limit = interval * count_max
        self.stalled = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ssh-keepalive", daemon=True)

    def start(self) -> Watchdog:
        if self.interval > 0:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _probe(self, answered: threading.Event) -> None:
        try:
            self.transport.global_request("keepalive@openssh.com", wait=True)
        except Exception:
            return  # the transport is going away: the loop sees that
        if self.transport.is_active():
            answered.set()

    def _run(self) -> None:
        answered: threading.Event | None = None
        since = 0.0
        while not self._stop.wait(self.interval):
            if not self.transport.is_active():
                return
            if answered is None or answered.is_set():
                answered, since = threading.Event(), time.monotonic()
                threading.Thread(target=self._probe, args=(answered,), name="ssh-keepalive-probe",
                                 daemon=True).start()
            elif time.monotonic() - since >= self.limit:
                self.stalled = True
                try:
                    self.transport.close()
                except Exception:
                    pass
                return
