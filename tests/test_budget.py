"""packer budget: exact arithmetic, suggestions that actually close the gap, and
the CLI's exit code 3 when over."""
from __future__ import annotations

import subprocess
import sys

import pytest

from shardship.units import parse_size
from train.budget import BudgetInputs, compute

G = 1024**3
M = 1024**2


def test_rows_add_up_and_headroom_includes_margin():
    b = compute(BudgetInputs(packed_bytes=717 * M, packed_files=91, checkpoint_bytes=100 * M, keep=3,
                             quota_bytes=10 * G, env_bytes=4 * G, log_bytes=50 * M, normaliser_bytes=64 * 1024))
    assert b.total == 717 * M + 5 * 100 * M + 64 * 1024 + 50 * M + 4 * G
    assert b.headroom == int(10 * G * 0.95) - b.total
    assert not b.over and b.suggestions == []


def test_over_quota_suggestions_each_name_what_they_free():
    inp = BudgetInputs(packed_bytes=6 * G, packed_files=700, checkpoint_bytes=500 * M, keep=5,
                       quota_bytes=10 * G, env_bytes=4 * G)
    b = compute(inp)
    assert b.over
    text = "\n".join(b.suggestions)
    assert "keep" in text and "--stride 2" in text and "--quality" in text and "[budget] env = 0" in text
    # applying the biggest suggestion (drop the venv) must actually fit here
    inp.env_bytes = 0
    assert not compute(inp).over


def test_inode_quota_counts_files():
    b = compute(BudgetInputs(packed_bytes=1 * G, packed_files=100, checkpoint_bytes=M, keep=1, quota_bytes=10 * G,
                             env_bytes=1 * G, env_files=60_000, inode_limit=50_000, inodes_used=0))
    assert b.over and b.inode_headroom is not None and b.inode_headroom < 0
    assert any("inode" in s for s in b.suggestions)


@pytest.mark.parametrize("text,expected", [("10G", 10 * G), ("512M", 512 * M), ("1.5T", int(1.5 * 1024**4)),
                                           ("10GiB", 10 * G), (1234, 1234)])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


def test_cli_exit_codes(tmp_path):
    pytest.importorskip("train.model")
    from tests.datasets import make_packed

    out = make_packed(tmp_path, sessions=1, frames=20, seed=1)
    ok = subprocess.run([sys.executable, "-m", "packer", "budget", "--out", str(out), "--quota", "10G"],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "checkpoints" in ok.stdout and "headroom" in ok.stdout and "fits" in ok.stdout
    over = subprocess.run([sys.executable, "-m", "packer", "budget", "--out", str(out), "--quota", "2G"],
                          capture_output=True, text=True)
    assert over.returncode == 3
    assert "OVER QUOTA" in over.stderr and "[budget] env = 0" in over.stderr
    missing = subprocess.run([sys.executable, "-m", "packer", "budget", "--out", str(tmp_path / "nope")],
                             capture_output=True, text=True)
    assert missing.returncode == 2 and "run `packer pack` first" in missing.stderr
    assert "Traceback" not in missing.stderr


@pytest.mark.skipif(not __import__("os").geteuid() == 0, reason="mounting a size-limited tmpfs needs root")
def test_live_quota_counts_uploaded_shards_once(tmp_path):
    """budget --remote on a real size-limited filesystem: the live `used` includes
    shards already uploaded; they must not be counted again as packed data."""
    pytest.importorskip("train.model")
    from shardship.config import Config
    from shardship.format import index as manifest
    from tests.datasets import make_packed
    from train.budget import live_quota_and_uploaded as _live_quota

    out = make_packed(tmp_path, sessions=1, frames=20, seed=2)
    mnt = tmp_path / "home"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(mnt)], check=True)
    try:
        up = subprocess.run([sys.executable, "-m", "transfer", "upload", "--cluster", f"local:{mnt}", "--out", str(out),
                             "--no-progress"], capture_output=True, text=True)
        assert up.returncode == 0, up.stderr
        index = manifest.load(out)
        q, already = _live_quota(Config(), f"local:{mnt}", index, False)
        assert q.limit_bytes == 32 * M
        assert already == sum(s["bytes"] for s in index["shards"]) > 0
        assert q.used_bytes >= already
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_budget_and_job_check_count_the_trainers_peak_checkpoints():
    """keep=0 still peaks at three files (last.pt, its temp during a save, best.pt)."""
    from train.retention import peak_checkpoint_files

    b = compute(BudgetInputs(packed_bytes=0, packed_files=0, checkpoint_bytes=M, keep=0, quota_bytes=10 * G))
    assert b.rows[1].bytes == 3 * M == peak_checkpoint_files(0) * M
    assert peak_checkpoint_files(3) == 5
