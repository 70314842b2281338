"""Faults of `transfer upload` / `status` and the SSH layer, each reproduced against
the real OpenSSH sshd of tests/sshd.py (real tmpfs quota, real signals), then fixed.
Numbers are the rows of the fault issue."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardship.errors import RemoteError
from tests.sshd import SSHD, TRANSPORTS, make_packed, on_transport  # noqa: F401 (fixtures come from conftest)
from tests.test_transfer_sshd import assert_mirrored, cli, sha, write_config
from transfer import connect
from transfer.lock import LOCK, Holder
from transfer.upload import DiskFullError, upload

pytestmark = pytest.mark.sshd


@pytest.fixture(params=TRANSPORTS)
def sshd_home(sshd_home: SSHD, request: pytest.FixtureRequest) -> Iterator[SSHD]:
    """The conftest fixture on one transport (every fault on both); no master left afterwards."""
    yield from on_transport(sshd_home, request.param)


# -- 5: disk full while index.json is written ---------------------------------


def test_05_disk_full_writing_index_is_one_line_and_keeps_shards(sshd_home: SSHD, tmp_path: Path) -> None:
    s = sshd_home
    out = tmp_path / "packed"
    index = make_packed(out)
    names = [x["name"] for x in index["shards"]]

    done: list[str] = []

    def fill_after_last_shard(kind: str, **kw) -> None:  # the last one done (several may be in flight)
        if kind == "shard_done":
            done.append(kw["name"])
        if kind == "shard_done" and len(done) == len(names):
            st = os.statvfs(s.home)
            s.fill(st.f_bavail * st.f_frsize)  # nothing left, not even for index.json

    with connect(s.cluster()) as remote:
        with pytest.raises(DiskFullError) as e:
            upload(remote, out, progress=False, margin=0, on_event=fill_after_last_shard)
    msg = str(e.value)
    assert e.value.code == 1 and "\n" not in msg
    assert "disk full while writing index.json" in msg and f"kept {len(names)} verified shards" in msg
    assert "Failure" not in msg and "rerun" in msg
    d = s.home / "shardship"
    assert not (d / "index.json").exists() and not [p for p in d.iterdir() if p.name.endswith(".tmp")]
    for x in index["shards"]:
        assert sha(d / x["name"]) == x["sha256"]

    (s.home / ".filler").unlink()
    cfg = write_config(tmp_path, s)
    p = cli(["upload", "--config", str(cfg), "--out", str(out), "--no-progress"], s)
    stdout, err = p.communicate(timeout=120)
    assert p.returncode == 0, err.decode()
    assert b"0 shards sent" in stdout and b"index.json updated" in stdout
    assert_mirrored(index, d, out, s.uid)


# -- 7: a remote shard rewritten with the same size and its mtime restored ----


def test_07_same_size_rewrite_with_mtime_kept_is_caught_and_resent(sshd_home: SSHD, tmp_path: Path) -> None:
    s = sshd_home
    out = tmp_path / "packed"
    index = make_packed(out)
    d = s.home / "shardship"
    cfg = write_config(tmp_path, s)
    with connect(s.cluster()) as remote:
        upload(remote, out, progress=False)
    victim = d / index["shards"][1]["name"]
    st = victim.stat()
    with open(victim, "r+b") as f:  # same size, other bytes (a stray `cp` of another pack, a bad disk)
        f.seek(1000)
        f.write(b"\xaa" * 4096)
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))  # ... and the mtime put back
    assert victim.stat().st_size == st.st_size and victim.stat().st_mtime_ns == st.st_mtime_ns

    p = cli(["status", "--config", str(cfg), "--out", str(out)], s)
    stdout, err = p.communicate(timeout=120)
    assert p.returncode == 1, err.decode()  # the remote does not hold the pack: partial (issue 39)
    assert f"{victim.name} (differs); run `transfer upload` to finish" in err.decode()
    line = next(ln for ln in stdout.decode().splitlines() if victim.name in ln)
    assert "verified" not in line and "differs" in line
    assert "2/3 shards verified" in stdout.decode()

    # what the train reader tells the user to do now works: a re-upload re-sends that shard
    p = cli(["upload", "--config", str(cfg), "--out", str(out), "--no-progress"], s)
    stdout, err = p.communicate(timeout=120)
    assert p.returncode == 0, err.decode()
    assert b"1 shard sent and verified" in stdout
    assert_mirrored(index, d, out, s.uid)
    p = cli(["status", "--config", str(cfg), "--out", str(out)], s)
    stdout, _ = p.communicate(timeout=120)
    assert "3/3 shards verified" in stdout.decode()


# -- 10: two uploads to one remote --------------------------------------------


def _wait_for(cond, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _slow_upload(s: SSHD, tmp_path: Path) -> tuple[Path, dict, Path, Path, subprocess.Popen]:
    """A packed dir, its config, the remote dir, and a rate-limited upload of it running."""
    out = tmp_path / "packed"
    index = make_packed(out)
    cfg = write_config(tmp_path, s)
    first = cli(["upload", "--config", str(cfg), "--out", str(out), "--no-progress", "--bwlimit", "1M"], s)
    return out, index, cfg, s.home / "shardship", first


def test_10_second_upload_is_refused_naming_the_first(sshd_home: SSHD, tmp_path: Path) -> None:
    s = sshd_home
    out, index, cfg, d, first = _slow_upload(s, tmp_path)
    try:
        _wait_for(lambda: any(p.name.endswith(".part") for p in d.glob("*")) if d.exists() else False)
        second = cli(["upload", "--config", str(cfg), "--out", str(out), "--no-progress"], s)
        _, err2 = second.communicate(timeout=120)
    finally:
        _, err1 = first.communicate(timeout=120)
    text = err2.decode()
    assert second.returncode == 4, text
    assert text.count("\n") == 1 and text.startswith("error: ") and "Traceback" not in text
    assert f"another upload (host {socket.gethostname()}, pid {first.pid}, since " in text
    assert f"{d}/{LOCK}" in text and "remove it if that upload is dead" in text
    assert first.returncode == 0, err1.decode()
    assert_mirrored(index, d, out, s.uid)
    assert not (d / LOCK).is_symlink()  # released at the end


def test_10_stale_lock_of_a_killed_upload_on_this_host_is_taken_over(sshd_home: SSHD, tmp_path: Path) -> None:
    s = sshd_home
    out, index, cfg, d, first = _slow_upload(s, tmp_path)
    _wait_for(lambda: (d / LOCK).is_symlink() and any(p.name.endswith(".part") for p in d.iterdir()))
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=30)
    assert (d / LOCK).is_symlink()  # left behind by the killed client

    p = cli(["upload", "--config", str(cfg), "--out", str(out), "--no-progress"], s)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0, err.decode()
    assert f"stale upload lock of pid {first.pid}" in err.decode()
    assert_mirrored(index, d, out, s.uid)
    assert not (d / LOCK).is_symlink()


def test_10_lock_of_another_host_is_not_taken(sshd_home: SSHD, tmp_path: Path) -> None:
    s = sshd_home
    out = tmp_path / "packed"
    make_packed(out)
    d = s.home / "shardship"
    d.mkdir()
    os.chown(d, s.uid, -1)
    other = Holder("laptop-of-someone-else", 4242, time.time() - 3600)
    os.symlink(other.text(), d / LOCK)
    with connect(s.cluster()) as remote:
        with pytest.raises(RemoteError) as e:
            upload(remote, out, progress=False)
    assert e.value.code == 4 and "host laptop-of-someone-else, pid 4242" in str(e.value)
    assert sorted(p.name for p in d.iterdir()) == [LOCK]  # nothing written, the lock untouched


# -- 18: the server freezes (SIGSTOP) mid-upload --------------------------------


@contextlib.contextmanager
def ssh_config_lines(s: SSHD, lines: str) -> Iterator[None]:
    """Options for the test alias, read before the fixture's own (ssh keeps the first value)."""
    before = s.ssh_config.read_text()
    s.ssh_config.write_text(f"Host {s.alias}\n{lines}\n\n" + before)
    try:
        yield
    finally:
        s.ssh_config.write_text(before)


def test_18_frozen_server_is_detected_by_keepalives(sshd_home: SSHD, tmp_path: Path) -> None:
    s = sshd_home
    out = tmp_path / "packed"
    index = make_packed(out)
    names = [x["name"] for x in index["shards"]]
    stopped: list[int] = []

    def freeze_the_server(kind: str, **kw) -> None:
        if kind == "shard_start" and kw["name"] == names[1] and not stopped:
            for pid in s.user_pids():  # the session's sshd child (and its remote helpers)
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)

    t0 = time.monotonic()
    try:
        with ssh_config_lines(s, "  ServerAliveInterval 1\n  ServerAliveCountMax 2"):
            with pytest.raises(RemoteError) as e:
                with connect(s.cluster()) as remote:
                    upload(remote, out, progress=False, on_event=freeze_the_server)
    finally:
        for pid in stopped:  # by pid, the ones stopped here (SIGKILL ends a stopped process too)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    took = time.monotonic() - t0
    assert stopped and took < 30, took
    msg = str(e.value)
    assert e.value.code == 4 and "stalled" in msg and "rerun to resume" in msg and "\n" not in msg
    assert "ServerAliveInterval 1" in msg

    with connect(s.cluster()) as remote:
        res = upload(remote, out, progress=False)
    first = res.outcomes[0]
    if s.transport == "paramiko":  # sent before the freeze (hashed one behind): resumed, not sent again
        assert first.name == names[0] and first.sent == 0 and first.resumed_from == index["shards"][0]["bytes"]
    else:  # shards were in flight together when it froze: each resumed from what had arrived
        sizes = {x["name"]: x["bytes"] for x in index["shards"]}
        assert all(o.resumed_from + o.sent == sizes[o.name] for o in res.outcomes)
    assert_mirrored(index, s.home / "shardship", out, s.uid)


def test_18_keepalive_settings_from_ssh_config(sshd_home: SSHD) -> None:
    s = sshd_home

    def keepalive(remote) -> tuple[float, float]:  # (interval, seconds of silence that end it)
        if s.transport == "openssh":  # OpenSSH's master sends them itself
            return remote.master.alive_interval, remote.master.alive_interval * remote.master.alive_count
        return remote.watchdog.interval, remote.watchdog.limit

    with connect(s.cluster()) as remote:
        assert keepalive(remote) == (15, 45)  # the defaults
    s.disconnect()
    with ssh_config_lines(s, "  ServerAliveInterval 2\n  ServerAliveCountMax 5"):
        with connect(s.cluster()) as remote:
            assert keepalive(remote) == (2, 10)
            time.sleep(4.5)  # answered keepalives keep a live connection up
            assert remote.run(["true"]).ok and not getattr(remote, "stalled", False)


# -- 19: a port that never sends an SSH banner ------------------------------------


@contextlib.contextmanager
def silent_port() -> Iterator[int]:
    """A TCP port that accepts connections and never says a word."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(srv.accept()[0])

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        t.join()
        for c in held:
            c.close()
        srv.close()


@pytest.mark.parametrize("connect_timeout", [2, pytest.param(None, marks=pytest.mark.slow)])
def test_19_no_banner_is_one_line_within_the_connect_timeout(sshd_home: SSHD, tmp_path: Path,
                                                             connect_timeout: int | None) -> None:
    """The default (15 s) is the case where paramiko's thread logged its traceback to stderr."""
    s = sshd_home
    extra = f"  ConnectTimeout {connect_timeout}\n" if connect_timeout else ""
    cfg = tmp_path / "shardship.toml"
    cfg.write_text(f'[cluster.test]\nhost = "silent"\nremote_dir = "shardship"\nquota = "auto"\n'
                   f'transport = "{s.transport}"\n')
    with silent_port() as port:
        block = f"Host silent\n  HostName 127.0.0.1\n  Port {port}\n  User {s.user}\n{extra}\n"
        before = s.ssh_config.read_text()
        s.ssh_config.write_text(block + before)
        try:
            t0 = time.monotonic()
            p = cli(["quota", "--config", str(cfg)], s)
            _, err = p.communicate(timeout=60)
            took = time.monotonic() - t0
        finally:
            s.ssh_config.write_text(before)
    text = err.decode()
    assert p.returncode == 4, text
    assert text.count("\n") == 1 and text.startswith("error: "), text
    assert "Traceback" not in text and "Exception (client)" not in text
    assert f"127.0.0.1:{port}" in text and "banner" in text.lower()
    assert f"within {connect_timeout or 15} s" in text and took < (connect_timeout or 15) + 10, took


# -- 20: the host key changed: the printed ssh-keygen -R command must work ------


def test_20_changed_host_key_hint_works_as_printed(sshd_home: SSHD, tmp_path: Path) -> None:
    s = sshd_home
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    kind, b64 = Path(f"{other}.pub").read_text().split()[:2]
    s.known_hosts.write_text(f"[127.0.0.1]:{s.port} {kind} {b64}\n")
    cfg = write_config(tmp_path, s)
    p = cli(["quota", "--config", str(cfg), "--accept-new-host-key"], s)
    _, err = p.communicate(timeout=60)
    text = err.decode()
    assert p.returncode == 4 and "HOST KEY CHANGED" in text and text.count("\n") == 1, text
    command = re.search(r"`(ssh-keygen -R [^`]+)`", text)
    assert command is not None, text
    assert f"'[127.0.0.1]:{s.port}'" in command.group(1) and f"-f {s.known_hosts}" in command.group(1)
    subprocess.run(command.group(1), shell=True, check=True, capture_output=True, env=s.env())  # as printed
    assert f"[127.0.0.1]:{s.port}" not in s.known_hosts.read_text()

    p = cli(["quota", "--config", str(cfg), "--accept-new-host-key"], s)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err.decode()
    assert b"accepted new host key" in err and b"64.0 MB" in out
    with connect(s.cluster()) as remote:
        assert remote.run(["true"]).ok


# -- status --verify: the one consistency check (shardship.format.check) ------------


def test_status_verify_uses_check_files_on_the_remote(sshd_home: SSHD, tmp_path: Path) -> None:
    s = sshd_home
    out = tmp_path / "packed"
    index = make_packed(out)
    cfg = write_config(tmp_path, s)
    with connect(s.cluster()) as remote:
        upload(remote, out, progress=False)
    p = cli(["status", "--config", str(cfg), "--out", str(out), "--verify"], s)
    stdout, err = p.communicate(timeout=120)
    assert p.returncode == 0, err.decode()
    assert "3/3 shards verified" in stdout.decode() and "remote dataset (its index.json + shards): consistent" \
        in stdout.decode()
    victim = s.home / "shardship" / index["shards"][2]["name"]
    with open(victim, "r+b") as f:
        f.seek(700)
        f.write(b"\x55" * 100)
    (s.home / "shardship" / index["shards"][0]["name"]).unlink()
    p = cli(["status", "--config", str(cfg), "--out", str(out), "--verify"], s)
    text = p.communicate(timeout=120)[0].decode()
    assert "1/3 shards verified" in text
    assert f"2 problems: {index['shards'][0]['name']}: missing; {victim.name}: sha256 " in text


# -- 3: re-upload of a changed pack, client killed -------------------------------


def _remote_problems(d: Path) -> list:
    from shardship.format import index as fmt
    from shardship.format.check import check_files

    idx = fmt.parse((d / "index.json").read_bytes())
    sizes = {p.name: p.stat().st_size for p in d.iterdir() if p.is_file()}
    return check_files(idx, sizes, lambda n: sha(d / n))


@pytest.mark.slow
def test_03_killed_reupload_of_a_changed_pack_leaves_a_consistent_remote(sshd_home: SSHD, tmp_path: Path) -> None:
    s = sshd_home
    out = tmp_path / "packed"
    make_packed(out, seed=0)
    cfg = write_config(tmp_path, s)
    d = s.home / "shardship"
    with connect(s.cluster()) as remote:
        upload(remote, out, progress=False)
    assert _remote_problems(d) == []  # a job on the cluster reads this dataset ...
    old_names = {sh["name"] for sh in json.loads((out / "index.json").read_text())["shards"]}
    # ... while a re-pack (new bytes) is uploaded: packer names shards by their content
    # (shardship.format.shards), so new bytes come under new names
    for p in out.iterdir():
        p.unlink()
    index = make_packed(out, {"session_a-0a1b2c-0000-1a2b3c4d.tar": 16, "session_a-0a1b2c-0001-5e6f7a8b.tar": 16,
                              "session_b-3d4e5f-0000-9c0d1e2f.tar": 8}, seed=1)
    assert not old_names & {sh["name"] for sh in index["shards"]}  # content-named: new bytes, new names
    first = index["shards"][0]
    p = cli(["upload", "--config", str(cfg), "--out", str(out), "--no-progress", "--bwlimit", "512K"], s)
    try:
        _wait_for(lambda: (d / first["name"]).exists() and sha(d / first["name"]) == first["sha256"])  # new shard in
    finally:
        p.send_signal(signal.SIGKILL)  # the client dies mid-upload
        p.communicate(timeout=30)
    assert _remote_problems(d) == []  # what the job sees stays consistent
    # the rerun finishes, switches index.json; --prune then removes the old pack's shards
    r = cli(["upload", "--config", str(cfg), "--out", str(out), "--no-progress", "--prune"], s)
    assert r.wait(timeout=300) == 0
    assert _remote_problems(d) == []
    left = {p.name for p in d.iterdir() if p.name.endswith(".tar")}
    assert left == {sh["name"] for sh in index["shards"]}
