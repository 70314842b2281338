"""One row of bench/gpu_check.sh: the stack preset's training step fed one way,
timed with `train bench`'s own pieces (train.bench, train.speed).

    python -m bench.gpu_check --data DIR --mode MODE --precision bf16|fp32 --compile on|off
                              [--model stack] [--seconds 20] [--workers 3] [--csv FILE]

MODE: streaming (the workers decode), host (host frame cache), gpu (frame
cache on the device), gpu_decode (the workers read bytes, nvJPEG decodes).
Appends one CSV row: samples/s together, data-wait, the model alone, the
feed's own line, the machine and torch. A mode that cannot run here (nvJPEG
without torchvision, a GPU cache on a CPU) is a row saying why, not a crash."""
from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from pathlib import Path
from typing import Any

MODES = {"streaming": ("off", "workers"), "host": ("host", "workers"), "gpu": ("gpu", "workers"),
         "gpu_decode": ("off", "device")}


def measure(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    from train.bench import bench_run, step_fn, timed
    from train.config import TrainConfig
    from train.data.frames import nvjpeg_available
    from train.feed import open_feed
    from train.runtime import to_device
    from train.speed import repeat, time_steps

    cache, decode = MODES[a.mode]
    cfg = TrainConfig(batch_size=a.batch_size, num_workers=a.workers, amp=a.precision == "bf16",
                      compile=a.compile == "on", cache=cache, decode=decode, device=a.device, tensorboard=False,
                      model={"preset": a.model, "backbone_weights": "none"})
    row: dict[str, Any] = {"mode": a.mode, "precision": a.precision, "compile": a.compile, "model": a.model,
                           "batch_size": a.batch_size, "workers": a.workers}
    with bench_run(a.data, cfg) as run:
        dev = run.device
        row.update(device=torch.cuda.get_device_name(dev) if dev.type == "cuda" else str(dev),
                   cpu_cores=len(os.sched_getaffinity(0)), torch=torch.__version__)
        if a.mode == "gpu_decode" and not nvjpeg_available(dev):
            return {**row, "note": f"no nvJPEG here (device {dev}, torchvision missing or built for another torch): "
                                   "the rest of the bytes path is the CPU decode, measured by the tests"}
        if a.mode == "gpu" and dev.type != "cuda":
            row["note"] = f"device {dev}: the 'gpu' cache is this process's memory"
        t0 = time.perf_counter()
        feed = open_feed(run.train_ds, cfg, dev, say=False)
        row["feed"] = f"{feed.mode}: {feed.why}"
        row["setup_s"] = round(time.perf_counter() - t0, 1)
        step = step_fn(run)
        batch = to_device(timed(lambda g: next(g), feed, run), dev)
        model = time_steps(step, repeat(batch), a.seconds, dev, warmup=5 if cfg.compile else 2)
        together = timed(lambda g: time_steps(step, g, a.seconds, dev), feed, run)
        row.update(samples_per_s=round(together.per_s, 1), data_wait=round(together.wait_share, 4),
                   model_samples_per_s=round(model.per_s, 1), target="samples_per_s >= 5000, data_wait < 0.05 "
                   "(one H200, 4 CPU cores)")
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="a packed dir (index.json + shards)")
    ap.add_argument("--mode", choices=list(MODES), required=True)
    ap.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--compile", choices=("on", "off"), default="off")
    ap.add_argument("--model", default="stack")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--csv", type=Path, default=Path("bench/results/gpu_check.csv"))
    a = ap.parse_args()
    try:
        row = measure(a)
    except Exception as e:  # noqa: BLE001 - a mode that fails is a row with its reason; the others still run
        row = {"mode": a.mode, "precision": a.precision, "compile": a.compile, "model": a.model,
               "note": f"failed: {type(e).__name__}: {str(e)[:300]}"}
    row["command"] = " ".join(sys.argv)
    new = not a.csv.exists()
    a.csv.parent.mkdir(parents=True, exist_ok=True)
    fields = ["mode", "precision", "compile", "model", "batch_size", "workers", "samples_per_s", "data_wait",
              "model_samples_per_s", "feed", "setup_s", "device", "cpu_cores", "torch", "note", "target", "command"]
    with open(a.csv, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        if new:
            w.writeheader()
        w.writerow(row)
    print(row, flush=True)
    return 0 if "failed" not in str(row.get("note", "")) else 1


if __name__ == "__main__":
    sys.exit(main())
