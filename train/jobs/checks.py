"""Pre-submit checks: the arithmetic that would have caught the job-script failures
before a job waited hours in the queue to die.

- memory: ranks x (training process + num_workers x per-worker RSS) against the
  memory asked for and the biggest node (16 ranks x 8 workers OOM-killed a
  256 GB node);
- cores: data workers per rank against the cores per rank;
- wall clock: a periodic checkpoint must land before the trainer's time limit;
- quota: the checkpoints the run keeps must fit the remote quota headroom.

Every function here is pure: numbers in, `Finding`s out. `raise_for(findings)`
turns the errors into one ShardshipError; warnings are only reported. Where
the numbers come from (bench CSV, probes, remote) is in `measure.py`."""
from __future__ import annotations

import math
from dataclasses import dataclass

from shardship.errors import QuotaError, ShardshipError
from shardship.units import human
from train.jobs.spec import JobSpec
from train.retention import peak_checkpoint_files

GiB = 1024**3
# Documented defaults when nothing was measured (see measure.py for measured values):
DEFAULT_WORKER_RSS = 1 * GiB  # one DataLoader worker: torch imported + decode buffers + prefetch
RANK_RSS_GPU = 3 * GiB  # a training process on a GPU: torch, CUDA context, pinned batches
RANK_RSS_CPU = 1 * GiB  # a training process on CPU
MEMORY_MARGIN = 0.10  # keep 10% of the node for the OS, page cache, the launcher
DEFAULT_STEP_SECONDS = 0.5  # one optimizer step of the default model on a GPU (batch 32)
DEFAULT_STARTUP_SECONDS = 30  # module load, imports, shard verification before step 1
LOG_BYTES = 10 * 1024**2  # metrics JSONL, loss plot, scheduler logs of one run
QUOTA_MARGIN = 0.05  # quotas are enforced on blocks: keep 5% free (as packer budget)


@dataclass(frozen=True)
class Finding:
    level: str  # "error" | "warning"
    check: str  # "memory" | "cpus" | "walltime" | "quota"
    message: str

    def __str__(self) -> str:
        return f"{self.check}: {self.message}"


def rank_rss(spec: JobSpec) -> int:
    return RANK_RSS_GPU if spec.gpus_per_node else RANK_RSS_CPU


def memory_needed(ranks_per_node: int, num_workers: int, worker_rss: int, per_rank_rss: int) -> int:
    """Bytes one node needs: every rank's training process plus its workers."""
    return ranks_per_node * (per_rank_rss + num_workers * worker_rss)


WORKERS_SETTING = "[train] num_workers = {n}"  # how the fix names the setting; a --command's override differs


def check_memory(spec: JobSpec, worker_rss: int, worker_rss_source: str, node_mem: int | None = None,
                 node_mem_source: str = "", workers_setting: str = WORKERS_SETTING) -> list[Finding]:
    """Workers x ranks x per-worker RSS vs the memory asked for (and the biggest node)."""
    out: list[Finding] = []
    per_rank = rank_rss(spec)
    need = memory_needed(spec.ranks_per_node, spec.num_workers, worker_rss, per_rank)
    cache = spec.mem_cache  # the decoded-frame cache train submit added to the request (cachemem.py): not theirs
    asked = spec.mem_bytes
    limit, limit_what = asked, f"mem = {spec.mem_said} per node"
    if node_mem is not None and node_mem < asked:
        other = ' (or set [train] cache = "auto" or "off")' if cache else ""
        out.append(Finding("error", "memory", f"mem = {spec.mem_said} per node, but the biggest node has "
                                              f"{human(node_mem)} ({node_mem_source}): ask for at most that{other}"))
        limit, limit_what = node_mem, f"the biggest node's {human(node_mem)} ({node_mem_source})"
    usable = int((limit - cache) * (1 - MEMORY_MARGIN))
    if need > usable:
        fit = math.floor((usable / spec.ranks_per_node - per_rank) / worker_rss) if worker_rss else 0
        fix = (f"set {workers_setting.format(n=max(fit, 0))}" if fit >= 1 or (fit == 0 and spec.num_workers > 0)
               else "use fewer processes per node or a node with more memory")
        out.append(Finding(
            "error", "memory",
            f"{spec.ranks_per_node} ranks x ({human(per_rank)} + {spec.num_workers} workers x {human(worker_rss)} "
            f"per worker, {worker_rss_source}) = {human(need)} per node, more than {limit_what}"
            f"{' less the cache' if cache else ''} minus {MEMORY_MARGIN:.0%}: the job would be OOM-killed; {fix}"))
    return out


def check_cpus(spec: JobSpec, workers_setting: str = WORKERS_SETTING) -> list[Finding]:
    """Data workers per rank vs the cores each rank gets."""
    out: list[Finding] = []
    if spec.cpus_per_node < spec.ranks_per_node:
        out.append(Finding("error", "cpus", f"cpus = {spec.cpus_per_node} per node for {spec.ranks_per_node} "
                                            "processes per node: ask for at least one core per process"))
        return out
    per_rank = spec.cpus_per_rank
    if spec.num_workers > per_rank:
        out.append(Finding(
            "error", "cpus",
            f"num_workers = {spec.num_workers} per rank but each rank gets {per_rank} cores ({spec.cpus_per_node} "
            f"cores / {spec.ranks_per_node} ranks): workers would fight for cores; set "
            f"{workers_setting.format(n=max(per_rank - 1, 1))} or "
            f"cpus = {spec.ranks_per_node * (spec.num_workers + 1)}"))
    elif spec.num_workers == per_rank and per_rank > 1:
        out.append(Finding("warning", "cpus",
                           f"num_workers = {spec.num_workers} uses every core of a rank; the "
                           f"training process shares one (num_workers = {per_rank - 1} leaves it one)"))
    return out


def check_walltime(spec: JobSpec, step_seconds: float, step_source: str,
                   startup_seconds: float = DEFAULT_STARTUP_SECONDS) -> list[Finding]:
    """A periodic checkpoint must land before the trainer's time limit."""
    out: list[Finding] = []
    window = spec.time_limit_s - startup_seconds
    if window <= 0:
        out.append(Finding("error", "walltime", f"time = {spec.walltime} leaves no time to train after "
                                                f"{spec.stop_before_s} s for the final checkpoint and "
                                                f"{startup_seconds:.0f} s of start-up: ask for more time"))
        return out
    first = startup_seconds + spec.checkpoint_every * step_seconds
    if first > spec.time_limit_s:
        fit = max(1, int(window / step_seconds))
        out.append(Finding(
            "error", "walltime",
            f"checkpoint_every = {spec.checkpoint_every} steps x {step_seconds:.3g} s/step ({step_source}) = "
            f"{first / 3600:.1f} h to the first checkpoint, past the {spec.time_limit_s / 3600:.1f} h the job may "
            f"train (time = {spec.walltime}): set [train] checkpoint_every <= {fit} or ask for more time"))
    return out


def check_quota(spec: JobSpec, checkpoint_bytes: int, headroom_bytes: int | None, quota_bytes: int | None,
                quota_source: str, existing_bytes: int = 0) -> list[Finding]:
    """The checkpoints the run will keep (minus what its outputs already hold) vs the headroom."""
    if headroom_bytes is None:
        return [Finding("warning", "quota", f"no quota known for the remote ({quota_source}): checkpoints "
                                            f"need about {human(peak_checkpoint_files(spec.keep) * checkpoint_bytes)}")]
    n = peak_checkpoint_files(spec.keep)
    total = n * checkpoint_bytes + LOG_BYTES
    more = max(0, total - existing_bytes)
    margin = int((quota_bytes or 0) * QUOTA_MARGIN)
    if more > headroom_bytes - margin:
        fit_keep = spec.keep
        while (fit_keep > 0
               and max(0, peak_checkpoint_files(fit_keep) * checkpoint_bytes + LOG_BYTES - existing_bytes)
               > headroom_bytes - margin):
            fit_keep -= 1
        fix = (f"set [train] keep = {fit_keep}" if fit_keep < spec.keep and fit_keep > 0 else
               "free space on the cluster or use a smaller model")
        return [Finding(
            "error", "quota",
            f"{n} checkpoints x {human(checkpoint_bytes)} + logs = {human(total)} "
            f"({human(existing_bytes)} already in {spec.out_dir}), but only {human(max(headroom_bytes - margin, 0))} "
            f"is free ({quota_source}, {QUOTA_MARGIN:.0%} margin): {fix}")]
    return []


def errors(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.level == "error"]


def raise_for(findings: list[Finding], where: str) -> None:
    """One ShardshipError naming every failed check (QuotaError when only the quota failed)."""
    errs = errors(findings)
    if not errs:
        return
    text = f"{where}: refusing to submit: " + "; ".join(str(f) for f in errs)
    if all(f.check == "quota" for f in errs):
        raise QuotaError(text)
    raise ShardshipError(text)
