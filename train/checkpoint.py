"""Checkpoint files: what one holds, how it is written so a kill never costs the
previous one, how it is read back, and which files a run keeps.

    last.pt       newest state; the run resumes from it automatically
    step_N.pt     every checkpoint_every steps, the newest `keep` kept
                  (last.pt is a hard link to the newest one: no extra space)
    best.pt       lowest validation loss (EMA weights, validation sessions)

The disk peak of this retention is train.retention.peak_checkpoint_files (kept
torch-free there: `packer budget` and the job checks size quotas by it)."""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from shardship.atomic import atomic_open, write_bytes
from shardship.errors import QuotaError, ShardshipError
from train.config import TrainConfig
from train.model import DiffusionPolicy
from train.optim import EMA

CHECKPOINT_FORMAT = "shardship-checkpoint"
STEP_RE = re.compile(r"^step_(\d+)\.pt$")


def checkpoint_payload(model: DiffusionPolicy, ema: EMA, opt: torch.optim.Optimizer, sched: Any, scaler: Any, *,
                       step: int, total_steps: int, reader: dict[str, Any], rngs: list[dict[str, Any]],
                       world_size: int, global_batch: int, cfg: TrainConfig, best_val: float | None,
                       sessions: tuple[list[str], list[str]], data: dict[str, Any]) -> dict[str, Any]:
    """Everything a resumed run (and `train eval`) needs, as one picklable dict.
    model.checkpoint_bytes() sizes exactly this layout."""
    return {
        "format": CHECKPOINT_FORMAT, "version": 1,
        "step": step, "epoch": int(reader["epoch"]), "total_steps": total_steps,
        "reader": reader,
        "model": model.state_dict(), "ema": ema.state_dict(),
        "optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "scaler": scaler.state_dict(),
        "rng": rngs, "world_size": world_size, "global_batch": global_batch,
        "model_config": model.cfg, "train_config": dataclasses.asdict(cfg), "normaliser": model.normaliser(),
        "best_val": best_val, "train_sessions": sessions[0], "val_sessions": sessions[1],
        "data": data,
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def save_checkpoint(state: Mapping[str, Any], path: Path) -> None:
    """torch.save into a temp file in the same directory, fsync, rename: a kill
    mid-write leaves the previous file untouched (and a temp that the next run removes).
    A full disk or quota is a one-line QuotaError naming the file.

    torch.save writes through a file object of its own (`sink`, a dup of the temp
    file's descriptor) that a ctrl-C leaves open: the interrupt can leave torch's
    zip writer unfinished, and the writer finishes the archive when it is
    garbage-collected, after atomic_open has closed and removed the temp file.
    Into a closed file object that write raises inside a C++ destructor and the
    process aborts (SIGABRT, seen in CI); into `sink` it lands in the removed file,
    and the descriptor closes with the writer."""
    try:
        with atomic_open(path, "wb") as f:
            sink = os.fdopen(os.dup(f.fileno()), "wb")
            try:
                torch.save(dict(state), sink)
            except KeyboardInterrupt:
                raise  # the writer may be unfinished: `sink` stays open for it (see above)
            except BaseException:  # the writer finished (or never began): free the space now
                with contextlib.suppress(OSError):
                    sink.close()
                raise
            sink.close()
    except (OSError, RuntimeError) as e:
        if isinstance(e.__context__, KeyboardInterrupt):
            # a ctrl-C inside torch.save: its zip writer's cleanup then fails on the half-written file and
            # would hide the interrupt behind a RuntimeError (and a traceback); the temp file is removed
            raise KeyboardInterrupt from None
        os_err = os_error_in(e)
        if os_err is None:  # not an I/O failure: a bug, keep the traceback
            raise
        if os_err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise QuotaError(f"cannot write checkpoint {path}: {os_err.strerror}; {_kept(path)}. "
                             "Free space, lower [train] keep, or use a smaller model") from None
        raise ShardshipError(f"cannot write checkpoint {path}: {os_err}; {_kept(path)}") from None


def _kept(path: Path) -> str:
    """What survived a failed checkpoint write, honestly: the file as it was, the run's
    last.pt, or nothing yet (a first checkpoint that did not fit leaves nothing to resume)."""
    if path.exists():
        return f"the previous {path.name} is intact"
    last = path.parent / "last.pt"
    if last.exists():
        return f"{last} is intact (the run resumes from it)"
    return f"no earlier checkpoint in {path.parent}: nothing saved to resume from yet"


def os_error_in(e: BaseException | None) -> OSError | None:
    """The OSError behind `e` (torch's zip writer turns a failed write into a
    RuntimeError whose context is the OSError)."""
    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, OSError):
            return e
        e = e.__cause__ or e.__context__
        seen += 1
    return None


def space_error(e: BaseException, out: Path) -> QuotaError | None:
    """A one-line QuotaError (exit 3, what the job's requeue logic expects for
    space) when `e` is, or wraps, a full disk or quota (ENOSPC/EDQUOT); else None."""
    if isinstance(e, QuotaError):
        return e
    os_err = os_error_in(e)
    if os_err is None or os_err.errno not in (errno.ENOSPC, errno.EDQUOT):
        return None
    where = os_err.filename or out
    last = out / "last.pt"
    then = (f"run the same command to resume from {last}" if last.exists()
            else f"run the same command again (no checkpoint in {out} yet)")
    return QuotaError(f"no space left writing {where} ({os_err.strerror}): free space in {out} or raise the quota, "
                      f"then {then}")


def load_checkpoint(path: Path) -> dict[str, Any]:
    """The checkpoint at `path`; a foreign or damaged file is a one-line error."""
    try:
        ck = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # a foreign or damaged file: say which and what to do
        raise ShardshipError(f"{path}: cannot read checkpoint ({type(e).__name__}: {e}); "
                             "move it away to start over") from None
    if not isinstance(ck, dict) or ck.get("format") != CHECKPOINT_FORMAT:
        raise ShardshipError(f"{path}: not a shardship checkpoint")
    return ck


def link_atomic(src: Path, dst: Path) -> None:
    """dst <- src without copying data (hard link + rename); copy if links are unsupported."""
    tmp = dst.with_name(f".{dst.name}.link.tmp")
    try:
        tmp.unlink(missing_ok=True)
        os.link(src, tmp)
        os.replace(tmp, dst)
    except OSError:
        tmp.unlink(missing_ok=True)
        write_bytes(dst, src.read_bytes())


def periodic_checkpoints(out: Path) -> list[tuple[int, Path]]:
    """(step, path) of the step_N.pt files in `out`, oldest first."""
    found = []
    for p in out.glob("step_*.pt"):
        m = STEP_RE.match(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return sorted(found)


def write_checkpoint(state: Mapping[str, Any], out: Path, kind: str, keep: int) -> None:
    """Write `state` as a 'best' (best.pt) or 'periodic' checkpoint. Periodic with
    keep > 0: step_N.pt, last.pt linked to it, then the step files beyond the newest
    `keep` removed (new before old: a kill in between leaves one too many, never
    none); keep = 0: last.pt alone."""
    if kind == "best":
        save_checkpoint(state, out / "best.pt")
    elif keep > 0:
        p = out / f"step_{state['step']}.pt"
        save_checkpoint(state, p)
        link_atomic(p, out / "last.pt")
        for _, old in periodic_checkpoints(out)[:-keep]:
            old.unlink(missing_ok=True)
    else:
        save_checkpoint(state, out / "last.pt")
