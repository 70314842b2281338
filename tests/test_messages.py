"""Messages that gave the wrong fix (issue 21.9), each as the user meets it: the real
command. (The first checkpoint on a full disk is in test_trainer.py, beside its twin.)"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT
from tests.sshd import make_packed

ENV = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}


def tool(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", name, *args], capture_output=True, text=True, env=ENV, timeout=600)


def test_damaged_remote_index_says_upload_not_pack(tmp_path: Path) -> None:
    out, home = tmp_path / "packed", tmp_path / "home"
    make_packed(out)
    assert tool("transfer", "upload", "--cluster", f"local:{home}", "--out", str(out), "--quiet").returncode == 0
    remote_index = home / "shardship" / "index.json"
    remote_index.write_text(remote_index.read_text()[:200])  # a partial copy on the cluster
    r = tool("transfer", "status", "--cluster", f"local:{home}", "--out", str(out), "--verify")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "index.json: not valid JSON" in r.stderr and "`transfer upload` again" in r.stderr, r.stderr
    assert "packer pack" not in r.stderr


def test_older_pack_never_silently_replaces_a_newer_remote_index(tmp_path: Path) -> None:
    out, home = tmp_path / "packed", tmp_path / "home"
    make_packed(out)
    (home / "shardship").mkdir(parents=True)
    newer = {"format": "shardship-index", "version": 2, "shards": []}
    (home / "shardship" / "index.json").write_text(json.dumps(newer))
    r = tool("transfer", "upload", "--cluster", f"local:{home}", "--out", str(out), "--quiet")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "format version 2, newer than this pack's (1)" in r.stderr and "nothing was sent" in r.stderr, r.stderr
    assert json.loads((home / "shardship" / "index.json").read_text()) == newer
    assert not list((home / "shardship").glob("*.tar"))


def test_truncated_imu_json_says_reexport(raw_copy: Path) -> None:
    victim = sorted(raw_copy.iterdir())[0]
    imu = victim / "imu.json"
    imu.write_bytes(imu.read_bytes()[: imu.stat().st_size // 2])  # the app stopped mid-write
    r = tool("packer", "check", "--raw", str(raw_copy))
    assert r.returncode == 1
    (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("FAIL")]
    assert f"session {victim.name}: imu.json: truncated" in line and "re-export" in line, line


def test_session_moved_out_of_raw_is_named_in_the_summary(raw_copy: Path, tmp_path: Path) -> None:
    out = tmp_path / "packed"
    args = ("pack", "--raw", str(raw_copy), "--out", str(out), "--no-slam", "--quiet")
    assert tool("packer", *args).returncode == 0
    gone = sorted(raw_copy.iterdir())[1]
    shutil.move(str(gone), str(tmp_path / gone.name))
    r = tool("packer", *args)
    assert r.returncode == 0, r.stderr
    assert f"removed session {gone.name} from index.json: it is no longer in {raw_copy}" in r.stderr, r.stderr
    assert "kept 2 unchanged, removed 1, 0 failed" in r.stdout, r.stdout
    assert gone.name not in json.loads((out / "index.json").read_text())["sessions"]
