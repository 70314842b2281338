"""One job description, built from `[cluster.NAME]` + `[train]`.

Both renderers (sge.py, slurm.py) and the pre-submit checks read only this
dataclass, so what gets checked is exactly what gets written into the script.
Paths in it are absolute remote paths: SGE does not expand `~` or `$JOB_ID` in
`-o`, and a job must not depend on the submit directory."""
from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shardship.config import ClusterConfig, DefaultSize
from shardship.errors import ShardshipError
from shardship.units import human, parse_size
from train.config import TrainConfig

SCHEDULERS = ("sge", "slurm")
# The trainer checkpoints and stops this long before the wall clock (`train run --time-limit`);
# SLURM also sends the batch shell USR1 this long ahead. Clamped to a third of the wall clock.
DEFAULT_STOP_BEFORE_S = 300
RDZV_PORT = 29500


@dataclass(frozen=True)
class JobSpec:
    """Everything a job script says, in the units the schedulers use."""

    name: str  # job name (-N / --job-name), also the run directory name
    scheduler: str  # "sge" | "slurm"
    source: str  # what the script was generated from, for its header
    nodes: int
    gpus_per_node: int  # 0 = CPU job
    ranks_per_node: int  # training processes per node: one per GPU, or `--nproc-per-node` for a CPU job
    cpus_per_node: int
    mem: str  # per node, as asked for ("64G"): as configured, plus the decoded-frame cache when not configured
    wall_seconds: int
    data_dir: str  # absolute remote path of the packed shards (index.json)
    out_dir: str  # absolute remote path of the run: checkpoints, metrics; `last` lives here
    log_dir: str  # absolute remote directory for the scheduler's stdout/stderr
    script_path: str  # absolute remote path the script is written to
    config_path: str | None = None  # absolute remote path of the [train] TOML the trainer reads
    # the [train] settings the checks read; defaults are the trainer's (train.config)
    num_workers: int = TrainConfig.num_workers
    checkpoint_every: int = TrainConfig.checkpoint_every
    keep: int = TrainConfig.keep
    batch_size: int = TrainConfig.batch_size
    python: str = "python3"
    setup: tuple[str, ...] = ()
    train_args: tuple[str, ...] = ()  # extra `train run` arguments, e.g. ("--max-steps", "100")
    stop_before_s: int = DEFAULT_STOP_BEFORE_S
    command: tuple[str, ...] = ()  # `--command`: someone else's script instead of `train run` (foreign.py)
    launcher: str = "torchrun"  # "torchrun" | "lightning" (R tasks per node, srun python; foreign.py)
    partitions: tuple[str, ...] = ()  # `--partitions a,b`: copies race, the first to start wins (race.py)
    code_dir: str | None = None  # shipped shardship source (train/jobs/ship.py), first on PYTHONPATH
    cache: str = TrainConfig.cache  # [train] cache: where the trainer keeps the decoded frames
    mem_default: bool = False  # the config gives no `mem`: `mem` started from the built-in default
    mem_cache: int = 0  # bytes added to `mem` for the decoded-frame cache in host memory (cachemem.py)
    mem_base: str = ""  # `mem` before the cache was added to it
    # site-specific pass-through keys (gpu_c, gpu_type, gpu_memory, gres, constraint,
    # partition, queue, account, project) are read from the cluster config as given
    cluster: ClusterConfig = field(default_factory=lambda: ClusterConfig(name=""), compare=False)

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def mem_bytes(self) -> int:
        return parse_size(self.mem)

    @property
    def mem_said(self) -> str:
        """`mem` as the messages say it: "42G (32G + 9.5 GB decoded-frame cache)" when the cache was added."""
        if not self.mem_cache:
            return self.mem
        return f"{self.mem} ({self.mem_base} + {human(self.mem_cache)} decoded-frame cache)"

    @property
    def cpus_per_rank(self) -> int:
        return self.cpus_per_node // max(1, self.ranks_per_node)

    @property
    def uses_torchrun(self) -> bool:
        return self.ranks > 1 and self.launcher != "lightning"

    @property
    def walltime(self) -> str:
        return format_walltime(self.wall_seconds)

    @property
    def time_limit_s(self) -> int:
        """What the trainer gets as --time-limit: it checkpoints and exits 0 by then."""
        return self.wall_seconds - self.stop_before_s

    def train_command(self) -> list[str]:
        """`train run` arguments after `python -m` / `torchrun ... -m`."""
        words = ["train", "run", "--data", self.data_dir, "--out", self.out_dir]
        if self.config_path:
            words += ["--config", self.config_path]
        words += ["--time-limit", format_walltime(self.time_limit_s), *self.train_args]
        return words


_WALL = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def parse_walltime(text: str | int) -> int:
    """'12:00:00', '1-00:00:00', '90:00' (MM:SS as SLURM reads it), '30' minutes -> seconds.

    Accepted forms follow SLURM's --time, which is a superset of SGE's h_rt."""
    if isinstance(text, int):
        return text
    m = _WALL.match(str(text).strip())
    if not m:
        raise ShardshipError(f"cannot read wall clock {text!r}: use HH:MM:SS (e.g. 12:00:00) or D-HH:MM:SS")
    days, a, b, c = (int(x) if x is not None else None for x in m.groups())
    assert a is not None  # the regex's first number is not optional
    if c is not None:  # H:M:S
        assert b is not None  # the regex's third number only ever matches after a second
        secs = a * 3600 + b * 60 + c
    elif b is not None:  # M:S, or D-H:M
        secs = a * 3600 + b * 60 if days is not None else a * 60 + b
    else:  # minutes, or D-H
        secs = a * 3600 if days is not None else a * 60
    secs += (days or 0) * 86400
    if secs <= 0:
        raise ShardshipError(f"wall clock {text!r} is zero: give the job some time, e.g. 12:00:00")
    return secs


def format_walltime(seconds: int) -> str:
    """Seconds -> HH:MM:SS (hours may exceed 24: both SGE h_rt and SLURM --time read that)."""
    h, rem = divmod(int(seconds), 3600)
    m, s = divmod(rem, 60)
    return f"{h:02d}:{m:02d}:{s:02d}"


_NAME_BAD = re.compile(r"[^A-Za-z0-9_.-]")


def job_name(text: str) -> str:
    """A name both schedulers accept: SGE -N must start with a letter and may not hold '/', ':', '@'..."""
    name = _NAME_BAD.sub("_", text.strip()) or "shardship"
    if not name[0].isalpha():
        name = "j" + name
    return name[:64]


def _positive_int(value: Any, what: str, minimum: int = 1) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ShardshipError(f"{what} = {value!r}: not a whole number") from None
    if n < minimum:
        raise ShardshipError(f"{what} = {n}: must be at least {minimum}")
    return n


def train_settings(train: Mapping[str, Any], where: str = "[train]") -> dict[str, Any]:
    """num_workers, checkpoint_every, keep, batch_size (ints) and cache as `train run` will use them:
    parsed by the trainer's own TrainConfig (its defaults, its validation), which is
    torch-free, so a submit host without torch checks exactly what the job will run."""
    tc = TrainConfig.from_dict(train, where)
    return {"num_workers": int(tc.num_workers), "checkpoint_every": int(tc.checkpoint_every), "keep": int(tc.keep),
            "batch_size": int(tc.batch_size), "cache": str(tc.cache)}


def build_spec(
    cluster: ClusterConfig,
    train: Mapping[str, Any],
    remote_root: str,
    source: str,
    *,
    name: str = "shardship",
    ranks_per_node: int | None = None,
    stop_before_s: int = DEFAULT_STOP_BEFORE_S,
    train_args: tuple[str, ...] = (),
    code_dir: str | None = None,
    train_where: str = "[train]",
    partitions: tuple[str, ...] = (),
    command: tuple[str, ...] = (),
    launcher: str = "torchrun",
) -> JobSpec:
    """JobSpec for `cluster` with the run's files under `remote_root` (absolute).

    Remote layout (stable, so a resubmission finds `last` again):
        <root>/                      packed shards + index.json (what `transfer upload` sends)
        <root>/outputs/<name>/       trainer output: checkpoints, metrics, plots
        <root>/jobs/<name>.<sched>.sh, <name>.toml, logs/   script, its [train], scheduler logs

    `ranks_per_node` is for CPU jobs (gpus = 0): how many processes torchrun starts;
    with GPUs it is one per GPU and may not be given differently."""
    where = f"[cluster.{cluster.name}]"
    sched = (cluster.scheduler or "").lower()
    if sched not in SCHEDULERS:
        raise ShardshipError(f"{where} scheduler = {cluster.scheduler!r}: use \"sge\" or \"slurm\"")
    if not posixpath.isabs(remote_root):
        raise ShardshipError(
            f"remote directory {remote_root!r} must be absolute here (resolve it against the remote home)"
        )
    nodes = _positive_int(cluster.nodes, f"{where} nodes")
    gpus = _positive_int(cluster.gpus, f"{where} gpus", minimum=0)
    cpus = _positive_int(cluster.cpus, f"{where} cpus")
    if gpus:
        if ranks_per_node not in (None, gpus):
            raise ShardshipError(f"{where} gpus = {gpus}: one process per GPU, so {ranks_per_node} processes per "
                                 "node cannot be asked for")
        ranks_per_node = gpus
    else:
        ranks_per_node = _positive_int(1 if ranks_per_node is None else ranks_per_node, "processes per node")
    if sched == "sge" and nodes > 1:
        raise ShardshipError(
            f"{where} nodes = {nodes}: multi-node jobs are generated for SLURM only; under SGE use one node "
            "(up to its GPUs with torchrun --standalone)"
        )
    parse_size(cluster.mem)  # fail early on a bad size
    jname = job_name(name)
    root = posixpath.normpath(remote_root)
    jobs = posixpath.join(root, "jobs")
    wall = parse_walltime(cluster.time)
    if sched == "slurm":  # SLURM counts whole minutes: 0:90 is a 2-minute limit
        wall = -(-wall // 60) * 60
    stop_before = min(_positive_int(stop_before_s, "stop_before_s"), max(1, wall // 3))
    ts = train_settings(train, train_where)
    return JobSpec(
        name=jname,
        scheduler=sched,
        source=source,
        nodes=nodes,
        gpus_per_node=gpus,
        ranks_per_node=ranks_per_node,
        cpus_per_node=cpus,
        mem=str(cluster.mem),
        wall_seconds=wall,
        data_dir=root,
        out_dir=posixpath.join(root, "outputs", jname),
        log_dir=posixpath.join(jobs, "logs"),
        script_path=posixpath.join(jobs, f"{jname}.{sched}.sh"),
        config_path=posixpath.join(jobs, f"{jname}.toml"),
        **ts,  # num_workers, checkpoint_every, keep, batch_size, cache
        mem_default=isinstance(cluster.mem, DefaultSize),
        python=cluster.python or "python3",
        setup=_setup_lines(cluster.setup, where),
        train_args=tuple(train_args),
        stop_before_s=stop_before,
        code_dir=code_dir,
        partitions=tuple(partitions), command=tuple(command), launcher=launcher,
        cluster=cluster,
    )


def _setup_lines(setup: Any, where: str) -> tuple[str, ...]:
    """`setup` is a list of shell lines; a single string is one line."""
    if not setup:
        return ()
    lines = (setup,) if isinstance(setup, str) else tuple(setup)
    for line in lines:
        if not isinstance(line, str) or "\n" in line:
            raise ShardshipError(f"{where} setup: {line!r}: give one shell line per list entry")
    return lines
