"""`transfer connect` / `disconnect` and the user's own ControlMaster, against the real sshd
(tests/sshd.py), on both transports (the paramiko one has no master to keep: it says so)."""
from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sshd import SSHD, TRANSPORTS, on_transport
from tests.test_transfer_sshd import cli, sessions_in_log, write_config
from transfer import connect

pytestmark = pytest.mark.sshd


@pytest.fixture(params=TRANSPORTS)
def sshd_home(sshd_home: SSHD, request: pytest.FixtureRequest) -> Iterator[SSHD]:
    """The conftest fixture, on one transport; no master connection left afterwards."""
    yield from on_transport(sshd_home, request.param)


def test_connect_once_then_commands_ride_on_it_until_disconnect(sshd_home: SSHD, tmp_path: Path) -> None:
    s = sshd_home
    cfg = write_config(tmp_path, s)
    p = cli(["connect", "--config", str(cfg)], s)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err.decode()
    if s.transport == "paramiko":
        assert b"paramiko transport" in out
        return
    assert b"connected" in out and b"transfer disconnect" in out
    logins = sessions_in_log(s)[0]
    for _ in range(2):
        p = cli(["quota", "--config", str(cfg)], s)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0 and b"64.0 MB" in out, err.decode()
    assert sessions_in_log(s)[0] == logins  # no login of their own
    p = cli(["disconnect", "--config", str(cfg)], s)
    assert b"disconnected" in p.communicate(timeout=60)[0]
    p = cli(["quota", "--config", str(cfg)], s)
    assert p.wait(timeout=60) == 0 and sessions_in_log(s)[0] == logins + 1


def test_the_users_own_controlmaster_is_reused(sshd_home: SSHD, tmp_path: Path) -> None:
    """~/.ssh/config with ControlMaster/ControlPath, and a master the user opened with `ssh`:
    shardship runs over it (no login), and does not close it on exit."""
    from transfer.connection import master_for

    s = sshd_home
    if s.transport == "paramiko":
        pytest.skip("paramiko cannot use an OpenSSH ControlMaster (the reason for the OpenSSH transport)")
    alias = "shardship-own-cm"
    sock = s.client_home / ".ssh" / "cm-%C"
    block = (f"\nHost {alias}\n  HostName 127.0.0.1\n  Port {s.port}\n  User {s.user}\n  IdentityFile {s.key}\n"
             f"  UserKnownHostsFile {s.known_hosts}\n  ControlMaster auto\n  ControlPath {sock}\n")
    original = s.ssh_config.read_text()
    s.ssh_config.write_text(original + block)
    cluster = s.cluster(host=alias)
    try:
        subprocess.run(["ssh", "-F", str(s.ssh_config), "-M", "-N", "-f", alias], env=s.env(), check=True,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
        logins = sessions_in_log(s)[0]
        m = master_for(cluster)
        assert not m.own_socket and m.alive()
        with connect(cluster) as remote:
            assert remote.run(["whoami"]).stdout.strip() == s.user
        assert sessions_in_log(s)[0] == logins and m.alive()
    finally:
        master_for(cluster).stop()
        s.ssh_config.write_text(original)
