"""Where a step's time goes: the loader alone, the model alone, and both together.

`train bench` measures each for a few seconds on the machine it runs on; `train
run` prints the same lines, from its own first minute, near the top of its log.
The words are the same in both:

    loader streaming: 1,640 samples/s (3 workers, decoded by the workers)
    loader cache: 21,300 samples/s (host cache: 9.5 GB, filled in 41 s)
    model: 5,900 samples/s (the stack step on cuda:0, bf16, synthetic batches)
    together: 5,750 samples/s, data-wait 2% (host cache)
    choice: cache = "host": the model sets the pace

A step is the trainer's own (train.trainer: autocast, backward, clip, AdamW);
the model is timed on one real batch kept on the device, so no loader cost
enters it. On CUDA every timing ends with a synchronize."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

MIN_BATCHES = 3  # a measurement runs at least this many batches past the first


@dataclass
class Rate:
    """Samples per second over a timed stretch, with what it measured."""

    samples: int
    seconds: float
    wait: float = 0.0  # of which waiting for data (together)

    @property
    def per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def wait_share(self) -> float:
        return self.wait / self.seconds if self.seconds > 0 else 0.0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_loader(batches: Iterator[dict[str, torch.Tensor]], seconds: float, device: torch.device) -> Rate:
    """Batches per second of an iterator, its first batch (start-up) not counted."""
    next(batches)
    _sync(device)
    t0, n, k = time.perf_counter(), 0, 0
    for b in batches:
        n += int(b["weight"].shape[0])
        k += 1
        if k >= MIN_BATCHES and time.perf_counter() - t0 >= seconds:
            break
    _sync(device)
    return Rate(n, time.perf_counter() - t0)


def time_steps(step: Callable[[dict[str, torch.Tensor]], None], batches: Iterator[dict[str, torch.Tensor]],
               seconds: float, device: torch.device, warmup: int = 2) -> Rate:
    """Training steps over `batches`, timed after `warmup` steps; the time spent
    waiting for the next batch is counted apart (data-wait)."""
    for _ in range(warmup):
        step(next(batches))
    _sync(device)
    t0, n, k, wait = time.perf_counter(), 0, 0, 0.0
    while True:
        tw = time.perf_counter()
        try:
            b = next(batches)
        except StopIteration:
            break
        wait += time.perf_counter() - tw
        step(b)
        n += int(b["weight"].shape[0])
        k += 1
        if k >= MIN_BATCHES and time.perf_counter() - t0 >= seconds:
            break
    _sync(device)
    return Rate(n, time.perf_counter() - t0, wait)


def repeat(batch: dict[str, torch.Tensor]) -> Iterator[dict[str, torch.Tensor]]:
    """One batch forever: the model's own rate, with no loader behind it."""
    while True:
        yield batch


def verdict(model: Rate, together: Rate, mode: str) -> str:
    """Who sets the pace, in one line."""
    if together.wait_share < 0.05:
        return f"the model sets the pace ({mode})"
    return (f"the loader sets the pace ({mode}, data-wait {together.wait_share:.0%}): the model alone does "
            f"{model.per_s:,.0f} samples/s; a frame cache (cache = \"gpu\" or \"host\"), more CPU cores "
            "(num_workers) or JPEG decode on the GPU (decode = \"device\") would feed it faster")


def summary_lines(loader: tuple[str, Rate | None, str], model: Rate, together: Rate, note: str) -> list[str]:
    """The lines `train bench` prints and `train run` logs after its first minute.
    `loader`: (its name, e.g. "loader cache", its rate or None when only a bound is
    known, the detail in brackets)."""
    name, rate, detail = loader
    if rate is None:  # in a run: the loader kept up when data-wait is low, so only a floor is known
        fast = together.wait_share < 0.05
        amount = f">= {together.per_s:,.0f}" if fast else f"~{together.per_s:,.0f}"
        lines = [f"{name}: {amount} samples/s ({detail})"]
    else:
        lines = [f"{name}: {rate.per_s:,.0f} samples/s ({detail})"]
    lines.append(f"model: {model.per_s:,.0f} samples/s ({note})")
    lines.append(f"together: {together.per_s:,.0f} samples/s, data-wait {together.wait_share:.0%}")
    return lines
