"""The reader's peers for `make bench` (loader rows): litdata `StreamingDataset`
and MosaicML `StreamingDataset`, over the same frames as shardship's reader.

Each peer gets the same samples written once in its own format (litdata chunks
via `BinaryWriter`, MosaicML MDS shards via `MDSWriter`; uncompressed, the JPEG
and JSON bytes as stored in the tar shards), shuffles with seed 0, and decodes
every item with the same PIL (pillow-simd) and `json.loads` as the `files` and
`webdataset` rows, in 2 DataLoader workers, batches of 32.

Installing them: their pip requirements would replace torch (2.14 with CUDA 13)
and pillow-simd (pillow 13) in this environment, so `scripts/install_bench_peers.sh`
installs the pinned wheels of `bench/peers.txt` with `--no-deps` into
`.bench-peers/` (git-ignored), which only the bench puts on sys.path. What they
import but the image bench never calls and that is not installed here
(mosaicml-streaming imports `transformers` and `torchvision` at module level) is
stubbed from `bench/stubs/`, appended to sys.path only when the real package is
missing; `importable()` says which, and the CSV rows carry it."""
from __future__ import annotations

import importlib.util
import io
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from train.data.index import ShardIndex

ROOT = Path(__file__).resolve().parent.parent
PEERS_DIR = ROOT / ".bench-peers"
STUBS_DIR = Path(__file__).resolve().parent / "stubs"
STUBBED = ("transformers", "torchvision")


def importable() -> dict[str, str]:
    """{peer: "" (ready) | "stubbed: ..." | "not installed: ..."} after putting
    .bench-peers and, for missing packages only, the stubs on sys.path."""
    if PEERS_DIR.is_dir() and str(PEERS_DIR) not in sys.path:
        sys.path.insert(0, str(PEERS_DIR))
    missing = [m for m in STUBBED if importlib.util.find_spec(m) is None]
    if missing and str(STUBS_DIR) not in sys.path:
        sys.path.append(str(STUBS_DIR))
    out: dict[str, str] = {}
    for peer, module in (("litdata", "litdata"), ("mosaic", "streaming")):
        try:
            __import__(module)
            if peer == "mosaic":
                from streaming import MDSWriter, StreamingDataset  # noqa: F401
        except Exception as e:  # noqa: BLE001 - any import failure: the row is skipped, saying why
            out[peer] = f"not installed: {type(e).__name__}: {e} (sh scripts/install_bench_peers.sh)"
            continue
        stubbed = [m for m in missing if peer == "mosaic"]
        out[peer] = f"stubbed: {', '.join(stubbed)} (imported, never called)" if stubbed else ""
    return out


def _members(index: ShardIndex):
    """(key, jpg bytes, json bytes) of every sample, in index order."""
    for i in range(index.n_samples):
        with open(index.shard_path(int(index.shard[i])), "rb") as f:
            f.seek(int(index.jpg_offset[i]))
            jpg = f.read(int(index.jpg_size[i]))
            f.seek(int(index.json_offset[i]))
            js = f.read(int(index.json_size[i]))
        yield index.key(i), jpg, js


def _decode(jpg: bytes, js: bytes, shape: tuple[int, int, int]) -> dict[str, Any]:
    """The same work as the `files` row: PIL decode, json.loads, numpy arrays."""
    from PIL import Image

    with Image.open(io.BytesIO(jpg)) as im:
        img = np.array(im.convert("RGB"))
    meta = json.loads(bytes(js))  # litdata hands bytes back as a memoryview
    h, d, j = shape
    action = np.asarray(meta["action"], dtype=np.float32).reshape(h, d)
    mask = np.asarray(meta.get("action_mask") or [1] * h, dtype=np.float32)
    proprio = np.asarray(meta.get("proprio") or [0.0] * j, dtype=np.float32)
    return {"image": torch.from_numpy(img), "action": torch.from_numpy(action),
            "action_mask": torch.from_numpy(mask), "proprio": torch.from_numpy(proprio)}


# ------------------------------------------------------------------ litdata
def write_litdata(index: ShardIndex, dst: Path) -> Path:
    from litdata.streaming.writer import BinaryWriter

    dst.mkdir(parents=True, exist_ok=True)
    w = BinaryWriter(str(dst), chunk_bytes="2MB")  # the shardship shards' size in this bench
    for n, (_, jpg, js) in enumerate(_members(index)):
        w[n] = {"jpg": jpg, "json": js}
    w.done()
    w.merge()
    return dst


def litdata_loader(root: Path, index: ShardIndex, batch: int, workers: int) -> Any:
    from litdata import StreamingDataLoader, StreamingDataset

    shape = (index.horizon, index.action_dim, index.proprio_dim)

    class Decoded(StreamingDataset):
        def __getitem__(self, i: Any) -> dict[str, Any]:
            d = super().__getitem__(i)
            return _decode(d["jpg"], d["json"], shape)

    ds = Decoded(str(root), shuffle=True, seed=0)
    return StreamingDataLoader(ds, batch_size=batch, num_workers=workers)


# ------------------------------------------------------------------ MosaicML streaming
def write_mds(index: ShardIndex, dst: Path) -> Path:
    from streaming import MDSWriter

    with MDSWriter(out=str(dst), columns={"jpg": "bytes", "json": "bytes"}, compression=None,
                   size_limit=2 << 20) as w:
        for _, jpg, js in _members(index):
            w.write({"jpg": jpg, "json": js})
    return dst


class MosaicLoader:
    """One MosaicML StreamingDataset for the whole bench (it owns shared memory
    named after its local dir, so a second one over the same dir is refused); each
    call gives a fresh DataLoader = one more shuffled epoch."""

    def __init__(self, root: Path, index: ShardIndex, batch: int, workers: int):
        from streaming import StreamingDataset

        shape = (index.horizon, index.action_dim, index.proprio_dim)

        class Decoded(StreamingDataset):
            def __getitem__(self, i: Any) -> dict[str, Any]:
                d = super().__getitem__(i)
                return _decode(d["jpg"], d["json"], shape)

        self.ds = Decoded(local=str(root), shuffle=True, shuffle_seed=0, batch_size=batch)
        self.batch, self.workers = batch, workers

    def __call__(self) -> DataLoader:
        return DataLoader(self.ds, batch_size=self.batch, num_workers=self.workers)


__all__ = ["importable", "write_litdata", "litdata_loader", "write_mds", "MosaicLoader"]
