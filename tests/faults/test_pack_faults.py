"""Faults of `packer pack` in the local packed dir: a kill at every point of a run
that removes and re-packs sessions, a full disk at index.json, a damaged shard, and
two packs on one out dir. The invariant everywhere: index.json never names a file
that is not there with its size and sha256, and a rerun finishes the job."""
from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from packer.cli import main as packer_main
from packer.pack import pack
from shardship.config import PackOptions
from shardship.format import index as manifest
from shardship.format.check import check_files
from shardship.hashing import sha256_file
from tests.conftest import ROOT, is_root
from tests.test_pack import assert_consistent, opts

needs_root = pytest.mark.skipif(not is_root(), reason="mounting a size-limited tmpfs needs root")
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
PACK_ARGS = ["--no-slam", "--workers", "1", "--shard-mb", "0.25", "--quiet"]


def named_files_ok(out: Path) -> list:
    """What is wrong with the files index.json names (empty: nothing)."""
    if not (out / "index.json").exists():
        return []
    idx = manifest.read(out)
    sizes = {p.name: p.stat().st_size for p in out.iterdir() if p.is_file()}
    return check_files(idx, sizes, lambda n: sha256_file(out / n), compressed=True)


def assert_no_strays(out: Path) -> None:
    """Every .tar/.tar.zst on disk is named by index.json (no leak)."""
    idx = manifest.load(out)
    named = {s["name"] for s in idx["shards"]} | {s["compressed"]["name"] for s in idx["shards"] if s["compressed"]}
    on_disk = {p.name for p in out.iterdir() if p.name.endswith((".tar", ".tar.zst"))}
    assert on_disk == named, f"strays: {on_disk - named}, missing: {named - on_disk}"


def driver(out: Path, raw: Path, action: str, k: int, *extra: str, wait: bool = True):
    cmd = [sys.executable, "-m", "tests.faults.pack_driver", str(out), action, str(k), "--",
           "--raw", str(raw), "--out", str(out), *PACK_ARGS, *extra]
    if not wait:
        return subprocess.Popen(cmd, env=ENV, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=300)


def run_pack(raw: Path, out: Path, *extra: str):
    return CliRunner().invoke(packer_main, ["pack", "--raw", str(raw), "--out", str(out), *PACK_ARGS, *extra])


# ---------------------------------------------------------------------------
# rows 1 and 2: a session removed from data/raw (and one changed), killed anywhere
# ---------------------------------------------------------------------------


def _removal_scenario(raw: Path, out: Path) -> tuple[str, str]:
    """Pack all three (with .tar.zst), then delete one session and change another."""
    r = run_pack(raw, out, "--compress", "zstd")
    assert r.exit_code == 0, r.output
    gone, changed = sorted(p.name for p in raw.iterdir())[:2]
    shutil.rmtree(raw / gone)
    frames = sorted((raw / changed / "rgb").iterdir())
    frames[0].write_bytes(frames[1].read_bytes())
    return gone, changed


def test_removed_session_takes_its_tar_zst_along(raw_copy: Path, tmp_path: Path):
    out = tmp_path / "p"
    gone, _ = _removal_scenario(raw_copy, out)
    r = run_pack(raw_copy, out, "--compress", "zstd")
    assert r.exit_code == 0, r.output
    assert gone not in manifest.load(out)["sessions"]
    assert not named_files_ok(out)
    assert_no_strays(out)


@pytest.fixture
def before_removal(raw_copy: Path, tmp_path: Path):
    out = tmp_path / "p"
    gone, changed = _removal_scenario(raw_copy, out)
    shutil.copytree(out, tmp_path / "before")
    return out, gone, changed


@pytest.mark.slow
def test_kill_at_every_step_of_a_removal_and_repack(raw_copy: Path, tmp_path: Path, before_removal):
    """SIGKILL after each file-system change of a run (index rename, shard rename,
    delete): index.json is always true, and the rerun leaves no stray file."""
    out, gone, _ = before_removal
    count = driver(out, raw_copy, "KILL", 0, "--compress", "zstd")
    assert count.returncode == 0, count.stderr
    total = int((tmp_path / "mutations.txt").read_text())
    assert total >= 6
    for k in range(1, total + 1):
        shutil.rmtree(out)
        shutil.copytree(tmp_path / "before", out)
        p = driver(out, raw_copy, "KILL", k, "--compress", "zstd")
        assert p.returncode == -signal.SIGKILL, (k, p.stderr)
        assert not named_files_ok(out), f"killed after change {k}: index.json names a missing or wrong file"
        r = run_pack(raw_copy, out, "--compress", "zstd")
        assert r.exit_code == 0, (k, r.output)
        assert not named_files_ok(out) and gone not in manifest.load(out)["sessions"]
        assert_no_strays(out)


def test_killed_right_after_deleting_a_removed_sessions_file(raw_copy: Path, tmp_path: Path, before_removal):
    """The issue's case: SIGKILL just after the first file of the removed session is
    deleted. index.json must not name it; the rerun completes without strays."""
    out, gone, _ = before_removal
    doomed = {s["name"] for s in manifest.load(out)["shards"] if s["session"] == gone}
    doomed |= {s["compressed"]["name"] for s in manifest.load(out)["shards"] if s["session"] == gone}
    k = 0
    while True:
        k += 1
        shutil.rmtree(out)
        shutil.copytree(tmp_path / "before", out)
        p = driver(out, raw_copy, "KILL", k, "--compress", "zstd")
        assert p.returncode == -signal.SIGKILL, (k, p.stderr)
        if any(not (out / n).exists() for n in doomed):
            break
        assert k < 50
    assert not named_files_ok(out), "index.json names a deleted shard of the removed session"
    r = run_pack(raw_copy, out, "--compress", "zstd")
    assert r.exit_code == 0, r.output
    assert not named_files_ok(out)
    assert_no_strays(out)


# ---------------------------------------------------------------------------
# row 4: the disk fills up exactly when index.json is written
# ---------------------------------------------------------------------------


def _fill(directory: Path) -> Path:
    """Take every free byte of the file system that holds `directory`."""
    filler = directory / "filler.bin"
    with open(filler, "wb", buffering=0) as f:
        for size in (1 << 20, 4096, 512, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError:
                pass
    return filler


@needs_root
def test_disk_full_exactly_at_index_json(raw_copy: Path, tmp_path: Path, monkeypatch):
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)], check=True)
    try:
        out = mnt / "p"
        real, writes = tempfile.mkstemp, []
        filler: list[Path] = []

        def mkstemp(*a, **kw):  # the 3rd index.json write (the last session's) meets a full disk
            if str(kw.get("prefix", "")).startswith(".index.json."):
                writes.append(1)
                if len(writes) == 3:
                    filler.append(_fill(mnt))
            return real(*a, **kw)

        monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
        r = run_pack(raw_copy, out)
        assert r.exit_code == 1 and not isinstance(r.exception, OSError), r.output
        assert "Traceback" not in r.output and "disk full" in r.output and "free" in r.output, r.output
        assert len(manifest.load(out)["sessions"]) == 2 and not named_files_ok(out)
        assert_no_strays(out)
        monkeypatch.setattr(tempfile, "mkstemp", real)
        r = run_pack(raw_copy, out)  # same free space: the same clean failure, not a traceback
        assert r.exit_code == 1 and isinstance(r.exception, SystemExit), r.output
        assert "disk full" in r.output and "Traceback" not in r.output, r.output
        assert not named_files_ok(out)
        filler[0].unlink()
        r = run_pack(raw_copy, out)
        assert r.exit_code == 0, r.output
        assert len(manifest.load(out)["sessions"]) == 3
        assert_consistent(out)
        assert_no_strays(out)
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


# ---------------------------------------------------------------------------
# row 8: one flipped byte in a local shard (same size, even the same mtime)
# ---------------------------------------------------------------------------


def _flip(path: Path, at: int = 1000) -> None:
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # a same-size rewrite that keeps the mtime


def test_flipped_byte_in_a_shard_is_found_and_rewritten(raw_copy: Path, tmp_path: Path):
    out = tmp_path / "p"
    pack(raw_copy, out, opts(compress="zstd"), progress=False)
    shards = manifest.load(out)["shards"]
    tar, zst = out / shards[0]["name"], out / shards[-1]["compressed"]["name"]
    _flip(tar)
    _flip(zst, at=100)
    v = CliRunner().invoke(packer_main, ["verify", "--out", str(out)])
    assert v.exit_code == 1, v.output
    assert tar.name in v.output and zst.name in v.output and "packer pack" in v.output
    assert "Traceback" not in v.output
    r = pack(raw_copy, out, opts(compress="zstd"), progress=False)
    assert r.packed == [shards[0]["session"]] and not r.failed
    assert not named_files_ok(out)
    assert_consistent(out)
    assert_no_strays(out)
    v = CliRunner().invoke(packer_main, ["verify", "--out", str(out)])
    assert v.exit_code == 0, v.output


def test_unchanged_rerun_hashes_nothing(raw_copy: Path, tmp_path: Path, monkeypatch):
    """The stat fast path: an untouched shard is not re-hashed on every rerun."""
    import packer.outdir

    out = tmp_path / "p"
    pack(raw_copy, out, opts(compress="zstd"), progress=False)
    calls = []
    real = packer.outdir.sha256_file
    monkeypatch.setattr(packer.outdir, "sha256_file", lambda p: calls.append(p) or real(p))
    r = pack(raw_copy, out, opts(compress="zstd"), progress=False)
    assert len(r.reused) == 3 and r.images == 0 and not calls, calls
    victim = out / manifest.load(out)["shards"][1]["name"]
    shutil.copy2(victim, victim.with_name("copy"))
    os.replace(victim.with_name("copy"), victim)  # same bytes, new inode: hashed once, kept
    r = pack(raw_copy, out, opts(compress="zstd"), progress=False)
    assert len(r.reused) == 3 and r.images == 0 and calls == [victim]


def test_verify_without_index_or_with_missing_file(raw_copy: Path, tmp_path: Path):
    out = tmp_path / "p"
    v = CliRunner().invoke(packer_main, ["verify", "--out", str(out)])
    assert v.exit_code == 2 and "packer pack" in v.output and "Traceback" not in v.output
    pack(raw_copy, out, opts(), progress=False)
    gone = out / manifest.load(out)["shards"][2]["name"]
    gone.unlink()
    (out / "x-abcdef-0000.tar").write_bytes(b"left over")
    v = CliRunner().invoke(packer_main, ["verify", "--out", str(out)])
    assert v.exit_code == 1 and f"{gone.name}: missing" in v.output and "x-abcdef-0000.tar" in v.output, v.output


# ---------------------------------------------------------------------------
# row 9: two `packer pack` on one out dir
# ---------------------------------------------------------------------------


def test_second_pack_on_a_locked_out_dir_is_refused(raw_copy: Path, tmp_path: Path):
    out = tmp_path / "p"
    out.mkdir()
    with open(out / ".packer.lock", "a+") as f:  # what a running pack holds
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        f.write("4242\n")
        f.flush()
        r = run_pack(raw_copy, out)
    assert r.exit_code == 2, r.output
    assert "another `packer pack` (pid 4242) is using" in r.output and str(out) in r.output
    assert len(r.output.strip().splitlines()[-1]) < 300 and not (out / "index.json").exists()
    r = run_pack(raw_copy, out)  # released: the next one runs
    assert r.exit_code == 0, r.output


@pytest.mark.slow
def test_two_real_packs_then_sigkill_releases_the_lock(raw_copy: Path, tmp_path: Path):
    """A real pack stopped mid-run (SIGSTOP after its first shard rename) holds the
    out dir: a second real pack exits 2 naming its pid. SIGKILL the first: the lock
    goes with it and the second pack completes the job."""
    out = tmp_path / "p"
    first = driver(out, raw_copy, "STOP", 1, wait=False)
    deadline = time.time() + 120
    while time.time() < deadline:
        st = Path(f"/proc/{first.pid}/stat").read_text().split()
        if st[2] == "T":
            break
        time.sleep(0.05)
    else:
        first.kill()
        pytest.fail("the first pack never reached its first rename")
    try:
        second = subprocess.run([sys.executable, "-m", "packer", "pack", "--raw", str(raw_copy), "--out", str(out),
                                 *PACK_ARGS], env=ENV, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stderr
        assert f"another `packer pack` (pid {first.pid}) is using {out}" in second.stderr
        assert "Traceback" not in second.stderr
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=60)
    third = subprocess.run([sys.executable, "-m", "packer", "pack", "--raw", str(raw_copy), "--out", str(out),
                            *PACK_ARGS], env=ENV, capture_output=True, text=True, timeout=300)
    assert third.returncode == 0, third.stderr
    assert "packed 3 sessions" in third.stdout or "kept" in third.stdout
    assert_consistent(out)
    assert_no_strays(out)


def test_a_pack_into_a_busy_out_dir_encodes_nothing_early(raw_copy: Path, tmp_path: Path):
    """The early start (workers encoding a first pack's frames before the sessions are
    loaded) asks the out dir lock first: a second pack into a directory another pack
    holds is refused without a worker started (it used to encode up to 8,000 frames
    first, and on a loaded machine took minutes to say the directory was busy)."""
    from packer.framepool import FramePool, prefeed
    from packer.lockfile import held_by_another, locked

    out = tmp_path / "busy"
    out.mkdir()
    assert not held_by_another(out)
    with FramePool.for_options(PackOptions(workers=1)) as free:
        prefeed(free, raw_copy, out, PackOptions(workers=1))
        assert free._pool is not None  # a first pack into a free directory starts at once
    with locked(out):
        with FramePool.for_options(PackOptions(workers=1)) as busy:
            prefeed(busy, raw_copy, out, PackOptions(workers=1))
            assert busy._pool is None  # nothing encoded for a pack that will be refused
        holder = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                                 "from packer.lockfile import held_by_another; "
                                 "sys.exit(0 if held_by_another(Path(sys.argv[1])) else 1)", str(out)],
                                env=ENV, cwd=ROOT, timeout=60)
        assert holder.returncode == 0  # another process sees the directory busy
    assert not held_by_another(out)  # and free again once released
