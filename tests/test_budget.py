"""packer budget: exact arithmetic, suggestions that actually close the gap, and
the CLI's exit code 3 when over."""
from __future__ import annotations

import subprocess
import sys

import pytest

from shardship.units import parse_size
from train.budget import BudgetInputs, compute, render

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


# ---------------------------------------------------------------- the decoded-frame cache ([train] cache)
def test_cache_bytes_is_frames_times_width_height_rgb():
    from train.cachesize import cache_bytes

    assert cache_bytes(63_000, 224, 224) == 63_000 * 224 * 224 * 3 == 9_483_264_000
    assert cache_bytes(1, 320, 240) == 320 * 240 * 3
    assert cache_bytes(0, 224, 224) == 0
    with pytest.raises(ValueError):
        cache_bytes(-1, 224, 224)


def test_cache_counts_the_posed_frames_of_the_training_sessions_only():
    from tests.datasets import index_doc
    from train.cachesize import for_train, training_cache

    doc = index_doc({"a": (100, 16), "b": (50, 16), "c": (30, 0)}, size=[320, 240])
    held_b = training_cache(doc, val_sessions=["b"])
    assert held_b.frames == 130 and held_b.sessions == ("a", "c")  # unposed frames are never read
    assert (held_b.width, held_b.height) == (320, 240) and held_b.bytes == 130 * 320 * 240 * 3
    assert training_cache(doc, val_fraction=0).frames == 180
    # the [train] table's split settings, the trainer's defaults where it gives none
    assert for_train(doc, {"val_sessions": ["b"]}) == held_b
    assert for_train(doc, {}) == training_cache(doc)
    # copies of one recording (content_key) go to one side together, as in the trainer
    copies = index_doc({"a": (10, 0), "a2": (10, 0), "b": (5, 0)}, content={"a": "k", "a2": "k"})
    assert training_cache(copies, val_sessions=["a"]).sessions == ("b",)


def test_cache_agrees_with_the_trainers_split_and_reader(tmp_path):
    """The trainer's own numbers: its ShardIndex's training sessions, samples and frame size."""
    from shardship.format import index as fmt
    from shardship.split import split_sessions
    from tests.datasets import make_packed
    from train.cachesize import cache_bytes, for_train
    from train.data import load_index

    out = make_packed(tmp_path, sessions=4, frames=24, seed=3)
    index = load_index(out)
    for train in ({}, {"val_fraction": 0.5, "seed": 7}, {"val_sessions": [index.sessions_present()[0]]}):
        names, _ = split_sessions(index.sessions_present(), float(train.get("val_fraction", 0.1)),
                                  int(train.get("seed", 0)), train.get("val_sessions"), index.session_content)
        ix = index.select_sessions(names)
        size = for_train(fmt.load(out), train)
        assert size.sessions == tuple(names) and size.frames == ix.n_samples
        assert size.bytes == cache_bytes(ix.n_samples, *ix.image_size)


def test_budget_shows_the_cache_as_memory_not_in_the_disk_total():
    from train.cachesize import CacheSize

    base = dict(packed_bytes=717 * M, packed_files=91, checkpoint_bytes=100 * M, keep=3, quota_bytes=10 * G)
    cache = CacheSize(63_000, 224, 224, ("a",))
    without = compute(BudgetInputs(**base))
    b = compute(BudgetInputs(**base, cache=cache, cache_mode="auto"))
    assert (b.total, b.headroom, b.over) == (without.total, without.headroom, without.over)
    assert all("cache" not in r.item for r in b.rows)
    text = render(b, "--quota")
    line = text.splitlines()[-1]
    assert line.startswith("decoded-frame cache: 8.8 GB of memory (host shared memory or GPU; not on disk")
    assert '[train] cache = "auto"' in line and "63,000 training frames x 224x224x3" in line
    host = render(compute(BudgetInputs(**base, cache=cache, cache_mode="host")), "q")
    assert "8.8 GB of memory (host shared memory, one copy per node" in host
    gpu = render(compute(BudgetInputs(**base, cache=cache, cache_mode="gpu")), "q")
    assert "8.8 GB of memory (GPU memory, one copy per GPU" in gpu
    off = render(compute(BudgetInputs(**base, cache=cache, cache_mode="off")), "q").splitlines()[-1]
    assert off.startswith('decoded-frame cache: off ([train] cache = "off"')
    assert "decoded-frame cache" not in render(without, "q")


def test_cli_prints_the_cache_line(tmp_path):
    pytest.importorskip("train.model")
    from tests.datasets import make_packed

    out = make_packed(tmp_path, sessions=1, frames=20, seed=1)
    cfg = tmp_path / "shardship.toml"
    for mode, words in (("auto", "decoded-frame cache: "), ("off", 'decoded-frame cache: off ([train] cache = "off"')):
        cfg.write_text(f'[train]\ncache = "{mode}"\n')
        res = subprocess.run([sys.executable, "-m", "packer", "budget", "--out", str(out), "--quota", "10G",
                              "--config", str(cfg)], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        assert words in res.stdout and "fits" in res.stdout, res.stdout
    cfg.write_text('[train]\ncache = "disk"\n')
    bad = subprocess.run([sys.executable, "-m", "packer", "budget", "--out", str(out), "--config", str(cfg)],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "cache must be auto, gpu, host, off" in bad.stderr, bad.stderr
