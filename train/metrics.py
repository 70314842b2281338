"""The run's logs beside its checkpoints: metrics.jsonl (rank 0: one line per
logged window, validation and checkpoint), samples/rankN.jsonl (every rank, with
log_samples: which samples each step used) and loss.png drawn from metrics.jsonl.

metrics.jsonl is only ever appended to: a restart at step 0 deleted it and a resume
rewrote it without the steps past the checkpoint, so a resume from an older
checkpoint, or a start over by mistake, lost the record of what was trained. Each
run marks where it starts instead ({"step": s, "event": "resume" | "start"}), and
readers that want one value per step (`current_run`, loss.png) let the lines after a
mark replace what earlier lines said about the steps past s. The samples logs
follow the checkpoint: a resumed run drops the lines of the steps it redoes."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import IO, Any

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


def open_metrics(out: Path, is_main: bool) -> IO[str] | None:
    """metrics.jsonl for appending, line-buffered (a kill loses at most one line); None
    on the other ranks. Never emptied: see `run_mark` for where a run starts."""
    if not is_main:
        return None
    return open(out / METRICS, "a", buffering=1)  # noqa: SIM115  (closed by the trainer's finally)


def run_mark(out: Path, step: int, resumed_file: str | None) -> str:
    """The text that marks where this run starts, written before its first record (not
    at open: on a nearly full disk the TensorBoard writer, opened next, met the ENOSPC
    first, in a thread that printed a traceback): at `step`, resumed from
    `resumed_file` (None: a fresh start). After a line cut by a kill it starts a line
    of its own, so the cut one stays one bad line."""
    path = out / METRICS
    cut = path.is_file() and path.stat().st_size > 0 and not _ends_with_newline(path)
    mark = {"step": step, "event": "resume", "from": resumed_file} if resumed_file else {"step": step, "event": "start"}
    return ("\n" if cut else "") + json.dumps(mark) + "\n"


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, 2)
        return f.read(1) == b"\n"


def current_run(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of the run as it stands now: a start or resume mark at step s drops
    what the lines before it said about steps past s (the run redid them, or started
    over), as a reader of one curve wants; the file keeps every line."""
    out: list[dict[str, Any]] = []
    for r in records:
        if r.get("event") in ("start", "resume"):
            s = _step(r)
            out = [x for x in out if _step(x) <= s]
        out.append(r)
    return out


def _step(rec: dict[str, Any]) -> int:
    try:
        return int(rec.get("step", 0))
    except (TypeError, ValueError):
        return 0


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """metrics.jsonl's records (a line cut by a kill is skipped), every run's."""
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


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
    for d in current_run(read_metrics(metrics)):
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
