"""Multi-frame observations (obs_horizon), relative proprio, session edges and
normalisation, checked against the shards themselves (tarfile + JSON), on data
from the real packer. Small shards, so a frame's t-1 often sits in the previous
shard."""
from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from packer.actions import OBS_STATS_STEPS
from shardship.errors import ShardshipError
from shardship.format import index as fmt
from tests.datasets import make_packed
from train.data import ShardDataset, load_index, make_loader, partition
from train.data.index import ShardIndex
from train.data.normalize import make_normalizer, obs_summary

IDENTITY = [0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0]  # zero position, rot6d(I)


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_packed(tmp_path_factory.mktemp("obs"), sessions=2, frames=40, seed=4, shard_bytes=150_000)


def _member(index: ShardIndex, i: int, ext: str) -> bytes:
    with tarfile.open(index.shard_path(int(index.shard[i]))) as tf:
        f = tf.extractfile(f"{index.key(i)}.{ext}")
        assert f is not None
        return f.read()


def _epoch(ds: ShardDataset, workers: int = 0) -> list[dict]:
    return [{k: v.numpy().copy() for k, v in b.items()} for b in make_loader(ds, workers)]


def test_t_minus_1_is_the_previous_frames_jpeg_byte_for_byte(packed: Path) -> None:
    index = load_index(packed)
    ds = ShardDataset(index, 8, seed=2, obs_horizon=2, edges="inside")
    crossed = 0
    for b in _epoch(ds, workers=2):
        for row, i in enumerate(b["index"].tolist()):
            prev = i - 1
            assert index.session[prev] == index.session[i]
            frame = int(index.key(i).rsplit("/", 1)[1])
            assert index.key(prev).endswith(f"/{frame - 1:06d}")  # stride 1: the previous raw frame
            jpg_prev = _member(index, prev, "jpg")
            assert bytes(ds.files.read_many([prev, i])[0][0]) == jpg_prev  # the bytes the reader decodes
            img = np.asarray(Image.open(io.BytesIO(jpg_prev)).convert("RGB")).transpose(2, 0, 1)
            assert np.array_equal(b["image"][row, 0], img)
            cur = np.asarray(Image.open(io.BytesIO(_member(index, i, "jpg"))).convert("RGB")).transpose(2, 0, 1)
            assert np.array_equal(b["image"][row, 1], cur)
            crossed += int(index.shard[prev] != index.shard[i])
    assert crossed > 0, "no window reached into the previous shard: shrink shard_bytes"


def test_relative_proprio_is_identity_at_t_and_the_inverse_action_at_t_minus_1(packed: Path) -> None:
    index = load_index(packed)
    ds = ShardDataset(index, 16, seed=0, obs_horizon=2, edges="inside")
    b = next(iter(ds))
    p = b["proprio"].numpy()
    assert p.shape == (16, 2, 13) and b["image"].shape == (16, 2, 3, 224, 224)
    assert (p[:, 1, :9] == np.asarray(IDENTITY, np.float32)).all()  # exactly, not approximately
    for row, i in enumerate(b["index"].tolist()):
        cur, prev = (json.loads(_member(index, j, "json")) for j in (i, i - 1))
        assert p[row, 1, 9:] == pytest.approx(cur["proprio"], abs=1e-5)
        assert p[row, 0, 9:] == pytest.approx(prev["proprio"], abs=1e-5)
        # the packer's first action step of t-1 is t relative to t-1; its inverse is t-1 relative to t
        a = np.asarray(prev["action"][0], dtype=np.float64)
        r1 = np.stack([a[3:6], a[6:9], np.cross(a[3:6], a[6:9])], axis=1)
        assert p[row, 0, :3] == pytest.approx(-r1.T @ a[:3], abs=1e-4)
        assert p[row, 0, 3:9] == pytest.approx(np.concatenate([r1.T[:, 0], r1.T[:, 1]]), abs=1e-4)


def test_inside_windows_never_leave_the_session_and_mask_repeats_frame_t(packed: Path) -> None:
    index = load_index(packed)
    inside = ShardDataset(index, 4, seed=1, obs_horizon=3, edges="inside", tail="pad")
    got = _epoch(inside)
    idx = np.concatenate([b["index"][b["weight"] > 0] for b in got])
    per_session = np.bincount(index.session, minlength=len(index.session_names))
    assert len(idx) == sum(max(0, n - 2 - index.horizon) for n in per_session if n)  # the user's sample count
    assert all((b["action_mask"] == 1).all() and (b["obs_mask"] == 1).all() for b in got)
    assert (index.run_before[idx] >= 2).all() and (index.run_after[idx] >= index.horizon).all()

    masked = ShardDataset(index, 4, seed=1, obs_horizon=2, edges="mask", tail="pad")
    assert masked.n_samples == index.n_samples
    starts = set(np.flatnonzero(index.run_before == 0).tolist())
    seen_start = seen_end = False
    for b in _epoch(masked):
        for row, i in enumerate(b["index"].tolist()):
            if i in starts:  # the first frame: t-1 repeats frame t, flagged
                seen_start = True
                assert b["obs_mask"][row].tolist() == [0.0, 1.0]
                assert np.array_equal(b["image"][row, 0], b["image"][row, 1])
                assert b["proprio"][row, 0].tolist() == b["proprio"][row, 1].tolist()
            if index.run_after[i] < index.horizon:
                seen_end = True
                assert b["action_mask"][row].sum() == index.run_after[i]
    assert seen_start and seen_end


def test_minmax_maps_the_pack_time_min_and_max_to_minus_1_and_1(packed: Path) -> None:
    index = load_index(packed)
    st = index.stats["action"]
    lo, hi = np.asarray(st["min"]), np.asarray(st["max"])
    moving = hi - lo > 1e-6
    norm = make_normalizer(index.stats, "minmax", index.action_dim, index.proprio_dim, 2)
    assert norm.normalize_action(lo)[moving] == pytest.approx(-1.0, abs=1e-6)
    assert norm.normalize_action(hi)[moving] == pytest.approx(1.0, abs=1e-6)
    assert norm.unnormalize_action(norm.normalize_action(hi)) == pytest.approx(hi, abs=1e-5)
    ds = ShardDataset(index, 8, seed=0, obs_horizon=2, edges="inside", normalize="minmax")
    batches = _epoch(ds)
    acts = np.concatenate([b["action"] for b in batches])
    known = np.concatenate([b["joints_mask"] for b in batches]).reshape(-1).astype(bool)
    tol = 1e-6 / norm.action_scale + 1e-6  # sample JSON rounds to 1e-6; pack-time stats saw the unrounded values
    flat = np.abs(acts.reshape(-1, acts.shape[-1]))
    flat[~known, 9:] = 0.0  # a step whose joints the glove did not record is not scored on them
    assert (flat <= 1 + tol).all()  # real steps lie inside the packed range
    assert (np.abs(acts.reshape(-1, acts.shape[-1])[:, moving]).max(0) > 0.5).all()  # and use it
    z = make_normalizer(index.stats, "zscore", index.action_dim, index.proprio_dim, 2)
    assert z.action_offset == pytest.approx(st["mean"], abs=1e-6)


def test_pack_time_obs_stats_are_the_readers_proprio(packed: Path) -> None:
    """stats.obs (per backward offset, pooled for N = 2) describe exactly the proprio
    an edges="mask" reader yields (every frame, t-1 repeating t at the start)."""
    index = load_index(packed)
    assert len(index.stats["obs"]) == OBS_STATS_STEPS
    ds = ShardDataset(index, 8, seed=0, obs_horizon=2, edges="mask", tail="pad")
    props = np.concatenate([b["proprio"][b["weight"] > 0] for b in _epoch(ds)]).reshape(-1, 13)
    s = obs_summary(index.stats, 2, index.proprio_dim)
    assert s["min"] == pytest.approx(props.min(0), abs=1e-4)
    assert s["max"] == pytest.approx(props.max(0), abs=1e-4)
    assert s["mean"] == pytest.approx(props.mean(0), abs=1e-4)


def test_an_index_without_obs_or_minmax_stats_still_reads(packed: Path) -> None:
    """index.json from before stats.obs: proprio statistics derived; before min/max:
    minmax refused with what to do, zscore works."""
    doc = fmt.read(packed).doc
    old = json.loads(json.dumps(doc))
    old["stats"].pop("obs")
    for part in ("action", "proprio"):
        old["stats"][part].pop("min")
        old["stats"][part].pop("max")
    from train.data.index import index_from_doc

    ix = index_from_doc(old, packed)
    ds = ShardDataset(ix, 4, obs_horizon=2, normalize="zscore")
    assert next(iter(ds))["proprio"].shape == (4, 2, 13)
    with pytest.raises(ShardshipError, match="min/max"):
        ShardDataset(ix, 4, obs_horizon=2, normalize="minmax")


@pytest.mark.parametrize("edges", ["inside", "mask"])
def test_two_frame_resume_continues_the_stream_exactly(packed: Path, edges: str) -> None:
    """Two simulated ranks, 2 workers each: a reader restored from state_dict after
    k steps yields exactly the rest, with equal batch counts per rank."""
    index = load_index(packed)
    world, batch, k = 2, 3, 2

    def run(state: dict | None) -> list[list[np.ndarray]]:
        out = []
        for r in range(world):
            ds = ShardDataset(index, batch, r, world, seed=7, window=2, obs_horizon=2, edges=edges)
            if state is not None:
                assert ds.load_state_dict(state)
            out.append([np.stack([b["index"].numpy(), b["proprio"][:, 0, 0].numpy()]) for b in make_loader(ds, 2)])
        return out

    full = run(None)
    assert len({len(x) for x in full}) == 1
    ds0 = ShardDataset(index, batch, 0, world, seed=7, window=2, obs_horizon=2, edges=edges)
    state = dict(ds0.state_dict(), consumed=partition.advance(0, k, world, batch, ds0.n_samples))
    rest = run(state)
    for r in range(world):
        assert len(rest[r]) == len(full[r]) - k
        for a, b in zip(rest[r], full[r][k:], strict=True):
            assert np.array_equal(a, b)
    other = ShardDataset(index, batch, 0, world, seed=7, obs_horizon=2, edges="mask" if edges == "inside" else "inside")
    assert not other.load_state_dict(state)  # another sample set: the epoch starts over


def test_repack_adds_obs_stats_to_an_old_pack_without_re_encoding(packed: Path, tmp_path: Path) -> None:
    """A pack from before stats.obs: the next `packer pack` keeps every shard and
    adds the statistics (computed from poses and joints, no frame encoded)."""
    import shutil

    from packer.pack import pack
    from shardship.config import PackOptions

    raw, out = tmp_path / "raw", tmp_path / "packed"
    shutil.copytree(packed.parent / "raw", raw)
    shutil.copytree(packed, out)
    doc = fmt.read(out).doc
    want = doc["stats"]["obs"]
    for entry in doc["sessions"].values():
        entry["stats"].pop("obs")
    doc["stats"].pop("obs")
    fmt.save(out, doc)
    report = pack(raw, out, PackOptions(workers=1, shard_bytes=150_000), progress=False)
    assert report.packed == [] and sorted(report.reused) == sorted(doc["sessions"]) and report.images == 0
    again = fmt.read(out).doc
    assert again["stats"]["obs"] == want
    assert [s["sha256"] for s in again["shards"]] == [s["sha256"] for s in doc["shards"]]
