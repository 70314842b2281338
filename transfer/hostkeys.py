"""Host-key checking: unknown keys are refused unless the user opts in.

Fabric's `Connection` defaults to paramiko's AutoAddPolicy (trust on first use,
silently). Uploading a dataset and later running jobs on a host we never
verified is exactly what OpenSSH's StrictHostKeyChecking guards against, so
here the default is paramiko's `RejectPolicy` with a message that shows the
fingerprint (the same `SHA256:...` form OpenSSH prints and clusters publish)
and says how to accept it: `--accept-new-host-key` (OpenSSH's `accept-new`:
an unknown key is saved to known_hosts; a *changed* key is still refused).
"""
from __future__ import annotations

import base64
import hashlib
import os
import shlex
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import paramiko

from shardship.errors import RemoteError
from transfer.remote.master import UnknownHostKey  # one class for both transports

__all__ = ["UnknownHostKey", "fingerprint", "configure", "hops", "removal_command", "append_known_host"]

DEFAULT_USER_KNOWN_HOSTS = "~/.ssh/known_hosts"
GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style SHA256 fingerprint of a public key ("SHA256:base64", no padding)."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def user_known_hosts_files(ssh_config: dict[str, Any] | None) -> list[Path]:
    """The user's known_hosts files: `UserKnownHostsFile` from ~/.ssh/config, else the default."""
    raw = (ssh_config or {}).get("userknownhostsfile")
    names: list[str] = []
    if isinstance(raw, str):
        names = raw.split()
    elif isinstance(raw, (list, tuple)):
        for item in raw:
            names.extend(str(item).split())
    names = [n for n in names if n.lower() != "none"] or [DEFAULT_USER_KNOWN_HOSTS]
    return [Path(os.path.expanduser(n)) for n in names]


def load_host_keys(client: paramiko.SSHClient, ssh_config: dict[str, Any] | None) -> Path:
    """Load global and user known_hosts into `client`; return the file new keys go to."""
    for g in GLOBAL_KNOWN_HOSTS:
        if os.path.isfile(g):
            try:
                client.get_host_keys().load(g)
            except (OSError, paramiko.SSHException):
                pass
    files = user_known_hosts_files(ssh_config)
    for f in files:
        if f.is_file():
            try:
                client.load_system_host_keys(str(f))
            except (OSError, paramiko.SSHException) as e:
                raise RemoteError(f"{f}: cannot read known_hosts: {e}") from None
    return files[0]


class RefuseUnknownHost(paramiko.RejectPolicy):
    """paramiko's RejectPolicy with a message a person can act on."""

    def __init__(self, known_hosts: Path, label: str):
        self.known_hosts = known_hosts
        self.label = label

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise UnknownHostKey(
            f"{self.label}: unknown host key for {hostname}: {key.get_name()} {fingerprint(key)}. "
            f"Compare it with the fingerprint your cluster publishes; if it matches, rerun with "
            f"--accept-new-host-key to save it to {self.known_hosts} (or connect once with `ssh`)."
        )


class AcceptNewHost(paramiko.MissingHostKeyPolicy):
    """OpenSSH `StrictHostKeyChecking accept-new`: save an unknown key, say so."""

    def __init__(self, known_hosts: Path, label: str, stream: Any = None):
        self.known_hosts = known_hosts
        self.label = label
        self.stream = stream

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        append_known_host(self.known_hosts, hostname, key)
        print(
            f"{self.label}: accepted new host key for {hostname}: {key.get_name()} {fingerprint(key)} "
            f"(saved to {self.known_hosts})",
            file=self.stream or sys.stderr,
        )


def append_known_host(path: Path, hostname: str, key: paramiko.PKey) -> None:
    """Append one `host type base64` line, creating ~/.ssh (0700) and the file (0600) if needed."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as f:
        f.write(line)


def configure(client: paramiko.SSHClient, ssh_config: dict[str, Any] | None, label: str,
              accept_new: bool) -> None:
    """Set known_hosts and the missing-key policy on one client (each ProxyJump hop has its own)."""
    known = load_host_keys(client, ssh_config)
    policy: paramiko.MissingHostKeyPolicy = (
        AcceptNewHost(known, label) if accept_new else RefuseUnknownHost(known, label)
    )
    client.set_missing_host_key_policy(policy)


def hops(conn: Any) -> Iterable[Any]:
    """The connection and every ProxyJump gateway Connection behind it."""
    seen = conn
    while seen is not None and not isinstance(seen, (str, bool)):
        yield seen
        seen = getattr(seen, "gateway", None)


def known_hosts_name(hostname: str, port: int | None) -> str:
    """How known_hosts (and `ssh-keygen -R`) names a host: `[host]:port` unless the port is 22."""
    return hostname if port in (None, 22) else f"[{hostname}]:{port}"


def removal_command(conn: Any, hostname: str) -> str:
    """The `ssh-keygen -R NAME -f FILE` that removes `hostname`'s entry, shell-quoted, for the
    hop (of a ProxyJump chain) that connects to it, naming the file the entry is in."""
    hop = next((h for h in hops(conn) if getattr(h, "host", None) == hostname), conn)
    name = known_hosts_name(hostname, getattr(hop, "port", None))
    files = user_known_hosts_files(getattr(hop, "ssh_config", None))
    where = files[0]
    for f in [*files, *map(Path, GLOBAL_KNOWN_HOSTS)]:
        try:
            if f.is_file() and paramiko.HostKeys(str(f)).lookup(name) is not None:
                where = f
                break
        except (OSError, paramiko.SSHException):
            continue
    return f"ssh-keygen -R {shlex.quote(name)} -f {shlex.quote(str(where))}"
