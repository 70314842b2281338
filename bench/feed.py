"""What feeds the `stack` preset (2-frame windows, batch 64, 2 workers), per
CPU-second, in one interleaved run:

    baseline        the streaming reader at the baseline commit (a git worktree),
                    as `train run --model stack` built it there
    streaming       the streaming reader now (runs of 2 consecutive samples, each
                    distinct frame of a batch decoded once, labels parsed once)
    streaming_run1  the same without the runs (every sample drawn alone): what
                    decoding once inside a batch gives without them
    host_cache      batches gathered from the decoded-frame cache (filled first,
                    untimed; its fill time is its own column)
    bound           decode only: simplejpeg decodes the two frames of every sample
                    from bytes in memory, nothing else (the issue's bound)
    litdata, webdataset, mosaic   the peers doing equal work (bench/feed_peers.py):
                    both frames' JPEGs decoded with shardship's decoder, both
                    JSONs parsed, batches of 64 from 2 workers

Every loader runs in a fresh subprocess (its import and start-up not timed);
CPU time is the process's and its DataLoader workers' (getrusage self +
children: the workers are joined at each epoch's end). Rounds interleave the
loaders; reported are medians over rounds with min and max, and the ratios per
CPU-second against the baseline and the bound (median of per-round ratios).

    python -m bench --only feed [--quick]    (BASELINE=<ref> to pick the baseline)"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BATCH = 64
WORKERS = 2
BASELINE = os.environ.get("BASELINE", "ec3ccf3")  # main when issue 40's work began
OURS = ("streaming", "streaming_run1", "host_cache", "bound")
PEERS = ("litdata", "webdataset", "mosaic")


def _cpu() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def _reader_epochs(data: Path, name: str, passes: int) -> Iterable[Any]:
    """The streaming reader's batches over `passes` epochs (works at the baseline too)."""
    from train.data import ShardDataset, load_index, make_loader, verify_shards

    ix = load_index(data)
    verify_shards(ix)
    kw = {} if name == "baseline" else {"run_length": 1 if name == "streaming_run1" else 2}
    ds = ShardDataset(ix, BATCH, seed=0, obs_horizon=2, edges="inside", **kw)
    ds.reuse_buffers = True  # as train.feed sets it for the trainer (the baseline has no such thing)
    yield None  # the timing starts here: index, shard check and decoder set-up done
    for e in range(passes):
        ds.set_state(e, 0)
        yield from make_loader(ds, WORKERS)


def _cache_epochs(data: Path, passes: int, note: dict[str, Any]) -> Iterable[Any]:
    import torch

    from train.data import ShardDataset, load_index
    from train.data import cache as frame_cache
    from train.feed import cached_epoch

    ds = ShardDataset(load_index(data), BATCH, seed=0, obs_horizon=2, edges="inside", run_length=2)
    ds.labels  # noqa: B018 - parsed before the timing, as the trainer does
    c = frame_cache.build(ds, "host", torch.device("cpu"))
    note["fill_s"] = round(c.seconds, 2)
    yield None  # the timing starts here
    for e in range(passes):
        ds.set_state(e, 0)
        yield from cached_epoch(ds, c, torch.device("cpu"))


def _bound(data: Path, passes: int) -> Iterable[Any]:
    """Two simplejpeg decodes per training sample, bytes already in memory."""
    import numpy as np
    import simplejpeg

    from train.data import load_index
    from train.data.obs import anchors
    from train.data.shardio import ShardFiles

    ix = load_index(data)
    files = ShardFiles(ix, verify=False)
    samples = anchors(ix, 2, "inside").tolist()
    jpg = {i: bytes(files.read(i)[0]) for i in sorted({j for s in samples for j in (s - 1, s)})}
    out = np.empty((2, 224, 224, 3), np.uint8)
    yield None
    for _ in range(passes):
        for k in range(0, len(samples) - BATCH + 1, BATCH):
            for s in samples[k:k + BATCH]:
                simplejpeg.decode_jpeg(jpg[s - 1], colorspace="RGB", buffer=out[0])
                simplejpeg.decode_jpeg(jpg[s], colorspace="RGB", buffer=out[1])
            yield out


def one(name: str, data: Path, work: Path, passes: int) -> dict[str, Any]:
    """Time one loader in this process (the child side of `_measure`)."""
    note: dict[str, Any] = {}
    if name in ("baseline", "streaming", "streaming_run1"):
        it: Iterable[Any] = _reader_epochs(data, name, passes)
    elif name == "host_cache":
        it = _cache_epochs(data, passes, note)
    elif name == "bound":
        it = _bound(data, passes)
    else:
        from bench import feed_peers

        def peer() -> Iterable[Any]:
            loader = feed_peers.loader(name, work, batch=BATCH, workers=WORKERS)
            yield None
            for _ in range(passes):
                yield from loader
        it = peer()
    gen = iter(it)
    next(gen)  # set-up done (index read, cache filled, bytes read, peer opened)
    cpu0, t0, n = _cpu(), time.perf_counter(), 0
    for _ in gen:
        n += BATCH
    return {"samples": n, "wall_s": time.perf_counter() - t0, "cpu_s": _cpu() - cpu0, **note}


def _measure(name: str, data: Path, work: Path, passes: int, base: Path | None) -> dict[str, Any]:
    # run as a script, so that at the baseline `train` (and nothing else) comes from its worktree
    code = str(base) if name == "baseline" and base is not None else str(REPO)
    env = {**os.environ, "PYTHONPATH": code, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--one", name, "--data", str(data),
                        "--work", str(work), "--passes", str(passes)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"{name}: {r.stderr.strip()[-800:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _row(name: str, runs: list[dict[str, Any]], base: list[dict[str, Any]], bound: list[dict[str, Any]]
         ) -> dict[str, Any]:
    per_s = [r["samples"] / r["wall_s"] for r in runs]
    per_cpu = [r["samples"] / r["cpu_s"] for r in runs]
    def ratio(other: list[dict[str, Any]]) -> float | str:
        if not other:
            return ""
        return round(statistics.median(a["samples"] / a["cpu_s"] / (b["samples"] / b["cpu_s"])
                                       for a, b in zip(runs, other, strict=False)), 3)
    return {"loader": name, "batch_size": BATCH, "workers": WORKERS, "rounds": len(runs),
            "samples_per_s": round(statistics.median(per_s), 1), "samples_per_s_min": round(min(per_s), 1),
            "samples_per_s_max": round(max(per_s), 1),
            "samples_per_cpu_s": round(statistics.median(per_cpu), 1), "samples_per_cpu_s_min": round(min(per_cpu), 1),
            "samples_per_cpu_s_max": round(max(per_cpu), 1), "cpu_ratio_vs_baseline": ratio(base),
            "cpu_ratio_vs_bound": ratio(bound), "fill_s": runs[0].get("fill_s", "")}


def run(results: Path, quick: bool = False) -> list[dict[str, Any]]:
    from bench.common import baseline_worktree, machine, write_csv
    from tests.datasets import make_packed

    rounds, passes = (2, 1) if quick else (5, 2)
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        # epochs of tens of batches at least: the workers fork anew every epoch, as in `train run`, and
        # a set of a few batches would measure the fork (real sets: ~1,000 batches an epoch)
        data = make_packed(tmp / "set", sessions=3 if quick else 6, frames=300 if quick else 600, seed=1)
        for p in data.iterdir():  # a warm page cache for every loader
            p.read_bytes()
        names = ["baseline", *OURS]
        notes: dict[str, str] = {}
        for peer in PEERS:
            try:
                from bench import feed_peers

                notes[peer] = feed_peers.prepare(peer, data, tmp / "peers")
                names.append(peer)
            except Exception as e:  # noqa: BLE001 - a peer that cannot run is a note, not a failure
                notes[peer] = f"left out: {type(e).__name__}: {e}"
        out: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
        with baseline_worktree(BASELINE, tmp / "baseline") as (base, rev):
            if base is None:
                names.remove("baseline")
                notes["baseline"] = rev
            for k in range(rounds):
                for name in names[k % len(names):] + names[:k % len(names)]:
                    out[name].append(_measure(name, data, tmp / "peers", passes, base))
                    print(f"  round {k + 1}/{rounds} {name}: {out[name][-1]}", flush=True)
        rows = [_row(n, out[n], out.get("baseline", []), out["bound"]) for n in names]
    load = os.getloadavg()[0]
    for r in rows:
        r.update({"note": notes.get(r["loader"], ""), "baseline": BASELINE, "machine": machine(),
                  "load_avg_1min": round(load, 2), "passes": passes})
    write_csv(results / "feed.csv", rows, "python -m bench --only feed" + (" --quick" if quick else ""))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--one", required=True)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--passes", type=int, default=2)
    a = ap.parse_args()
    print(json.dumps(one(a.one, a.data, a.work, a.passes)))


if __name__ == "__main__":
    main()
