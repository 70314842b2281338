"""`train bench`: a short measurement, on the machine it runs on, of what feeds
the GPU and what the GPU does with it (train.speed has the words). It builds
the run exactly as `train run` would (the same config, model, reader and
training split), but writes nothing and takes no checkpoint.

Measured in turn, `seconds` each: the streaming reader alone (as configured:
workers, decode), the frame cache alone (where one fits: it is filled first, and
the fill time is said), the model's step alone on one batch kept on the device,
and the two together as `train run` would choose them (cache = "auto" picks)."""
from __future__ import annotations

import dataclasses
import os
import platform
import tempfile
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import torch

from train import ddp
from train.config import TrainConfig
from train.data import cache as frame_cache
from train.feed import Feed, open_feed
from train.optim import make_scheduler
from train.runtime import configure_device, to_device
from train.speed import Rate, repeat, time_loader, time_steps, verdict
from train.state import RunState, setup_run
from train.trainer import update


def machine_line(device: torch.device, cfg: TrainConfig, run: RunState) -> str:
    """What the figures below were measured on and with."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "no GPU"
    amp = str(run.dtype).replace("torch.", "") if run.dtype else "fp32"
    return (f"machine: {cores} CPU cores ({cpu}), {gpu}; device {device}, {amp}; model {run.mcfg['preset']}, "
            f"batch {cfg.batch_size}, {cfg.frames()} frame(s) per sample, {run.train_ix.n_samples} training frames")


def _forever(feed: Feed, run: RunState) -> Generator[dict[str, torch.Tensor], None, None]:
    """Batches across epochs (a small dataset ends its epoch within the measurement)."""
    ds = run.train_ds
    ds.set_state(0, 0)
    while True:
        yield from feed.epoch(ds, seed=ds.epoch)
        ds.set_state(ds.epoch + 1, 0)


T = TypeVar("T")


def timed(fn: Callable[[Iterator[dict[str, torch.Tensor]]], T], feed: Feed, run: RunState) -> T:
    """`fn` over `feed`'s batches; the loader's workers are shut down after."""
    gen = _forever(feed, run)
    try:
        return fn(gen)
    finally:
        gen.close()


@contextmanager
def bench_run(data: Path, cfg: TrainConfig, progress: bool = False) -> Generator[RunState, None, None]:
    """A run set up as `train run` would (model with random weights, no output folder)."""
    d = ddp.setup(cfg.device)
    try:
        configure_device(d.device)
        with tempfile.TemporaryDirectory() as tmp:
            run = setup_run(d, data, Path(tmp), cfg, progress, 0.0, pretrained=False)
        run.sched = make_scheduler(run.opt, cfg, max(run.total_steps, 10_000), None)
        yield run
    finally:
        ddp.cleanup()


def bench(data: Path, cfg: TrainConfig, seconds: float = 10.0, progress: bool = True) -> list[str]:
    """The summary lines (train.speed) of a measurement of `data` under `cfg`."""
    with bench_run(data, cfg, progress) as run:
        return _measure(run, cfg, seconds, progress)


def step_fn(run: RunState) -> Callable[[dict[str, torch.Tensor]], None]:
    """One training step of `run` on a batch (train.trainer.update)."""
    def step(b: dict[str, torch.Tensor]) -> None:
        update(run, b)
    return step


def _measure(run: RunState, cfg: TrainConfig, seconds: float, progress: bool) -> list[str]:
    device, ds = run.device, run.train_ds
    lines = [machine_line(device, cfg, run)]
    stream = open_feed(ds, dataclasses.replace(cfg, cache="off"), device, say=False)
    how = "decoded on the device" if stream.on_device else "decoded by the workers"
    r_stream = timed(lambda g: time_loader(g, seconds, device), stream, run)
    lines.append(f"loader streaming: {r_stream.per_s:,.0f} samples/s ({cfg.num_workers} workers, {how})")

    nbytes = frame_cache.cache_bytes(ds)
    where, why = frame_cache.choose("auto" if cfg.cache == "off" else cfg.cache, nbytes, device)
    cached: Feed | None = None
    if where != "off":
        c = frame_cache.build(ds, where, device, progress=progress)
        cached = Feed(mode=f"{where} cache", why=why, device=device, num_workers=0, cache=c)
        r_cache = timed(lambda g: time_loader(g, seconds, device), cached, run)
        lines.append(f"loader cache: {r_cache.per_s:,.0f} samples/s ({where} cache: {why}; filled in "
                     f"{c.seconds:.0f} s)")
    else:
        lines.append(f"loader cache: does not fit ({why})")

    step = step_fn(run)
    batch = to_device(timed(lambda g: next(g), cached or stream, run), device)
    model = time_steps(step, repeat(batch), seconds, device)
    amp = str(run.dtype).replace("torch.", "") if run.dtype else "fp32"
    lines.append(f"model: {model.per_s:,.0f} samples/s (the {run.mcfg['preset']} step on {device}, {amp}, "
                 "one batch kept on the device)")

    chosen = cached if (cached is not None and cfg.cache != "off") else stream
    together = timed(lambda g: time_steps(step, g, seconds, device), chosen, run)
    lines.append(f"together: {together.per_s:,.0f} samples/s, data-wait {together.wait_share:.0%} ({chosen.mode})")
    choice = "off" if chosen is stream else where
    lines.append(f"choice: cache = \"{choice}\": {verdict(model, together, chosen.mode)}")
    return lines


__all__ = ["Rate", "bench", "bench_run", "step_fn", "timed"]
