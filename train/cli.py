"""`train run | eval | submit | status | fetch`: thin click commands.

`train run` is what torchrun starts on every rank (`torchrun --nproc_per_node N
-m train run ...`); only rank 0 prints. Expected failures print one line and
exit with the code from DESIGN.md."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import click

from shardship.cliopts import config_option, friendly_errors, tool_group
from train.config import CACHES, DECODES, DEVICES, EDGES, NORMALIZE, PRESETS  # torch-free: `train --help` stays fast

_errors = friendly_errors(interrupted="interrupted: run the same command again to resume from the last checkpoint")


def _is_main() -> bool:
    return os.environ.get("RANK", "0") in ("", "0")


@tool_group
def main() -> None:
    """shardship train: streaming shard reader + diffusion policy trainer."""


@main.command()
@click.option("--data", type=click.Path(path_type=Path), default=None,
              help="Packed dir with index.json (default: [paths] packed, data/packed).")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Checkpoints, metrics, plots (default: [paths] outputs, outputs/).")
@config_option()
@click.option("--max-steps", type=int, default=None,
              help="Stop at this global step (the LR schedule still follows --steps/--epochs); rerun to continue.")
@click.option("--steps", type=int, default=None, help="Total optimizer steps (schedule length).")
@click.option("--epochs", type=int, default=None, help="Total epochs when --steps is not given.")
@click.option("--batch-size", type=int, default=None, help="Per-rank batch size.")
@click.option("--num-workers", type=int, default=None, help="DataLoader workers per rank.")
@click.option("--lr", type=float, default=None, help="Peak learning rate (AdamW), after the warm-up [3e-4].")
@click.option("--warmup", type=int, default=None, help="Warm-up steps.")
@click.option("--checkpoint-every", type=int, default=None, help="Write a checkpoint every N steps [500].")
@click.option("--keep", type=int, default=None, help="Periodic checkpoints kept (besides last and best).")
@click.option("--val-every", type=int, default=None, help="Validate every N steps (0: only at the end).")
@click.option("--ema-decay", type=float, default=None,
              help="Decay of the weights' moving average that eval and sampling use, in [0, 1) [0.999].")
@click.option("--seed", type=int, default=None, help="Seed for the split, shuffling and init [0].")
@click.option("--log-every", type=int, default=None, help="Log loss and rate to metrics.jsonl every N steps [10].")
@click.option("--device", type=click.Choice(DEVICES), default=None,
              help="auto (default): cuda, then mps, then cpu. DDP: nccl on cuda, gloo otherwise.")
@click.option("--model", "preset", type=click.Choice(list(PRESETS)), default=None,
              help="Model preset (default small; tiny trains on a CPU in minutes; stack is the user's "
                   "ResNet18 + ConditionalUnet1D policy, 17.5 M parameters, 6.4 M trainable).")
@click.option("--backbone-weights", default=None,
              help="stack: ResNet18 ImageNet weights: hub (torch hub cache, default), a .pth file, "
                   "or none (random init).")
@click.option("--time-limit", default=None, help="HH:MM:SS: checkpoint and stop before this much wall time.")
@click.option("--obs-horizon", type=int, default=None,
              help="Observation frames per sample (default: the preset's, 2 = t-1, t; tiny 1).")
@click.option("--edges", type=click.Choice(EDGES), default=None,
              help="Windows inside the session only (default), or every frame with padded steps masked.")
@click.option("--normalize", type=click.Choice(NORMALIZE), default=None,
              help="minmax (default): actions to [-1, 1], proprio z-scored; zscore: both z-scored.")
@click.option("--cache", type=click.Choice(CACHES), default=None,
              help="Decoded frames kept for the run: auto (default: gpu, then host, where they fit), gpu, host "
                   "(one copy per node), off (decode every step).")
@click.option("--decode", type=click.Choice(DECODES), default=None,
              help="Without a cache: JPEGs decoded by the DataLoader workers, or on the device (nvJPEG; "
                   "auto, the default: on CUDA where torchvision can).")
@click.option("--compile/--no-compile", "compile_", default=None,
              help="torch.compile the model (default off; the first steps are slower while it compiles).")
@click.option("--log-samples", is_flag=True, default=None, help="Write samples/rankN.jsonl (sample ids per step).")
@click.option("--resume/--no-resume", default=True, show_default=True, help="Continue from OUT/last.pt if present.")
@click.option("--quiet", is_flag=True,
              help="No progress output (default: a bar on a terminal, else a plain line per ~10% or per minute).")
@_errors
def run(data: Path | None, out: Path | None, config_path: Path | None, max_steps: int | None, resume: bool,
        preset: str | None, backbone_weights: str | None, quiet: bool, compile_: bool | None,
        **overrides: Any) -> None:
    """Train the diffusion policy on the packed shards (resumes automatically)."""
    overrides["time_limit"] = _from_job_start(overrides.get("time_limit"))
    cfg, tc = _train_config(config_path, preset, backbone_weights, compile=compile_, **overrides)
    from train.trainer import train  # torch: after the config's one-line errors, which need none of it

    data = data or cfg.packed
    out = out or cfg.outputs
    try:
        res = train(data, out, tc, max_steps=max_steps, resume=resume, progress=not quiet)
    except KeyboardInterrupt:  # a second ctrl-C, or one before training started
        click.echo(f"\n{_interrupted(out)}", err=True)
        # out at once, without the interpreter's teardown: torch's own threads can be mid-op after an interrupt,
        # and about 1 run in 5 of the second-ctrl-C test died in it with SIGABRT ("PyThreadState_Get: ... the GIL
        # is released", runtime finalizing) after the message. What is on disk is final already (atomic writes,
        # the temp file removed as the interrupt unwound); the output lock goes with the process.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    if _is_main():
        if res.stopped:
            click.echo(f"stopped at step {res.step}/{res.total_steps} ({res.stopped}), checkpoint {out}/last.pt; "
                       "run the same command to resume")
        elif max_steps and max_steps < res.total_steps:  # the goal was --max-steps, not the schedule's end
            click.echo(f"done: step {res.step}/{max_steps} (--max-steps; the schedule has {res.total_steps} steps: "
                       "a higher --max-steps continues it)")
        else:
            click.echo(f"done: step {res.step}/{res.total_steps}")
        best = f", best val loss {res.best_val:.4f}" if res.best_val is not None else ""
        click.echo(f"checkpoints: {out}/last.pt{', best.pt' if (out / 'best.pt').exists() else ''}{best}")
        click.echo(f"curves: {out}/loss.png, metrics: {out}/metrics.jsonl, TensorBoard: tensorboard --logdir {out}")
    if res.stopped == "SIGINT":
        sys.exit(130)  # ctrl-C: checkpointed, but the run did not finish (`train run && next` must not go on)


def _train_config(config_path: Path | None, preset: str | None, backbone_weights: str | None,
                  **overrides: Any) -> tuple[Any, Any]:
    """(shardship.toml, its [train] with the command line's overrides and model options)."""
    from shardship.config import load_config
    from train.config import TrainConfig

    cfg = load_config(config_path)
    tc = TrainConfig.from_dict(cfg.train, f"{cfg.path or 'shardship.toml'} [train]").merged(**overrides)
    if preset:
        tc.model = {**tc.model, "preset": preset}
    if backbone_weights:
        tc.model = {**tc.model, "backbone_weights": backbone_weights}
    return cfg, tc


@main.command(name="bench")
@click.option("--data", type=click.Path(path_type=Path), default=None,
              help="Packed dir with index.json (default: [paths] packed, data/packed).")
@config_option()
@click.option("--model", "preset", type=click.Choice(list(PRESETS)), default=None,
              help="Model preset, as for `train run` (default: the config's, else small).")
@click.option("--backbone-weights", default=None, help="stack: as for `train run` (default hub; none: random).")
@click.option("--batch-size", type=int, default=None, help="Per-rank batch size, as for `train run`.")
@click.option("--num-workers", type=int, default=None, help="DataLoader workers of the streaming reader.")
@click.option("--device", type=click.Choice(DEVICES), default=None, help="auto (default): cuda, then mps, then cpu.")
@click.option("--cache", type=click.Choice(CACHES), default=None,
              help="The cache measured and used together (default auto; off: measure streaming only together).")
@click.option("--decode", type=click.Choice(DECODES), default=None, help="Where the streaming reader decodes JPEGs.")
@click.option("--amp/--no-amp", default=None, help="bf16 autocast on CUDA (default on).")
@click.option("--compile/--no-compile", "compile_", default=None, help="torch.compile the model (default off).")
@click.option("--seconds", type=click.FloatRange(1), default=10, show_default=True,
              help="Length of each of the four measurements.")
@click.option("--quiet", is_flag=True, help="No progress output (the results are printed all the same).")
@_errors
def bench_cmd(data: Path | None, config_path: Path | None, preset: str | None, backbone_weights: str | None,
              seconds: float, quiet: bool, compile_: bool | None, **overrides: Any) -> None:
    """Measure the reader, the frame cache, the model's step and all together on this machine; say which to use."""
    cfg, tc = _train_config(config_path, preset, backbone_weights, compile=compile_, **overrides)
    from train.bench import bench  # torch: after the config's one-line errors

    for line in bench(data or cfg.packed, tc, seconds=seconds, progress=not quiet):
        click.echo(line)


def _from_job_start(limit: str | None) -> str | None:
    """In a job, --time-limit counts from the job script's start (SHARDSHIP_JOB_START, epoch
    seconds, exported by the script), not from this process's: imports, rendezvous and a busy
    node can take a minute before training starts, and the scheduler's wall clock does not
    wait for them (4 CPU ranks on 2 cores overshot a 2-minute limit by 9 s without this)."""
    start = os.environ.get("SHARDSHIP_JOB_START", "")
    if limit is None or not start.isdigit():
        return limit
    from train.config import parse_duration

    secs = parse_duration(limit)
    if secs is None:
        return limit
    # the other ranks' limit is 2 s later, so rank 0 (the one that reports) is always among those
    # past it when the ranks agree to stop, and says "time limit", not "another rank was signalled"
    later = 0 if _is_main() else 2
    return str(max(1, int(secs - max(0.0, time.time() - int(start))) + later))


def _interrupted(out: Path) -> str:
    """What an interrupted `train run` kept, honestly: last.pt, or nothing yet."""
    last = out / "last.pt"
    if last.exists():
        return f"interrupted: run the same command again to resume from {last}"
    return f"interrupted before the first checkpoint: no checkpoint in {out}; the same command starts over"


@main.command(name="eval")
@click.option("--data", type=click.Path(path_type=Path), default=None, help="Packed dir (default: data/packed).")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Training output dir (default: outputs/).")
@config_option()
@click.option("--checkpoint", default=None, help="Checkpoint file (default: OUT/best.pt, else OUT/last.pt).")
@click.option("--max-samples", type=click.IntRange(0), default=256, show_default=True,
              help="Validation samples (0 = all).")
@click.option("--sampler", type=click.Choice(["ddim", "ddpm"]), default=None,
              help="Sampler (default: the model config's; stack samples with DDPM as published).")
@click.option("--ddim-steps", type=int, default=None,
              help="Sampling steps (default: the model config's ddim_steps for DDIM, every step for DDPM).")
@click.option("--batch-size", type=click.IntRange(1), default=32, show_default=True, help="Samples per batch.")
@click.option("--num-workers", type=click.IntRange(0), default=2, show_default=True, help="DataLoader workers.")
@click.option("--device", type=click.Choice(DEVICES), default="auto", show_default=True,
              help="auto: cuda, then mps (a Mac), then cpu.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the sampler's noise.")
@click.option("--quiet", is_flag=True, help="No progress output.")
@_errors
def eval_cmd(data: Path | None, out: Path | None, config_path: Path | None, checkpoint: str | None,
             max_samples: int, sampler: str | None, ddim_steps: int | None, batch_size: int, num_workers: int,
             device: str, seed: int, quiet: bool) -> None:
    """Position (cm), rotation (deg) and joint (deg) error of the EMA policy on the validation sessions."""
    from shardship.config import load_config

    cfg = load_config(config_path)
    from train.evaluate import evaluate, summary_lines  # torch: after the config is read

    res = evaluate(data or cfg.packed, out or cfg.outputs, checkpoint=checkpoint, max_samples=max_samples,
                   ddim_steps=ddim_steps, batch_size=batch_size, num_workers=num_workers, device=device, seed=seed,
                   sampler=sampler, progress=not quiet)
    for line in summary_lines(res):
        click.echo(line)


from train.jobs_cli import doctor, fetch, logs, status, submit, where  # noqa: E402  (train/jobs_cli.py: jobs helper)

for _cmd in (submit, status, fetch, logs, doctor, where):
    main.add_command(_cmd)
