"""Render a JobSpec as a Grid Engine (`qsub`) script, BU SCC style.

What it gets right that hand-written scripts often do not:
- `-o` is an absolute directory that exists before submission (SGE does not expand
  `~`, and a missing directory loses the log); SGE names the file
  `<name>.o<JOB_ID>` inside it, `-j y` merges stderr.
- CUDA_VISIBLE_DEVICES is never touched: SGE sets it to the GPUs it granted.
- `-pe omp N` reserves the cores for the data workers of every rank.
- Several GPUs on one node: `torchrun --standalone`, one process per GPU.
- The trainer stops with a checkpoint before `h_rt` (`--time-limit`); the script
  then exits 99, which makes SGE reschedule the same job, and the next run
  resumes from `last`. (Where a site forbids rescheduling, `train submit` again.)"""
from __future__ import annotations

from shardship.errors import ShardshipError
from train.jobs.common import directive_value, fresh_checkpoint_test, header, launch_line, setup_block, wait_loop
from train.jobs.slurm import slurm_mem
from train.jobs.spec import JobSpec

RESCHEDULE_EXIT = 99  # SGE: a job script exiting 99 is put back into the queue


def log_path(spec: JobSpec, job_id: str | int) -> str:
    """Where SGE writes the job's output for `-o <dir>/`."""
    return f"{spec.log_dir}/{spec.name}.o{job_id}"


def mem_request(spec: JobSpec) -> str | None:
    """`-l NAME=VALUE` for the site's memory resource: the node's `mem` for the job, or
    `mem` / cpus per slot (rounded up to MiB) where the site counts memory per slot."""
    name = spec.cluster.mem_resource
    if not name:
        return None
    per = (spec.cluster.mem_per or "job").lower()
    if per not in ("job", "slot"):
        raise ShardshipError(f"[cluster.{spec.cluster.name}] mem_per = {spec.cluster.mem_per!r}: use \"job\" "
                             "(the node's memory for the whole job) or \"slot\" (per core, as mem_per_core)")
    if per == "job":
        return f"{directive_value(name, 'mem_resource')}={slurm_mem(spec.mem)}"
    mib = -(-spec.mem_bytes // (spec.cpus_per_node * 2**20))
    return f"{directive_value(name, 'mem_resource')}={mib}M"


def render(spec: JobSpec) -> str:
    if spec.scheduler != "sge":
        raise ShardshipError(f"job {spec.name}: scheduler is {spec.scheduler}, not sge")
    if spec.nodes != 1:
        raise ShardshipError(f"job {spec.name}: SGE jobs run on one node; got nodes = {spec.nodes}")
    d = directive_value
    lines = ["#!/bin/bash -l"]
    lines += header(spec, "Grid Engine (qsub)", log_path(spec, "<JOB_ID>"))
    lines.append("")
    lines.append(f"#$ -N {d(spec.name, 'job name')}")
    if spec.cluster.project:
        lines.append(f"#$ -P {d(spec.cluster.project, 'project')}")
    if spec.cluster.account:
        lines.append(f"#$ -A {d(spec.cluster.account, 'account')}")
    if spec.cluster.queue:
        lines.append(f"#$ -q {d(spec.cluster.queue, 'queue')}")
    lines.append("#$ -S /bin/bash")
    lines.append(f"#$ -pe omp {spec.cpus_per_node}")
    if spec.gpus_per_node:
        lines.append(f"#$ -l gpus={spec.gpus_per_node}")
        if spec.cluster.gpu_c:
            lines.append(f"#$ -l gpu_c={d(spec.cluster.gpu_c, 'gpu_c')}")
        if spec.cluster.gpu_type:
            lines.append(f"#$ -l gpu_type={d(spec.cluster.gpu_type, 'gpu_type')}")
        if spec.cluster.gpu_memory:
            lines.append(f"#$ -l gpu_memory={d(spec.cluster.gpu_memory, 'gpu_memory')}")
    mem = mem_request(spec)
    if mem:
        lines.append(f"#$ -l {mem}")
    lines.append(f"#$ -l h_rt={spec.walltime}")
    lines.append("#$ -j y")
    lines.append(f"#$ -o {d(spec.log_dir.rstrip('/') + '/', 'log directory')}")
    lines.append("")
    lines.append("# CUDA_VISIBLE_DEVICES is set by SGE to the GPUs it granted: never set it here.")
    lines += setup_block(spec)
    lines.append('echo "shardship: job $JOB_ID ($JOB_NAME) run ${RESTARTED:-0} on $(hostname), $NSLOTS slots, '
                 'started $(date -Is)"')
    lines.append("")
    lines.append("start=$(date +%s)")
    lines.append('export SHARDSHIP_JOB_START="$start"  # the trainer\'s --time-limit counts from here')
    lines.append("set +e")
    if spec.uses_torchrun:
        lines.append(f"# {spec.ranks_per_node} processes on this node, one per GPU (torchrun sets RANK/LOCAL_RANK)")
    lines.append(f"{launch_line(spec)} &")
    lines += wait_loop()
    lines.append("")
    lines.append(f"# Stopped for the time limit ({spec.time_limit_s} s) with a fresh checkpoint: "
                 f"exit {RESCHEDULE_EXIT} makes SGE")
    lines.append("# reschedule this job (same job id); the next run resumes from `last`.")
    lines.append(f'if [ "$rc" -eq 0 ] && [ "$elapsed" -ge {spec.time_limit_s} ] && {fresh_checkpoint_test(spec)}; then')
    lines.append('  echo "shardship: time limit reached, checkpoint saved: '
                 'rescheduling job $JOB_ID (resumes from last)"')
    lines.append(f"  exit {RESCHEDULE_EXIT}")
    lines.append("fi")
    lines.append('exit "$rc"')
    return "\n".join(lines) + "\n"
