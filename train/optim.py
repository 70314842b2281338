"""What the optimizer step needs besides the model: AdamW with its parameter
groups, the warm-up + cosine learning-rate schedule (and how a resumed run picks
it up mid-way), and the EMA of the weights that validation and `train eval` use."""
from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

import torch

from train.config import TrainConfig


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices/kernels only (not norms, biases)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    other = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": float(cfg.weight_decay)}, {"params": other, "weight_decay": 0.0}]
    kw: dict[str, Any] = {"lr": float(cfg.lr), "betas": (0.95, 0.999)}
    if device.type == "cuda":
        kw["fused"] = True
    return torch.optim.AdamW(groups, **kw)


def lr_lambda(warmup: int, total: int, min_ratio: float) -> Callable[[int], float]:
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


def make_scheduler(opt: torch.optim.Optimizer, cfg: TrainConfig, total_steps: int,
                   resume_step: int | None) -> torch.optim.lr_scheduler.LambdaLR:
    """The LR schedule over `total_steps`. It is rebuilt from the config rather than
    loaded from the checkpoint, so a changed --lr or --steps applies on resume;
    `resume_step` (a resumed run) sets it to the LR of the next optimizer step."""
    for g in opt.param_groups:
        g["initial_lr"] = float(cfg.lr)  # a changed --lr applies on resume too
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(int(cfg.warmup), total_steps, float(cfg.min_lr_ratio)))
    if resume_step is not None:  # continue the schedule at `step` (LR for the next optimizer step)
        for g in opt.param_groups:
            g["lr"] = g["initial_lr"] * sched.lr_lambdas[0](resume_step)
        sched.last_epoch = resume_step
        sched._last_lr = [g["lr"] for g in opt.param_groups]  # what get_last_lr() reports
    return sched


M = TypeVar("M", bound=torch.nn.Module)


class EMA(Generic[M]):
    """Exponential moving average of the weights, with the usual warm-up
    (decay ramps up as (1 + n) / (10 + n)) so early averages are not stuck at init."""

    def __init__(self, model: M, decay: float):
        self.module: M = copy.deepcopy(model).eval().requires_grad_(False)
        self.decay = float(decay)
        self.updates = 0

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        self.updates += 1
        d = min(self.decay, (1 + self.updates) / (10 + self.updates))
        ema_p: list[torch.Tensor] = list(self.module.parameters())
        src = [p.detach() for p in model.parameters()]
        torch._foreach_lerp_(ema_p, src, 1.0 - d)
        for b_ema, b in zip(self.module.buffers(), model.buffers(), strict=True):
            b_ema.copy_(b)

    def state_dict(self) -> dict[str, Any]:
        return {"module": self.module.state_dict(), "updates": self.updates, "decay": self.decay}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.module.load_state_dict(state["module"])
        self.updates = int(state["updates"])
