"""The `stack` preset's feed, done by shardship's peers, for `make bench` (issue 40):
what bench/feed.py times against shardship's reader, per CPU-second.

The sample set is shardship's `edges="inside"` with a 2-frame window
(`train.data.obs.anchors(index, 2, "inside")`: samples i with run_before >= 1
and run_after >= horizon). `prepare` writes, once and untimed, one item per such
sample into the peer's own format, uncompressed: the sample index i, the JPEG
bytes of frames i-1 and i and the sample JSON bytes of frames i-1 and i, exactly
as stored in the tar shards (no re-encoding); shards / chunks about as large as
the packed set's shards on average.

    litdata     litdata `BinaryWriter` chunks; read by `StreamingDataset(shuffle=True,
                seed=seed)` and `StreamingDataLoader(drop_last=True)` (litdata drops
                the remainder from its index: those items are never read)
    webdataset  tar shards (`webdataset.ShardWriter`, members `<i>.prev.jpg`, `<i>.jpg`,
                `<i>.prev.json`, `<i>.json`); read by `WebDataset(shardshuffle=<shards>,
                seed=seed)` (whole shards split between the workers), a 1000-item
                shuffle buffer (seed) and `.batched(batch, partial=False)` in the
                workers, then `WebLoader(batch_size=None)`
    mosaic      MosaicML MDS shards (`MDSWriter`); read by `StreamingDataset(shuffle=True,
                shuffle_seed=seed, batch_size=batch)` and a torch `DataLoader(drop_last=True)`

Every item of a batch, in the DataLoader worker that made the batch (`workers` of
them, forked as shardship's): both JPEGs decoded by `train.data.decode.decode_jpeg_into`
(shardship's own decoder: simplejpeg straight into the slot) into the item's own
(2, H, W, 3) uint8 array (t-1 first), both JSONs parsed by `json.loads`; action
(T, D), action_mask (T,), joints (2, J) float32 and poses (2, 4, 4) float64 of
t-1 and t taken from them (`decode_item`). This runs in the batch's collate_fn
(`columns_batch`, `tar_batch`), not per item as the peer reads it: a worker's
partial last batch, which drop_last discards, is then never decoded (decoded per
item, webdataset and mosaic decoded it and threw it away: 117 and 53 of the 309
items of a 3x120-frame set an epoch; shardship's reader with tail="drop" never
reads its dropped tail either). Collation is this module's own `collate`, counted:
`np.stack` per key (one copy of the pixels, as `default_collate`'s `torch.stack`
makes) and the relative proprio of the whole batch from the poses with shardship's
`train.data.labels.relative_poses`, as shardship's reader computes it per batch.
A batch: index (B,) int64, image (B, 2, H, W, 3) uint8, action (B, T, D),
action_mask (B, T), proprio (B, 2, 9 + J) float32 (each step's pose relative to
frame t, then its joints): shardship's layout, channels last. Not done here but
done by shardship: mean-filling of the joints of frames with `joints_valid: false`.

The peers' packages come from `scripts/install_bench_peers.sh` (.bench-peers/, put
on sys.path here, stubs for mosaic's never-called imports as bench/peers.py does);
`webdataset` is the training venv's own. Nothing here times anything."""
from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import shutil
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
from torch.utils.data import DataLoader

from bench.peers import PEERS_DIR, STUBBED, STUBS_DIR
from train.data import decode, load_index
from train.data.decode import decode_jpeg_into
from train.data.index import ShardIndex
from train.data.labels import relative_poses
from train.data.obs import anchors

PEERS: tuple[str, ...] = ("litdata", "webdataset", "mosaic")
MODULES = {"litdata": "litdata", "webdataset": "webdataset", "mosaic": "streaming"}
SHUFFLE_BUFFER = 1000  # webdataset's in-worker shuffle buffer (items), as bench/loader.py's row
Shape = tuple[int, int, int, int, int]  # height, width, horizon, action_dim, joints
Item = tuple[int, bytes, bytes, bytes, bytes]  # i, prev jpg, jpg, prev json, json

_mosaic: dict[str, Any] = {}  # local dir -> its one StreamingDataset in this process


# ------------------------------------------------------------------ import check
def _missing(module: str) -> bool:
    """Not installed: not found, or found only among the stubs (on sys.path already)."""
    spec = importlib.util.find_spec(module)
    return spec is None or (spec.origin is not None and STUBS_DIR in Path(spec.origin).parents)


def _ready(name: str) -> str:
    """Import the peer (after putting .bench-peers and, for mosaic's missing
    never-called imports, the stubs on sys.path). Returns its note; raises
    RuntimeError saying why it does not import."""
    if name not in PEERS:
        raise ValueError(f"unknown peer {name!r}; one of {PEERS}")
    if name != "webdataset" and PEERS_DIR.is_dir() and str(PEERS_DIR) not in sys.path:
        sys.path.insert(0, str(PEERS_DIR))
    stubbed = [m for m in STUBBED if _missing(m)] if name == "mosaic" else []
    if stubbed and str(STUBS_DIR) not in sys.path:
        sys.path.append(str(STUBS_DIR))
    try:
        importlib.import_module(MODULES[name])
        if name == "mosaic":
            from streaming import MDSWriter, StreamingDataset  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure: the row is left out, saying why
        hint = "" if name == "webdataset" else " (sh scripts/install_bench_peers.sh)"
        raise RuntimeError(f"{name} not installed: {type(e).__name__}: {e}{hint}") from e
    return f"stubbed: {', '.join(stubbed)} (imported, never called)" if stubbed else ""


# ------------------------------------------------------------------ the items, from the packed set
def _items(index: ShardIndex) -> Iterator[Item]:
    """(i, jpg of i-1, jpg of i, json of i-1, json of i) of every sample of the
    2-frame "inside" set, in index order (a t-1 may sit in the previous shard)."""
    files: dict[int, BinaryIO] = {}

    def member(j: int, offset: np.ndarray, size: np.ndarray) -> bytes:
        s = int(index.shard[j])
        if s not in files:
            files[s] = open(index.shard_path(s), "rb")  # noqa: SIM115 - closed below
        f = files[s]
        f.seek(int(offset[j]))
        return f.read(int(size[j]))

    try:
        for i in anchors(index, 2, "inside").tolist():
            yield (i, member(i - 1, index.jpg_offset, index.jpg_size), member(i, index.jpg_offset, index.jpg_size),
                   member(i - 1, index.json_offset, index.json_size), member(i, index.json_offset, index.json_size))
    finally:
        for f in files.values():
            f.close()


def _shape(index: ShardIndex) -> Shape:
    w, h = index.image_size
    return h, w, index.horizon, index.action_dim, index.proprio_dim


def _chunk_bytes(index: ShardIndex) -> int:
    """The peers' shard / chunk size: the packed set's mean shard size."""
    return max(1 << 16, int(index.shard_bytes.mean()))


def _write_litdata(index: ShardIndex, dst: Path) -> None:
    from litdata.streaming.writer import BinaryWriter

    w = BinaryWriter(str(dst), chunk_bytes=_chunk_bytes(index))
    for n, (i, pj, j, pjs, js) in enumerate(_items(index)):
        w[n] = {"index": i, "prev_jpg": pj, "jpg": j, "prev_json": pjs, "json": js}
    w.done()
    w.merge()


def _write_webdataset(index: ShardIndex, dst: Path) -> None:
    import webdataset as wds

    with wds.ShardWriter(str(dst / "shard-%06d.tar"), maxsize=_chunk_bytes(index), maxcount=1 << 30,
                         verbose=0, encoder=False) as w:
        for i, pj, j, pjs, js in _items(index):
            w.write({"__key__": f"{i:06d}", "prev.jpg": pj, "jpg": j, "prev.json": pjs, "json": js})


def _write_mosaic(index: ShardIndex, dst: Path) -> None:
    from streaming import MDSWriter

    cols = {"index": "int64", "prev_jpg": "bytes", "jpg": "bytes", "prev_json": "bytes", "json": "bytes"}
    with MDSWriter(out=str(dst), columns=cols, compression=None, size_limit=_chunk_bytes(index)) as w:
        for i, pj, j, pjs, js in _items(index):
            w.write({"index": i, "prev_jpg": pj, "jpg": j, "prev_json": pjs, "json": js})


def prepare(name: str, packed: Path, work: Path) -> str:
    """Write the peer's format of the 2-frame "inside" samples of `packed` into
    `work/name` (replacing what is there). Returns the peer's note ("" or what
    was stubbed); raises RuntimeError when the peer does not import."""
    note = _ready(name)
    index = load_index(packed)
    dst = Path(work) / name
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    {"litdata": _write_litdata, "webdataset": _write_webdataset, "mosaic": _write_mosaic}[name](index, dst)
    (dst / "feed_shape.json").write_text(json.dumps(list(_shape(index))))
    return note


# ------------------------------------------------------------------ decode + collate (in the workers)
def decode_item(i: int, prev_jpg: bytes | memoryview, jpg: bytes | memoryview, prev_js: bytes | memoryview,
                js: bytes | memoryview, shape: Shape) -> dict[str, Any]:
    """One item: both frames decoded (shardship's decoder), both JSONs parsed."""
    h, w, horizon, dim, joints = shape
    image = np.empty((2, h, w, 3), np.uint8)
    decode_jpeg_into(prev_jpg, image[0])
    decode_jpeg_into(jpg, image[1])
    prev, cur = json.loads(bytes(prev_js)), json.loads(bytes(js))  # litdata hands back memoryviews
    mask = cur.get("action_mask")
    zeros = [0.0] * joints
    return {"index": int(i), "image": image,
            "action": np.asarray(cur["action"], np.float32).reshape(horizon, dim),
            "action_mask": np.asarray([1.0] * horizon if mask is None else mask, np.float32),
            "joints": np.asarray([prev.get("proprio") or zeros, cur.get("proprio") or zeros], np.float32),
            "pose": np.asarray([prev["pose"], cur["pose"]], np.float64)}


def collate(items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Stack the items; proprio (B, 2, 9 + J): each step's pose relative to frame t
    (shardship's `relative_poses`, the whole batch at once), then its joints."""
    pose = np.stack([it["pose"] for it in items])
    same = np.zeros(pose.shape[:2], bool)
    same[:, -1] = True
    rel = relative_poses(pose[:, -1], pose, same)
    proprio = np.concatenate([rel, np.stack([it["joints"] for it in items])], axis=-1).astype(np.float32)
    return {"index": torch.as_tensor([it["index"] for it in items], dtype=torch.int64),
            "image": torch.from_numpy(np.stack([it["image"] for it in items])),
            "action": torch.from_numpy(np.stack([it["action"] for it in items])),
            "action_mask": torch.from_numpy(np.stack([it["action_mask"] for it in items])),
            "proprio": torch.from_numpy(proprio)}


def columns_batch(raw: list[dict[str, Any]], shape: Shape) -> dict[str, torch.Tensor]:
    """litdata's and mosaic's stored items -> the decoded, collated batch."""
    return collate([decode_item(int(d["index"]), d["prev_jpg"], d["jpg"], d["prev_json"], d["json"], shape)
                    for d in raw])


def tar_batch(raw: list[dict[str, Any]], shape: Shape) -> dict[str, torch.Tensor]:
    """webdataset's sample dicts (members by extension) -> the decoded, collated batch."""
    return collate([decode_item(int(d["__key__"]), d["prev.jpg"], d["jpg"], d["prev.json"], d["json"], shape)
                    for d in raw])


# ------------------------------------------------------------------ loaders
def _litdata(root: Path, shape: Shape, batch: int, workers: int, seed: int) -> Iterable:
    from litdata import StreamingDataLoader, StreamingDataset

    ds = StreamingDataset(str(root), shuffle=True, seed=seed)
    return StreamingDataLoader(ds, batch_size=batch, num_workers=workers, drop_last=True,
                               collate_fn=functools.partial(columns_batch, shape=shape))


def _webdataset(root: Path, shape: Shape, batch: int, workers: int, seed: int) -> Iterable:
    import webdataset as wds

    urls = sorted(str(p) for p in root.glob("shard-*.tar"))
    ds = (wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False, seed=seed)
          .shuffle(SHUFFLE_BUFFER, seed=seed)
          .batched(batch, collation_fn=functools.partial(tar_batch, shape=shape), partial=False))
    return wds.WebLoader(ds, batch_size=None, num_workers=workers)


def _mosaic_dataset(root: Path, batch: int, seed: int) -> Any:
    """MosaicML's StreamingDataset owns shared memory named after its local dir:
    a second one over the same dir in one process is refused, so one is kept per
    dir and reused (a fresh DataLoader over it = its next shuffled epoch)."""
    from streaming import StreamingDataset

    key = str(root.resolve())
    ds = _mosaic.get(key)
    if ds is None:
        ds = _mosaic[key] = StreamingDataset(local=key, shuffle=True, shuffle_seed=seed, batch_size=batch)
    elif (ds.batch_size, ds.shuffle_seed) != (batch, seed):
        raise RuntimeError(f"mosaic: {root} is already open in this process with batch {ds.batch_size}, "
                           f"seed {ds.shuffle_seed}; use a fresh process for batch {batch}, seed {seed}")
    return ds


def loader(name: str, work: Path, batch: int = 64, workers: int = 2, seed: int = 0) -> Iterable:
    """One epoch's loader over `work/name` (written by `prepare`), shuffled with
    `seed`: batches of `batch` decoded items (the module docstring), the last
    partial batch of each worker dropped."""
    _ready(name)
    root = Path(work) / name
    shape_file = root / "feed_shape.json"
    if not shape_file.is_file():
        raise FileNotFoundError(f"{root}: not prepared (bench.feed_peers.prepare({name!r}, packed, work))")
    h, w, horizon, dim, joints = (int(v) for v in json.loads(shape_file.read_text()))
    shape = (h, w, horizon, dim, joints)
    decode.prepare()  # the decoder's checks, here before the workers fork, as shardship's reader does
    if name == "litdata":
        return _litdata(root, shape, batch, workers, seed)
    if name == "webdataset":
        return _webdataset(root, shape, batch, workers, seed)
    return DataLoader(_mosaic_dataset(root, batch, seed), batch_size=batch, num_workers=workers, drop_last=True,
                      collate_fn=functools.partial(columns_batch, shape=shape))


__all__ = ["PEERS", "prepare", "loader", "decode_item", "collate", "columns_batch", "tar_batch"]
