"""The training loop, in one readable function (`train`), nanoGPT style.

Per step: wait for a batch (timed: the data-wait fraction), forward under
autocast (bf16 on GPUs that have it, fp16 + GradScaler on those that do not, off
on CPU), backward, clip, AdamW, cosine LR with warmup, EMA. Every `log_every`
steps the ranks all-reduce the loss and a stop flag (SIGTERM/SIGUSR1 or the time
limit), so every rank stops on the same step and nobody waits in a collective
for a rank that left. Checkpoints (rank 0, atomic: temp file + rename):

    last.pt       newest state; the run resumes from it automatically
    step_N.pt     every checkpoint_every steps, the newest `keep` kept
                  (last.pt is a hard link to the newest one: no extra space)
    best.pt       lowest validation loss (EMA weights, validation sessions)

A checkpoint holds model, EMA, optimizer, scheduler, scaler, the RNG states of
every rank, the reader position (seed, epoch, consumed) and the normaliser.
metrics.jsonl and loss.png follow the checkpoint: a resumed run drops the lines
of steps it is about to redo."""
from __future__ import annotations

import copy
import dataclasses
import datetime
import errno
import json
import math
import os
import random
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from shardship.atomic import atomic_open, remove_stale_temps, write_bytes
from shardship.errors import QuotaError, ShardshipError
from train import ddp
from train.data import ShardDataset, load_index, make_loader, split_sessions, verify_shards
from train.data.dataset import unwrap_worker_error
from train.data.index import ShardIndex
from train.model import MODEL_KEYS, DiffusionPolicy, model_config

CHECKPOINT_FORMAT = "shardship-checkpoint"
STEP_RE = re.compile(r"^step_(\d+)\.pt$")


@dataclass
class TrainConfig:
    """[train] in shardship.toml; CLI flags override. Model keys (obs_size,
    enc_channels, unet_dims, ...) may sit here or in a [train.model] table."""

    batch_size: int = 32  # per rank
    num_workers: int = 2  # DataLoader workers per rank
    lr: float = 3e-4
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    weight_decay: float = 1e-4
    warmup: int = 200  # steps
    steps: int | None = None  # total optimizer steps (schedule length); default: epochs
    epochs: int = 100
    checkpoint_every: int = 500
    keep: int = 2  # periodic step_N.pt files kept
    val_every: int = 500
    val_fraction: float = 0.1
    val_sessions: list[str] = field(default_factory=list)
    ema_decay: float = 0.999
    grad_clip: float = 1.0
    seed: int = 0
    window: int = 8  # shards shuffled together
    log_every: int = 10
    amp: bool = True
    device: str = "auto"  # auto | cuda | cpu
    time_limit: str | None = None  # "HH:MM:SS" or seconds: checkpoint and stop before it
    log_samples: bool = False  # per-rank samples/rankN.jsonl (which samples each step used)
    model: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "[train]") -> "TrainConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        kw: dict[str, Any] = {}
        model: dict[str, Any] = dict(d.get("model") or {})
        for k, v in d.items():
            if k == "model":
                continue
            if k in names:
                kw[k] = v
            elif k in MODEL_KEYS:
                model[k] = v
            else:
                known = ", ".join(sorted(names | MODEL_KEYS))
                raise ShardshipError(f"{where}: unknown key {k!r} (known: {known})")
        bad = [k for k in model if k not in MODEL_KEYS]
        if bad:
            raise ShardshipError(f"{where} model: unknown key(s) {', '.join(bad)} (known: {', '.join(sorted(MODEL_KEYS))})")
        cfg = cls(**kw, model=model)
        cfg.validate(where)
        return cfg

    def validate(self, where: str = "[train]") -> None:
        for k in ("batch_size", "checkpoint_every", "log_every", "epochs"):
            if int(getattr(self, k)) < 1:
                raise ShardshipError(f"{where}: {k} must be >= 1 (got {getattr(self, k)})")
        for k in ("num_workers", "keep", "warmup", "val_every", "window"):
            if int(getattr(self, k)) < 0:
                raise ShardshipError(f"{where}: {k} must be >= 0 (got {getattr(self, k)})")
        if self.steps is not None and int(self.steps) < 1:
            raise ShardshipError(f"{where}: steps must be >= 1 (got {self.steps})")
        if not 0 <= float(self.ema_decay) < 1:
            raise ShardshipError(f"{where}: ema_decay must be in [0, 1) (got {self.ema_decay})")
        if self.device not in ("auto", "cuda", "cpu"):
            raise ShardshipError(f"{where}: device must be auto, cuda or cpu (got {self.device!r})")
        parse_duration(self.time_limit)

    def merged(self, **overrides: Any) -> "TrainConfig":
        """A copy with the non-None overrides (CLI flags) applied."""
        d = dataclasses.asdict(self)
        d.update({k: v for k, v in overrides.items() if v is not None})
        out = TrainConfig(**d)
        out.validate("command line")
        return out


def parse_duration(text: str | int | float | None) -> float | None:
    """'HH:MM:SS' (hours may exceed 24), 'D-HH:MM:SS' (SLURM), 'MM:SS' or seconds -> seconds."""
    if text is None or text == "":
        return None
    if isinstance(text, (int, float)):
        return float(text)
    days, dash, rest = str(text).strip().rpartition("-")
    try:
        parts = [float(p) for p in rest.split(":")]
        secs = float(days) * 86400 if days else 0.0
    except ValueError:
        raise ShardshipError(f"time_limit {text!r}: use HH:MM:SS or seconds") from None
    if len(parts) > 3 or (dash and (not days or len(parts) != 3)) or any(p < 0 for p in parts):
        raise ShardshipError(f"time_limit {text!r}: use HH:MM:SS or seconds")
    acc = 0.0
    for p in parts:
        acc = acc * 60 + p
    return secs + acc


# ------------------------------------------------------------------ helpers
class EMA:
    """Exponential moving average of the weights, with the usual warm-up
    (decay ramps up as (1 + n) / (10 + n)) so early averages are not stuck at init."""

    def __init__(self, model: torch.nn.Module, decay: float):
        self.module = copy.deepcopy(model).eval().requires_grad_(False)
        self.decay = float(decay)
        self.updates = 0

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        self.updates += 1
        d = min(self.decay, (1 + self.updates) / (10 + self.updates))
        ema_p = [p for p in self.module.parameters()]
        src = [p.detach() for p in model.parameters()]
        torch._foreach_lerp_(ema_p, src, 1.0 - d)
        for b_ema, b in zip(self.module.buffers(), model.buffers()):
            b_ema.copy_(b)

    def state_dict(self) -> dict[str, Any]:
        return {"module": self.module.state_dict(), "updates": self.updates, "decay": self.decay}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.module.load_state_dict(state["module"])
        self.updates = int(state["updates"])


def lr_lambda(warmup: int, total: int, min_ratio: float):
    """Linear warm-up to 1, then cosine to min_ratio at `total` (held after)."""

    def f(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        span = max(1, total - warmup)
        progress = min(1.0, (step - warmup) / span)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


def lr_at(step: int, cfg: TrainConfig, total: int) -> float:
    """The learning rate used for optimizer step `step` (0-based)."""
    return float(cfg.lr) * lr_lambda(int(cfg.warmup), total, float(cfg.min_lr_ratio))(step)


def rng_state(device: torch.device) -> dict[str, Any]:
    st: dict[str, Any] = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if device.type == "cuda":
        st["cuda"] = torch.cuda.get_rng_state(device)
    return st


def set_rng_state(st: Mapping[str, Any], device: torch.device) -> None:
    torch.set_rng_state(st["torch"])
    np.random.set_state(st["numpy"])
    random.setstate(st["python"])
    if device.type == "cuda" and "cuda" in st:
        torch.cuda.set_rng_state(st["cuda"], device)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def amp_dtype(device: torch.device, enabled: bool) -> torch.dtype | None:
    """bf16 on GPUs that support it, fp16 (with loss scaling) on older ones, none on CPU."""
    if not enabled or device.type != "cuda":
        return None
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def make_scaler(enabled: bool) -> Any:
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler("cuda", enabled=enabled)
    return torch.cuda.amp.GradScaler(enabled=enabled)  # torch < 2.3


def save_checkpoint(state: Mapping[str, Any], path: Path) -> None:
    """torch.save into a temp file in the same directory, fsync, rename: a kill
    mid-write leaves the previous file untouched (and a temp that the next run removes).
    A full disk or quota is a one-line QuotaError naming the file."""
    try:
        with atomic_open(path, "wb") as f:
            torch.save(dict(state), f)
    except (OSError, RuntimeError) as e:
        os_err = _os_error_in(e)
        if os_err is None:  # not an I/O failure: a bug, keep the traceback
            raise
        if os_err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise QuotaError(f"cannot write checkpoint {path}: {os_err.strerror}; the previous checkpoint is intact. "
                             "Free space, lower [train] keep, or use a smaller model") from None
        raise ShardshipError(f"cannot write checkpoint {path}: {os_err}; the previous checkpoint is intact") from None


def _os_error_in(e: BaseException | None) -> OSError | None:
    """The OSError behind `e` (torch's zip writer turns a failed write into a
    RuntimeError whose context is the OSError)."""
    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, OSError):
            return e
        e = e.__cause__ or e.__context__
        seen += 1
    return None


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


def load_checkpoint(path: Path) -> dict[str, Any]:
    try:
        ck = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # a foreign or damaged file: say which and what to do
        raise ShardshipError(f"{path}: cannot read checkpoint ({type(e).__name__}: {e}); move it away to start over") from None
    if not isinstance(ck, dict) or ck.get("format") != CHECKPOINT_FORMAT:
        raise ShardshipError(f"{path}: not a shardship checkpoint")
    return ck


def periodic_checkpoints(out: Path) -> list[tuple[int, Path]]:
    found = []
    for p in out.glob("step_*.pt"):
        m = STEP_RE.match(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return sorted(found)


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
        ax.plot(*zip(*tr), label="train loss", lw=1)
    if va:
        ax.plot(*zip(*va), "o-", label="val loss (EMA)", lw=1.5)
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


class StopFlag:
    """SIGTERM / SIGUSR1 (scheduler warnings before the wall clock) -> finish the
    step, checkpoint, exit 0. The flag is all-reduced so all ranks stop together."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self._old: dict[int, Any] = {}

    def install(self) -> None:
        for sig in (signal.SIGTERM, getattr(signal, "SIGUSR1", None)):
            if sig is not None:
                try:
                    self._old[sig] = signal.signal(sig, self._handle)
                except ValueError:  # not the main thread (train() called from a library)
                    pass

    def _handle(self, signum: int, frame: Any) -> None:
        self.reason = signal.Signals(signum).name

    def restore(self) -> None:
        for sig, h in self._old.items():
            signal.signal(sig, h)


# ------------------------------------------------------------------ the run
@dataclass
class RunResult:
    step: int
    total_steps: int
    epoch: int
    best_val: float | None
    out: Path
    stopped: str | None  # reason for an early stop, None when the run reached its end
    resumed_from: int | None


def _to_device(batch: Mapping[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    keys = ("image", "proprio", "action", "action_mask", "weight", "joints_valid")
    nb = device.type == "cuda"
    return {k: batch[k].to(device, non_blocking=nb) for k in keys if k in batch}


def _batches(loader: Any) -> Iterator[dict[str, torch.Tensor]]:
    it = iter(loader)
    while True:
        try:
            yield next(it)
        except StopIteration:
            return
        except ShardshipError as e:
            raise unwrap_worker_error(e) from None


def build_model(index: ShardIndex, cfg: TrainConfig) -> tuple[DiffusionPolicy, dict[str, Any]]:
    mcfg = model_config(cfg.model, action_dim=index.action_dim, proprio_dim=index.proprio_dim,
                        horizon=index.horizon, image_size=index.image_size[0])
    model = DiffusionPolicy(mcfg)
    model.set_normaliser(index.stats)
    return model, mcfg


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices/kernels only (not norms, biases)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    other = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": float(cfg.weight_decay)}, {"params": other, "weight_decay": 0.0}]
    kw: dict[str, Any] = {"lr": float(cfg.lr), "betas": (0.95, 0.999)}
    if device.type == "cuda":
        kw["fused"] = True
    return torch.optim.AdamW(groups, **kw)


def train(data: str | Path, out: str | Path, cfg: TrainConfig, max_steps: int | None = None,
          resume: bool = True, progress: bool = True) -> RunResult:
    """Train (or continue training) a policy on the packed directory `data`,
    writing checkpoints and metrics under `out`. Runs as one rank of torchrun
    when launched by it."""
    data, out = Path(data), Path(out)
    dist_ = ddp.setup(cfg.device)
    stop = StopFlag()
    stop.install()
    try:
        return _train(dist_, data, out, cfg, max_steps, resume, progress, stop)
    finally:
        stop.restore()
        ddp.cleanup()


def _train(d: ddp.Dist, data: Path, out: Path, cfg: TrainConfig, max_steps: int | None, resume: bool,
           progress: bool, stop: StopFlag) -> RunResult:
    from tqdm import tqdm

    t_start = time.monotonic()
    time_limit = parse_duration(cfg.time_limit)
    device = d.device
    if d.is_main:
        out.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(out)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True

    # ---- data: index, shard check (before workers fork: they inherit it), split by session
    index = load_index(data)
    verify_shards(index, progress=progress and d.is_main)
    train_names, val_names = split_sessions(index.sessions_present(), float(cfg.val_fraction), int(cfg.seed),
                                            cfg.val_sessions or None)
    train_ix = index.select_sessions(train_names)
    val_ix = index.select_sessions(val_names) if val_names else None
    train_ds = ShardDataset(train_ix, cfg.batch_size, d.rank, d.world_size, seed=int(cfg.seed), window=cfg.window,
                            tail="drop")
    spe = train_ds.steps_per_epoch()
    global_batch = cfg.batch_size * d.world_size
    if spe < 1:
        raise ShardshipError(f"{data}: the training sessions hold {train_ix.n_samples} samples, fewer than one global "
                             f"batch ({cfg.batch_size} x {d.world_size} ranks): lower batch_size")
    total_steps = int(cfg.steps) if cfg.steps else int(cfg.epochs) * spe

    # ---- model, EMA, optimizer, schedule, AMP
    seed_everything(int(cfg.seed) + d.rank)
    model, mcfg = build_model(index, cfg)
    model.to(device)
    ema = EMA(model, cfg.ema_decay)
    opt = make_optimizer(model, cfg, device)
    dtype = amp_dtype(device, cfg.amp)
    scaler = make_scaler(dtype == torch.float16)

    # ---- resume
    step, epoch, best_val, resumed_from = 0, 0, None, None
    last = out / "last.pt"
    if resume and last.exists():
        ck = load_checkpoint(last)
        if ck["model_config"] != mcfg:
            raise ShardshipError(f"{last} was trained with another model config or data shape; "
                                 "use a new --out, or move it away to start over")
        model.load_state_dict(ck["model"])
        ema.load_state_dict(ck["ema"])
        opt.load_state_dict(ck["optimizer"])
        scaler.load_state_dict(ck["scaler"])
        step, best_val, resumed_from = int(ck["step"]), ck.get("best_val"), int(ck["step"])
        if not cfg.steps:
            total_steps = int(ck.get("total_steps", total_steps))
        same_data = train_ds.load_state_dict(ck["reader"])
        epoch = train_ds.epoch
        rngs = ck.get("rng") or []
        if len(rngs) == d.world_size:
            set_rng_state(rngs[d.rank], device)
        else:  # another number of ranks: fresh, distinct, reproducible streams
            seed_everything(int(cfg.seed) * 1_000_003 + step * 101 + d.rank)
        if d.is_main:
            note = "" if same_data else " (the data changed since: this epoch starts over)"
            tqdm.write(f"resuming from {last} at step {step}, epoch {epoch}, "
                       f"{train_ds.consumed}/{train_ix.n_samples} samples into the epoch{note}")
            truncate_jsonl(out / "metrics.jsonl", step)
        del ck
    for g in opt.param_groups:
        g["initial_lr"] = float(cfg.lr)  # a changed --lr applies on resume too
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(int(cfg.warmup), total_steps, float(cfg.min_lr_ratio)))
    if resumed_from is not None:  # continue the schedule at `step` (LR for the next optimizer step)
        for g in opt.param_groups:
            g["lr"] = g["initial_lr"] * sched.lr_lambdas[0](step)
        sched.last_epoch = step
        sched._last_lr = [g["lr"] for g in opt.param_groups]  # what get_last_lr() reports
    end = min(total_steps, max_steps) if max_steps else total_steps
    if step >= end:
        if d.is_main:
            tqdm.write(f"{last} is already at step {step} (target {end}): nothing to do; raise --steps to continue")
        return RunResult(step=step, total_steps=total_steps, epoch=train_ds.epoch, best_val=best_val, out=out,
                         stopped=None, resumed_from=resumed_from)

    samples_log = None
    if cfg.log_samples:
        sdir = out / "samples"
        sdir.mkdir(parents=True, exist_ok=True)
        mine = sdir / f"rank{d.rank}.jsonl"
        if resumed_from is not None:
            truncate_jsonl(mine, step)
            if d.is_main:
                for p in sdir.glob("rank*.jsonl"):
                    r = re.match(r"rank(\d+)\.jsonl$", p.name)
                    if r and int(r.group(1)) >= d.world_size:
                        truncate_jsonl(p, step)
        elif mine.exists():
            mine.unlink()
        samples_log = open(mine, "a", buffering=1)

    net: torch.nn.Module = model
    if d.distributed:
        net = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                      broadcast_buffers=False)  # buffers (normaliser, schedule) never change

    if d.is_main and resumed_from is None:
        (out / "metrics.jsonl").unlink(missing_ok=True)  # a fresh run starts a fresh curve
    metrics = open(out / "metrics.jsonl", "a", buffering=1) if d.is_main else None

    def log(rec: dict[str, Any]) -> None:
        if metrics is not None:
            metrics.write(json.dumps(rec) + "\n")

    def checkpoint_state() -> dict[str, Any] | None:
        rngs = d.all_gather_object(rng_state(device))  # collective: every rank calls it on the same step
        if not d.is_main:
            return None
        return checkpoint_payload(
            model, ema, opt, sched, scaler, step=step, total_steps=total_steps, reader=train_ds.state_dict(),
            rngs=rngs, world_size=d.world_size, global_batch=global_batch, cfg=cfg, best_val=best_val,
            sessions=(train_names, val_names),
            data={"root": str(data), "fingerprint": index.fingerprint(), "pose_metric": index.pose_metric})

    def save(kind: str) -> None:
        """kind: 'periodic' (step_N + last) or 'best'. Disk peak of this retention:
        train.retention.peak_checkpoint_files (budget and job checks size by it)."""
        state = checkpoint_state()
        if state is None:
            return
        if kind == "best":
            save_checkpoint(state, out / "best.pt")
        elif cfg.keep > 0:
            p = out / f"step_{step}.pt"
            save_checkpoint(state, p)
            link_atomic(p, out / "last.pt")
            for _, old in periodic_checkpoints(out)[:-cfg.keep]:
                old.unlink(missing_ok=True)
        else:
            save_checkpoint(state, out / "last.pt")
        log({"step": step, "event": f"checkpoint:{kind}"})

    def validate() -> float | None:
        if val_ix is None:
            return None
        ds = ShardDataset(val_ix, cfg.batch_size, d.rank, d.world_size, seed=int(cfg.seed), window=cfg.window,
                          tail="pad")
        gen = torch.Generator(device=device).manual_seed(int(cfg.seed) * 7919 + d.rank)
        num = torch.zeros(2, device=device, dtype=torch.float64)
        ema.module.eval()
        with torch.no_grad():
            for batch in _batches(make_loader(ds, cfg.num_workers, device.type == "cuda", seed=int(cfg.seed))):
                b = _to_device(batch, device)
                with torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                    s, w = ema.module.loss_terms(b, generator=gen)
                num += torch.stack([s.double(), w.double()])
        d.all_reduce_sum(num)
        return float(num[0] / num[1]) if num[1] > 0 else None

    if d.is_main:
        tqdm.write(f"train: {train_ix.n_samples} samples ({len(train_names)} sessions), val: "
                   f"{val_ix.n_samples if val_ix else 0} samples ({len(val_names)} sessions); {d.world_size} rank(s) "
                   f"x batch {cfg.batch_size}, {spe} steps/epoch, {total_steps} steps; device {device}"
                   f"{', ' + str(dtype).replace('torch.', '') if dtype else ''}; out {out}")
    bar = tqdm(total=end, initial=step, desc="train", unit="step", disable=not (progress and d.is_main),
               dynamic_ncols=True, mininterval=1.0)

    # ---- the loop
    win_loss = torch.zeros((), device=device, dtype=torch.float64)
    win_steps, win_wait, win_t0 = 0, 0.0, time.perf_counter()
    stopped: str | None = None
    last_saved = step if resumed_from is not None else -1
    model.train()
    try:
        while step < end and stopped is None:
            batches = _batches(make_loader(train_ds, cfg.num_workers, device.type == "cuda",
                                           seed=int(cfg.seed) * 1_000_003 + train_ds.epoch))
            t_wait = time.perf_counter()
            for batch in batches:
                win_wait += time.perf_counter() - t_wait
                b = _to_device(batch, device)
                with torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                    loss = net(b)
                opt.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                scaler.unscale_(opt)
                gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), float(cfg.grad_clip))
                lr_used = sched.get_last_lr()[0]
                scaler.step(opt)
                scaler.update()
                sched.step()
                ema.update(model)
                step += 1
                train_ds.consumed += global_batch
                win_loss += loss.detach().double()
                win_steps += 1
                if samples_log is not None:
                    samples_log.write(json.dumps({"step": step, "epoch": train_ds.epoch,
                                                  "position": batch["position"].tolist(),
                                                  "index": batch["index"].tolist()}) + "\n")

                if step % cfg.log_every == 0 or step >= end:
                    over = time_limit is not None and time.monotonic() - t_start >= time_limit
                    flag = 1.0 if (stop.reason or over) else 0.0
                    red = d.all_reduce_sum(torch.stack([win_loss, torch.tensor(float(win_steps), device=device,
                                                                               dtype=torch.float64),
                                                        torch.tensor(flag, device=device, dtype=torch.float64)]))
                    dt = time.perf_counter() - win_t0
                    mean_loss = float(red[0] / red[1])
                    rec = {"step": step, "epoch": train_ds.epoch, "consumed": train_ds.consumed,
                           "loss": mean_loss, "lr": lr_used, "grad_norm": float(gnorm),
                           "samples_per_s": win_steps * global_batch / dt, "data_wait": win_wait / dt}
                    log(rec)
                    bar.set_postfix(loss=f"{mean_loss:.4f}", lr=f"{lr_used:.2e}",
                                    sps=f"{rec['samples_per_s']:.0f}", wait=f"{rec['data_wait']:.0%}")
                    win_loss.zero_()
                    win_steps, win_wait, win_t0 = 0, 0.0, time.perf_counter()
                    if red[2] > 0:
                        stopped = stop.reason or ("time limit" if over else "another rank was signalled")
                    if not math.isfinite(mean_loss):  # same value on every rank: all stop together
                        raise ShardshipError(f"training loss is {mean_loss} at step {step}: lower lr (now {cfg.lr}) "
                                             f"or raise warmup; {out / 'last.pt'} holds the last good state")
                bar.update(1)

                t_pause = time.perf_counter()  # validation and checkpoints are not training throughput
                if cfg.val_every and step % cfg.val_every == 0 and step < end:
                    v = validate()
                    model.train()
                    if v is not None:
                        log({"step": step, "val_loss": v})
                        if best_val is None or v < best_val:
                            best_val = v
                            save("best")
                if step % cfg.checkpoint_every == 0 and step < end:
                    save("periodic")
                    last_saved = step
                    if d.is_main:
                        plot_metrics(out / "metrics.jsonl", out / "loss.png")
                win_t0 += time.perf_counter() - t_pause
                if stopped or step >= end:
                    break
                t_wait = time.perf_counter()
            else:
                train_ds.set_state(train_ds.epoch + 1, 0)  # epoch finished
            batches.close()  # shuts the epoch's workers down

        # ---- the end (or an early stop): validate, checkpoint, plot
        if stopped is None and step >= end:
            v = validate()
            if v is not None:
                log({"step": step, "val_loss": v})
                if best_val is None or v < best_val:
                    best_val = v
                    save("best")
        if step != last_saved:
            save("periodic")
        if d.is_main:
            plot_metrics(out / "metrics.jsonl", out / "loss.png")
    finally:
        bar.close()
        if samples_log is not None:
            samples_log.close()
        if metrics is not None:
            metrics.close()
    return RunResult(step=step, total_steps=total_steps, epoch=train_ds.epoch, best_val=best_val, out=out,
                     stopped=stopped, resumed_from=resumed_from)
