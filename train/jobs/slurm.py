"""Render a JobSpec as a SLURM (`sbatch`) script.

What it gets right that hand-written scripts often do not:
- One task per node (`--ntasks=1`, or `--ntasks-per-node=1` on several nodes):
  torchrun starts the per-GPU processes. `--ntasks=G` would start G launchers
  that each wait for G peers: the classic DDP hang.
- Several nodes: `srun torchrun` so every node runs a launcher (without srun only
  the first node joins), with a c10d rendezvous on the first host of
  `scontrol show hostnames`.
- The trainer checkpoints and stops before the wall clock (`--time-limit`),
  `--signal=B:USR1@S` tells the script the end is near; the script then requeues
  the job (same job id, `--open-mode=append` keeps one log) and the next run
  resumes from `last`."""
from __future__ import annotations

import re

from shardship.errors import ShardshipError
from shardship.units import parse_size
from train.jobs.common import (
    continued,
    directive_value,
    fresh_checkpoint_test,
    header,
    launch_line,
    q,
    setup_block,
    train_lines,
    wait_loop,
)
from train.jobs.spec import RDZV_PORT, JobSpec

_SLURM_MEM = re.compile(r"^\d+[KMGT]?$")


def log_path(spec: JobSpec, job_id: str | int) -> str:
    return f"{spec.log_dir}/{spec.name}-{job_id}.out"


def slurm_mem(mem: str) -> str:
    """SLURM takes integer sizes with K/M/G/T; anything else (1.5T, 64GB) as whole MiB."""
    m = str(mem).strip().upper().removesuffix("B")
    return m if _SLURM_MEM.match(m) else f"{parse_size(mem) // 2**20}M"


def gres(spec: JobSpec) -> str | None:
    if spec.cluster.gres:
        return spec.cluster.gres
    if not spec.gpus_per_node:
        return None
    return f"gpu:{spec.cluster.gpu_type}:{spec.gpus_per_node}" if spec.cluster.gpu_type else f"gpu:{spec.gpus_per_node}"


def multinode_launch(spec: JobSpec) -> list[str]:
    """srun starts one torchrun per node. `--cpus-per-task` is repeated for srun because
    SLURM 22.05 steps do not inherit it from sbatch (workers would share one core)."""
    return [
        "# one torchrun per node (srun), rendezvous on the first node of the allocation",
        'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        continued(
            'srun --kill-on-bad-exit=1 --nodes "$SLURM_NNODES" --ntasks-per-node=1 '
            '--cpus-per-task "$SLURM_CPUS_PER_TASK"',
            f'torchrun --nnodes "$SLURM_NNODES" --nproc_per_node {spec.ranks_per_node}',
            f'--rdzv_id "$SLURM_JOB_ID" --rdzv_backend c10d --rdzv_endpoint "$head:{RDZV_PORT}"',
            *train_lines(spec, "-m"),
        ),
    ]


def render(spec: JobSpec) -> str:
    if spec.scheduler != "slurm":
        raise ShardshipError(f"job {spec.name}: scheduler is {spec.scheduler}, not slurm")
    d = directive_value
    s = "#SBATCH"
    lines = ["#!/bin/bash"]
    lines += header(spec, "SLURM (sbatch)", log_path(spec, "<JOB_ID>"))
    lines.append("")
    lines.append(f"{s} --job-name={d(spec.name, 'job name')}")
    if spec.cluster.account:
        lines.append(f"{s} --account={d(spec.cluster.account, 'account')}")
    if spec.cluster.partition:
        lines.append(f"{s} --partition={d(spec.cluster.partition, 'partition')}")
    lines.append(f"{s} --nodes={spec.nodes}")
    if spec.launcher == "lightning":  # Lightning's SLURM contract: one task per rank, devices x num_nodes
        lines.append(f"{s} --ntasks-per-node={spec.ranks_per_node}")
        lines.append(f"{s} --cpus-per-task={spec.cpus_per_rank}")
    else:
        lines.append(f"{s} --ntasks=1" if spec.nodes == 1 else f"{s} --ntasks-per-node=1")
        lines.append(f"{s} --cpus-per-task={spec.cpus_per_node}")
    lines.append(f"{s} --mem={slurm_mem(spec.mem)}")
    g = gres(spec)
    if g:
        lines.append(f"{s} --gres={d(g, 'gres')}")
    if spec.cluster.constraint:
        lines.append(f"{s} --constraint={d(spec.cluster.constraint, 'constraint')}")
    lines.append(f"{s} --time={spec.walltime}")
    lines.append(f"{s} --output={d(log_path(spec, '%j'), 'log path')}")
    lines.append(f"{s} --open-mode=append")
    lines.append(f"{s} --requeue")
    lines.append(f"{s} --signal=B:USR1@{spec.stop_before_s}")
    lines.append("")
    lines += setup_block(spec)
    if len(spec.partitions) > 1:
        from train.jobs.race import guard_lines

        lines += guard_lines(spec)
    lines.append('echo "shardship: job $SLURM_JOB_ID ($SLURM_JOB_NAME) restart ${SLURM_RESTART_COUNT:-0} '
                 'on $SLURM_JOB_NODELIST, started $(date -Is)"')
    lines.append("")
    lines.append(f"# SLURM sends USR1 to this shell {spec.stop_before_s} s before the wall clock (--signal=B:...);")
    lines.append(f"# the trainer checkpoints and stops by itself at {spec.time_limit_s} s (--time-limit).")
    lines.append("requeue=0")
    lines.append("trap 'requeue=1; echo \"shardship: USR1 from SLURM: the wall clock is near\"' USR1")
    lines.append("start=$(date +%s)")
    lines.append('export SHARDSHIP_JOB_START="$start"  # the trainer\'s --time-limit counts from here')
    lines.append("set +e")
    if spec.launcher == "lightning":
        lines.append("# Lightning: srun starts every rank (SLURM_PROCID / SLURM_LOCALID), Trainer reads them")
        lines.append(continued(f'srun --kill-on-bad-exit=1 --cpus-per-task "$SLURM_CPUS_PER_TASK" {q(spec.python)}',
                               *train_lines(spec, "")) + " &")
    elif spec.nodes > 1:
        launch = multinode_launch(spec)
        lines += launch[:-1]
        lines.append(launch[-1] + " &")
    else:
        if spec.uses_torchrun:
            lines.append(f"# {spec.ranks_per_node} processes on this node (torchrun sets RANK/LOCAL_RANK)")
        lines.append(f"{launch_line(spec)} &")
    lines += wait_loop()
    lines.append("")
    lines.append("# Stopped for the wall clock with a fresh checkpoint: requeue (same job id, same log);")
    lines.append("# the next run resumes from `last`.")
    lines.append(f'if [ "$rc" -eq 0 ] && {{ [ "$requeue" = 1 ] || [ "$elapsed" -ge {spec.time_limit_s} ]; }} && '
                 f"{fresh_checkpoint_test(spec)}; then")
    lines.append('  echo "shardship: requeueing job $SLURM_JOB_ID (resumes from last)"')
    lines.append('  scontrol requeue "$SLURM_JOB_ID"')
    lines.append("fi")
    lines.append('exit "$rc"')
    return "\n".join(lines) + "\n"
