"""transfer against a real OpenSSH sshd on 127.0.0.1 (tests/sshd.py), on both transports.

The remote user is non-root and its home is a 64 MiB tmpfs: over-quota and
disk-full are the kernel's, host keys and quoting are OpenSSH's. Every test
runs twice: over the OpenSSH client's ControlMaster and over Fabric/paramiko
(the `transport` fixture). Skipped with the reason when not root or sshd is
missing. The MFA (keyboard-interactive) tests are in test_transfer_mfa.py.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardship.errors import QuotaError, RemoteError
from tests.sshd import SSHD, TRANSPORTS, make_packed, on_transport  # noqa: F401 (fixtures come from conftest)
from transfer import connect, hashing
from transfer.hostkeys import UnknownHostKey
from transfer.pull import pull
from transfer.quota import free, live_quota
from transfer.upload import DiskFullError, UnsafeShardError, upload

pytestmark = pytest.mark.sshd
ROOT = Path(__file__).resolve().parents[1]
MiB = 1024**2


@pytest.fixture(params=TRANSPORTS)
def sshd_home(sshd_home: SSHD, request: pytest.FixtureRequest) -> Iterator[SSHD]:
    """The conftest fixture, on one transport; no master connection left afterwards."""
    yield from on_transport(sshd_home, request.param)


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def assert_mirrored(index: dict, remote_dir: Path, packed: Path, uid: int) -> None:
    for s in index["shards"]:
        f = remote_dir / s["name"]
        assert sha(f) == s["sha256"], s["name"]
        assert f.stat().st_uid == uid  # written by the test user, not by root
    assert (remote_dir / "index.json").read_bytes() == (packed / "index.json").read_bytes()
    assert not [p.name for p in remote_dir.iterdir() if p.name.endswith((".part", ".tmp", ".zst"))]


def write_config(tmp_path: Path, s: SSHD, remote_dir: str = "shardship") -> Path:
    cfg = tmp_path / "shardship.toml"
    cfg.write_text(s.toml(remote_dir))
    return cfg


def cli(args: list[str], s: SSHD, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "transfer", *args], cwd=ROOT, env=s.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def sessions_in_log(s: SSHD) -> tuple[int, int]:
    text = s.log.read_text()
    return text.count("Accepted publickey"), text.count("subsystem 'sftp'")


def test_fresh_upload_verified_then_rerun_sends_nothing(sshd_home: SSHD, tmp_path: Path) -> None:
    s = sshd_home
    out = tmp_path / "packed"
    index = make_packed(out)
    with connect(s.cluster()) as remote:
        first = upload(remote, out, progress=False)
        assert first.bytes_sent == sum(x["bytes"] for x in index["shards"]) and first.index_written
        assert_mirrored(index, s.home / "shardship", out, s.uid)
        second = upload(remote, out, progress=False)
    assert second.bytes_sent == 0 and second.outcomes == [] and not second.index_written


def test_cli_upload_uses_one_connection_and_one_sftp_session(sshd_home: SSHD, tmp_path: Path) -> None:
    s = sshd_home
    out = tmp_path / "packed"
    index = make_packed(out)
    cfg = write_config(tmp_path, s)
    logins, sftps = sessions_in_log(s)
    p = cli(["upload", "--config", str(cfg), "--out", str(out), "--no-progress"], s)
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 0, stderr.decode()
    assert b"3 shards sent and verified" in stdout
    # OpenSSH sends the bytes on channels of its one master, without the SFTP subsystem
    assert sessions_in_log(s) == (logins + 1, sftps + (s.transport == "paramiko"))
    assert_mirrored(index, s.home / "shardship", out, s.uid)


def test_sigkill_mid_shard_then_rerun_completes(sshd_home: SSHD, tmp_path: Path) -> None:
    s = sshd_home
    out = tmp_path / "packed"
    index = make_packed(out, {"big-000000-0000.tar": 64, "small-000000-0000.tar": 4}, frame_bytes=128 * 1024)
    big = index["shards"][0]
    cfg = write_config(tmp_path, s)
    part = s.home / "shardship" / "big-000000-0000.tar.part"
    p = cli(["upload", "--config", str(cfg), "--out", str(out), "--bwlimit", "3M", "--no-progress"], s)
    try:
        deadline = time.monotonic() + 60
        while not (part.exists() and part.stat().st_size >= 2 * MiB):
            assert p.poll() is None, p.stderr.read().decode()
            assert time.monotonic() < deadline, "upload did not start"
            time.sleep(0.02)
        p.send_signal(signal.SIGKILL)
    finally:
        p.wait(timeout=30)
    assert p.returncode == -signal.SIGKILL
    time.sleep(0.2)  # let sftp-server finish the writes it already received
    left = part.stat().st_size
    assert 0 < left < big["bytes"]
    assert not (s.home / "shardship" / "index.json").exists()

    with connect(s.cluster()) as remote:
        res = upload(remote, out, progress=False)
    o = res.outcomes[0]
    assert o.name == big["name"] and o.resumed_from == left and not o.restarted
    assert o.sent == big["bytes"] - left
    assert_mirrored(index, s.home / "shardship", out, s.uid)


def test_corrupted_remote_part_detected(sshd_home: SSHD, tmp_path: Path) -> None:
    s = sshd_home
    out = tmp_path / "packed"
    index = make_packed(out)
    first = index["shards"][0]
    d = s.home / "shardship"
    d.mkdir()
    os.chown(d, s.uid, -1)
    data = bytearray((out / first["name"]).read_bytes()[:500_000])
    data[12345] ^= 0x01
    part = d / (first["name"] + ".part")
    part.write_bytes(bytes(data))
    os.chown(part, s.uid, -1)
    events: list[str] = []
    with connect(s.cluster()) as remote:
        res = upload(remote, out, progress=False, on_event=lambda k, **kw: events.append(k), log=lambda m: None)
    assert "corrupt_part" in events
    assert res.outcomes[0].restarted and res.outcomes[0].sent == first["bytes"]
    assert_mirrored(index, d, out, s.uid)


def test_content_that_never_verifies_is_retried_once_then_removed(sshd_home: SSHD, tmp_path: Path) -> None:
    s = sshd_home
    out = tmp_path / "packed"
    index = make_packed(out)
    bad = out / index["shards"][1]["name"]
    raw = bytearray(bad.read_bytes())
    raw[-2000] ^= 0xFF  # local file no longer matches its index entry (same size)
    bad.write_bytes(bytes(raw))
    events: list[tuple] = []
    with connect(s.cluster()) as remote:
        with pytest.raises(RemoteError) as e:
            upload(remote, out, progress=False, log=lambda m: None,
                   on_event=lambda k, **kw: events.append((k, kw.get("attempt"))))
    assert "twice" in str(e.value) and e.value.code == 4
    assert [a for k, a in events if k == "verify_mismatch"] == [1, 2]
    names = {p.name for p in (s.home / "shardship").iterdir()}
    assert index["shards"][0]["name"] in names  # verified before: kept
    assert not any(n.startswith(index["shards"][1]["name"]) for n in names) and "index.json" not in names


def test_over_quota_refused_with_nothing_written(sshd_home: SSHD, tmp_path: Path) -> None:
    s = sshd_home
    s.fill(40 * MiB)
    before = sorted(p.name for p in s.home.iterdir())
    used = s.used_bytes()
    out = tmp_path / "packed"
    make_packed(out, {f"s-000000-000{i}.tar": 60 for i in range(4)}, frame_bytes=100_000)  # ~24 MB
    with connect(s.cluster()) as remote:
        with pytest.raises(QuotaError) as e:
            upload(remote, out, progress=False)
    assert e.value.code == 3
    assert "Nothing was sent" in str(e.value) and "64.0 MB" in str(e.value)
    assert sorted(p.name for p in s.home.iterdir()) == before and s.used_bytes() == used

    cfg = write_config(tmp_path, s)
    p = cli(["upload", "--config", str(cfg), "--out", str(out)], s)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 3 and err.startswith(b"error: ") and b"Traceback" not in err
    assert sorted(p.name for p in s.home.iterdir()) == before


def test_disk_full_midway_keeps_verified_shards(sshd_home: SSHD, tmp_path: Path) -> None:
    s = sshd_home
    out = tmp_path / "packed"
    index = make_packed(out, {f"s-000000-000{i}.tar": 60 for i in range(3)}, frame_bytes=100_000)
    names = [x["name"] for x in index["shards"]]

    def another_writer_fills_the_disk(kind: str, **kw) -> None:
        if kind == "shard_done" and kw["name"] == names[0]:
            free = os.statvfs(s.home).f_bavail * os.statvfs(s.home).f_frsize
            s.fill(free - 3 * MiB)  # e.g. a job writing checkpoints meanwhile

    with connect(s.cluster()) as remote:  # one stream: which shard meets the full disk is then known
        with pytest.raises(DiskFullError) as e:
            upload(remote, out, progress=False, margin=0, on_event=another_writer_fills_the_disk, streams=1)
    msg = str(e.value)
    assert e.value.code == 1
    # the shard being sent when the disk filled up (shards are hashed one behind the sends)
    failed = next(n for n in names if f"disk full while sending {n}" in msg)
    k = names.index(failed)
    assert k >= 1 and f"kept {k} verified shards" in msg
    assert f"{len(names) - k} shards" in msg and "not sent" in msg and "index.json not updated" in msg
    d = s.home / "shardship"
    assert sorted(p.name for p in d.iterdir()) == sorted(names[:k] + [".shardship-state.json"])  # no .part left
    for x in index["shards"][:k]:
        assert sha(d / x["name"]) == x["sha256"]

    (s.home / ".filler").unlink()
    with connect(s.cluster()) as remote:
        res = upload(remote, out, progress=False, margin=0)
    assert [o.name for o in res.outcomes] == names[k:]
    assert res.bytes_sent == sum(x["bytes"] for x in index["shards"][k:])
    assert_mirrored(index, d, out, s.uid)


def test_disk_full_with_shards_in_flight_leaves_no_part(sshd_home: SSHD, tmp_path: Path) -> None:
    """Several shards being written at once (OpenSSH: one channel each) when the disk fills:
    every partial file goes, the verified ones stay, index.json is untouched; a rerun finishes."""
    s = sshd_home
    out = tmp_path / "packed"
    index = make_packed(out, {f"s-000000-000{i}.tar": 60 for i in range(4)}, frame_bytes=100_000)

    def fill_after_the_plan(kind: str, **kw) -> None:
        if kind == "plan":
            st = os.statvfs(s.home)
            s.fill(st.f_bavail * st.f_frsize - 10 * MiB)

    with connect(s.cluster()) as remote:
        with pytest.raises(DiskFullError) as e:
            upload(remote, out, progress=False, margin=0, on_event=fill_after_the_plan, log=lambda m: None)
    assert e.value.code == 1 and "index.json not updated" in str(e.value)
    d = s.home / "shardship"
    left = sorted(p.name for p in d.iterdir())
    assert not [n for n in left if n.endswith((".part", ".tmp"))] and "index.json" not in left
    for x in index["shards"]:
        if x["name"] in left:
            assert sha(d / x["name"]) == x["sha256"]
    (s.home / ".filler").unlink()
    with connect(s.cluster()) as remote:
        upload(remote, out, progress=False, margin=0)
    assert_mirrored(index, d, out, s.uid)


def _host_fingerprint(s: SSHD) -> str:
    pub = s.workdir / "server" / "host_ed25519.pub"
    return subprocess.run(["ssh-keygen", "-l", "-f", str(pub)], capture_output=True, text=True,
                          check=True).stdout.split()[1]


def test_unknown_host_key_refused_then_accepted(sshd_home: SSHD, tmp_path: Path) -> None:
    s = sshd_home
    s.without_known_host()
    logins, _ = sessions_in_log(s)
    with pytest.raises(UnknownHostKey) as e:
        connect(s.cluster())
    msg = str(e.value)
    assert e.value.code == 4 and _host_fingerprint(s) in msg and "--accept-new-host-key" in msg
    assert sessions_in_log(s)[0] == logins  # refused before authenticating
    assert s.known_hosts.read_text() == ""

    cfg = write_config(tmp_path, s)
    p = cli(["quota", "--config", str(cfg)], s)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 4 and b"unknown host key" in err and b"Traceback" not in err

    p = cli(["quota", "--config", str(cfg), "--accept-new-host-key"], s)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err.decode()
    assert b"accepted new host key" in err and b"64.0 MB" in out
    assert f"[127.0.0.1]:{s.port} ssh-ed25519" in s.known_hosts.read_text()
    with connect(s.cluster()) as remote:  # now known: no flag needed
        assert remote.run(["true"]).ok


def test_changed_host_key_refused_even_with_accept_new(sshd_home: SSHD, tmp_path: Path) -> None:
    s = sshd_home
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    kind, b64 = Path(f"{other}.pub").read_text().split()[:2]
    s.known_hosts.write_text(f"[127.0.0.1]:{s.port} {kind} {b64}\n")
    with pytest.raises(RemoteError) as e:
        connect(s.cluster(), accept_new_host_key=True)
    assert "HOST KEY CHANGED" in str(e.value) and "ssh-keygen -R" in str(e.value)


def test_names_with_shell_metacharacters_cannot_inject(sshd_home: SSHD, tmp_path: Path) -> None:
    s = sshd_home
    remote_dir = "data; touch INJ1 $(touch INJ2) `touch INJ3` && touch INJ4"
    shard = "session 2026; touch INJ5 $(touch INJ6)`touch INJ7`-0000.tar"
    out = tmp_path / "packed"
    index = make_packed(out, {shard: 4}, compress=True, keep_tar=True)
    with connect(s.cluster(remote_dir)) as remote:
        assert remote.run(["echo", "$(id)", ";", "`id`", "&&", "a b"]).stdout == "$(id) ; `id` && a b\n"
        res = upload(remote, out, progress=False)
        assert res.outcomes[0].done
        assert hashing.sha256(remote, shard) == index["shards"][0]["sha256"]
        assert live_quota(remote) is not None
    d = s.home / remote_dir
    assert sha(d / shard) == index["shards"][0]["sha256"]
    injected = [p for p in s.home.rglob("*") if p.name.startswith("INJ")]
    assert injected == [], injected
    assert not list(Path("/tmp").glob("INJ*")) and not list(ROOT.glob("INJ*"))


def test_tar_with_dotdot_members_refused_on_unpack(sshd_home: SSHD, tmp_path: Path) -> None:
    import tarfile

    s = sshd_home
    evil = tarfile.TarInfo("../../escape.sh")
    evil.size = 5
    out = tmp_path / "packed"
    make_packed(out, {"ok-000000-0000.tar": 2, "bad-000000-0000.tar": 2}, compress=True, keep_tar=False,
                frame_bytes=4096, extra_members={"bad-000000-0000.tar": [(evil, b"echo!")]})
    # the cluster's python3 decodes with the zstd CLI when it lacks the zstandard module
    cluster = s.cluster() if shutil.which("zstd") else s.cluster(python=sys.executable)
    with connect(cluster) as remote:
        with pytest.raises(UnsafeShardError) as e:
            upload(remote, out, progress=False)
    assert "../../escape.sh" in str(e.value) and "refused to unpack" in str(e.value)
    d = s.home / "shardship"
    names = sorted(p.name for p in d.iterdir())
    assert "ok-000000-0000.tar" in names and not any(n.startswith("bad-") for n in names)
    assert not any(p.name == "escape.sh" for p in s.workdir.rglob("escape.sh"))


def test_zst_upload_unpacked_on_the_cluster(sshd_home: SSHD, tmp_path: Path) -> None:
    s = sshd_home
    out = tmp_path / "packed"
    index = make_packed(out, compress=True, keep_tar=False)
    cluster = s.cluster() if shutil.which("zstd") else s.cluster(python=sys.executable)
    with connect(cluster) as remote:
        res = upload(remote, out, progress=False)
    assert res.bytes_sent == sum(x["compressed"]["bytes"] for x in index["shards"])
    assert_mirrored(index, s.home / "shardship", out, s.uid)


def test_proxyjump_alias_goes_through_the_jump_host(sshd_home: SSHD, tmp_path: Path) -> None:
    s = sshd_home
    logins, _ = sessions_in_log(s)
    with connect(s.cluster(host=s.jump_alias)) as remote:
        if s.transport == "paramiko":
            gw = remote.conn.gateway
            assert gw is not None and gw.is_connected  # the hop is a real SSH connection
        assert remote.run(["whoami"]).stdout.strip() == s.user
    assert sessions_in_log(s)[0] == logins + 2  # jump host + target


def test_live_quota_is_the_tmpfs(sshd_home: SSHD) -> None:
    s = sshd_home
    s.fill(10 * MiB)
    with connect(s.cluster()) as remote:
        q = live_quota(remote)
    assert q.source == "df -P" and q.limit_bytes == s.quota_bytes
    assert abs(q.used_bytes - s.used_bytes()) < MiB and q.headroom_bytes <= s.quota_bytes - 10 * MiB
    with connect(s.cluster()) as remote:
        assert abs(free(remote) - (s.quota_bytes - s.used_bytes())) < MiB


def test_pull_back_with_resume(sshd_home: SSHD, tmp_path: Path) -> None:
    s = sshd_home
    out = tmp_path / "packed"
    index = make_packed(out)
    name = index["shards"][0]["name"]
    dest = tmp_path / "back"
    dest.mkdir()
    (dest / (name + ".part")).write_bytes((out / name).read_bytes()[:200_000])
    with connect(s.cluster()) as remote:
        upload(remote, out, progress=False)
        got = pull(remote, [name, "index.json"], dest, progress=False)
    assert got[0].resumed_from == 200_000 and not got[0].retried
    assert sha(dest / name) == index["shards"][0]["sha256"]
    assert (dest / "index.json").read_bytes() == (out / "index.json").read_bytes()


def test_dropped_connection_mid_shard_then_rerun_resumes(sshd_home: SSHD, tmp_path: Path) -> None:
    import threading

    s = sshd_home
    out = tmp_path / "packed"
    index = make_packed(out, {"big-000000-0000.tar": 64, "small-000000-0000.tar": 4}, frame_bytes=128 * 1024)
    big = index["shards"][0]
    part = s.home / "shardship" / "big-000000-0000.tar.part"
    killed: list[int] = []

    def drop_the_connection() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if part.exists() and part.stat().st_size >= 2 * MiB:
                for pid in s.user_pids():  # the test user's sshd session + sftp-server, by pid
                    try:
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
                    except ProcessLookupError:
                        pass
                return
            time.sleep(0.01)

    t = threading.Thread(target=drop_the_connection)
    t.start()
    try:
        with connect(s.cluster()) as remote:
            with pytest.raises(RemoteError) as e:
                upload(remote, out, progress=False, bwlimit=3 * MiB)
    finally:
        t.join()
    assert killed
    assert e.value.code == 4 and "connection lost" in str(e.value) and "rerun" in str(e.value)
    time.sleep(0.2)
    left = part.stat().st_size
    assert 0 < left < big["bytes"]

    with connect(s.cluster()) as remote:
        res = upload(remote, out, progress=False)
    assert res.outcomes[0].name == big["name"] and res.outcomes[0].resumed_from == left
    assert_mirrored(index, s.home / "shardship", out, s.uid)


def test_bwlimit_achieved_rate_is_the_limit(sshd_home: SSHD, tmp_path: Path) -> None:
    """--bwlimit is the achieved rate, not 1/15 of it (issue 21.5: the OpenSSH transport charged
    the throttle 1 MiB before each sendfile into a pipe that takes ~64 KiB a call). The band
    is generous (0.5x - 1.3x over 6 MiB): it catches a throttle off by a factor, not jitter."""
    s = sshd_home
    out = tmp_path / "packed"
    index = make_packed(out, {"a-000000-0000.tar": 48, "b-000000-0000.tar": 48})  # 2 x 3 MiB
    total = sum(x["bytes"] for x in index["shards"])
    cfg = write_config(tmp_path, s)
    limit = 2 * MiB
    t0 = time.monotonic()
    p = cli(["upload", "--config", str(cfg), "--out", str(out), "--bwlimit", "2M", "--no-progress"], s, text=True)
    stdout, stderr = p.communicate(timeout=120)
    wall = time.monotonic() - t0
    assert p.returncode == 0, stderr
    assert "2 shards sent and verified" in stdout, stdout
    # the summary's own rate (bytes over the sending time) and the wall clock's (an upper bound
    # on the time, so a lower bound on the rate: connecting and verifying are in it too)
    said = float(re.search(r"([\d.]+) MB/s", stdout).group(1)) * 1e6  # type: ignore[union-attr]
    assert 0.5 * limit <= said <= 1.3 * limit, (said / limit, stdout)
    assert total / wall <= 1.3 * limit, (total / wall / limit, wall)
    assert total / wall >= 0.35 * limit, (total / wall / limit, wall)  # 1/15 of the limit before the fix
