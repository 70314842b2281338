"""transfer on a `local:PATH` remote: the same upload code as over SSH, no root needed."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from shardship.config import ClusterConfig
from shardship.errors import QuotaError
from tests.sshd import make_packed
from transfer import connect
from transfer.cli import main as cli
from transfer.pull import pull
from transfer.remote import LocalRemote
from transfer.status import status
from transfer.unpack import unsafe_member
from transfer.upload import UnsafeShardError, upload

ROOT = Path(__file__).resolve().parents[1]


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def assert_mirrored(index: dict, remote_dir: Path, packed: Path) -> None:
    """Every shard is on the remote with the index's sha256, and index.json is byte-identical."""
    for s in index["shards"]:
        assert sha(remote_dir / s["name"]) == s["sha256"], s["name"]
    assert (remote_dir / "index.json").read_bytes() == (packed / "index.json").read_bytes()
    assert not [p for p in remote_dir.iterdir() if p.name.endswith((".part", ".tmp", ".zst"))]


@pytest.fixture
def packed(tmp_path: Path) -> tuple[Path, dict]:
    out = tmp_path / "packed"
    return out, make_packed(out)


@pytest.fixture
def remote(tmp_path: Path) -> LocalRemote:
    return connect(ClusterConfig(name="t", host=f"local:{tmp_path / 'home'}", remote_dir="data"))


def test_connect_local_is_a_local_remote(remote: LocalRemote, tmp_path: Path) -> None:
    assert isinstance(remote, LocalRemote)
    assert remote.root == str(tmp_path / "home" / "data")
    with remote as r:
        assert r.run(["echo", "a b"]).stdout == "a b\n"
        assert r.run(["no-such-command-xyz"]).returncode == 127


def test_fresh_upload_then_rerun_sends_nothing(packed, remote: LocalRemote) -> None:
    out, index = packed
    first = upload(remote, out, progress=False)
    total = sum(s["bytes"] for s in index["shards"])
    assert first.bytes_sent == total and first.index_written
    assert all(o.done and o.resumed_from == 0 for o in first.outcomes)
    assert_mirrored(index, Path(remote.root), out)
    state = json.loads((Path(remote.root) / ".shardship-state.json").read_text())
    assert {k: v["sha256"] for k, v in state["files"].items()} == {s["name"]: s["sha256"] for s in index["shards"]}

    mtime = (Path(remote.root) / "index.json").stat().st_mtime_ns
    second = upload(remote, out, progress=False)
    assert second.bytes_sent == 0 and second.outcomes == [] and not second.index_written
    assert [s.action for s in second.plan.steps] == ["skip"] * len(index["shards"])
    assert (Path(remote.root) / "index.json").stat().st_mtime_ns == mtime


def test_changed_shard_is_the_only_one_sent(tmp_path: Path, remote: LocalRemote) -> None:
    out = tmp_path / "packed"
    make_packed(out, seed=1)
    upload(remote, out, progress=False)
    new = make_packed(out, {"session_a-0a1b2c-0000.tar": 16, "session_a-0a1b2c-0001.tar": 17,
                            "session_b-3d4e5f-0000.tar": 8}, seed=1)
    res = upload(remote, out, progress=False)
    assert [o.name for o in res.outcomes] == ["session_a-0a1b2c-0001.tar"]
    assert [s.action for s in res.plan.steps] == ["skip", "replace", "skip"]
    assert_mirrored(new, Path(remote.root), out)


def test_remote_files_without_state_are_hashed_not_resent(packed, remote: LocalRemote) -> None:
    out, index = packed
    upload(remote, out, progress=False)
    (Path(remote.root) / ".shardship-state.json").unlink()  # e.g. copied there with scp earlier
    res = upload(remote, out, progress=False)
    assert res.bytes_sent == 0
    assert (Path(remote.root) / ".shardship-state.json").exists()


def test_resume_from_good_part(packed, remote: LocalRemote) -> None:
    out, index = packed
    first = index["shards"][0]
    root = Path(remote.root)
    root.mkdir(parents=True)
    data = (out / first["name"]).read_bytes()
    (root / (first["name"] + ".part")).write_bytes(data[:300_000])
    res = upload(remote, out, progress=False)
    o = res.outcomes[0]
    assert o.resumed_from == 300_000 and o.sent == first["bytes"] - 300_000 and not o.restarted
    assert res.plan.steps[0].action == "resume"
    assert_mirrored(index, root, out)


def test_corrupted_part_is_detected_and_restarted(packed, remote: LocalRemote) -> None:
    out, index = packed
    first = index["shards"][0]
    root = Path(remote.root)
    root.mkdir(parents=True)
    data = bytearray((out / first["name"]).read_bytes()[:300_000])
    data[1000] ^= 0xFF
    (root / (first["name"] + ".part")).write_bytes(bytes(data))
    events = []
    res = upload(remote, out, progress=False, on_event=lambda kind, **kw: events.append(kind), log=lambda m: None)
    o = res.outcomes[0]
    assert o.restarted and o.resumed_from == 0 and o.sent == first["bytes"]
    assert "corrupt_part" in events
    assert_mirrored(index, root, out)


def test_over_quota_refused_before_anything_is_written(packed, remote: LocalRemote) -> None:
    out, _ = packed
    with pytest.raises(QuotaError) as e:
        upload(remote, out, progress=False, config_quota="1M", margin=0)
    assert e.value.code == 3
    assert "Nothing was sent" in str(e.value) and "1.0 MB" in str(e.value)
    assert not Path(remote.home).exists() or not Path(remote.root).exists()


def test_dry_run_sends_nothing(packed, remote: LocalRemote) -> None:
    out, index = packed
    res = upload(remote, out, progress=False, dry_run=True)
    assert res.dry_run and len(res.plan.sends) == len(index["shards"])
    assert not Path(remote.root).exists()
    assert any("3 of 3 shards to send" in line for line in res.plan.lines())


def test_zst_shards_are_unpacked_on_arrival(tmp_path: Path, remote: LocalRemote) -> None:
    out = tmp_path / "packed"
    # compressible payload so the .tar.zst is worth sending
    index = make_packed(out, frame_bytes=64 * 1024, compress=True, keep_tar=False)
    for s in index["shards"]:
        assert s["compressed"]["bytes"] < s["bytes"]
    res = upload(remote, out, progress=False)
    assert res.bytes_sent == sum(s["compressed"]["bytes"] for s in index["shards"])
    assert_mirrored(index, Path(remote.root), out)
    assert upload(remote, out, progress=False).bytes_sent == 0


def test_leftover_zst_not_yet_unpacked_is_finished(tmp_path: Path, remote: LocalRemote) -> None:
    out = tmp_path / "packed"
    index = make_packed(out, compress=True, keep_tar=False)
    s0 = index["shards"][0]
    root = Path(remote.root)
    root.mkdir(parents=True)
    (root / s0["compressed"]["name"]).write_bytes((out / s0["compressed"]["name"]).read_bytes())
    res = upload(remote, out, progress=False)
    assert res.outcomes[0].sent == 0 and res.outcomes[0].resumed_from == s0["compressed"]["bytes"]
    assert_mirrored(index, root, out)


def _evil(name: str, link: str | None = None) -> list:
    ti = tarfile.TarInfo(name)
    if link is not None:
        ti.type, ti.linkname = tarfile.SYMTYPE, link
        return [(ti, None)]
    ti.size = 5
    return [(ti, b"pwned")]


@pytest.mark.parametrize("members", [_evil("../../evil.sh"), _evil("/etc/evil"), _evil("s/x", link="../../../etc"),
                                     _evil("s/y", link="/etc/passwd")])
def test_unsafe_plain_tar_refused_before_sending(tmp_path: Path, remote: LocalRemote, members: list) -> None:
    out = tmp_path / "packed"
    make_packed(out, {"s-000000-0000.tar": 2, "s-000000-0001.tar": 2}, extra_members={"s-000000-0001.tar": members})
    with pytest.raises(UnsafeShardError) as e:
        upload(remote, out, progress=False)
    assert "s-000000-0001.tar" in str(e.value) and "nothing was sent" in str(e.value)
    assert not Path(remote.root).exists()


def test_unsafe_zst_refused_on_unpack(tmp_path: Path, remote: LocalRemote) -> None:
    out = tmp_path / "packed"
    make_packed(out, {"s-000000-0000.tar": 2, "s-000000-0001.tar": 2}, compress=True, keep_tar=False, frame_bytes=4096,
                extra_members={"s-000000-0001.tar": _evil("../escape.txt")})
    with pytest.raises(UnsafeShardError) as e:
        upload(remote, out, progress=False)
    assert "refused to unpack" in str(e.value) and "../escape.txt" in str(e.value)
    root = Path(remote.root)
    names = sorted(p.name for p in root.iterdir())
    assert "s-000000-0000.tar" in names  # the good shard before it stays verified
    assert not any(n.startswith("s-000000-0001") for n in names)  # nothing of the bad one is left
    assert "index.json" not in names
    assert not (root.parent / "escape.txt").exists()


def test_safe_links_inside_a_shard_are_allowed() -> None:
    assert unsafe_member("s/000001.jpg", "symlink", "000000.jpg") is None
    assert unsafe_member("s/a/b", "symlink", "../c") is None
    assert unsafe_member("s/a", "symlink", "../../x") == "link pointing outside the shard"
    assert unsafe_member("s/a", "hardlink", "s/b") is None
    assert unsafe_member("s/a", "hardlink", "../b") == "link pointing outside the shard"
    assert unsafe_member("s/dev", "other") == "device or fifo member"
    assert unsafe_member("s/../../x", "file") == "path with '..' component"


def test_shell_characters_in_names_are_just_names(tmp_path: Path) -> None:
    home = tmp_path / "home $(touch INJECTED) ; x"
    remote = connect(ClusterConfig(name="t", host=f"local:{home}", remote_dir="d; touch INJECTED2"))
    out = tmp_path / "packed"
    name = "sess; touch INJECTED3 $(touch INJECTED4) `touch INJECTED5`.tar"
    index = make_packed(out, {name: 3})
    os.chdir(tmp_path)
    res = upload(remote, out, progress=False)
    assert res.outcomes[0].done
    assert sha(Path(remote.root) / name) == index["shards"][0]["sha256"]
    assert not list(tmp_path.rglob("INJECTED*"))


def test_pull_resumes_and_verifies(packed, remote: LocalRemote, tmp_path: Path) -> None:
    out, index = packed
    upload(remote, out, progress=False)
    (Path(remote.root) / "logs").mkdir()
    (Path(remote.root) / "logs" / "train.jsonl").write_text('{"step": 1}\n' * 1000)
    dest = tmp_path / "back"
    name = index["shards"][0]["name"]
    dest.mkdir()
    full = (out / name).read_bytes()
    (dest / (name + ".part")).write_bytes(full[:100_000])
    got = pull(remote, [name, "logs"], dest, progress=False)
    by = {o.local_path.name: o for o in got}
    assert by[name].resumed_from == 100_000 and by[name].received == len(full) - 100_000
    assert (dest / name).read_bytes() == full
    assert (dest / "logs" / "train.jsonl").read_text().count("step") == 1000
    again = pull(remote, [name, "logs"], dest, progress=False)
    assert all(o.skipped for o in again)


def test_pull_bad_part_is_retried_from_zero(packed, remote: LocalRemote, tmp_path: Path) -> None:
    out, index = packed
    upload(remote, out, progress=False)
    name = index["shards"][1]["name"]
    dest = tmp_path / "back"
    dest.mkdir()
    (dest / (name + ".part")).write_bytes(b"\0" * 5000)
    o = pull(remote, [name], dest, progress=False)[0]
    assert o.retried and sha(dest / name) == index["shards"][1]["sha256"]


def test_status_reports_verified_missing_partial(packed, remote: LocalRemote) -> None:
    out, index = packed
    names = [s["name"] for s in index["shards"]]
    before = status(remote, out)
    assert [s.state for s in before.shards] == ["missing"] * 3 and before.index_remote == "missing"
    upload(remote, out, progress=False)
    (Path(remote.root) / names[2]).unlink()
    (Path(remote.root) / (names[2] + ".part")).write_bytes(b"x" * 10)
    (Path(remote.root) / "old-000000-0000.tar").write_bytes(b"")
    rep = status(remote, out, verify=True)
    assert [s.state for s in rep.shards][:2] == ["verified", "verified"]
    assert rep.shards[2].state.startswith("partial") and rep.remote_only == ["old-000000-0000.tar"]
    assert rep.index_remote == "same" and not rep.complete
    assert any("2/3 shards verified" in line for line in rep.lines())


def test_cli_local_dry_run_upload_status_quota(packed, tmp_path: Path) -> None:
    out, index = packed
    target = f"local:{tmp_path / 'h'}"
    r = CliRunner().invoke(cli, ["upload", "--cluster", target, "--out", str(out), "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "3 of 3 shards to send" in r.output and not (tmp_path / "h").exists()
    r = CliRunner().invoke(cli, ["upload", "--cluster", target, "--out", str(out), "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "3 shards sent and verified" in r.output
    r = CliRunner().invoke(cli, ["status", "--cluster", target, "--out", str(out)])
    assert r.exit_code == 0 and "3/3 shards verified" in r.output
    r = CliRunner().invoke(cli, ["quota", "--cluster", target, "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["source"] == "df -P"
    name = index["shards"][0]["name"]
    (out / name).write_bytes(b"\0" * index["shards"][0]["bytes"])  # local copy damaged, same size
    r = CliRunner().invoke(cli, ["status", "--cluster", target, "--out", str(out), "--verify"])
    assert r.exit_code == 0 and f"differ from index.json: {name}" in r.output
    r = CliRunner().invoke(cli, ["pull", "--cluster", target, "--dest", str(tmp_path / "back"), name, "index.json",
                                 "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "2 files fetched and verified" in r.output
    assert sha(tmp_path / "back" / name) == index["shards"][0]["sha256"]
    r = CliRunner().invoke(cli, ["pull", "--cluster", target, "--dest", str(tmp_path / "back"), "nope.tar"])
    assert r.exit_code == 4 and "does not exist" in r.output


def test_cli_status_exits_1_while_a_shard_is_missing_or_incomplete(packed, tmp_path: Path) -> None:
    """Issue 39.7.4: `transfer status` printed "2/3 shards verified" and exited 0, so
    `transfer status && sbatch job.sh` queued a job on data that was not there. Now:
    exit 1 (the README's partial) with one line naming the shards, until it is whole."""
    out, index = packed
    names = [s["name"] for s in index["shards"]]
    target = f"local:{tmp_path / 'h'}"
    args = ["status", "--cluster", target, "--out", str(out)]
    r = CliRunner().invoke(cli, args)  # nothing sent yet
    assert r.exit_code == 1, r.output
    assert "error: " in r.output and "incomplete: 3 of 3 shards not verified" in r.output, r.output
    assert "remote index.json is missing" in r.output and "run `transfer upload`" in r.output, r.output
    assert CliRunner().invoke(cli, ["upload", "--cluster", target, "--out", str(out), "--quiet"]).exit_code == 0
    assert CliRunner().invoke(cli, args).exit_code == 0
    root = tmp_path / "h" / "shardship"
    (root / names[0]).unlink()  # gone on the cluster
    with open(root / names[1], "r+b") as f:  # cut short (a copy by hand that stopped)
        f.truncate(index["shards"][1]["bytes"] // 2)
    for extra in ([], ["--verify"]):
        r = CliRunner().invoke(cli, args + extra)
        assert r.exit_code == 1, (extra, r.output)
        (line,) = [ln for ln in r.output.splitlines() if ln.startswith("error: ")]
        assert "incomplete: 2 of 3 shards not verified" in line and "run `transfer upload`" in line, line
        assert f"{names[0]} (missing)" in line and f"{names[1]} (incomplete)" in line, line
        assert "Traceback" not in r.output
    assert CliRunner().invoke(cli, ["upload", "--cluster", target, "--out", str(out), "--quiet"]).exit_code == 0
    r = CliRunner().invoke(cli, args + ["--verify"])
    assert r.exit_code == 0 and "3/3 shards verified" in r.output, r.output


def test_cli_over_quota_exit_3(packed, tmp_path: Path) -> None:
    out, _ = packed
    cfg = tmp_path / "shardship.toml"
    cfg.write_text(f'[cluster.tiny]\nhost = "local:{tmp_path / "h"}"\nquota = "2M"\n')
    r = CliRunner().invoke(cli, ["upload", "--config", str(cfg), "--out", str(out), "--margin", "0", "--dry-run"])
    assert r.exit_code == 3 and "DOES NOT FIT" in r.output and "error: " in r.output
    r = CliRunner().invoke(cli, ["upload", "--config", str(cfg), "--out", str(out), "--margin", "0"])
    assert r.exit_code == 3, r.output
    assert r.output.startswith("error: ") and "Traceback" not in r.output
    assert not (tmp_path / "h").exists()


def test_cli_missing_index_is_a_usage_error(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["upload", "--cluster", f"local:{tmp_path}", "--out", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "index.json not found" in r.output


def _wait_for_part(part: Path, proc: subprocess.Popen, at_least: int, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"uploader exited early: {proc.stderr.read().decode()[-2000:]}")
        try:
            n = part.stat().st_size
        except FileNotFoundError:
            n = 0
        if n >= at_least:
            return n
        time.sleep(0.02)
    raise AssertionError("the upload did not start")


def test_sigkill_mid_shard_then_rerun_resumes(tmp_path: Path) -> None:
    out = tmp_path / "packed"
    index = make_packed(out, {"big-000000-0000.tar": 48}, frame_bytes=128 * 1024)  # ~6 MiB
    home = tmp_path / "home"
    proc = subprocess.Popen(
        [sys.executable, "-m", "transfer", "upload", "--cluster", f"local:{home}", "--out", str(out),
         "--bwlimit", "2M", "--no-progress"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    part = home / "shardship" / "big-000000-0000.tar.part"
    try:
        _wait_for_part(part, proc, 1 << 20)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    size = part.stat().st_size
    assert 0 < size < index["shards"][0]["bytes"]
    assert not (home / "shardship" / "index.json").exists()
    res = upload(LocalRemote(home), out, progress=False)
    o = res.outcomes[0]
    assert o.resumed_from == size and o.sent == index["shards"][0]["bytes"] - size
    assert_mirrored(index, home / "shardship", out)


class _ShortWritingRemote(LocalRemote):
    """A file system that accepts every write and then keeps fewer bytes (what NFS
    does when it reports a full disk only at close and the SFTP server drops that
    error). Cannot be produced for real here; the uploader must still notice."""

    def __init__(self, *args, short_name: str, **kw):
        super().__init__(*args, **kw)
        self.short_name = short_name

    def put(self, local, path, offset=0, callback=None, throttle=None):  # type: ignore[override]
        sent = super().put(local, path, offset, callback, throttle)
        if Path(path).name.startswith(self.short_name):
            full = Path(self.path(path))
            os.truncate(full, full.stat().st_size - 1000)
        return sent


def test_a_shard_shorter_on_the_remote_than_sent_is_an_error_not_published(packed, tmp_path: Path) -> None:
    out, index = packed
    bad = index["shards"][1]["name"]
    remote = _ShortWritingRemote(str(tmp_path / "home"), "data", short_name=bad)
    with pytest.raises(Exception) as e:
        upload(remote, out, progress=False)
    assert bad in str(e.value) and "bytes on the remote after sending" in str(e.value), str(e.value)
    root = Path(remote.root)
    assert not (root / bad).exists()  # never renamed into place
    assert not (root / "index.json").exists()
    assert (root / index["shards"][0]["name"]).exists()  # the shard before it was verified and kept
