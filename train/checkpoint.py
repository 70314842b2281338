"""Checkpoint files: what one holds, how it is written so a kill never costs the
previous one, how it is read back, and which files a run keeps.

    last.pt       newest state; the run resumes from it automatically (from the
                  newest one that reads back when it does not: `find_resume`)
    step_N.pt     every checkpoint_every steps, the newest `keep` kept
                  (last.pt is a hard link to the newest one: no extra space;
                  retention never removes one newer than the file just written,
                  nor counts a damaged one as kept)
    best.pt       lowest validation loss (EMA weights, validation sessions); its
                  value is the bar a later run, resumed or not, has to beat

The disk peak of this retention is train.retention.peak_checkpoint_files (kept
torch-free there: `packer budget` and the job checks size quotas by it)."""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import os
import re
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
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


class UnreadableCheckpoint(ShardshipError):
    """A checkpoint file that does not read back as one; `why` says how, without the path."""

    def __init__(self, path: Path, why: str, message: str):
        self.path, self.why = path, why
        super().__init__(message)


def load_checkpoint(path: Path, mmap: bool = False) -> dict[str, Any]:
    """The checkpoint at `path`; a foreign or damaged file is a one-line error.
    `mmap`: tensors stay in the file (torch >= 2.1), for reading a field or two."""
    try:
        try:
            ck = torch.load(path, map_location="cpu", weights_only=False, **({"mmap": True} if mmap else {}))
        except TypeError:
            if not mmap:
                raise
            ck = torch.load(path, map_location="cpu", weights_only=False)  # a torch without mmap=
    except Exception as e:  # a foreign or damaged file: say which (callers say what to do)
        why = f"{type(e).__name__}: {str(e).split('. ')[0][:120]}"  # torch's own text runs on for lines
        raise UnreadableCheckpoint(path, why, f"{path}: cannot read checkpoint ({why}): damaged or cut short; "
                                   "use another checkpoint") from None
    if not isinstance(ck, dict) or ck.get("format") != CHECKPOINT_FORMAT:
        raise UnreadableCheckpoint(path, "not a shardship checkpoint", f"{path}: not a shardship checkpoint")
    return ck


def looks_intact(path: Path) -> bool:
    """Does the file end as a torch.save archive ends (a zip with its central directory)?
    A file cut short by a kill, a full disk or a copy does not. Cheap (the directory only),
    for retention, which must not count a damaged file among the ones it keeps."""
    try:
        with zipfile.ZipFile(path) as z:
            return bool(z.namelist())
    except (OSError, zipfile.BadZipFile, ValueError):
        return False


@dataclass
class Resume:
    """The checkpoint a run continues from, and the newer ones that would not read back."""

    path: Path
    ckpt: dict[str, Any] | None  # loaded (rank 0 picked it), else None: load `path`
    unreadable: list[tuple[Path, str]] = field(default_factory=list)  # (file, why), newest first

    def notice(self) -> str | None:
        """One line for the log when this is not last.pt, else None."""
        if not self.unreadable:
            return None
        return (f"warning: {unreadable(self.unreadable)}: resuming from {self.path}, the newest checkpoint "
                "that reads back")


def unreadable(bad: list[tuple[Path, str]]) -> str:
    """"a, b are unreadable (why)": files that failed alike said once (last.pt and the
    step_N.pt it is a hard link of always do)."""
    by_why: dict[str, list[str]] = {}
    for p, why in bad:
        by_why.setdefault(why, []).append(str(p))
    return "; ".join(f"{', '.join(ps)} {'is' if len(ps) == 1 else 'are'} unreadable ({why})"
                     for why, ps in by_why.items())


def resume_candidates(out: Path) -> list[Path]:
    """last.pt, then every other checkpoint newest first (by when it was written, then by
    step): the run's own newest state before an older run's step file."""
    def newest(p: Path) -> tuple[int, int]:
        m = STEP_RE.match(p.name)
        return p.stat().st_mtime_ns, int(m.group(1)) if m else -1

    last = out / "last.pt"
    others = [p for _, p in periodic_checkpoints(out)] + [p for p in (out / "best.pt",) if p.is_file()]
    return ([last] if last.is_file() else []) + sorted(others, key=newest, reverse=True)


def find_resume(out: Path) -> Resume | None:
    """What a run in `out` resumes from: last.pt, or when it does not read back (cut short
    by a copy, a disk, a hand) the newest checkpoint that does. It used to say "move it
    away to start over", and a run that did started at step 0 beside an intact step_N.pt.
    None: no checkpoint at all. None readable: a one-line error naming each."""
    bad: list[tuple[Path, str]] = []
    for p in resume_candidates(out):
        try:
            return Resume(p, load_checkpoint(p), bad)
        except UnreadableCheckpoint as e:
            bad.append((p, e.why))
    if not bad:
        return None
    raise ShardshipError(f"no checkpoint in {out} reads back: {unreadable(bad)}; copy good ones back, or move "
                         "them away (or pass --no-resume) to start over")


def best_so_far(out: Path, mcfg: Mapping[str, Any]) -> tuple[float | None, str | None]:
    """(best.pt's validation loss, a warning): the bar a new best must beat, also for a run
    that did not resume (a restart, --no-resume) - it overwrote a better best.pt with its
    first, worse validation. A damaged best.pt is replaced by the next validation (the
    warning says so); one of another model is refused as a resume from it would be."""
    path = out / "best.pt"
    if not path.is_file():
        return None, None
    try:
        ck = load_checkpoint(path, mmap=True)
    except UnreadableCheckpoint as e:
        return None, f"warning: {path} is unreadable ({e.why}): the next validation replaces it"
    if ck.get("model_config") != mcfg:
        raise ShardshipError(f"{path} was trained with another model config or data shape; use a new --out, or "
                             "move it away to start over")
    best = ck.get("best_val")
    return (float(best) if isinstance(best, (int, float)) else None), None


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


def write_checkpoint(state: Mapping[str, Any], out: Path, kind: str, keep: int,
                     protect: frozenset[str] | set[str] = frozenset()) -> None:
    """Write `state` as a 'best' (best.pt) or 'periodic' checkpoint. Periodic with
    keep > 0: step_N.pt, last.pt linked to it, then the older step files beyond
    `keep` removed (new before old: a kill in between leaves one too many, never
    none; see `stale_checkpoints`, which never removes a file named in `protect`);
    keep = 0: last.pt alone."""
    if kind == "best":
        save_checkpoint(state, out / "best.pt")
    elif keep > 0:
        p = out / f"step_{state['step']}.pt"
        save_checkpoint(state, p)
        link_atomic(p, out / "last.pt")
        for old in stale_checkpoints(out, int(state["step"]), keep, protect):
            old.unlink(missing_ok=True)
    else:
        save_checkpoint(state, out / "last.pt")


def stale_checkpoints(out: Path, step: int, keep: int, protect: frozenset[str] | set[str] = frozenset()) -> list[Path]:
    """The step files retention removes once step_{step}.pt is written: of the older ones,
    all but the newest keep - 1 that are intact (a damaged one is no backup: it goes, and
    does not count). Never the one just written, never a newer one, never one in
    `protect` (`foreign_checkpoints`: another run's). Counting by step number alone, a
    run that started over removed the old run's intact step_N.pt, its only good state."""
    older = [p for s, p in periodic_checkpoints(out) if s < step and p.name not in protect]
    kept: list[Path] = []
    for p in reversed(older):
        if len(kept) < keep - 1 and looks_intact(p):
            kept.append(p)
    return [p for p in older if p not in kept]


def foreign_checkpoints(out: Path, resumed_from: int | None) -> set[str]:
    """The step files in `out` that are not this run's ancestors: past the step it resumed
    from (a newer run's that did not read back, or one it moved on from), or any, for a
    run that started at step 0 beside them. Retention leaves them to the user."""
    floor = -1 if resumed_from is None else resumed_from
    return {p.name for s, p in periodic_checkpoints(out) if s > floor}
