"""`connect(cluster)`: the one place a Remote is made from a `[cluster.NAME]`.

Transport (`transport` in [cluster.NAME]): "openssh" drives the OpenSSH client
over one ControlMaster per cluster (transfer.remote.master: one login, one MFA
prompt, per working day, shared by every command); "paramiko" is one Fabric
connection per command; "auto" (default) is openssh when an `ssh` binary is
installed and no programmatic `prompter` was passed, else paramiko.

Fabric: one `Connection` per command: host may be a ~/.ssh/config alias
(HostName, User, Port, IdentityFile, ProxyJump are honoured by Fabric's ssh
config loading), unknown host keys are refused (see hostkeys), and MFA
prompts go to the terminal (see auth). Connection problems become one-line
`RemoteError`s (exit code 4) that name the host and say what to check; a
[cluster.NAME] that names no host or transport to try is a config error (exit 2).
"""
from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from shardship.config import ClusterConfig
from shardship.errors import RemoteError, ShardshipError
from transfer.remote import (
    SFTP_MAX_PACKET_SIZE,
    SFTP_WINDOW_SIZE,
    LocalRemote,
    OpenSSHRemote,
    Remote,
    SSHRemote,
    local_home,
    ssh_binary,
)
from transfer.remote.master import Master, resolve

if TYPE_CHECKING:
    from transfer.auth import Prompter
else:
    Prompter = Callable[[str, bool], str]

# paramiko / Fabric (~0.3 s of imports) load only when an SSH remote is opened:
# `local:PATH` commands (the demo, the fast tests) never pay for them.

CONNECT_TIMEOUT = 30  # seconds, unless ~/.ssh/config sets ConnectTimeout
BANNER_TIMEOUT = 15  # seconds for the server's SSH banner, unless ~/.ssh/config sets ConnectTimeout

#: AES-GCM first: paramiko then needs no separate HMAC per packet, which is most of
#: its per-byte cost (measured by bench/upload.py: ~1.5x aes128-ctr + hmac-sha2-256).
PREFERRED_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "aes128-ctr", "aes256-ctr")


def fast_transport(sock: Any, **kwargs: Any) -> Any:
    """paramiko Transport with the cheapest strong ciphers preferred (server still agrees)."""
    import paramiko

    t = paramiko.Transport(sock, **kwargs)
    opts = t.get_security_options()
    supported = tuple(opts.ciphers)
    opts.ciphers = tuple(c for c in PREFERRED_CIPHERS if c in supported) + tuple(
        c for c in supported if c not in PREFERRED_CIPHERS)
    return t


def connect(cluster: ClusterConfig, accept_new_host_key: bool = False, *, prompter: Prompter | None = None,
            window_size: int = SFTP_WINDOW_SIZE, max_packet_size: int = SFTP_MAX_PACKET_SIZE) -> Remote:
    """Open the cluster's Remote (use it as a context manager; it closes the connection).

    `cluster.host` is `local:PATH` (a directory standing in for the remote home)
    or an SSH host / ~/.ssh/config alias; `cluster.remote_dir` is relative to the
    home unless absolute and becomes `remote.root`. `prompter(text, echo)` answers
    keyboard-interactive prompts (default: the terminal)."""
    if cluster.is_local:
        return LocalRemote(local_home(cluster.host), cluster.remote_dir, cluster.python)
    if not cluster.host:
        raise ShardshipError(f"[cluster.{cluster.name}] has no host: "  # a config error (exit 2), not a remote one
                             "set host = \"login.example.edu\" (or an ~/.ssh/config alias)")
    if transport(cluster, prompter) == "openssh":
        master = master_for(cluster, accept_new_host_key)
        master.ensure()
        return OpenSSHRemote(master, cluster.remote_dir, cluster.python)
    conn = _open(cluster, accept_new_host_key, prompter)
    label = f"{conn.user}@{cluster.host}"
    try:
        return SSHRemote(conn, cluster.remote_dir, cluster.python, label=label, window_size=window_size,
                         max_packet_size=max_packet_size)
    except BaseException:
        conn.close()
        raise


def transport(cluster: ClusterConfig, prompter: Prompter | None = None) -> str:
    """"openssh" or "paramiko" for this cluster (see the module docstring)."""
    want = (cluster.transport or "auto").lower()
    if want not in ("auto", "openssh", "paramiko"):
        raise ShardshipError(f"[cluster.{cluster.name}] transport = {cluster.transport!r}: "
                             f"use \"auto\", \"openssh\" or \"paramiko\"")
    if want == "openssh" and ssh_binary() is None:
        raise ShardshipError(f"[cluster.{cluster.name}] transport = \"openssh\" but no `ssh` client is installed: "
                             f"install openssh-client or set transport = \"paramiko\"")
    if want == "auto":
        return "openssh" if ssh_binary() is not None and prompter is None else "paramiko"
    return want


def master_for(cluster: ClusterConfig, accept_new_host_key: bool = False) -> Master:
    """The cluster's OpenSSH master (not started): for `transfer connect` / `disconnect`."""
    if cluster.is_local or not cluster.host:
        raise ShardshipError(f"[cluster.{cluster.name}]: host {cluster.host!r} is not an SSH host: nothing to connect")
    return resolve(cluster, accept_new_host_key)


def _open(cluster: ClusterConfig, accept_new: bool, prompter: Prompter | None) -> Any:
    import fabric
    import paramiko

    from transfer import hostkeys
    from transfer.auth import fabric_overrides

    config = fabric.Config(overrides=fabric_overrides(prompter))
    try:
        conn = fabric.Connection(cluster.host, user=cluster.user or None, port=cluster.port or None, config=config,
                                 connect_timeout=None, connect_kwargs={"transport_factory": fast_transport})
    except (ValueError, paramiko.SSHException) as e:
        raise RemoteError(f"[cluster.{cluster.name}] host {cluster.host!r}: {e}") from None
    banner_timeout = conn.connect_timeout or BANNER_TIMEOUT  # ConnectTimeout covers the banner too, as in ssh
    conn.connect_kwargs["banner_timeout"] = banner_timeout
    if conn.connect_timeout is None:
        conn.connect_timeout = CONNECT_TIMEOUT
    _quiet_paramiko_log()
    label = f"{conn.user}@{cluster.host}"
    for hop in hostkeys.hops(conn):
        hostkeys.configure(hop.client, hop.ssh_config, label, accept_new)
    where = f"{conn.user}@{conn.host}:{conn.port}"
    if conn.host != cluster.host:
        where += f" (alias {cluster.host})"
    try:
        conn.open()
    except RemoteError:
        _close_quietly(conn)
        raise
    except paramiko.BadHostKeyException as e:
        _close_quietly(conn)
        raise RemoteError(
            f"{where}: HOST KEY CHANGED: server sent {e.key.get_name()} {hostkeys.fingerprint(e.key)}, "
            f"known_hosts has {hostkeys.fingerprint(e.expected_key)}. Ask the admins whether the key changed; "
            f"if so remove the old entry with `{hostkeys.removal_command(conn, e.hostname)}` and connect again"
        ) from None
    except paramiko.AuthenticationException as e:
        _close_quietly(conn)
        raise RemoteError(
            f"{where}: authentication failed ({_auth_summary(e)}). Check that `ssh {cluster.host}` works; "
            f"keys come from the agent, IdentityFile in ~/.ssh/config, or ~/.ssh/id_*"
        ) from None
    except socket.gaierror as e:
        _close_quietly(conn)
        raise RemoteError(f"{where}: cannot resolve host name ({e.strerror}); check host in shardship.toml "
                          f"or the Host alias in ~/.ssh/config") from None
    except (paramiko.ssh_exception.NoValidConnectionsError, ConnectionError, TimeoutError) as e:
        _close_quietly(conn)
        raise RemoteError(f"{where}: cannot connect ({e}); check the host, port and your network/VPN") from None
    except (paramiko.SSHException, EOFError, OSError) as e:
        banner = _got_banner(conn)
        _close_quietly(conn)
        if not banner:
            raise RemoteError(f"{where}: no SSH banner within {banner_timeout:g} s (not an SSH server, or an "
                              f"overloaded one); check the host and port, or raise ConnectTimeout in "
                              f"~/.ssh/config") from None
        raise RemoteError(f"{where}: SSH connection failed: {e or type(e).__name__}") from None
    return conn


def _quiet_paramiko_log() -> None:
    """paramiko logs failures ("Exception (client): ...", with a traceback) from its own
    thread; with no handler configured Python's last-resort handler prints them to
    stderr before our one-line error. A NullHandler keeps them out (an application
    that configures logging still gets them through propagation)."""
    log = logging.getLogger("paramiko")
    if not any(isinstance(h, logging.NullHandler) for h in log.handlers):
        log.addHandler(logging.NullHandler())


def _got_banner(conn: Any) -> bool:
    """Whether the server sent its SSH identification line before things went wrong."""
    client = getattr(conn, "client", None)
    t = client.get_transport() if client is not None else None
    return bool(t is not None and getattr(t, "remote_version", ""))


def _auth_summary(e: Exception) -> str:
    result = getattr(e, "result", None)
    if not result:
        return str(e) or type(e).__name__
    tried = [str(getattr(r, "source", r)) for r in result]
    return "tried " + ", ".join(tried) if tried else "no key or method accepted"


def _close_quietly(conn: Any) -> None:
    from transfer import hostkeys

    for hop in hostkeys.hops(conn):
        try:
            hop.close()
        except Exception:
            pass
