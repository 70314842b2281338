"""What the training loop runs on: one rank's `RunState`, built from the data and
the config (`setup_run`), continued from a checkpoint (`resume_run`), written
back as one (`RunState.save`).

Kept apart from train.trainer so the loop reads in one sitting; the order of
the setup steps matters for exact resume (seeding before the model is built,
the checkpoint's random streams restored after), so it lives in these few
functions only."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from packer.actions import POSE_DIMS
from shardship.errors import ShardshipError
from train import ddp
from train.checkpoint import (
    Resume,
    best_so_far,
    checkpoint_payload,
    find_resume,
    foreign_checkpoints,
    load_checkpoint,
    write_checkpoint,
)
from train.config import TrainConfig, parse_duration
from train.data import ShardDataset, load_index, split_sessions, verify_shards
from train.data.index import ShardIndex
from train.data.normalize import make_normalizer
from train.metrics import open_metrics, open_samples_log, run_mark
from train.model import DiffusionPolicy, model_config
from train.optim import EMA, make_optimizer
from train.runtime import amp_dtype, make_scaler, rng_state, seed_everything, set_rng_state
from train.step_opts import CompiledStep, apply_step_options, compile_net
from train.tblog import ScalarLog


@dataclass
class RunResult:
    step: int
    total_steps: int
    epoch: int
    best_val: float | None
    out: Path
    stopped: str | None  # reason for an early stop, None when the run reached its end
    resumed_from: int | None


def build_model(index: ShardIndex, cfg: TrainConfig,
                pretrained: bool = False) -> tuple[DiffusionPolicy, dict[str, Any]]:
    """The policy for this data's shapes (cfg.frames() observation frames, 13-D
    relative proprio per frame), its normaliser (cfg.normalize) set from index.json's
    stats: the model's offset/scale buffers hold it, so a checkpoint carries its
    normaliser. With `pretrained`, the backbone's pretrained weights are loaded
    (stack: ImageNet ResNet18)."""
    n = cfg.frames()
    mcfg = model_config(cfg.model, action_dim=index.action_dim, proprio_dim=POSE_DIMS + index.proprio_dim,
                        horizon=index.horizon, image_size=index.image_size[0], obs_horizon=n)
    model = DiffusionPolicy(mcfg)
    norm = make_normalizer(index.stats, cfg.normalize, index.action_dim, index.proprio_dim, n)
    model.set_normaliser(norm.as_stats())
    if pretrained:
        model.load_pretrained()
    return model, mcfg


def model_summary(model: DiffusionPolicy) -> str:
    """One line: preset, parameters (all / trainable) and where pretrained weights came from."""
    c = model.cfg
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    line = f"model {c['preset']}: {total / 1e6:.2f} M parameters, {trainable / 1e6:.2f} M trainable"
    if c["arch"] == "stack":
        weights = c["backbone_weights"]
        line += (f" (ResNet18 {'frozen' if c['freeze_backbone'] else 'fine-tuned'}, {c['backbone_norm']} norm, "
                 f"weights {'random init' if weights in ('', 'none') else weights}; obs_horizon {c['obs_horizon']})")
    return line


def warmup_warning(cfg: TrainConfig, total_steps: int) -> str | None:
    """A warm-up that lasts the whole run never reaches the configured LR: say so."""
    if int(cfg.warmup) >= total_steps:
        return (f"warning: warmup {cfg.warmup} steps >= the run's {total_steps} steps: the learning rate never "
                f"reaches lr {cfg.lr} (set --warmup below {total_steps}, e.g. {max(0, total_steps // 10)})")
    return None


def make_dataset(ix: ShardIndex, cfg: TrainConfig, d: ddp.Dist, tail: str) -> ShardDataset:
    """The reader the trainer uses: raw units (the model normalises), cfg's
    obs_horizon; validation (tail="pad") scores every frame, edges masked."""
    return ShardDataset(ix, cfg.batch_size, d.rank, d.world_size, seed=int(cfg.seed), window=cfg.window, tail=tail,
                        obs_horizon=cfg.frames(), edges=cfg.edges if tail == "drop" else "mask",
                        run_length=cfg.run_length() if tail == "drop" else 1)


@dataclass(eq=False)
class RunState:
    """One rank's run: what setup builds and the step, validation and checkpoint
    code share. `step`, `best_val` and the reader position change as it trains."""

    d: ddp.Dist
    cfg: TrainConfig
    data: Path
    out: Path
    t_start: float  # time.monotonic() at the start, for the time limit
    time_limit: float | None  # seconds
    index: ShardIndex
    sessions: tuple[list[str], list[str]]  # (train, validation) session names
    train_ix: ShardIndex
    val_ix: ShardIndex | None
    train_ds: ShardDataset
    steps_per_epoch: int
    total_steps: int
    model: DiffusionPolicy
    mcfg: dict[str, Any]
    ema: EMA[DiffusionPolicy]
    opt: torch.optim.AdamW
    dtype: torch.dtype | None  # autocast dtype; None: full precision
    scaler: Any
    net: torch.nn.Module  # the model, or its DDP wrapper
    sched: Any = None  # LambdaLR, built once the resumed step is known
    step: int = 0
    best_val: float | None = None
    resumed_from: int | None = None
    resumed_file: str | None = None  # the checkpoint's file name (last.pt, or an older one when it was unreadable)
    metrics: IO[str] | None = None  # metrics.jsonl, rank 0 only
    mark: str | None = None  # the line marking this run's start, written before its first record
    scalars: ScalarLog | None = None  # TensorBoard / wandb, rank 0 only
    samples: IO[str] | None = None  # samples/rankN.jsonl, with log_samples
    plot_warned: bool = False  # loss.png failed once and said so
    foreign: set[str] = field(default_factory=set)  # step files not this run's, which retention leaves
    feed: Any = None  # train.feed.Feed: how the training batches reach the device, set before the first step
    val_ds: ShardDataset | None = None  # the validation reader, made at the first validation
    step_how: str = "eager"  # how the step runs (train.step_opts): channels-last, compiled

    @property
    def device(self) -> torch.device:
        return self.d.device

    @property
    def global_batch(self) -> int:
        return self.cfg.batch_size * self.d.world_size

    def log(self, rec: dict[str, Any]) -> None:
        """One metrics.jsonl line (a no-op on ranks other than 0)."""
        if self.metrics is not None:
            if self.mark is not None:
                self.metrics.write(self.mark)
                self.mark = None
            self.metrics.write(json.dumps(rec) + "\n")
        if self.scalars is not None:
            self.scalars.write(rec)

    def result(self, stopped: str | None) -> RunResult:
        return RunResult(step=self.step, total_steps=self.total_steps, epoch=self.train_ds.epoch,
                         best_val=self.best_val, out=self.out, stopped=stopped, resumed_from=self.resumed_from)

    def last_good(self) -> str:
        """Which checkpoint a failed run leaves to resume from, honestly."""
        last = self.out / "last.pt"
        return f"{last} holds the last good state" if last.exists() else f"no checkpoint in {self.out} yet"

    def check_finite(self, what: str) -> None:
        """Refuse to go on (and to write `what`) when a weight is NaN/inf: the loss
        diverged since the last logged step. The same answer on every rank (DDP
        keeps the weights identical), so all ranks stop together."""
        params = [p for m in (self.model, self.ema.module) for p in m.parameters()]
        if bool(torch.stack([p.isfinite().all() for p in params]).all()):
            return
        raise ShardshipError(f"the weights are not finite at step {self.step} (the loss diverged): not writing {what}; "
                             f"{self.last_good()}; lower lr (now {self.cfg.lr}) or raise warmup")

    def save(self, kind: str) -> None:
        """kind: 'periodic' (step_N + last) or 'best'. A collective (every rank's RNG
        state is gathered): all ranks call it on the same step; rank 0 writes."""
        self.check_finite(f"the {kind} checkpoint")
        rngs = self.d.all_gather_object(rng_state(self.device))
        if not self.d.is_main:
            return
        state = checkpoint_payload(
            self.model, self.ema, self.opt, self.sched, self.scaler, step=self.step, total_steps=self.total_steps,
            reader=self.train_ds.state_dict(), rngs=rngs, world_size=self.d.world_size,
            global_batch=self.global_batch, cfg=self.cfg, best_val=self.best_val, sessions=self.sessions,
            data={"root": str(self.data), "fingerprint": self.index.fingerprint(),
                  "pose_metric": self.index.pose_metric})
        write_checkpoint(state, self.out, kind, self.cfg.keep, protect=self.foreign)
        self.foreign.discard(f"step_{self.step}.pt")  # replaced by this run's own
        self.log({"step": self.step, "event": f"checkpoint:{kind}"})


def setup_run(d: ddp.Dist, data: Path, out: Path, cfg: TrainConfig, progress: bool, t_start: float,
              pretrained: bool = True) -> RunState:
    """Data (index, shard check, session split, reader), then model, EMA, optimizer
    and AMP. Shards are checked here, before DataLoader workers fork: they inherit
    the result. `pretrained`: load the backbone's pretrained weights (not needed,
    nor required to exist, when a checkpoint is about to replace them)."""
    index = load_index(data)
    verify_shards(index, progress=progress and d.is_main)
    train_names, val_names = split_sessions(index.sessions_present(), float(cfg.val_fraction), int(cfg.seed),
                                            cfg.val_sessions or None, index.session_content)
    train_ix = index.select_sessions(train_names)
    val_ix = index.select_sessions(val_names) if val_names else None
    train_ds = make_dataset(train_ix, cfg, d, "drop")
    spe = train_ds.steps_per_epoch()
    if spe < 1:
        raise ShardshipError(f"{data}: the training sessions hold {train_ds.n_samples} samples (edges={cfg.edges}, "
                             f"obs_horizon={cfg.frames()}), fewer than one global "
                             f"batch ({cfg.batch_size} x {d.world_size} ranks): lower batch_size")
    total_steps = int(cfg.steps) if cfg.steps else int(cfg.epochs) * spe

    seed_everything(int(cfg.seed) + d.rank)
    model, mcfg = build_model(index, cfg, pretrained=pretrained)
    model.to(d.device)
    # before EMA, the optimizer and a resumed state: they take the parameters' layout; under DDP
    # the wrapper is compiled instead (open_logs)
    net, how = apply_step_options(model, d.device, cfg.channels_last, cfg.compile and not d.distributed,
                                  warn=lambda line: tqdm.write(line, file=sys.stderr))
    ema = EMA(model, cfg.ema_decay)
    opt = make_optimizer(model, cfg, d.device)
    dtype = amp_dtype(d.device, cfg.amp)
    return RunState(d=d, cfg=cfg, data=data, out=out, t_start=t_start, time_limit=parse_duration(cfg.time_limit),
                    index=index, sessions=(train_names, val_names),
                    train_ix=train_ix, val_ix=val_ix, train_ds=train_ds, steps_per_epoch=spe, total_steps=total_steps,
                    model=model, mcfg=mcfg, ema=ema, opt=opt, dtype=dtype, scaler=make_scaler(dtype == torch.float16),
                    net=net, step_how=how)


def plan_resume(d: ddp.Dist, out: Path, resume: bool) -> Resume | None:
    """The checkpoint this run continues from (train.checkpoint.find_resume: last.pt, or
    the newest that reads back), None for a fresh start. Rank 0 looks (and keeps what it
    loaded); every rank learns the same file, or the same one-line error."""
    pick, err = None, None
    if resume and d.is_main:
        try:
            pick = find_resume(out)
        except ShardshipError as e:
            err = str(e)
    if d.distributed:
        path, err = d.all_gather_object((str(pick.path) if pick else None, err))[0]
        if not d.is_main:
            pick = Resume(Path(path), None) if path else None
    if err:
        raise ShardshipError(err)
    return pick


def resume_run(run: RunState, pick: Resume) -> None:
    """Continue from `pick`: weights, EMA, optimizer, scaler, step, reader position
    and every rank's random streams, so the run goes on as if never stopped.
    (The LR schedule is rebuilt from the config by train.optim.make_scheduler.)"""
    d, cfg, last = run.d, run.cfg, pick.path
    ck = pick.ckpt if pick.ckpt is not None else load_checkpoint(last)
    pick.ckpt = None  # its tensors go into the model: no second copy kept
    if ck["model_config"] != run.mcfg:
        raise ShardshipError(f"{last} was trained with another model config or data shape; "
                             "use a new --out, or move it away to start over")
    run.model.load_state_dict(ck["model"])
    run.ema.load_state_dict(ck["ema"])
    run.opt.load_state_dict(ck["optimizer"])
    run.scaler.load_state_dict(ck["scaler"])
    run.step, run.best_val, run.resumed_from = int(ck["step"]), ck.get("best_val"), int(ck["step"])
    run.resumed_file = last.name
    if not cfg.steps:
        run.total_steps = int(ck.get("total_steps", run.total_steps))
    same_data = run.train_ds.load_state_dict(ck["reader"])
    rngs = ck.get("rng") or []
    if len(rngs) == d.world_size:
        set_rng_state(rngs[d.rank], d.device)
    else:  # another number of ranks: fresh, distinct, reproducible streams
        seed_everything(int(cfg.seed) * 1_000_003 + run.step * 101 + d.rank)
    if d.is_main:
        notice = pick.notice()
        if notice:
            tqdm.write(notice, file=sys.stderr)
        note = "" if same_data else " (the data changed since: this epoch starts over)"
        tqdm.write(f"resuming from {last} at step {run.step}, epoch {run.train_ds.epoch}, "
                   f"{run.train_ds.consumed}/{run.train_ix.n_samples} samples into the epoch{note}")


def seed_best(run: RunState) -> None:
    """run.best_val <- the lower of the resumed checkpoint's and best.pt's own value, so
    best.pt is only replaced by a better validation loss, whatever happened between: a
    restart at step 0, a resume from an older checkpoint (best.pt may be newer), a
    kill between best.pt and the next periodic checkpoint. Rank 0 reads; all ranks learn
    (saving best.pt is a collective)."""
    d = run.d
    best, note, err = None, None, None
    if d.is_main:
        try:
            best, note = best_so_far(run.out, run.mcfg)
        except ShardshipError as e:
            err = str(e)
    if d.distributed:
        best, err = d.all_gather_object((best, err))[0]
    if err:
        raise ShardshipError(err)
    if note and d.is_main:
        tqdm.write(note, file=sys.stderr)
    if best is not None and (run.best_val is None or best < run.best_val):
        run.best_val = best


def note_foreign(run: RunState) -> None:
    """The step files in OUT that are not this run's (train.checkpoint.foreign_checkpoints):
    its retention leaves them, and says so once. Rank 0 only (it alone writes)."""
    run.foreign = foreign_checkpoints(run.out, run.resumed_from) if run.d.is_main else set()
    if run.foreign:
        tqdm.write(f"note: {', '.join(sorted(run.foreign))} in {run.out}: past step {run.step}, where this run "
                   "starts, so not its own: retention leaves them (remove them when no longer needed)",
                   file=sys.stderr)


def open_logs(run: RunState) -> None:
    """The samples log, the DDP wrapper, metrics.jsonl: what only a run that will
    take steps needs (a run already at its target leaves its files alone)."""
    d = run.d
    if run.cfg.log_samples:
        run.samples = open_samples_log(run.out, d.rank, d.world_size, run.resumed_from)
    if d.distributed:
        run.net = DistributedDataParallel(run.model, device_ids=[d.device.index] if d.device.type == "cuda" else None,
                                          broadcast_buffers=False)  # buffers (normaliser, schedule) never change
        if run.cfg.compile:  # torch's documented order: compile the DDP wrapper
            run.net = compile_net(run.net, d.device, warn=lambda line: tqdm.write(line, file=sys.stderr))
            run.step_how += ", compiled" if isinstance(run.net, CompiledStep) else ", compile unavailable"
    run.metrics = open_metrics(run.out, d.is_main)
    run.mark = run_mark(run.out, run.step, run.resumed_file) if d.is_main else None
    if d.is_main:
        cfg = run.cfg
        run.scalars = ScalarLog.open(run.out, cfg.tensorboard, cfg.wandb, cfg.wandb_project, cfg,
                                     purge_step=(run.resumed_from + 1) if run.resumed_from is not None else None)


def close_logs(run: RunState) -> None:
    for f in (run.samples, run.metrics):
        if f is not None:
            f.close()
    if run.scalars is not None:
        run.scalars.close()
