"""The training loop, nanoGPT style: `train` sets a rank up, `_loop` runs the
epochs, `_train_step` is one optimizer step.

Per step: wait for a batch (timed: the data-wait fraction), forward under
autocast (bf16 on GPUs that have it, fp16 + GradScaler on those that do not, off
on CPU), backward, clip, AdamW, cosine LR with warmup, EMA. Every `log_every`
steps the ranks all-reduce the loss and a stop flag (SIGTERM/SIGUSR1 or the time
limit), so every rank stops on the same step and nobody waits in a collective
for a rank that left. Rank 0 checkpoints atomically every `checkpoint_every`
steps, at a new best validation loss and at the end (train.checkpoint lists the
files); the run resumes from last.pt by itself (from the newest checkpoint that
reads back when last.pt does not), with the same step, learning rate, data
position and random streams. best.pt is replaced only by a better validation loss
than its own, also across restarts; metrics.jsonl is only appended to, each run
marking where it starts, and loss.png draws the run as it stands.
Rank 0 holds OUT/.lock for the run (a second run into OUT is refused), no
checkpoint is written from non-finite weights, a failed loss.png is a warning,
and a full disk anywhere is one line and exit 3 (Exit.QUOTA).

The pieces live beside this file: train.config (the [train] schema, torch-free),
train.state (one rank's run: setup, resume, checkpoint), train.optim (AdamW, LR
schedule, EMA), train.checkpoint (contents, atomic writes, retention),
train.runtime (random streams, mixed precision, stop signals), train.metrics
(metrics.jsonl, samples logs, loss.png) and train.tblog (TensorBoard, wandb)."""
from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from shardship.atomic import remove_stale_temps
from shardship.errors import ShardshipError
from shardship.progress import bar as progress_bar
from shardship.units import plural
from train import ddp
from train.checkpoint import checkpoint_payload, load_checkpoint, os_error_in, save_checkpoint, space_error
from train.config import TrainConfig, parse_duration
from train.data import make_loader
from train.feed import open_feed
from train.metrics import METRICS, plot_metrics
from train.optim import EMA, lr_at, lr_lambda, make_optimizer, make_scheduler
from train.runtime import (
    StopFlag,
    amp_dtype,
    autocast,
    batches,
    configure_device,
    make_scaler,
    rng_state,
    take_output_lock,
    to_device,
)
from train.speed import Rate, summary_lines, verdict
from train.state import (
    RunResult,
    RunState,
    build_model,
    close_logs,
    make_dataset,
    model_summary,
    note_foreign,
    open_logs,
    plan_resume,
    resume_run,
    seed_best,
    setup_run,
    warmup_warning,
)

# Besides train(): the names tests, bench/ and older callers import from train.trainer.
__all__ = ["EMA", "RunResult", "StopFlag", "TrainConfig", "amp_dtype", "build_model", "checkpoint_payload",
           "load_checkpoint", "lr_at", "lr_lambda", "make_optimizer", "make_scaler", "parse_duration", "rng_state",
           "save_checkpoint", "train"]


def train(data: str | Path, out: str | Path, cfg: TrainConfig, max_steps: int | None = None,
          resume: bool = True, progress: bool = True) -> RunResult:
    """Train (or continue training) a policy on the packed directory `data`,
    writing checkpoints and metrics under `out`. Runs as one rank of torchrun
    when launched by it."""
    data, out = Path(data), Path(out)
    dist_ = ddp.setup(cfg.device)
    stop = StopFlag()
    stop.install()
    lock = None
    try:
        lock = take_output_lock(dist_, out)
        return _train(dist_, data, out, cfg, max_steps, resume, progress, stop)
    except (OSError, RuntimeError) as e:  # a full disk anywhere (logs, plots, checkpoints): exit 3, one line
        full = space_error(e, out)
        if full is None:
            raise
        raise full from None
    finally:
        if lock is not None:
            lock.release()
        stop.restore()
        ddp.cleanup()


def _train(d: ddp.Dist, data: Path, out: Path, cfg: TrainConfig, max_steps: int | None, resume: bool,
           progress: bool, stop: StopFlag) -> RunResult:
    t_start = time.monotonic()
    if d.is_main:
        out.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(out)
    configure_device(d.device)
    pick = plan_resume(d, out, resume)
    run = setup_run(d, data, out, cfg, progress, t_start, pretrained=pick is None)
    if pick is not None:
        resume_run(run, pick)
    seed_best(run)
    note_foreign(run)
    run.sched = make_scheduler(run.opt, cfg, run.total_steps, run.resumed_from)
    end = min(run.total_steps, max_steps) if max_steps else run.total_steps
    if run.step >= end:
        if d.is_main:
            tqdm.write(f"{out / (run.resumed_file or 'last.pt')} is already at step {run.step} (target {end}): "
                       "nothing to do; raise --steps to continue")
        return run.result(None)

    open_logs(run)
    run.feed = open_feed(run.train_ds, cfg, run.device, d, progress=progress and d.is_main)
    if d.is_main:
        val_samples = run.val_ix.n_samples if run.val_ix else 0
        amp = f", {str(run.dtype).replace('torch.', '')}" if run.dtype else ""
        n_tr, n_va = len(run.sessions[0]), len(run.sessions[1])
        tqdm.write(f"train: {run.train_ix.n_samples} samples ({n_tr} {plural('session', n_tr)}), val: "
                   f"{val_samples} samples ({n_va} {plural('session', n_va)}); {d.world_size} rank(s) "
                   f"x batch {cfg.batch_size}, {run.steps_per_epoch} steps/epoch, {run.total_steps} steps; "
                   f"device {d.device}{amp}; out {out}")
        tqdm.write(f"{model_summary(run.model)}; step: {run.step_how}")
        warn = warmup_warning(cfg, run.total_steps)
        if warn:
            tqdm.write(warn, file=sys.stderr)
            run.log({"step": run.step, "warning": warn})
    # a bar on a terminal; in a job log one plain line per 10% or per minute (shardship.progress)
    bar = progress_bar(end, "train", "step", None if (progress and d.is_main) else False, initial=run.step,
                       mininterval=1.0)
    try:
        stopped, last_saved = _loop(run, end, stop, bar)
        _finish(run, stopped, end, last_saved)
    finally:
        bar.close()
        close_logs(run)
    return run.result(stopped)


SPEED_AFTER_S = 60.0  # the speed summary goes into the log after this much training


@dataclass
class _FirstMinute:
    """Sums over the run's first SPEED_AFTER_S seconds of steps, for the speed summary."""

    samples: int = 0
    wait: float = 0.0
    seconds: float = 0.0
    done: bool = False

    def add(self, win: _Window, samples: int, seconds: float) -> None:
        self.samples += samples
        self.wait += win.wait
        self.seconds += seconds


@dataclass
class _Window:
    """Running sums of one logging window; all-reduced and reset when it closes."""

    loss: torch.Tensor
    steps: int = 0
    wait: float = 0.0  # seconds spent waiting for batches
    t0: float = field(default_factory=time.perf_counter)

    def reset(self) -> None:
        self.loss.zero_()
        self.steps, self.wait, self.t0 = 0, 0.0, time.perf_counter()


def _loop(run: RunState, end: int, stop: StopFlag, bar: Any) -> tuple[str | None, int]:
    """Epochs of steps until step `end` or a stop every rank agreed on.
    Returns (why it stopped early, or None; the last step checkpointed)."""
    cfg = run.cfg
    win = _Window(torch.zeros((), device=run.device, dtype=torch.float64))
    first = _FirstMinute()
    stopped: str | None = None
    last_saved = run.step if run.resumed_from is not None else -1
    run.model.train()
    while run.step < end and stopped is None:
        epoch_batches = run.feed.epoch(run.train_ds, seed=int(cfg.seed) * 1_000_003 + run.train_ds.epoch)
        t_wait = time.perf_counter()
        for batch in epoch_batches:
            win.wait += time.perf_counter() - t_wait
            lr_used, gnorm = _train_step(run, batch, win)
            if run.step % cfg.log_every == 0 or run.step >= end:
                if not first.done:
                    first.add(win, win.steps * cfg.batch_size, time.perf_counter() - win.t0)
                    _speed_summary(run, first)
                stopped = _close_window(run, win, lr_used, gnorm, stop, bar)
            bar.update(1)

            t_pause = time.perf_counter()  # validation and checkpoints are not training throughput
            if cfg.val_every and run.step % cfg.val_every == 0 and run.step < end:
                _validate_and_keep_best(run)
                run.model.train()
            if run.step % cfg.checkpoint_every == 0 and run.step < end:
                run.save("periodic")
                last_saved = run.step
                _plot(run)
            win.t0 += time.perf_counter() - t_pause
            if stopped or run.step >= end:
                break
            t_wait = time.perf_counter()
        else:
            run.train_ds.set_state(run.train_ds.epoch + 1, 0)  # epoch finished
        epoch_batches.close()  # shuts the epoch's workers down
    return stopped, last_saved


def _train_step(run: RunState, batch: dict[str, torch.Tensor], win: _Window) -> tuple[float, torch.Tensor]:
    """One optimizer step on `batch`; returns (the LR it used, the gradient norm)."""
    loss, gnorm, lr_used = update(run, batch)
    run.step += 1
    run.train_ds.consumed += run.global_batch
    win.loss += loss.detach().double()
    win.steps += 1
    if run.samples is not None:
        run.samples.write(json.dumps({"step": run.step, "epoch": run.train_ds.epoch,
                                      "position": batch["position"].tolist(),
                                      "index": batch["index"].tolist()}) + "\n")
    return lr_used, gnorm


def update(run: RunState, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, float]:
    """The step's work (also what `train bench` times): forward under autocast, backward,
    clip, AdamW, LR schedule, EMA. Returns (loss, gradient norm, the LR used)."""
    b = to_device(batch, run.device)
    with autocast(run.device, run.dtype):
        loss = run.net(b)
    run.opt.zero_grad(set_to_none=True)
    run.scaler.scale(loss).backward()
    run.scaler.unscale_(run.opt)
    gnorm = torch.nn.utils.clip_grad_norm_(run.model.parameters(), float(run.cfg.grad_clip))
    lr_used = run.sched.get_last_lr()[0]
    run.scaler.step(run.opt)
    run.scaler.update()
    run.sched.step()
    run.ema.update(run.model)
    return loss, gnorm, lr_used


def _close_window(run: RunState, win: _Window, lr_used: float, gnorm: torch.Tensor, stop: StopFlag,
                  bar: Any) -> str | None:
    """All-reduce the window's loss with the stop flag, log it, reset the window.
    Returns why every rank stops now (the same answer on all of them), or None."""
    over = run.time_limit is not None and time.monotonic() - run.t_start >= run.time_limit
    flag = 1.0 if (stop.reason or over) else 0.0
    red = run.d.all_reduce_sum(torch.stack([win.loss,
                                            torch.tensor(float(win.steps), device=run.device, dtype=torch.float64),
                                            torch.tensor(flag, device=run.device, dtype=torch.float64)]))
    dt = time.perf_counter() - win.t0
    mean_loss = float(red[0] / red[1])
    rec = {"step": run.step, "epoch": run.train_ds.epoch, "consumed": run.train_ds.consumed,
           "loss": mean_loss, "lr": lr_used, "grad_norm": float(gnorm),
           "samples_per_s": win.steps * run.global_batch / dt, "data_wait": win.wait / dt}
    run.log(rec)
    bar.set_postfix(loss=f"{mean_loss:.4f}", lr=f"{lr_used:.2e}",
                    sps=f"{rec['samples_per_s']:.0f}", wait=f"{rec['data_wait']:.0%}")
    win.reset()
    stopped = None
    if red[2] > 0:
        stopped = stop.reason or ("time limit" if over else "another rank was signalled")
    if not math.isfinite(mean_loss):  # same value on every rank: all stop together
        raise ShardshipError(f"training loss is {mean_loss} at step {run.step}: lower lr (now {run.cfg.lr}) "
                             f"or raise warmup; {run.last_good()}")
    return stopped


def _speed_summary(run: RunState, first: _FirstMinute) -> None:
    """Once SPEED_AFTER_S seconds of steps are done: what fed the device and who set
    the pace, in `train bench`'s words (train.speed), near the top of the log."""
    if first.seconds < SPEED_AFTER_S:
        return
    first.done = True
    if not run.d.is_main:
        return
    feed = run.feed
    name = "loader cache" if feed.cache is not None else "loader streaming"
    model, together = Rate(first.samples, first.seconds - first.wait), Rate(first.samples, first.seconds, first.wait)
    lines = summary_lines((name, None, f"{feed.mode}: {feed.why}"), model, together,
                          "this rank's steps, the time not spent waiting for data")
    lines.append(f"choice: cache = \"{run.cfg.cache}\": {verdict(model, together, feed.mode)}")
    tqdm.write(f"speed over the first {first.seconds:.0f} s (rank 0):\n  " + "\n  ".join(lines))
    run.log({"step": run.step, "speed": lines})


def _validate(run: RunState) -> float | None:
    """Mean EMA loss over the validation sessions (every rank a share, fixed noise)."""
    if run.val_ix is None:
        return None
    cfg, d, device = run.cfg, run.d, run.device
    if run.val_ds is None:
        run.val_ds = make_dataset(run.val_ix, cfg, d, "pad")
    ds = run.val_ds
    ds.set_state(0, 0)
    gen = torch.Generator(device=device).manual_seed(int(cfg.seed) * 7919 + d.rank)
    num = torch.zeros(2, device=device, dtype=torch.float64)
    run.ema.module.eval()
    with torch.no_grad():
        for batch in batches(make_loader(ds, cfg.num_workers, device.type == "cuda", seed=int(cfg.seed))):
            b = to_device(batch, device)
            with autocast(device, run.dtype):
                s, w = run.ema.module.loss_terms(b, generator=gen)
            num += torch.stack([s.double(), w.double()])
    d.all_reduce_sum(num)
    return float(num[0] / num[1]) if num[1] > 0 else None


def _validate_and_keep_best(run: RunState) -> None:
    """Validate, log it, and write best.pt when the EMA beat its best so far."""
    v = _validate(run)
    if v is not None:
        run.log({"step": run.step, "val_loss": v})
        if run.best_val is None or v < run.best_val:
            run.best_val = v
            run.save("best")


def _finish(run: RunState, stopped: str | None, end: int, last_saved: int) -> None:
    """The end (or an early stop): validate if the run reached its end, checkpoint
    unless this step already is one, plot."""
    if stopped is None and run.step >= end:
        _validate_and_keep_best(run)
    if run.step != last_saved:
        run.save("periodic")
    _plot(run)


def _plot(run: RunState) -> None:
    """loss.png on rank 0. A plot never stops a run: a failure (full disk, a broken
    matplotlib) is one warning, the first time; later plots are tried again quietly."""
    if not run.d.is_main:
        return
    png = run.out / "loss.png"
    try:
        plot_metrics(run.out / METRICS, png)
    except Exception as e:  # noqa: BLE001 - any plotting failure: warn, train on
        if not run.plot_warned:
            run.plot_warned = True
            why = os_error_in(e) or e
            tqdm.write(f"warning: cannot write {png} ({getattr(why, 'strerror', None) or why}); training goes on, "
                       "metrics.jsonl has the numbers", file=sys.stderr)
