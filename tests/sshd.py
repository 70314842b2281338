"""pytest fixtures: a real OpenSSH `sshd` on 127.0.0.1 for the transfer tests.

Why a real daemon: the bugs that matter (quoting of remote commands, SFTP
resume, a full disk, host-key checks) only show against the real server, so no
paramiko server stubs. The remote user is a NON-ROOT account whose home is a
tmpfs mount with a size limit: that mount *is* the quota, so "over quota" and
"disk full mid-way" are the kernel's ENOSPC, not a simulation.

Needs root (to create the user and mount the tmpfs) and `/usr/sbin/sshd`
(Debian `openssh-server`); otherwise every test using the fixture is skipped
with the reason. Everything started here is stopped by pid at teardown.

Use: `pytest_plugins = ["tests.sshd"]` in conftest, or import the fixtures
(`from tests.sshd import sshd, sshd_home  # noqa: F401`) in a test module.
`start_sshd(...)` is the same server as a context manager (bench/upload.py,
a second server with PAM keyboard-interactive for the MFA tests), and
`make_packed(...)` writes small docs/FORMAT.md-conformant shards + index.json.
"""
from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

QUOTA_BYTES = 64 * 1024 * 1024  # size of the tmpfs home = the test user's quota
ALIAS = "shardship-test"  # Host alias written to the client's ~/.ssh/config
JUMP_ALIAS = "shardship-jump"  # a second alias that reaches ALIAS through ProxyJump


def _sshd_binary() -> str | None:
    return shutil.which("sshd") or (("/usr/sbin/sshd") if os.path.exists("/usr/sbin/sshd") else None)


def skip_reason() -> str | None:
    """Why the real-sshd tests cannot run here, or None when they can."""
    if os.geteuid() != 0:
        return "real sshd tests need root (to create the test user and mount its tmpfs home)"
    if _sshd_binary() is None:
        return "OpenSSH sshd not installed (apt-get install openssh-server)"
    if shutil.which("ssh-keygen") is None:
        return "ssh-keygen not installed (apt-get install openssh-client)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, capture_output=True, text=True)


@dataclass
class SSHD:
    """A running sshd plus everything a client needs to reach it."""

    host: str
    port: int
    user: str
    uid: int
    home: Path  # the remote user's home (tmpfs, QUOTA_BYTES)
    client_home: Path  # use as $HOME for the client: .ssh/config, known_hosts, id_ed25519
    key: Path  # the client's private key
    ssh_config: Path  # for OpenSSH clients: `ssh -F ssh_config ALIAS`
    known_hosts: Path
    host_key_line: str  # "[127.0.0.1]:PORT ssh-ed25519 AAAA..."
    log: Path
    proc: subprocess.Popen
    quota_bytes: int = QUOTA_BYTES
    alias: str = ALIAS
    jump_alias: str = JUMP_ALIAS
    workdir: Path = field(default=Path("/"))
    transport: str = "auto"  # [cluster] transport for cluster() / toml(): tests run both

    def env(self) -> dict[str, str]:
        """Environment for a client subprocess (Fabric reads ~/.ssh through $HOME)."""
        env = dict(os.environ)
        env["HOME"] = str(self.client_home)
        return env

    def cluster(self, remote_dir: str = "shardship", host: str | None = None, **kw):
        """A ClusterConfig for this server (via the ~/.ssh/config alias by default)."""
        from shardship.config import ClusterConfig

        kw.setdefault("transport", self.transport)
        return ClusterConfig(name="test", host=host or self.alias, remote_dir=remote_dir, quota="auto", **kw)

    def toml(self, remote_dir: str = "shardship", name: str = "test", extra: str = "") -> str:
        """A shardship.toml [cluster.NAME] section for this server."""
        return (
            f"[cluster.{name}]\nhost = \"{self.alias}\"\nremote_dir = \"{remote_dir}\"\n"
            f"quota = \"auto\"\ntransport = \"{self.transport}\"\n{extra}"
        )

    def disconnect(self) -> None:
        """Close the OpenSSH masters the client side may have left (ControlPersist), so that
        each test starts without a logged-in connection. Only ever `ssh -O exit`."""
        from transfer.connection import master_for

        old = os.environ.get("HOME")
        os.environ["HOME"] = str(self.client_home)
        try:
            for host in (self.alias, self.jump_alias):
                with contextlib.suppress(Exception):
                    master_for(self.cluster(host=host)).stop()
        finally:
            if old is None:
                os.environ.pop("HOME", None)
            else:
                os.environ["HOME"] = old

    def askpass_env(self, answer: str, asked: Path) -> dict[str, str]:
        """Environment that makes OpenSSH answer its login prompts without a terminal
        (tests only): SSH_ASKPASS is a script that appends each prompt to `asked` and
        prints the answer from the environment (never written to a file)."""
        script = self.workdir / "askpass.sh"
        if not script.exists():
            script.write_text('#!/bin/sh\nprintf \'%s\\n\' "$1" >> "$SHARDSHIP_TEST_ASKED"\n'
                              'printf \'%s\\n\' "$SHARDSHIP_TEST_ANSWER"\n')
            script.chmod(0o700)
        return {"SSH_ASKPASS": str(script), "SSH_ASKPASS_REQUIRE": "force", "SHARDSHIP_TEST_ASKED": str(asked),
                "SHARDSHIP_TEST_ANSWER": answer}

    def wipe_home(self) -> None:
        """Empty the remote home (as root) so each test starts from a clean quota."""
        for p in self.home.iterdir():
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()

    def used_bytes(self) -> int:
        st = os.statvfs(self.home)
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    def fill(self, nbytes: int, name: str = ".filler") -> Path:
        """Occupy `nbytes` of the quota with a file owned by the test user."""
        p = self.home / name
        with open(p, "wb") as f:
            f.write(b"\0" * nbytes)
        os.chown(p, self.uid, -1)
        return p

    def without_known_host(self) -> None:
        """Forget the server's host key on the client side."""
        self.known_hosts.write_text("")

    def restore_known_host(self) -> None:
        self.known_hosts.write_text(self.host_key_line + "\n")

    def user_pids(self) -> list[int]:
        """Processes running as the test user (its sshd sessions, sftp-servers)."""
        pids = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    if d.stat().st_uid == self.uid:
                        pids.append(int(d.name))
                except FileNotFoundError:
                    pass
        return pids


def _write_config(d: Path, port: int, user: str, host_key: Path, authorized: Path, pid: Path,
                  overrides: dict[str, str] | None = None) -> Path:
    """sshd_config; `overrides` come first (sshd keeps the first value it reads)."""
    cfg = d / "sshd_config"
    cfg.write_text(
        "\n".join(
            [f"{k} {v}" for k, v in (overrides or {}).items()] + [
                f"Port {port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {host_key}",
                f"PidFile {pid}",
                f"AuthorizedKeysFile {authorized}",
                f"AllowUsers {user}",
                "UsePAM no",
                "StrictModes no",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PubkeyAuthentication yes",
                "PermitRootLogin no",
                "AllowTcpForwarding yes",  # ProxyJump tests hop through this same server
                "MaxStartups 50",
                "MaxSessions 20",
                "Subsystem sftp internal-sftp",
                "LogLevel VERBOSE",
                "",
            ]
        )
    )
    return cfg


def _wait_for_banner(port: int, proc: subprocess.Popen, log: Path, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited with {proc.returncode}: {log.read_text() if log.exists() else ''}")
        with contextlib.suppress(OSError):
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                if s.recv(64).startswith(b"SSH-"):
                    return
        time.sleep(0.05)
    raise RuntimeError(f"sshd did not answer on 127.0.0.1:{port} within {timeout}s")


@contextlib.contextmanager
def start_sshd(quota_bytes: int = QUOTA_BYTES, overrides: dict[str, str] | None = None,
               password: str | None = None) -> Iterator[SSHD]:
    """Create the user, mount its tmpfs home, generate keys, run sshd; undo it all after.
    `overrides`: sshd_config lines that win over the defaults; `password`: give the user one
    (for keyboard-interactive via PAM), never printed."""
    reason = skip_reason()
    if reason:
        raise RuntimeError(reason)
    work = Path(tempfile.mkdtemp(prefix="shardship-sshd-"))
    work.chmod(0o755)  # the test user must traverse to its home
    user = f"sst{os.getpid() % 100000}{secrets.token_hex(2)}"
    home = work / "home"
    home.mkdir()
    mounted = created = False
    proc: subprocess.Popen | None = None
    try:
        _run("useradd", "-M", "-d", str(home), "-s", "/bin/sh", user)
        created = True
        _run("usermod", "-p", "*", user)  # '!' (locked) is refused by sshd with UsePAM no
        if password is not None:
            subprocess.run(["chpasswd"], input=f"{user}:{password}\n", text=True, check=True, capture_output=True)
        pw = pwd.getpwnam(user)
        _run("mount", "-t", "tmpfs", "-o", f"size={quota_bytes},mode=0755,uid={pw.pw_uid},gid={pw.pw_gid}",
             "tmpfs", str(home))
        mounted = True

        srv = work / "server"
        srv.mkdir()
        host_key = srv / "host_ed25519"
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "shardship-test-host", "-f", str(host_key))
        client_home = work / "client"
        ssh_dir = client_home / ".ssh"
        ssh_dir.mkdir(parents=True)
        ssh_dir.chmod(0o700)
        key = ssh_dir / "id_ed25519"
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "shardship-test-client", "-f", str(key))
        authorized = srv / "authorized_keys"
        authorized.write_text(Path(f"{key}.pub").read_text())
        authorized.chmod(0o644)

        port = _free_port()
        pid_file = srv / "sshd.pid"
        cfg = _write_config(srv, port, user, host_key, authorized, pid_file, overrides)
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # privilege-separation dir
        log = srv / "sshd.log"
        proc = subprocess.Popen([_sshd_binary(), "-D", "-f", str(cfg), "-E", str(log)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_for_banner(port, proc, log)

        host_pub = Path(f"{host_key}.pub").read_text().split()
        host_line = f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}"
        known_hosts = ssh_dir / "known_hosts"
        known_hosts.write_text(host_line + "\n")
        ssh_config = ssh_dir / "config"
        ssh_config.write_text(
            f"Host {ALIAS}\n  HostName 127.0.0.1\n  Port {port}\n  User {user}\n  IdentityFile {key}\n"
            f"  UserKnownHostsFile {known_hosts}\n  StrictHostKeyChecking yes\n  BatchMode yes\n\n"
            f"Host {JUMP_ALIAS}\n  HostName 127.0.0.1\n  Port {port}\n  User {user}\n  IdentityFile {key}\n"
            f"  ProxyJump {ALIAS}\n  UserKnownHostsFile {known_hosts}\n  StrictHostKeyChecking yes\n"
            f"  BatchMode yes\n"
        )
        yield SSHD(host="127.0.0.1", port=port, user=user, uid=pw.pw_uid, home=home, client_home=client_home,
                   key=key, ssh_config=ssh_config, known_hosts=known_hosts, host_key_line=host_line, log=log,
                   proc=proc, quota_bytes=quota_bytes, workdir=work)
    finally:
        if created:
            # Session processes of the test user outlive the listener: end them by pid first,
            # while the listener is still there to reap their privileged monitors.
            with contextlib.suppress(KeyError):
                uid = pwd.getpwnam(user).pw_uid
                for d in Path("/proc").iterdir():
                    if d.name.isdigit():
                        with contextlib.suppress(OSError):
                            if d.stat().st_uid == uid:
                                os.kill(int(d.name), signal.SIGKILL)
            time.sleep(0.1)
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if mounted:
            if subprocess.run(["umount", str(home)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(home)], capture_output=True)
        if created:
            subprocess.run(["userdel", user], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="session")
def sshd() -> Iterator[SSHD]:
    """One real sshd for the whole test session (skipped without root / sshd)."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    with start_sshd() as server:
        yield server
        server.disconnect()


@pytest.fixture
def sshd_home(sshd: SSHD, monkeypatch: pytest.MonkeyPatch) -> Iterator[SSHD]:
    """The session sshd with an empty remote home and $HOME pointing at its client side."""
    sshd.wipe_home()
    sshd.restore_known_host()
    monkeypatch.setenv("HOME", str(sshd.client_home))
    yield sshd
    sshd.wipe_home()


TRANSPORTS = ("openssh", "paramiko")


def on_transport(s: SSHD, transport: str) -> Iterator[SSHD]:
    """`s` with [cluster] transport set for the test, and no master connection left
    afterwards. A module runs every test on both transports with:

        @pytest.fixture(params=TRANSPORTS)
        def sshd_home(sshd_home: SSHD, request: pytest.FixtureRequest) -> Iterator[SSHD]:
            yield from on_transport(sshd_home, request.param)
    """
    s.transport = transport
    yield s
    s.disconnect()
    s.transport = "auto"


# ---------------------------------------------------------------------------
# packed test data: small WebDataset tars + a docs/FORMAT.md index.json
# (built here so transfer tests do not depend on the packer's code)
# ---------------------------------------------------------------------------


def _tar_bytes(session: str, frames: int, frame_bytes: int, rng, extra: list | None = None) -> tuple[bytes, list]:
    """A ustar shard `<session>/<frame:06d>.jpg|.json` and its FORMAT.md sample rows."""
    import io
    import json
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(frames):
            for ext, data in (("jpg", rng.bytes(frame_bytes)),
                              ("json", json.dumps({"session": session, "frame": i, "timestamp": i / 60}).encode())):
                ti = tarfile.TarInfo(f"{session}/{i:06d}.{ext}")
                ti.size, ti.mtime, ti.mode = len(data), 1767225600, 0o644
                tf.addfile(ti, io.BytesIO(data))
        for ti, data in extra or []:
            tf.addfile(ti, io.BytesIO(data) if data is not None else None)
    raw = buf.getvalue()
    rows = []
    with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
        members = tf.getmembers()
        for a, b in zip(members[0::2], members[1::2]):
            if a.name.endswith(".jpg") and b.name.endswith(".json"):
                rows.append([a.name[:-4], a.offset_data, a.size, b.offset_data, b.size, 0])
    return raw, rows


def make_packed(out: Path, shards: dict[str, int] | None = None, *, frame_bytes: int = 64 * 1024, seed: int = 0,
                compress: bool = False, keep_tar: bool = True, extra_members: dict[str, list] | None = None) -> dict:
    """Write shards + index.json into `out`. `shards`: {shard name: frames}. With
    `compress`, each shard also gets a `.tar.zst` (and the index a `compressed` entry);
    `keep_tar=False` then leaves only the `.tar.zst` locally. Returns the index."""
    import hashlib
    import json
    import zlib

    import numpy as np

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    shards = shards or {"session_a-0a1b2c-0000.tar": 16, "session_a-0a1b2c-0001.tar": 16,
                        "session_b-3d4e5f-0000.tar": 8}
    entries, sessions = [], {}
    for name, frames in shards.items():
        session = name.split("-")[0]
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])  # a shard's bytes depend on it alone
        raw, rows = _tar_bytes(session, frames, frame_bytes, rng, (extra_members or {}).get(name))
        entry = {"name": name, "bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest(), "session": session,
                 "samples": rows, "compressed": None}
        if compress:
            import zstandard

            z = zstandard.ZstdCompressor(level=3).compress(raw)
            (out / f"{name}.zst").write_bytes(z)
            entry["compressed"] = {"name": f"{name}.zst", "bytes": len(z), "sha256": hashlib.sha256(z).hexdigest()}
        if keep_tar or not compress:
            (out / name).write_bytes(raw)
        entries.append(entry)
        s = sessions.setdefault(session, {"fingerprint": hashlib.sha256(session.encode()).hexdigest(), "frames": 0,
                                          "samples": 0, "raw_bytes": 0, "packed_bytes": 0, "shards": [],
                                          "intrinsics": None, "pose_metric": False, "calibration": None,
                                          "warnings": []})
        s["frames"] += frames
        s["samples"] += len(rows)
        s["packed_bytes"] += len(raw)
        s["shards"].append(name)
    index = {
        "format": "shardship-index", "version": 1, "created": "2026-01-01T00:00:00Z", "tool": "shardship 0.1.0",
        "pil": "test", "options": {"size": 224, "crop": "squash", "quality": 90, "stride": 1,
                                   "shard_bytes": 8 << 20, "horizon": 16, "compress": "zstd" if compress else "none"},
        "sample_fields": ["key", "jpg_offset", "jpg_size", "json_offset", "json_size", "has_action"],
        "shards": entries, "sessions": sessions, "failed": {}, "joints": [], "action_dim": 9, "horizon": 16,
        "stats": {}, "totals": {"samples": sum(len(e["samples"]) for e in entries), "raw_bytes": 0,
                                "packed_bytes": sum(e["bytes"] for e in entries)},
    }
    (out / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    return index
