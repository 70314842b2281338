"""The streaming shard reader: partition math, exactly-once coverage across ranks x
workers, exact resume (also onto another number of ranks), and refusal of bad shards.

Ranks are simulated by building one dataset per rank (rank/world_size arguments);
workers are real DataLoader worker processes. Shards come from the real packer."""
from __future__ import annotations

import io
import os
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from shardship.errors import ShardshipError
from shardship.split import split_sessions
from tests.datasets import make_packed
from train.data import ShardDataset, load_index, make_loader, partition, verify_shards
from train.data.dataset import unwrap_worker_error


# ------------------------------------------------------------------ pure math
@pytest.mark.parametrize("seed,epoch", [(0, 0), (3, 7)])
def test_epoch_order_is_a_seeded_permutation_grouped_by_window(seed: int, epoch: int) -> None:
    counts = np.array([5, 3, 8, 1, 6, 4, 7, 2, 9, 3, 5])
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    shard_of = np.repeat(np.arange(len(counts)), counts)
    order = partition.epoch_order(counts, seed, epoch, window=3)
    assert sorted(order.tolist()) == list(range(counts.sum()))
    assert np.array_equal(order, partition.epoch_order(counts, seed, epoch, window=3))
    assert not np.array_equal(order, partition.epoch_order(counts, seed, epoch + 1, window=3))
    # windows of 3 shards: taking shards in order of first appearance, each group of 3
    # occupies one contiguous stretch of the order (reads stay within 3 files at a time)
    shards_in_order = list(dict.fromkeys(shard_of[order].tolist()))
    assert sorted(shards_in_order) == list(range(len(counts)))
    pos = 0
    for g in range(0, len(shards_in_order), 3):
        group = shards_in_order[g:g + 3]
        n = int(counts[group].sum())
        assert set(shard_of[order[pos:pos + n]].tolist()) == set(group)
        pos += n
    assert starts[0] == 0


@pytest.mark.parametrize("n,world,batch", [(97, 2, 5), (97, 3, 4), (60, 4, 3), (11, 3, 4), (5, 2, 4)])
@pytest.mark.parametrize("tail", ["drop", "pad"])
def test_rank_batches_cover_the_stream_once_with_equal_counts(n: int, world: int, batch: int, tail: str) -> None:
    g = world * batch
    for consumed in sorted({c for c in (0, g, 2 * g, n - n % g) if c <= n}):
        per_rank = [partition.rank_batches(n, consumed, world, r, batch, tail) for r in range(world)]
        assert len({len(b) for b in per_rank}) == 1, "every rank must get the same number of batches"
        steps = len(per_rank[0])
        assert steps == partition.steps_left(n, consumed, world, batch, tail)
        got = np.concatenate([b.ravel() for b in per_rank])
        real = np.sort(got[got >= 0])
        if tail == "drop":
            assert (got >= 0).all()
            assert np.array_equal(real, np.arange(consumed, consumed + steps * g))
            assert n - (consumed + steps * g) < g  # what is dropped is less than one global batch
        else:
            assert np.array_equal(real, np.arange(consumed, n))
        # step k of every rank is a block of the global stream: after k steps the
        # consumed positions are a prefix
        for k in range(steps):
            step_pos = np.concatenate([b[k] for b in per_rank])
            step_real = np.sort(step_pos[step_pos >= 0])
            assert np.array_equal(step_real, np.arange(consumed + k * g, min(n, consumed + (k + 1) * g)))


def test_workers_take_batches_round_robin() -> None:
    batches = partition.rank_batches(100, 0, 2, 1, 4, "drop")  # 12 batches
    parts = [partition.worker_batches(batches, w, 5) for w in range(5)]
    assert [len(p) for p in parts] == [3, 3, 2, 2, 2]
    # DataLoader's in-order round robin over the workers gives back the rank's order
    merged = [parts[k % 5][k // 5] for k in range(len(batches))]
    assert np.array_equal(np.stack(merged), batches)


def test_resume_math_two_ranks_onto_three() -> None:
    n, b = 103, 4
    order = partition.epoch_order(np.array([10, 20, 30, 43]), 0, 0)
    seen = []
    k = 5
    for r in range(2):
        seen += order[partition.rank_batches(n, 0, 2, r, b)[:k].ravel()].tolist()
    consumed = partition.advance(0, k, 2, b, n)
    assert consumed == 40
    for r in range(3):
        seen += order[partition.rank_batches(n, consumed, 3, r, b).ravel()].tolist()
    assert len(seen) == len(set(seen)), "a sample repeated"
    assert sorted(seen) == sorted(order[:len(seen)].tolist()), "not a prefix of the epoch"
    assert n - len(seen) < 3 * b


def test_split_sessions_is_stable_and_by_session() -> None:
    names = [f"s{i}" for i in range(10)]
    tr, va = split_sessions(names, 0.2, seed=0)
    assert len(va) == 2 and not set(tr) & set(va) and sorted(tr + va) == names
    tr2, va2 = split_sessions(names + ["s10"], 0.2, seed=0)
    assert set(va) & set(va2), "adding a session should not reshuffle the held-out ones"
    assert split_sessions(["only"], 0.5, 0) == (["only"], [])
    assert split_sessions(names, 0.1, 0, val_sessions=["s3"])[1] == ["s3"]
    with pytest.raises(ShardshipError, match="nope"):
        split_sessions(names, 0.1, 0, val_sessions=["nope"])


# ------------------------------------------------------------------ with real shards
@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 sessions x 32 frames, ~3 samples per shard: 33 shards (odd, not divisible by
    2 x 2 or 3 x 2)."""
    return make_packed(tmp_path_factory.mktemp("reader"), sessions=3, frames=32, seed=1, shard_bytes=100_000)


def _collect(index, world: int, workers: int, batch: int, tail: str = "drop", epoch: int = 0, consumed: int = 0,
             max_batches: int | None = None) -> list[list[dict]]:
    """Batches per rank, each rank through a real DataLoader with `workers` processes."""
    out = []
    for r in range(world):
        ds = ShardDataset(index, batch, rank=r, world_size=world, seed=5, window=4, tail=tail)
        ds.set_state(epoch, consumed)
        got = []
        for bt in make_loader(ds, workers, seed=0):
            got.append({k: bt[k].numpy().copy() for k in ("index", "position", "weight", "action", "image")})
            if max_batches is not None and len(got) == max_batches:
                break
        out.append(got)
    return out


@pytest.mark.parametrize("world,workers", [(2, 2), (3, 2)])
def test_every_sample_once_across_ranks_and_workers(packed: Path, world: int, workers: int) -> None:
    index = load_index(packed)
    assert index.n_shards % (world * workers) != 0
    batch = 5
    g = world * batch
    per_rank = _collect(index, world, workers, batch)
    assert len({len(b) for b in per_rank}) == 1, "ranks got different batch counts (DDP would hang)"
    steps = len(per_rank[0])
    assert steps == index.n_samples // g
    seen = np.concatenate([b["index"] for rank in per_rank for b in rank])
    assert len(seen) == len(set(seen.tolist())), "a sample appeared twice"
    order = partition.epoch_order(index.counts, 5, 0, 4)
    assert set(seen.tolist()) == set(order[:steps * g].tolist())
    dropped = index.n_samples - len(seen)
    assert dropped == index.n_samples % g and dropped < g
    # stream order: rank r's k-th batch is block r of global step k, whatever the worker count
    for r, rank in enumerate(per_rank):
        for k, b in enumerate(rank):
            assert np.array_equal(b["position"], k * g + r * batch + np.arange(batch))
            assert np.array_equal(b["index"], order[b["position"]])

    # pad instead of drop: every sample exactly once with weight 1, padding weight 0
    per_rank = _collect(index, world, workers, batch, tail="pad")
    assert len({len(b) for b in per_rank}) == 1
    idx = np.concatenate([b["index"] for rank in per_rank for b in rank])
    w = np.concatenate([b["weight"] for rank in per_rank for b in rank])
    assert sorted(idx[w > 0].tolist()) == list(range(index.n_samples))


def test_samples_match_the_tar_members(packed: Path) -> None:
    """What the reader decodes is what `tarfile` + PIL read from the same shard."""
    index = load_index(packed)
    ds = ShardDataset(index, 4, seed=1)
    batch = next(iter(ds))
    import json

    for i, si in enumerate(batch["index"].tolist()):
        key = index.key(si)
        with tarfile.open(index.shard_path(int(index.shard[si]))) as tf:
            jpg = tf.extractfile(f"{key}.jpg").read()
            meta = json.loads(tf.extractfile(f"{key}.json").read())
        img = np.asarray(Image.open(io.BytesIO(jpg)).convert("RGB"))
        assert np.array_equal(batch["image"][i].numpy(), img)
        assert np.allclose(batch["action"][i].numpy(), np.asarray(meta["action"], dtype=np.float32))
        assert np.allclose(batch["proprio"][i].numpy(), np.asarray(meta["proprio"], dtype=np.float32))
    assert batch["image"].dtype == np.uint8 or str(batch["image"].dtype) == "torch.uint8"
    # per-sample index columns are numpy buffers (no per-sample Python objects to copy-on-write)
    for name in ("shard", "jpg_offset", "jpg_size", "json_offset", "json_size", "session", "keys"):
        assert isinstance(getattr(index, name), np.ndarray)
    assert index.keys.dtype.kind == "S"


def test_resume_after_k_batches_yields_exactly_the_rest(packed: Path) -> None:
    index = load_index(packed)
    world, batch, k = 2, 4, 3
    first = _collect(index, world, 2, batch, max_batches=k)
    state = ShardDataset(index, batch, 0, world, seed=5, window=4).state_dict()
    consumed = partition.advance(0, k, world, batch, index.n_samples)
    state.update(epoch=0, consumed=consumed)
    rest = []
    for r in range(world):
        ds = ShardDataset(index, batch, rank=r, world_size=world, seed=0, window=4)
        assert ds.load_state_dict(state)
        assert ds.seed == 5 and ds.consumed == consumed
        rest.append([b["index"].numpy() for b in make_loader(ds, 2)])
    full = _collect(index, world, 2, batch)
    before = np.concatenate([b["index"] for rank in first for b in rank])
    after = np.concatenate([b for rank in rest for b in rank])
    everything = np.concatenate([b["index"] for rank in full for b in rank])
    assert len(set(before.tolist()) & set(after.tolist())) == 0
    assert sorted(np.concatenate([before, after]).tolist()) == sorted(everything.tolist())
    # rank by rank, the resumed batches are exactly the uninterrupted run's remaining batches
    for r in range(world):
        assert len(rest[r]) == len(full[r]) - k
        for a, b in zip(rest[r], full[r][k:]):
            assert np.array_equal(a, b["index"])


def test_resume_from_two_ranks_onto_three(packed: Path) -> None:
    index = load_index(packed)
    batch, k = 4, 4
    first = _collect(index, 2, 2, batch, max_batches=k)
    consumed = partition.advance(0, k, 2, batch, index.n_samples)
    second = _collect(index, 3, 1, batch, consumed=consumed)
    assert len({len(b) for b in second}) == 1
    seen = np.concatenate([b["index"] for rank in first + second for b in rank])
    assert len(seen) == len(set(seen.tolist())), "a sample repeated after changing ranks"
    order = partition.epoch_order(index.counts, 5, 0, 4)
    assert set(seen.tolist()) == set(order[:len(seen)].tolist()), "a sample was lost before the tail"
    assert index.n_samples - len(seen) == (index.n_samples - consumed) % (3 * batch)


# ------------------------------------------------------------------ bad input
def test_sha256_mismatch_is_refused_with_the_shard_name(packed: Path, tmp_path: Path) -> None:
    bad = shutil.copytree(packed, tmp_path / "packed")
    index = load_index(bad)
    victim = index.shard_path(7)
    data = bytearray(victim.read_bytes())
    data[int(index.jpg_offset[index.starts[7]]) + 100] ^= 0xFF  # same size, one byte flipped
    victim.write_bytes(bytes(data))
    with pytest.raises(ShardshipError, match=f"{victim.name}.*sha256"):
        verify_shards(index)
    # the same refusal from inside a DataLoader worker (lazy check in the worker process)
    ds = ShardDataset(index, 8, window=100)
    with pytest.raises(ShardshipError) as err:
        for _ in make_loader(ds, 2):
            pass
    msg = str(unwrap_worker_error(err.value))
    assert victim.name in msg and "sha256" in msg and "\n" not in msg


@pytest.mark.timeout(120)
def test_truncated_shard_raises_a_clear_error_not_a_hang(packed: Path, tmp_path: Path) -> None:
    bad = shutil.copytree(packed, tmp_path / "packed")
    index = load_index(bad)
    victim = index.shard_path(4)
    size = victim.stat().st_size
    os.truncate(victim, size // 2)
    with pytest.raises(ShardshipError, match=f"{victim.name}.*truncated"):
        verify_shards(index)
    # without the up-front check, the read itself notices (in a worker process)
    ds = ShardDataset(index, 8, window=100, verify=False)
    with pytest.raises(ShardshipError) as err:
        for _ in make_loader(ds, 2):
            pass
    msg = str(unwrap_worker_error(err.value))
    assert victim.name in msg and "truncated" in msg


def test_missing_shard_with_zst_says_unpack(packed: Path, tmp_path: Path) -> None:
    bad = shutil.copytree(packed, tmp_path / "packed")
    index = load_index(bad)
    victim = index.shard_path(0)
    zst = victim.with_name(victim.name + ".zst")
    victim.unlink()
    if not zst.exists():
        zst.write_bytes(b"placeholder")
    with pytest.raises(ShardshipError, match=f"{victim.name}.*missing.*unpack"):
        verify_shards(index)


# ------------------------------------------------------------------ decoding fast paths
def test_jpeg_fast_path_matches_pil_and_falls_back() -> None:
    from train.data import decode

    rng = np.random.default_rng(1)
    img = (rng.random((30, 50, 3)) * 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=85)
    data = buf.getvalue()
    assert decode.jpeg_frame(data) == (50, 30, 3)
    want = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    assert np.array_equal(decode.decode_jpeg(data, 50, 30), want)
    assert decode._fast_jpeg_ok is True, "the direct decoder should work with pillow-simd"
    # grayscale and other sizes take the general path (and still give RGB)
    gray = io.BytesIO()
    Image.fromarray(img[..., 0]).save(gray, format="JPEG")
    assert decode.jpeg_frame(gray.getvalue())[2] == 1
    assert decode.decode_jpeg(gray.getvalue(), 50, 30).shape == (30, 50, 3)
    assert decode.decode_jpeg(data, 64, 64).shape == (30, 50, 3)  # caller sees the mismatch
    with pytest.raises((OSError, ValueError, SyntaxError)):
        decode.decode_jpeg(data[: len(data) // 2], 50, 30)


def test_decode_into_batch_slot_matches_pil() -> None:
    """The mapped path (decoder -> RGBX buffer -> OpenCV into the slot) gives PIL's
    pixels, in a slot of a larger batch array; other layouts fall back; a wrong size
    or broken data is an error, never a silently wrong slot."""
    from train.data import decode

    rng = np.random.default_rng(2)
    img = (rng.random((30, 50, 3)) * 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=85)
    data = buf.getvalue()
    want = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    batch = np.zeros((3, 2, 30, 50, 3), dtype=np.uint8)
    decode.decode_jpeg_into(memoryview(data), batch[1, 0])
    assert decode._mapped_ok is True, "the mapped decoder should work with pillow-simd + OpenCV"
    assert np.array_equal(batch[1, 0], want)
    assert not batch[0].any() and not batch[1, 1].any() and not batch[2].any()  # neighbours untouched
    gray = io.BytesIO()
    Image.fromarray(img[..., 0]).save(gray, format="JPEG")
    slot = np.zeros((30, 50, 3), dtype=np.uint8)
    decode.decode_jpeg_into(gray.getvalue(), slot)  # 1 component: general path, still RGB
    assert np.array_equal(slot, np.asarray(Image.open(io.BytesIO(gray.getvalue())).convert("RGB")))
    with pytest.raises(ValueError, match="50x30, index.json says 64x64"):
        decode.decode_jpeg_into(data, np.zeros((64, 64, 3), dtype=np.uint8))
    with pytest.raises((OSError, ValueError, SyntaxError)):
        decode.decode_jpeg_into(data[: len(data) // 2], slot)


@pytest.mark.timeout(120)
def test_workers_fork_after_the_parent_decoded(packed: Path) -> None:
    """The parent decodes frames itself (num_workers=0: eval, your own loop), then
    forks workers epoch after epoch (OpenCV state crosses the fork: a worker that
    reconfigured OpenCV's threads itself hung every epoch during development).
    Both paths give the same batches."""
    index = load_index(packed)
    ds = ShardDataset(index, 4, seed=3, window=4, tail="pad")
    inline = [b["image"].clone() for b in make_loader(ds, 0)]
    for _ in range(2):
        forked = [b["image"] for b in make_loader(ds, 2)]
        assert len(forked) == len(inline)
        assert all(torch.equal(a, b) for a, b in zip(inline, forked, strict=True))


def test_json_fast_path_matches_json_loads() -> None:
    import json

    from train.data.decode import sample_arrays

    rng = np.random.default_rng(2)
    doc = {"session": "s", "frame": 3, "pose": rng.random((4, 4)).tolist(), "proprio": rng.random(4).tolist(),
           "action": (rng.random((5, 13)) * 1e-4 - 3e-5).tolist(), "action_mask": [1, 1, 1, 0, 0]}
    compact = json.dumps(doc, separators=(",", ":")).encode()
    pretty = json.dumps(doc, indent=2).encode()  # not what the packer writes: general path
    for raw in (compact, pretty):
        got = sample_arrays(raw, 5, 13, 4)
        assert np.array_equal(got["action"], np.asarray(doc["action"], dtype=np.float32))
        assert np.array_equal(got["proprio"], np.asarray(doc["proprio"], dtype=np.float32))
        assert got["action_mask"].tolist() == [1, 1, 1, 0, 0]
    with pytest.raises(ValueError):
        sample_arrays(compact, 6, 13, 4)
    with pytest.raises(ValueError, match="null"):
        sample_arrays(json.dumps({**doc, "action": None}).encode(), 5, 13, 4)
