"""One OpenSSH ControlMaster per cluster: the login (and its MFA prompts) happens once.

A cluster that asks for Duo on every login would ask once per command if each
command opened its own connection. OpenSSH's connection sharing solves that:
a master process (`ssh -M -N -f`) logs in once, prompting on the terminal as
`ssh` always does, and stays for ControlPersist; every later `ssh` to the same
ControlPath runs as a new channel of that connection, with no login at all.

`resolve()` reads the effective client config once (`ssh -G`) to pick:
- the ControlPath: the user's own when ~/.ssh/config sets one (so a master the
  user opened by hand is reused, and ours serves their `ssh` too), else
  shardship's own socket under the user's config dir;
- ControlPersist from the config, else a working day (DEFAULT_PERSIST);
- ONE configuration for both transports: Fabric reads ~/.ssh through $HOME,
  OpenSSH through the passwd entry; when they differ, `-F $HOME/.ssh/config`
  and UserKnownHostsFile under $HOME are passed explicitly.
Host keys: StrictHostKeyChecking is always given on the command line, `yes`,
or `accept-new` only when the user opted in; never `no`.
Every command is an argv list: nothing goes through a local shell.
"""
from __future__ import annotations

import hashlib
import os
import pwd
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from shardship.config import ClusterConfig
from shardship.errors import RemoteError

DEFAULT_PERSIST = "8h"  # a working day: one MFA prompt in the morning
#: AES-GCM ahead of OpenSSH's default chacha20-poly1305 when the user set no Ciphers: with
#: AES instructions (x86 AES-NI, ARMv8) it costs ~20% less CPU per byte on both ends
#: (bench/upload.py measures on a 2-core loopback, where that CPU is the limit); same as
#: the paramiko path's PREFERRED_CIPHERS.
FAST_CIPHERS = "^aes128-gcm@openssh.com,aes256-gcm@openssh.com"
DEFAULT_ALIVE = ("15", "3")  # ServerAliveInterval/CountMax when the config sets none (as the Fabric path)
CONNECT_TIMEOUT = 15  # seconds for TCP connect + SSH banner unless ~/.ssh/config sets ConnectTimeout (as Fabric)


class UnknownHostKey(RemoteError):
    """The server's key is not in known_hosts (and the user did not opt in)."""


def ssh_binary() -> str | None:
    """The OpenSSH client, or None (then the Fabric transport is the fallback)."""
    return shutil.which("ssh")


def _config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "shardship" / "ssh"


def _passwd_home() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:
        return os.path.expanduser("~")


def config_file_args() -> list[str]:
    """`-F FILE` when $HOME is not the passwd home (tests, sudo -E): OpenSSH would read
    the passwd home's ~/.ssh/config, Fabric $HOME's. Otherwise nothing, so that OpenSSH
    also reads /etc/ssh/ssh_config exactly as the user's own `ssh` does."""
    home = os.path.expanduser("~")
    if os.path.realpath(home) == os.path.realpath(_passwd_home()):
        return []
    cfg = os.path.join(home, ".ssh", "config")
    return ["-F", cfg if os.path.isfile(cfg) else "/dev/null"]


@dataclass
class Master:
    """How to reach one cluster through its master connection."""

    host: str  # as given in shardship.toml (an ~/.ssh/config alias is fine)
    user: str
    hostname: str
    port: int
    control_path: str
    persist: str
    known_hosts: list[str]
    accept_new: bool = False
    own_socket: bool = True  # False: the user's ControlPath from ~/.ssh/config
    base: list[str] = field(default_factory=list)  # ssh + options shared by every call
    login_opts: list[str] = field(default_factory=list)  # only for the master's own login
    log: str = ""  # the master's own log (ssh -E): why it went away, e.g. unanswered keepalives
    alive_interval: float = float(DEFAULT_ALIVE[0])  # ServerAliveInterval the master uses
    alive_count: int = int(DEFAULT_ALIVE[1])
    connect_timeout: float = CONNECT_TIMEOUT

    @property
    def label(self) -> str:
        return f"{self.user}@{self.host}"

    @property
    def where(self) -> str:
        w = f"{self.user}@{self.hostname}:{self.port}"
        return w if self.hostname == self.host else f"{w} (alias {self.host})"

    def argv(self, command: str | None = None, *opts: str) -> list[str]:
        """ssh over the master as a client: no login of its own, never a prompt."""
        # ProxyCommand=false: with the master gone, ssh would silently log in on its own
        # (a new MFA prompt, or a failure, per command); this makes it fail instead
        out = [*self.base, "-o", "ControlMaster=no", "-o", "BatchMode=yes", "-o", "ProxyCommand=false", "-T",
               *opts, self.host]
        return out + (["--", command] if command is not None else [])

    def control(self, op: str) -> subprocess.CompletedProcess:
        """`ssh -O check|exit`: ask the master process (local; never touches the network)."""
        return subprocess.run([*self.base, "-O", op, self.host], stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=30)

    def alive(self) -> bool:
        return self.control("check").returncode == 0

    def start(self) -> None:
        """Log in once (prompts on the terminal) and leave the master running for `persist`.
        Raises RemoteError with one line saying what failed and what to do."""
        Path(self.control_path).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        Path(self.log).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        Path(self.log).write_bytes(b"")
        argv = [*self.base, "-o", "ControlMaster=yes", "-o", f"ControlPersist={self.persist}",
                "-o", "BatchMode=no", *self.login_opts, "-E", self.log, "-N", "-f", self.host]
        # stdout/stderr must not be pipes: the master keeps them after forking to the background
        with tempfile.TemporaryFile() as err:
            try:
                rc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                    timeout=600).returncode
            except subprocess.TimeoutExpired:
                raise RemoteError(f"{self.where}: login did not finish within 10 minutes; rerun") from None
            err.seek(0)
            text = err.read().decode("utf-8", "replace") + "\n" + self._log_text()
        if rc != 0:
            raise self.error(text)
        added = re.search(r"Permanently added '([^']+)' \(([^)]+)\)", text)
        if added:
            print(f"{self.label}: accepted new host key for {added.group(1)}: {added.group(2)} "
                  f"{self._fingerprint() or ''} (saved to {self.known_hosts[0]})",
                  file=_stderr())

    def _log_text(self) -> str:
        try:
            with open(self.log, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - 65536))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def stalled(self) -> str | None:
        """The one-line error when the master ended because keepalives went unanswered."""
        if "not responding" not in self._log_text():
            return None
        i, c = self.alive_interval, self.alive_count
        return (f"connection to {self.label} stalled (no answer to keepalives for {i * c:g} s: "
                f"ServerAliveInterval {i:g} x ServerAliveCountMax {c}); rerun to resume")

    def ensure(self) -> bool:
        """A live master: reuse one (True), or start it now (False: this call logged in)."""
        if self.alive():
            return True
        self.start()
        return False

    def stop(self) -> bool:
        """`ssh -O exit`; False when no master was running."""
        return self.control("exit").returncode == 0

    # -- messages -----------------------------------------------------------
    def _fingerprint(self) -> str | None:
        """SHA256 fingerprint of the server's host key, from a connection that stops at the
        host-key check (never authenticates): for the refusal message only."""
        res = subprocess.run([*self.base, "-v", "-o", "ControlMaster=no", "-o", "ControlPath=none", "-o",
                              "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o",
                              "UserKnownHostsFile=/dev/null", "-o", "GlobalKnownHostsFile=/dev/null", "-N", self.host],
                             stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        m = re.search(r"Server host key: (\S+) (SHA256:\S+)", res.stderr)
        return f"{m.group(1)} {m.group(2)}" if m else None

    def error(self, stderr: str) -> RemoteError:
        """OpenSSH's stderr after a failed login -> the one-line error to raise."""
        msg = self.explain(stderr)
        return UnknownHostKey(msg) if "unknown host key" in msg else RemoteError(msg)

    def explain(self, stderr: str) -> str:
        """OpenSSH's stderr after a failed login -> one line: host, what failed, what to do."""
        last = [ln.strip() for ln in stderr.replace("\r", "").splitlines() if ln.strip()]
        tail = last[-1] if last else "no message"
        name = self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"
        if "REMOTE HOST IDENTIFICATION HAS CHANGED" in stderr or "has changed and you have requested" in stderr:
            sent = re.search(r"(SHA256:\S+)", stderr)
            where = re.search(r"Offending \S+ key in (\S+?):\d+", stderr)
            f = where.group(1) if where else self.known_hosts[0]
            return (f"{self.where}: HOST KEY CHANGED: server sent {sent.group(1) if sent else 'another key'}. "
                    f"Ask the admins whether the key changed; if so remove the old entry with "
                    f"`ssh-keygen -R {_q(name)} -f {_q(f)}` and connect again")
        if "Host key verification failed" in stderr:
            fp = self._fingerprint() or "(fingerprint unavailable)"
            return (f"{self.label}: unknown host key for {name}: {fp}. Compare it with the fingerprint your "
                    f"cluster publishes; if it matches, rerun with --accept-new-host-key to save it to "
                    f"{self.known_hosts[0]} (or connect once with `ssh`).")
        asks = re.search(r"Permission denied \(([^)]*(keyboard-interactive|password)[^)]*)\)", stderr)
        if "read_passphrase" in stderr or "can't open /dev/tty" in stderr or (asks and not can_prompt()):
            return (f"{self.where}: the server asks for interactive login (password / Duo) but there is no "
                    f"terminal: run `transfer connect` in a terminal first (the login then lasts "
                    f"{self.persist}), or use a key that needs no prompt")
        if "Permission denied" in stderr:
            return (f"{self.where}: authentication failed ({tail}). Check that `ssh {self.host}` works; keys come "
                    f"from the agent, IdentityFile in ~/.ssh/config, or ~/.ssh/id_*")
        if "Could not resolve hostname" in stderr:
            return (f"{self.where}: cannot resolve host name; check host in shardship.toml or the Host alias in "
                    f"~/.ssh/config")
        if "banner exchange" in stderr or "kex_exchange_identification" in stderr:
            return (f"{self.where}: no SSH banner within {self.connect_timeout:g} s (not an SSH server, or an "
                    f"overloaded one); check the host and port, or raise ConnectTimeout in ~/.ssh/config")
        if "connect to host" in stderr:
            return f"{self.where}: cannot connect ({tail}); check the host, port and your network/VPN"
        return f"{self.where}: SSH connection failed: {tail}"


def can_prompt() -> bool:
    """Whether ssh can ask a person: a controlling terminal, or SSH_ASKPASS in force."""
    if os.environ.get("SSH_ASKPASS") and (os.environ.get("SSH_ASKPASS_REQUIRE") in ("force", "prefer")
                                          or os.environ.get("DISPLAY")):
        return True
    try:
        os.close(os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY))
    except OSError:
        return False
    return True


def _q(s: str) -> str:
    import shlex

    return shlex.quote(s)


def _stderr():  # noqa: ANN202 (a text stream)
    import sys

    return sys.stderr


def _effective(cluster: ClusterConfig, extra: list[str]) -> dict[str, list[str]]:
    """`ssh -G`: the client configuration OpenSSH will use for this host (no network)."""
    argv = ["ssh", *extra, "-o", "BatchMode=no", "-G", cluster.host]  # as the master runs (BatchMode
    # yes would also set ServerAliveInterval 300 in what -G prints)
    try:
        res = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    except OSError as e:
        raise RemoteError(f"[cluster.{cluster.name}]: cannot run ssh ({e}); set transport = \"paramiko\"") from None
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["no message"])[-1]
        raise RemoteError(f"[cluster.{cluster.name}] host {cluster.host!r}: ssh config: {last}")
    out: dict[str, list[str]] = {}
    for line in res.stdout.splitlines():
        key, _, value = line.partition(" ")
        out.setdefault(key.lower(), []).append(value)
    return out


def _known_hosts(values: list[str]) -> list[str]:
    """UserKnownHostsFile as Fabric sees it: `ssh -G` expands ~ with the passwd home, Fabric with $HOME."""
    pw, home = _passwd_home().rstrip("/"), os.path.expanduser("~").rstrip("/")
    files = [p for v in values for p in v.split() if p.lower() != "none"]
    return [home + p[len(pw):] if pw != home and p.startswith(pw + "/") else p for p in files] or \
        [os.path.join(home, ".ssh", "known_hosts")]


def resolve(cluster: ClusterConfig, accept_new: bool = False) -> Master:
    """The Master for `cluster` (nothing is started): ControlPath, ControlPersist, host keys."""
    extra = config_file_args()
    if cluster.user:
        extra += ["-l", cluster.user]
    if cluster.port:
        extra += ["-p", str(cluster.port)]
    cfg = _effective(cluster, extra)

    def one(key: str, default: str = "") -> str:
        return (cfg.get(key) or [default])[0]

    user, hostname, port = one("user"), one("hostname", cluster.host), int(one("port", "22") or 22)
    theirs = one("controlpath", "none")
    own = theirs.lower() == "none"
    if own:
        key = f"{cluster.host}\0{user}\0{hostname}\0{port}".encode()
        path = str(_config_dir() / f"cm-{hashlib.sha256(key).hexdigest()[:16]}")
    else:
        path = theirs
    persist = one("controlpersist", "no")
    if persist.lower() in ("no", "false", ""):
        persist = DEFAULT_PERSIST
    elif persist.lower() in ("yes", "true"):
        persist = "yes"
    known = _known_hosts(cfg.get("userknownhostsfile", []))
    base = ["ssh", *extra, "-o", f"ControlPath={path}", "-o", f"UserKnownHostsFile={' '.join(known)}",
            "-o", f"StrictHostKeyChecking={'accept-new' if accept_new else 'yes'}"]
    interval, count = float(one("serveraliveinterval", "0") or 0), int(one("serveralivecountmax", "3") or 3)
    if interval == 0:
        interval, count = float(DEFAULT_ALIVE[0]), int(DEFAULT_ALIVE[1])
        base += ["-o", f"ServerAliveInterval={DEFAULT_ALIVE[0]}", "-o", f"ServerAliveCountMax={DEFAULT_ALIVE[1]}"]
    timeout = one("connecttimeout", "none")
    if not timeout.isdigit() or timeout == "0":
        timeout = str(CONNECT_TIMEOUT)
        base += ["-o", f"ConnectTimeout={timeout}"]
    login = ["-o", f"Ciphers={FAST_CIPHERS}"] if one("ciphers").startswith("chacha20-poly1305") else []
    log = str(_config_dir() / f"master-{hashlib.sha256(path.encode()).hexdigest()[:16]}.log")
    return Master(cluster.host, user, hostname, port, path, persist, known, accept_new, own, base, login, log,
                  interval, count, float(timeout))
