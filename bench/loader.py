"""The shard reader vs two usual ways to feed the same samples, one run.

    shardship   train.data.ShardDataset: index offsets -> one pread per sample,
                PIL's JPEG decoder straight into the batch slot, 2 DataLoader
                workers (shardship_2frame: obs_horizon 2, two frames a sample)
    files       map-style Dataset over the same samples written as individual
                .jpg + .json files (the "just a folder of images" loader), shuffle
    webdataset  the `webdataset` library on the same .tar shards (shard shuffle +
                a 1000-sample shuffle buffer, rgb8 decode, batched in the workers)
    litdata, mosaic  litdata's and MosaicML's StreamingDataset over the same
                frames in their own formats (bench/peers.py)

All of them decode the same JPEGs with the same PIL (pillow-simd), parse the same
JSON into the same arrays (image uint8 HxWx3, action, mask, proprio) and yield
batches of 32 from 2 worker processes; the page cache is warm for all. Reported:
samples/s (median of `repeats` runs of `passes` epochs each, the loaders
interleaved, with min and max), CPU-ms per sample (this process + its workers),
the ratio to each peer (median of the per-round ratios), the load average,
and per-worker memory sampled from /proc over one more, untimed epoch: RSS, and USS (private
pages: what copy-on-write of the parent's Python objects would make grow).
Targets: shardship >= 1.0x files, >= 1.2x webdataset and litdata, worker USS flat.

On a CUDA machine one more row: the default policy's bf16 training step time
and the fraction of it spent waiting for this reader."""
from __future__ import annotations

import json
import os
import platform
import resource
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from bench.common import machine, write_csv
from shardship.pil import describe
from train.data import ShardDataset, load_index, make_loader, verify_shards
from train.data.index import ShardIndex

BATCH = 32
WORKERS = 2


# ------------------------------------------------------------------ worker memory
def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d.name))
    return out


def _mem_kb(pid: int) -> tuple[int, int] | None:
    """(RSS, USS = private clean + private dirty) in kB, from smaps_rollup."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    vals = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
            vals[parts[0][:-1]] = int(parts[1])
    return vals.get("Rss", 0), vals.get("Private_Clean", 0) + vals.get("Private_Dirty", 0)


class WorkerMemory:
    """Samples the memory of this process's child processes (the DataLoader
    workers) every `interval` s. Growth of a worker = its peak USS minus its USS
    one fifth into its life (after decoder buffers and the first batches exist)."""

    def __init__(self, interval: float = 0.05):
        self.interval = interval
        self.samples: dict[int, list[tuple[int, int]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> WorkerMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        me = os.getpid()
        while not self._stop.is_set():
            for pid in _children(me):
                m = _mem_kb(pid)
                if m is not None:
                    self.samples.setdefault(pid, []).append(m)
            self._stop.wait(self.interval)

    def summary(self) -> dict[str, float]:
        starts, peaks, growth, rss = [], [], [], []
        for rows in self.samples.values():
            if len(rows) < 5:
                continue
            after = rows[len(rows) // 5:]
            starts.append(after[0][1])
            peaks.append(max(r[1] for r in after))
            growth.append(peaks[-1] - starts[-1])
            rss.append(max(r[0] for r in rows))
        if not peaks:
            return {}
        return {"workers_seen": len(peaks), "rss_worker_peak_mb": round(max(rss) / 1024, 1),
                "uss_worker_start_mb": round(max(starts) / 1024, 1), "uss_worker_peak_mb": round(max(peaks) / 1024, 1),
                "uss_worker_growth_mb": round(max(growth) / 1024, 2)}


# ------------------------------------------------------------------ the loaders
def _sample_arrays(meta: dict, horizon: int, dim: int, joints: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    action = np.asarray(meta["action"], dtype=np.float32).reshape(horizon, dim)
    mask = np.asarray(meta.get("action_mask") or [1] * horizon, dtype=np.float32)
    proprio = np.asarray(meta.get("proprio") or [0.0] * joints, dtype=np.float32)
    return action, mask, proprio


class FilesDataset(Dataset):
    """One .jpg + one .json per sample, opened and decoded per item."""

    def __init__(self, root: Path, keys: list[str], horizon: int, dim: int, joints: int):
        self.root, self.keys = root, keys
        self.shape = (horizon, dim, joints)

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int) -> dict[str, Any]:
        from PIL import Image

        base = self.root / self.keys[i]
        with Image.open(base.with_suffix(".jpg")) as im:
            img = np.array(im.convert("RGB"))  # writable copy (torch tensors need one)
        meta = json.loads(base.with_suffix(".json").read_bytes())
        action, mask, proprio = _sample_arrays(meta, *self.shape)
        return {"image": torch.from_numpy(img), "action": torch.from_numpy(action),
                "action_mask": torch.from_numpy(mask), "proprio": torch.from_numpy(proprio)}


def extract_files(index: ShardIndex, dst: Path) -> list[str]:
    """Write every sample of the shards as individual files (same bytes)."""
    keys = []
    for i in range(index.n_samples):
        s = int(index.shard[i])
        key = index.key(i)
        with open(index.shard_path(s), "rb") as f:
            f.seek(int(index.jpg_offset[i]))
            jpg = f.read(int(index.jpg_size[i]))
            f.seek(int(index.json_offset[i]))
            js = f.read(int(index.json_size[i]))
        p = dst / key
        p.parent.mkdir(parents=True, exist_ok=True)
        p.with_suffix(".jpg").write_bytes(jpg)
        p.with_suffix(".json").write_bytes(js)
        keys.append(key)
    return keys


def webdataset_loader(index: ShardIndex) -> DataLoader:
    import webdataset as wds

    urls = [str(index.shard_path(s)) for s in range(index.n_shards)]
    h, d, j = index.horizon, index.action_dim, index.proprio_dim

    def to_arrays(sample: tuple[np.ndarray, dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        img, meta = sample
        return (img, *_sample_arrays(meta, h, d, j))

    ds = (wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False, seed=0)
          .shuffle(1000).decode("rgb8").to_tuple("jpg", "json").map(to_arrays).batched(BATCH))
    return wds.WebLoader(ds, batch_size=None, num_workers=WORKERS)


def _cpu_seconds() -> float:
    """user + sys of this process and its reaped children (the DataLoader workers,
    joined at the end of every epoch)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _timed(make: Callable[[], Iterable], passes: int) -> tuple[int, float, float]:
    """Samples, wall seconds and CPU seconds for `passes` epochs, each with a fresh
    loader (worker start-up included, as in training)."""
    c0, t0 = _cpu_seconds(), time.perf_counter()
    n = 0
    for _ in range(passes):
        for batch in make():
            if isinstance(batch, dict) and "weight" in batch:
                n += int((batch["weight"] > 0).sum())  # tail padding is not a sample
            else:
                n += int((batch["image"] if isinstance(batch, dict) else batch[0]).shape[0])
    return n, time.perf_counter() - t0, _cpu_seconds() - c0


def peer_loaders(index: ShardIndex, work: Path, loaders: dict[str, Callable[[], Iterable]]) -> dict[str, str]:
    """Add the litdata and MosaicML rows (bench.peers) to `loaders` when they import;
    returns {peer: note}: what was stubbed, or why a row is missing."""
    from bench import peers

    notes = peers.importable()
    if not notes.get("litdata", "not").startswith("not"):
        root = peers.write_litdata(index, work / "litdata")
        _warm(p for p in root.rglob("*") if p.is_file())
        loaders["litdata"] = lambda: peers.litdata_loader(root, index, BATCH, WORKERS)
    if not notes.get("mosaic", "not").startswith("not"):
        mds = peers.write_mds(index, work / "mds")
        _warm(p for p in mds.rglob("*") if p.is_file())
        loaders["mosaic"] = peers.MosaicLoader(mds, index, BATCH, WORKERS)
    return notes


def _warm(paths: Iterable[Path]) -> None:
    for p in paths:
        with open(p, "rb") as f:
            while f.read(1 << 22):
                pass


# ------------------------------------------------------------------ GPU step (CUDA only)
def gpu_rows(packed: Path, steps: int) -> list[dict]:
    """bf16 step time of the default policy fed by the reader, and the data wait."""
    if not torch.cuda.is_available():
        return []
    from train.config import TrainConfig
    from train.optim import make_optimizer
    from train.runtime import amp_dtype
    from train.state import build_model

    index = load_index(packed)
    dev = torch.device("cuda", 0)
    model, _ = build_model(index, TrainConfig())
    model.to(dev).train()
    opt = make_optimizer(model, TrainConfig(), dev)
    dtype = amp_dtype(dev, True)
    batch_size = 64
    tc = TrainConfig()  # the trainer's reader: obs_horizon frames, windows inside the session
    ds = ShardDataset(index, batch_size, seed=0, window=8, obs_horizon=tc.frames(), edges=tc.edges)
    done, wait, t_start = 0, 0.0, None
    epoch = 0
    while done < steps:
        ds.set_state(epoch, 0)
        it = iter(make_loader(ds, WORKERS, pin_memory=True, seed=epoch))
        while done < steps:
            t0 = time.perf_counter()
            try:
                b = next(it)
            except StopIteration:
                break
            if t_start is not None:
                wait += time.perf_counter() - t0
            b = {k: v.to(dev, non_blocking=True) for k, v in b.items() if k not in ("index", "position")}
            with torch.autocast("cuda", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                loss = model(b)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            torch.cuda.synchronize()
            done += 1
            if done == 5:  # warm-up excluded (cudnn autotune, first fork)
                t_start, wait = time.perf_counter(), 0.0
        epoch += 1
    total = time.perf_counter() - (t_start or time.perf_counter())
    n = max(1, done - 5)
    return [{"loader": "gpu_train_step", "batch_size": batch_size, "workers": WORKERS,
             "step_ms": round(1000 * total / n, 2), "data_wait": round(wait / total, 3) if total else None,
             "samples_per_s": round(n * batch_size / total, 1) if total else None,
             "gpu": torch.cuda.get_device_name(0), "amp": str(dtype).replace("torch.", "")}]


# ------------------------------------------------------------------ run
def _row(name: str, runs: dict[str, list[tuple[int, float, float]]], notes: dict[str, str],
         mem: dict[str, dict[str, float]], common: dict[str, Any]) -> dict[str, Any]:
    """One loader's CSV row: median samples/s over the interleaved repeats with its
    spread, CPU-ms per sample, and its ratio to each peer as the median of the
    per-round ratios (a round runs every loader once, so a slow minute hits both
    sides of a ratio)."""
    rates = [n / s for n, s, _ in runs[name]]
    cpu_ms = [1000 * c / n for n, _, c in runs[name]]
    row: dict[str, Any] = {"loader": name, "batch_size": BATCH, "workers": WORKERS, "samples": runs[name][0][0],
                           "samples_per_s": round(statistics.median(rates), 1),
                           "samples_per_s_min": round(min(rates), 1), "samples_per_s_max": round(max(rates), 1),
                           "cpu_ms_per_sample": round(statistics.median(cpu_ms), 3)}
    for peer in ("files", "webdataset", "litdata", "mosaic"):
        if peer in runs and runs[peer]:
            per_round = [(n / s) / (pn / ps) for (n, s, _), (pn, ps, _) in zip(runs[name], runs[peer], strict=True)]
            row[f"ratio_vs_{peer}"] = round(statistics.median(per_round), 3)
        else:
            row[f"ratio_vs_{peer}"] = None
    row["cpu_ratio_vs_litdata"] = (round(statistics.median(cpu_ms) / statistics.median(
        [1000 * c / n for n, _, c in runs["litdata"]]), 3) if runs.get("litdata") else None)
    return {**row, "peer_note": notes.get(name, ""), **mem.get(name, {}), **common}


def run(results_dir: Path, quick: bool = False) -> list[dict]:
    from tests.datasets import make_packed

    sessions, frames, repeats, passes = (2, 150, 1, 2) if quick else (4, 300, 5, 2)
    work = Path(tempfile.mkdtemp(prefix="bench-loader-"))
    try:
        packed = make_packed(work / "data", sessions=sessions, frames=frames, seed=0, shard_bytes=2 * 1024 * 1024)
        index = load_index(packed)
        verify_shards(index)  # as the trainer does before forking workers
        keys = extract_files(index, work / "files")
        files_ds = FilesDataset(work / "files", keys, index.horizon, index.action_dim, index.proprio_dim)
        _warm([index.shard_path(s) for s in range(index.n_shards)])
        _warm(p for p in (work / "files").rglob("*") if p.is_file())

        def ours() -> Iterable:
            return make_loader(ShardDataset(index, BATCH, seed=0, window=8, tail="pad"), WORKERS, seed=0)

        def ours_2frame() -> Iterable:  # every frame with its t-1 (2 JPEGs decoded per sample)
            return make_loader(ShardDataset(index, BATCH, seed=0, window=8, tail="pad", obs_horizon=2,
                                            edges="mask"), WORKERS, seed=0)

        def files() -> Iterable:
            return DataLoader(files_ds, batch_size=BATCH, shuffle=True, num_workers=WORKERS,
                              generator=torch.Generator().manual_seed(0))

        def wds() -> Iterable:
            return webdataset_loader(index)

        loaders: dict[str, Callable[[], Iterable]] = {"shardship": ours, "shardship_2frame": ours_2frame,
                                                      "files": files, "webdataset": wds}
        notes = peer_loaders(index, work, loaders)
        runs: dict[str, list[tuple[int, float, float]]] = {k: [] for k in loaders}
        mem: dict[str, dict[str, float]] = {}
        loads = [os.getloadavg()[0]]
        for name, make in loaders.items():  # memory first, in an untimed epoch: reading
            with WorkerMemory() as wm:       # /proc/PID/smaps_rollup costs CPU per mapping,
                _timed(make, 1)              # so sampling would tax a loader by its mmaps
            mem[name] = wm.summary()
        for _ in range(repeats):  # interleaved, so background load hits all alike
            for name, make in loaders.items():
                runs[name].append(_timed(make, passes))
            loads.append(os.getloadavg()[0])
        common = {"machine": machine(), "python": platform.python_version(), "pil": describe(),
                  "torch": torch.__version__, "samples_in_set": index.n_samples, "shards": index.n_shards,
                  "image": f"{index.image_size[0]}x{index.image_size[1]}", "repeats": repeats,
                  "passes": passes, "load_avg_1min": f"{min(loads):.1f}-{max(loads):.1f}"}
        rows = [_row(name, runs, notes, mem, common) for name in loaders]
        rows += [{"loader": k, "peer_note": v, **common} for k, v in notes.items() if k not in loaders]
        ours_row = rows[0]
        ours_row["target_vs_files"] = ">=1.0"
        ours_row["target_vs_webdataset"] = ">=1.2"
        ours_row["target_vs_litdata"] = ">=1.2"
        ours_row["meets_targets"] = (ours_row["ratio_vs_files"] >= 1.0 and ours_row["ratio_vs_webdataset"] >= 1.2
                                     and (ours_row["ratio_vs_litdata"] or 0) >= 1.2)
        for r in gpu_rows(packed, 30 if quick else 200):
            rows.append({**r, **common})
        write_csv(Path(results_dir) / "loader.csv", rows)
        return rows
    finally:
        shutil.rmtree(work, ignore_errors=True)


__all__ = ["run", "WorkerMemory", "FilesDataset", "webdataset_loader"]
