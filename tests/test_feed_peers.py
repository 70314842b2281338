"""bench/feed_peers.py: each peer's 2-frame feed holds shardship's 2-frame
"inside" sample set (less at most each worker's drop_last remainder), its first
batch shows exactly the pixels shardship's decoder gives for frames t-1 and t,
and its labels are the ones shardship's reader gives. A peer that is not
installed (litdata, mosaic: `sh scripts/install_bench_peers.sh`) is skipped."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench import feed_peers
from tests.datasets import make_packed
from train.data import ShardDataset, labels, load_index
from train.data.decode import decode_jpeg_into
from train.data.index import ShardIndex
from train.data.obs import anchors

BATCH, WORKERS = 8, 2


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_packed(tmp_path_factory.mktemp("feed"), sessions=2, frames=40, seed=4, shard_bytes=150_000)


def _frame(index: ShardIndex, i: int) -> np.ndarray:
    with open(index.shard_path(int(index.shard[i])), "rb") as f:
        f.seek(int(index.jpg_offset[i]))
        jpg = f.read(int(index.jpg_size[i]))
    w, h = index.image_size
    out = np.empty((h, w, 3), np.uint8)
    decode_jpeg_into(jpg, out)
    return out


@pytest.mark.parametrize("name", feed_peers.PEERS)
def test_peer_feeds_the_inside_windows(name: str, packed: Path, tmp_path: Path) -> None:
    try:
        note = feed_peers.prepare(name, packed, tmp_path)
    except RuntimeError as e:
        if "not installed" not in str(e):
            raise
        pytest.skip(str(e))
    assert isinstance(note, str)
    index = load_index(packed)
    want = anchors(index, 2, "inside")
    w, h = index.image_size
    batches = list(feed_peers.loader(name, tmp_path, batch=BATCH, workers=WORKERS, seed=0))
    assert batches
    for b in batches:
        assert tuple(b["image"].shape) == (BATCH, 2, h, w, 3) and str(b["image"].dtype) == "torch.uint8"
        assert tuple(b["action"].shape) == (BATCH, index.horizon, index.action_dim)
    seen = np.concatenate([b["index"].numpy() for b in batches])
    assert len(set(seen.tolist())) == len(seen) and set(seen.tolist()) <= set(want.tolist())
    assert 0 <= len(want) - len(seen) < WORKERS * BATCH  # drop_last: at most each worker's remainder

    first = {k: v.numpy() for k, v in batches[0].items()}
    for row, i in enumerate(first["index"].tolist()):
        assert np.array_equal(first["image"][row, 0], _frame(index, i - 1))
        assert np.array_equal(first["image"][row, 1], _frame(index, i))
    ds = ShardDataset(index, BATCH, obs_horizon=2, edges="inside")
    s = first["index"]
    ref = labels.window(ds.labels, s, np.stack([s - 1, s], axis=1), ds._joint_fill)
    for k in ("action", "action_mask", "proprio"):
        np.testing.assert_allclose(first[k], ref[k], atol=1e-6, err_msg=k)


def test_unprepared_or_unknown_peer_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown peer"):
        feed_peers.loader("tfrecord", tmp_path)
    with pytest.raises(FileNotFoundError, match="not prepared"):
        feed_peers.loader("webdataset", tmp_path)
