"""The three ways batches reach the device (train.feed): the decoded-frame cache
(on the device, or in host shared memory), the streaming reader decoding in its
workers, and the streaming reader handing JPEG bytes to a decoder outside the
workers (nvJPEG on a GPU; on this CPU, the workers' decoder). Same seed, same
step: the same batch, to the byte. On data from the real packer."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from shardship.errors import ShardshipError
from tests.datasets import make_packed
from train.config import TrainConfig
from train.data import ShardDataset, load_index, partition
from train.data import cache as frame_cache
from train.feed import Feed, open_feed

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_packed(tmp_path_factory.mktemp("feed"), sessions=2, frames=40, seed=4, shard_bytes=150_000)


def _feed(ds: ShardDataset, how: str) -> Feed:
    if how in ("gpu", "host"):
        return open_feed(ds, TrainConfig(cache=how), CPU, say=False)
    return Feed(mode=how, why="", device=CPU, num_workers=2, on_device=how == "bytes")


def _epoch(feed: Feed, ds: ShardDataset) -> list[dict[str, np.ndarray]]:
    return [{k: v.contiguous().numpy().copy() for k, v in b.items()} for b in feed.epoch(ds, seed=1)]


@pytest.mark.parametrize("obs_horizon", [2, None])
def test_cached_streamed_and_device_decoded_batches_are_identical(packed: Path, obs_horizon: int | None) -> None:
    index = load_index(packed)
    got = {}
    for how in ("streaming", "bytes", "host", "gpu"):
        ds = ShardDataset(index, 8, seed=5, obs_horizon=obs_horizon, edges="inside", run_length=2)
        ds.set_state(epoch=1)
        got[how] = _epoch(_feed(ds, how), ds)
    ref = got["streaming"]
    assert len(ref) == ds.steps_per_epoch() > 3
    first = ref[0]
    shape = (8, 2, 3, 224, 224) if obs_horizon else (8, 224, 224, 3)
    assert first["image"].shape == shape and first["image"].std() > 10  # real pictures, not zeros
    for how, batches in got.items():
        assert len(batches) == len(ref), how
        for step, (a, b) in enumerate(zip(batches, ref, strict=True)):
            assert sorted(a) == sorted(b), (how, sorted(a), sorted(b))
            for k in b:
                assert np.array_equal(a[k], b[k]), f"{how}: step {step}: {k} differs from the streaming reader's"


def test_runs_of_consecutive_samples_share_decoded_frames(packed: Path) -> None:
    """With runs of 2 and a 2-frame window, a batch of 8 needs ~12 distinct frames, not 16."""
    index = load_index(packed)
    ds = ShardDataset(index, 8, seed=5, obs_horizon=2, edges="inside", run_length=2)
    order = ds.order()
    distinct = [len(np.unique(ds.frames_of(order, pos)[2])) for pos in ds.my_batches()]
    assert np.mean(distinct) <= 13, distinct
    plain = ShardDataset(index, 8, seed=5, obs_horizon=2, edges="inside")
    order = plain.order()
    assert np.mean([len(np.unique(plain.frames_of(order, pos)[2])) for pos in plain.my_batches()]) > 14


def test_resume_with_the_cache_yields_exactly_the_rest_of_the_epoch(packed: Path) -> None:
    index = load_index(packed)
    ds = ShardDataset(index, 4, seed=2, obs_horizon=2, edges="inside", run_length=2)
    feed = _feed(ds, "host")
    full = _epoch(feed, ds)
    k = 3
    ds.set_state(epoch=0, consumed=k * 4)
    rest = _epoch(feed, ds)
    assert len(rest) == len(full) - k
    for a, b in zip(rest, full[k:], strict=True):
        assert all(np.array_equal(a[key], b[key]) for key in b)


def test_every_rank_gets_the_same_number_of_cached_batches_and_no_sample_twice(packed: Path) -> None:
    index = load_index(packed)
    seen, counts = [], []
    for rank in range(3):
        ds = ShardDataset(index, 4, rank=rank, world_size=3, seed=9, obs_horizon=2, edges="inside", run_length=2)
        batches = _epoch(_feed(ds, "gpu"), ds)
        counts.append(len(batches))
        seen += [i for b in batches for i in b["index"].tolist()]
    assert len(set(counts)) == 1 and counts[0] > 0
    assert len(seen) == len(set(seen)) == counts[0] * 12


def test_auto_streams_when_the_frames_do_not_fit(packed: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    index = load_index(packed)
    ds = ShardDataset(index, 4, seed=2, obs_horizon=2)
    need = frame_cache.cache_bytes(ds)
    assert need == index.n_samples * 224 * 224 * 3
    monkeypatch.setattr(frame_cache, "host_available", lambda: need + (4 << 30) - 1)  # 4 GiB are left to the processes
    feed = open_feed(ds, TrainConfig(cache="auto"), CPU)
    line = capsys.readouterr().err
    assert feed.cache is None and feed.mode == "streaming", feed
    assert "frames: streaming:" in line and "do not fit" in line and "streaming from the shards" in line, line
    monkeypatch.setattr(frame_cache, "host_available", lambda: need + (6 << 30))
    feed = open_feed(ds, TrainConfig(cache="auto"), CPU)
    assert feed.mode == "host cache" and feed.cache is not None and "frames: host cache:" in capsys.readouterr().err
    assert frame_cache.choose("off", need, CPU)[0] == "off"


def test_a_frame_that_does_not_decode_is_named_when_the_cache_is_filled(packed: Path, tmp_path: Path) -> None:
    data = tmp_path / "packed"
    shutil.copytree(packed, data)
    index = load_index(data)
    i = 5
    with open(index.shard_path(int(index.shard[i])), "r+b") as f:  # garble the scan data of one JPEG
        f.seek(int(index.jpg_offset[i]) + 700)
        f.write(b"\xff\xd9" * 64)
    ds = ShardDataset(index, 4, obs_horizon=2, verify=False)
    with pytest.raises(ShardshipError) as e:
        frame_cache.build(ds, "host", CPU)
    name = index.shard_names[int(index.shard[i])]
    assert f"shard {name}: sample {index.key(i)}: JPEG does not decode" in str(e.value), str(e.value)
    with pytest.raises(ShardshipError) as e:  # the bytes handed out of the workers, decoded here
        for _ in _feed(ds, "bytes").epoch(ds):
            pass
    assert f"shard {name}: sample {index.key(i)}: JPEG does not decode" in str(e.value), str(e.value)


def test_epoch_order_in_runs_is_a_permutation_that_keeps_each_run_together() -> None:
    counts = np.array([5, 7, 3, 9])
    for run in (1, 2, 3, 4):
        order = partition.epoch_order(counts, 3, 1, window=2, run=run)
        assert sorted(order.tolist()) == list(range(int(counts.sum())))
    assert np.array_equal(partition.epoch_order(counts, 3, 1, 2, run=1), partition.epoch_order(counts, 3, 1, 2))
    order = partition.epoch_order(counts, 3, 1, window=8, run=3)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    heads = [k for k in range(len(order)) if k == 0 or order[k] != order[k - 1] + 1]
    for k in heads:  # every run starts at a multiple of 3 into its shard
        s = int(np.searchsorted(starts, order[k], side="right") - 1)
        assert (order[k] - starts[s]) % 3 == 0


def test_readers_and_feeds_leave_no_file_descriptor_open(packed: Path) -> None:
    """The labels are read in the parent: its descriptors are closed after, and a
    reader dropped without close() closes its own (a suite of hundreds of readers in
    one process ran out of select()'s 1,024 descriptors)."""
    import gc
    import os

    index = load_index(packed)
    before = len(os.listdir("/proc/self/fd"))
    for how in ("streaming", "bytes", "host", "gpu", "streaming"):
        ds = ShardDataset(index, 4, obs_horizon=2, run_length=2)
        for _ in _feed(ds, how).epoch(ds):
            break
        it = iter(ds)  # in-process iteration opens shards through ds.files
        next(it)
        del it, ds
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= before, os.listdir("/proc/self/fd")
