"""The `stack` preset's training step (issue 40.4): samples/s of forward + backward +
gradient clipping + AdamW on synthetic reader batches, the variants interleaved:

    baseline        the step before issue 40.4: the frozen ResNet18 called whole,
                    autograd enabled (its parameters need no grad, so autograd records
                    nothing there either: this row and the next should tie)
    no_grad         its body (all but fc) under torch.no_grad (train.policy_stack)
    no_grad_cl      + channels-last weights and images (train.step_opts: what
                    [train] channels_last does on CUDA and CPU)
    no_grad_compile + torch.compile (inductor), images as they come
    no_grad_cl_compile  + both

Batches are what the reader gives: (B, 2, 3, H, W) uint8, a permuted view of
(B, 2, H, W, 3), 13-D proprio per frame, 16 x 13 actions; training mode, so the
1.07x crop and the colour jitter run as in training. Every variant has its own model
(the same initial weights) and optimizer. Two warm-up steps per variant, timed apart
(`warmup_s`: torch.compile's compile time is in it, with an empty inductor cache: a temporary
TORCHINDUCTOR_CACHE_DIR shared by the variants, so the second compiled one finds some of
the first one's kernels there); then `repeats` rounds, each running every variant for
`steps` steps, so background load hits all alike. Reported per variant: median
samples/s with min and max over the rounds, the median step in ms, and the speed-up
over baseline as the median of per-round ratios.

    python -m bench --only step [--quick]
    python -m bench.step [--batch 16] [--size 224] [--repeats 8] [--steps 3]"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.common import machine, write_csv
from train.config import TrainConfig
from train.model import DiffusionPolicy
from train.optim import make_optimizer
from train.step_opts import CompiledStep, compile_net, to_channels_last

CPU = torch.device("cpu")
# name: (no_grad body, channels-last, compile)
VARIANTS: dict[str, tuple[bool, bool, bool]] = {
    "baseline": (False, False, False), "no_grad": (True, False, False), "no_grad_cl": (True, True, False),
    "no_grad_compile": (True, False, True), "no_grad_cl_compile": (True, True, True)}


def make_batch(b: int, size: int, seed: int, n: int = 2) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    img = torch.randint(0, 256, (b, n, size, size, 3), dtype=torch.uint8, generator=g).permute(0, 1, 4, 2, 3)
    return {"image": img, "proprio": torch.randn(b, n, 13, generator=g), "action": torch.randn(b, 16, 13, generator=g),
            "action_mask": torch.ones(b, 16), "weight": torch.ones(b)}


class Variant:
    """One model + optimizer set up as `name` says; step() is one training step."""

    def __init__(self, name: str, size: int, warn: Callable[[str], None]):
        no_grad, cl, comp = VARIANTS[name]
        self.name = name
        torch.manual_seed(0)
        self.model = DiffusionPolicy({"preset": "stack", "action_dim": 13, "proprio_dim": 13, "horizon": 16,
                                      "obs_size": size, "image_size": size, "backbone_weights": "none"})
        self.model.train()  # the frozen backbone's BatchNorm goes to eval here
        enc = self.model.obs_encoder
        assert enc is not None
        if not no_grad:
            enc.frozen = False  # the old forward: self.backbone(x) whole, autograd on (BN stays in eval)
        if cl:
            to_channels_last(self.model)
        self.net: Any = compile_net(self.model, CPU, warn) if comp else self.model
        self.opt = make_optimizer(self.model, TrainConfig(), CPU)
        self.grad_clip = float(TrainConfig().grad_clip)

    def step(self, batch: dict[str, torch.Tensor]) -> float:
        loss = self.net(batch)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.opt.step()
        return float(loss.detach())

    def layout(self, batch: dict[str, torch.Tensor]) -> str:
        """The memory layout of the images the ResNet's first convolution gets (eager)."""
        enc = self.model.obs_encoder
        assert enc is not None
        torch.manual_seed(0)
        x = enc.prepare(batch["image"])
        return "NHWC" if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous() else "NCHW"


def _timed(v: Variant, batches: list[dict[str, torch.Tensor]], steps: int) -> float:
    t0 = time.perf_counter()
    for i in range(steps):
        v.step(batches[i % len(batches)])
    return time.perf_counter() - t0


def measure(batch: int, size: int, repeats: int, steps: int, warmup: int,
            names: list[str]) -> tuple[dict[str, list[float]], dict[str, dict[str, Any]], list[float]]:
    """({variant: seconds per round}, {variant: its fixed columns}, load averages)."""
    batches = [make_batch(batch, size, seed) for seed in range(2)]
    notes: list[str] = []
    variants, info = {}, {}
    for name in names:
        v = variants[name] = Variant(name, size, notes.append)
        t0 = time.perf_counter()
        losses = [v.step(batches[i % len(batches)]) for i in range(warmup)]
        fell_back = isinstance(v.net, CompiledStep) and v.net.fell_back
        info[name] = {"warmup_s": round(time.perf_counter() - t0, 1), "body_input": v.layout(batches[0]),
                      "compiled": VARIANTS[name][2] and not fell_back, "first_loss": round(losses[0], 6),
                      "note": "; ".join(notes)}
        notes.clear()
        print(f"    {name}: warm-up {info[name]['warmup_s']} s, first loss {losses[0]:.6f}", flush=True)
    runs: dict[str, list[float]] = {k: [] for k in names}
    loads = [os.getloadavg()[0]]
    for _ in range(repeats):
        for name in names:
            runs[name].append(_timed(variants[name], batches, steps))
        loads.append(os.getloadavg()[0])
    return runs, info, loads


def rows_of(runs: dict[str, list[float]], info: dict[str, dict[str, Any]], batch: int, steps: int,
            common: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    base = runs.get("baseline")
    for name, secs in runs.items():
        rates = [batch * steps / s for s in secs]
        row: dict[str, Any] = {
            "variant": name, "samples_per_s": round(statistics.median(rates), 2),
            "samples_per_s_min": round(min(rates), 2), "samples_per_s_max": round(max(rates), 2),
            "step_ms": round(1000 * statistics.median(secs) / steps, 1),
            "speedup_vs_baseline": round(statistics.median([b / s for b, s in zip(base, secs, strict=True)]), 3)
            if base else None}
        rows.append({**row, **info[name], **common})
    return rows


def run(results_dir: Path, quick: bool = False, batch: int = 16, size: int = 224, repeats: int = 8,
        steps: int = 3, names: list[str] | None = None, command: str | None = None) -> list[dict]:
    if quick:
        batch, repeats, steps = 8, 3, 2
    names = names or list(VARIANTS)
    cache = tempfile.mkdtemp(prefix="bench-step-inductor-")
    old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache  # compile time as a first run sees it
    try:
        runs, info, loads = measure(batch, size, repeats, steps, warmup=2, names=names)
    finally:
        if old is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = old
        shutil.rmtree(cache, ignore_errors=True)
    common = {"batch_size": batch, "image": f"{size}x{size}", "obs_horizon": 2, "repeats": repeats,
              "steps_per_repeat": steps, "threads": torch.get_num_threads(), "machine": machine(),
              "python": platform.python_version(), "torch": torch.__version__,
              "load_avg_1min": f"{min(loads):.1f}-{max(loads):.1f}"}
    rows = rows_of(runs, info, batch, steps, common)
    write_csv(Path(results_dir) / "step.csv", rows,
              command or f"python -m bench --only step{' --quick' if quick else ''}")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--size", type=int, default=224, help="obs_size = image_size (the stack preset: 224)")
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per variant per round")
    ap.add_argument("--only", nargs="*", choices=list(VARIANTS), default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--results", type=Path, default=Path("bench/results"))
    a = ap.parse_args()
    rows = run(a.results, a.quick, a.batch, a.size, a.repeats, a.steps, a.only,
               command="python -m bench.step " + " ".join(sys.argv[1:]))
    for r in rows:
        print({k: r[k] for k in ("variant", "samples_per_s", "samples_per_s_min", "samples_per_s_max", "step_ms",
                                 "speedup_vs_baseline", "warmup_s", "body_input", "compiled")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
