"""The run's logs beside its checkpoints: metrics.jsonl (rank 0: one line per
logged window, validation and checkpoint), samples/rankN.jsonl (every rank, with
log_samples: which samples each step used) and loss.png drawn from metrics.jsonl.

The logs follow the checkpoint: a resumed run drops the lines of the steps it is
about to redo, so every step appears once however often the run was killed."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import IO

from shardship.atomic import atomic_open, write_bytes

METRICS = "metrics.jsonl"


def truncate_jsonl(path: Path, max_step: int) -> None:
    """Keep the lines of steps <= max_step (a resumed run redoes the others)."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            if int(json.loads(line).get("step", 0)) <= max_step:
                keep.append(line)
        except (json.JSONDecodeError, AttributeError, ValueError, TypeError):
            continue  # a half-written last line from a kill
    write_bytes(path, ("\n".join(keep) + "\n").encode() if keep else b"")


def open_metrics(out: Path, is_main: bool, resumed: bool) -> IO[str] | None:
    """metrics.jsonl for appending, line-buffered (a kill loses at most one line);
    None on the other ranks. A fresh run starts a fresh curve."""
    if not is_main:
        return None
    if not resumed:
        (out / METRICS).unlink(missing_ok=True)
    return open(out / METRICS, "a", buffering=1)  # noqa: SIM115  (closed by the trainer's finally)


def open_samples_log(out: Path, rank: int, world_size: int, resumed_at: int | None) -> IO[str]:
    """samples/rank{rank}.jsonl for appending. On resume the lines past the
    checkpoint go, and rank 0 also trims the files of ranks a previous run had
    beyond today's world size, so no file claims steps that were redone."""
    sdir = out / "samples"
    sdir.mkdir(parents=True, exist_ok=True)
    mine = sdir / f"rank{rank}.jsonl"
    if resumed_at is not None:
        truncate_jsonl(mine, resumed_at)
        if rank == 0:
            for p in sdir.glob("rank*.jsonl"):
                r = re.match(r"rank(\d+)\.jsonl$", p.name)
                if r and int(r.group(1)) >= world_size:
                    truncate_jsonl(p, resumed_at)
    elif mine.exists():
        mine.unlink()
    return open(mine, "a", buffering=1)  # noqa: SIM115  (closed by the trainer's finally)


def plot_metrics(metrics: Path, png: Path) -> None:
    """loss.png: training loss (per logged window) and validation loss vs step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tr, va = [], []
    for line in metrics.read_text().splitlines() if metrics.exists() else []:
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "loss" in d:
            tr.append((d["step"], d["loss"]))
        if "val_loss" in d:
            va.append((d["step"], d["val_loss"]))
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    if tr:
        ax.plot(*zip(*tr, strict=True), label="train loss", lw=1)
    if va:
        ax.plot(*zip(*va, strict=True), "o-", label="val loss (EMA)", lw=1.5)
    ax.set_xlabel("step")
    ax.set_ylabel("diffusion loss (MSE, normalised units)")
    if tr and min(v for _, v in tr) > 0:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    with atomic_open(png, "wb") as f:
        fig.savefig(f, format="png")
    plt.close(fig)
