"""`train where`: where would this job start soonest? Per partition (SLURM) or
queue (SGE) and GPU type: free and total GPUs and cores, and the scheduler's own
start estimate for exactly this job (`sbatch --test-only` with the job's
resources), so nobody waits 6.5 h in a saturated partition while another has
free nodes. Every number is the scheduler's; none is guessed."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from train.jobs.spec import JobSpec

_GRES = re.compile(r"gpu(?::([A-Za-z0-9_.-]+))?:(\d+)")
_START = re.compile(r"to start at (\S+) using (\d+) processors on nodes (\S+) in partition (\S+)")
SINFO_FORMAT = "Partition:60,NodeList:60,StateLong:24,CPUsState:30,Gres:80,GresUsed:100,Memory:14"


@dataclass
class Pool:
    """One partition / queue and GPU type."""

    partition: str
    gpu_type: str = ""  # "" = no GPUs (or untyped)
    nodes: int = 0
    nodes_idle: int = 0
    cpus_free: int = 0
    cpus_total: int = 0
    gpus_free: int = 0
    gpus_total: int = 0
    start: str = ""  # the scheduler's estimate for this job, or why there is none
    node_names: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        gpu = f"{self.gpus_free}/{self.gpus_total} GPUs free" if self.gpus_total else "no GPUs"
        kind = f" {self.gpu_type}" if self.gpu_type else ""
        return (f"{self.partition + kind:<24} {gpu:<18} {self.cpus_free}/{self.cpus_total} cores free, "
                f"{self.nodes_idle}/{self.nodes} nodes idle   start: {self.start or '-'}")


def _gpus(text: str) -> tuple[str, int]:
    """('a100', 4) from 'gpu:a100:4(S:0-1)', ('', 2) from 'gpu:2', ('', 0) from '(null)'."""
    total, kind = 0, ""
    for m in _GRES.finditer(text):
        total += int(m.group(2))
        kind = kind or (m.group(1) or "")
    return kind, total


def parse_sinfo(text: str) -> list[Pool]:
    """`sinfo -h -N -O <SINFO_FORMAT>` rows (one per node and partition) -> pools."""
    pools: dict[tuple[str, str], Pool] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 7:
            continue
        part, node, state, cpus, gres, used = parts[0].rstrip("*"), parts[1], parts[2], parts[3], parts[4], parts[5]
        kind, total = _gpus(gres)
        _, busy = _gpus(used)
        p = pools.setdefault((part, kind), Pool(part, kind))
        p.nodes += 1
        p.node_names.append(node)
        down = any(s in state for s in ("down", "drain", "fail", "maint", "not_responding", "reserved"))
        alloc, idle, _other, cpu_total = (int(x) for x in cpus.split("/"))
        p.cpus_total += cpu_total
        p.gpus_total += total
        if not down:
            p.cpus_free += idle
            p.gpus_free += max(0, total - busy)
            p.nodes_idle += state.startswith("idle")
    return list(pools.values())


def test_only_argv(spec: JobSpec, partition: str) -> list[str]:
    """`sbatch --test-only` asking for what the job script asks for, in `partition`."""
    from train.jobs.slurm import gres, slurm_mem

    argv = ["sbatch", "--test-only", f"--partition={partition}", f"--nodes={spec.nodes}", "--ntasks-per-node=1",
            f"--cpus-per-task={spec.cpus_per_node}", f"--mem={slurm_mem(spec.mem)}", f"--time={spec.walltime}"]
    g = gres(spec)
    if g:
        argv.append(f"--gres={g}")
    if spec.cluster.account:
        argv.append(f"--account={spec.cluster.account}")
    if spec.cluster.constraint:
        argv.append(f"--constraint={spec.cluster.constraint}")
    return [*argv, "--wrap", "true"]


def parse_test_only(text: str) -> str:
    m = _START.search(text)
    if m:
        return f"{m.group(1)} on {m.group(3)}"
    last = (text.strip().splitlines() or ["no answer"])[-1]
    return f"cannot run here: {last.removeprefix('sbatch: error: ')[:120]}"


def slurm_pools(remote: Any, spec: JobSpec | None) -> list[Pool]:
    res = remote.run(["sinfo", "-h", "-N", "-O", SINFO_FORMAT], timeout=60)
    res.check("sinfo")
    pools = parse_sinfo(res.stdout)
    if spec is not None:
        estimates: dict[str, str] = {}
        for p in pools:
            if p.partition not in estimates:
                t = remote.run(test_only_argv(spec, p.partition), timeout=60)
                estimates[p.partition] = parse_test_only(t.stderr + t.stdout)
            p.start = estimates[p.partition]
    return pools


def parse_qstat_gc(text: str) -> list[Pool]:
    """`qstat -g c`: CLUSTER QUEUE CQLOAD USED RES AVAIL TOTAL aoACDS cdsuE -> slots per queue."""
    pools = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 7 and not line.startswith(("CLUSTER", "-")) and parts[3].isdigit():
            avail, total = int(parts[4]), int(parts[5])
            pools.append(Pool(parts[0], cpus_free=avail, cpus_total=total,
                              start="SGE gives no start estimate" if avail else "no free slots now"))
    return pools


def sge_pools(remote: Any) -> tuple[list[Pool], str]:
    """Queues from `qstat -g c`, and `qgpus` (BU SCC's GPU table) as is, where it exists."""
    res = remote.run(["qstat", "-g", "c"], timeout=60)
    res.check("qstat -g c")
    pools = parse_qstat_gc(res.stdout)
    g = remote.run(["sh", "-c", 'command -v qgpus >/dev/null && qgpus || true'], timeout=60)
    return pools, g.stdout.strip()


def soonest(pools: list[Pool]) -> Pool | None:
    """The pool whose estimate is earliest (ISO times sort as text)."""
    timed = [p for p in pools if re.match(r"\d{4}-\d\d-\d\dT", p.start)]
    return min(timed, key=lambda p: p.start) if timed else None


def where(remote: Any, scheduler: str, spec: JobSpec | None) -> tuple[list[Pool], str]:
    """(pools, extra text) for the cluster; with `spec`, SLURM's start estimate for that job in each."""
    if scheduler == "sge":
        return sge_pools(remote)
    return slurm_pools(remote, spec), ""
