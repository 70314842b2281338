"""Scalars for dashboards, beside metrics.jsonl (which stays the record of truth):
TensorBoard event files in the run's output directory (rank 0), and Weights &
Biases when `[train] wandb = true` and the package is installed.

Neither is required: without tensorboard (or wandb) installed the run says so in
one line and trains on. A resumed run passes the checkpoint's step as TensorBoard's
purge_step, so the steps it redoes replace the old points instead of doubling
the curve (as train.metrics.current_run reads metrics.jsonl, which keeps them)."""
from __future__ import annotations

import dataclasses
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# metrics.jsonl key -> dashboard tag; other numeric keys go under train/
TAGS = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm",
        "samples_per_s": "train/samples_per_s", "data_wait": "train/data_wait", "val_loss": "val/loss"}
NOT_SCALARS = {"step", "epoch", "consumed"}
WANDB_ID = "wandb_id.txt"


def _warn(msg: str) -> None:
    print(f"warning: {msg}", file=sys.stderr)


class ScalarLog:
    """TensorBoard and/or wandb writers for one process (rank 0)."""

    def __init__(self, tb: Any = None, wb: Any = None):
        self.tb, self.wb = tb, wb

    @classmethod
    def open(cls, out: Path, tensorboard: bool = True, wandb: bool = False, project: str = "shardship",
             config: Any = None, purge_step: int | None = None) -> ScalarLog:
        return cls(_tensorboard(out, purge_step) if tensorboard else None,
                   _wandb(out, project, config) if wandb else None)

    @property
    def active(self) -> bool:
        return self.tb is not None or self.wb is not None

    def write(self, rec: Mapping[str, Any], prefix: str = "") -> None:
        """The numeric fields of a metrics.jsonl record at its `step`."""
        step = int(rec.get("step", 0))
        vals = {prefix + TAGS.get(k, f"train/{k}"): float(v) for k, v in rec.items()
                if k not in NOT_SCALARS and isinstance(v, (int, float)) and not isinstance(v, bool)}
        if not vals:
            return
        if self.tb is not None:
            for tag, v in vals.items():
                self.tb.add_scalar(tag, v, step)
        if self.wb is not None:
            self.wb.log(vals, step=step)

    def flush(self) -> None:
        if self.tb is not None:
            self.tb.flush()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
            self.tb = None
        if self.wb is not None:
            self.wb.finish()
            self.wb = None


def _tensorboard(out: Path, purge_step: int | None) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        _warn("tensorboard is not installed (pip install tensorboard): no event files, metrics.jsonl has the numbers")
        return None
    _quiet_writer_threads()
    return SummaryWriter(log_dir=str(out), purge_step=purge_step, flush_secs=10)


def _quiet_writer_threads() -> None:
    """TensorBoard writes events from a thread of its own; an OSError there (a full disk)
    is handed to the trainer's next call into the writer, which raises it, and the run
    says it in one line (exit 3). The thread also re-raises it, and Python printed that
    copy as a traceback, after the one line or not, by a race with the process's exit.
    Only that copy is dropped: every other thread's error is printed as before."""
    previous = threading.excepthook
    if getattr(previous, "shardship_quiet", False):
        return

    def hook(args: Any) -> None:
        if type(args.thread).__name__ == "_AsyncWriterThread" and isinstance(args.exc_value, OSError):
            return
        previous(args)

    hook.shardship_quiet = True  # type: ignore[attr-defined]
    threading.excepthook = hook


def _wandb(out: Path, project: str, config: Any) -> Any:
    """A wandb run that a resumed training run continues (its id kept in OUT)."""
    try:
        import wandb
    except ImportError:
        _warn("[train] wandb = true but wandb is not installed (pip install wandb): logging to TensorBoard only")
        return None
    id_file = out / WANDB_ID
    run_id = id_file.read_text().strip() if id_file.exists() else wandb.util.generate_id()
    id_file.write_text(run_id + "\n")
    cfg = dataclasses.asdict(config) if dataclasses.is_dataclass(config) and not isinstance(config, type) else config
    return wandb.init(project=project, id=run_id, resume="allow", dir=str(out), config=cfg)
