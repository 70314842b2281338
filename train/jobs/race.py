"""`train submit --partitions a,b`: the user's "hybrid" strategy. The same job goes
to several partitions at once; the first copy to start wins, cancels the others,
and is the one `train status`, `train logs` and `train fetch` follow.

Who won is decided on the cluster, not by a watcher on the laptop: each copy's
script first tries `mkdir <outputs>/.shardship-winner.lock` (atomic on any
POSIX filesystem, NFS and Lustre included); the copy that creates it writes its
job id to `.shardship-winner` and scancels the ids in `<jobs>/<name>.siblings`;
a copy that starts later finds another id there and exits 0 without touching
the outputs. A requeued winner finds its own id and goes on."""
from __future__ import annotations

import posixpath
from typing import Any

from shardship.errors import RemoteError, ShardshipError
from train.jobs.common import directive_value, q
from train.jobs.spec import JobSpec

WINNER = ".shardship-winner"


def winner_path(out_dir: str) -> str:
    return posixpath.join(out_dir, WINNER)


def siblings_path(spec: JobSpec) -> str:
    return posixpath.join(posixpath.dirname(spec.script_path), f"{spec.name}.siblings")


def guard_lines(spec: JobSpec) -> list[str]:
    """Shell lines at the top of each copy (after cd into the outputs): win or step aside."""
    win, lock, sib = q(winner_path(spec.out_dir)), q(winner_path(spec.out_dir) + ".lock"), q(siblings_path(spec))
    return [
        f"# One of several copies of this run ({', '.join(spec.partitions)}): the first to start wins and",
        "# cancels the others (`train submit --partitions`); a later one steps aside.",
        f'mkdir {lock} 2>/dev/null && echo "$SLURM_JOB_ID" > {win}',
        f"for i in $(seq 60); do [ -s {win} ] && break; sleep 1; done",
        f'if [ "$(cat {win} 2>/dev/null)" != "$SLURM_JOB_ID" ]; then',
        f'  echo "shardship: job $(cat {win} 2>/dev/null) started first in another partition: '
        'this copy ($SLURM_JOB_PARTITION) steps aside"',
        "  exit 0",
        "fi",
        f"for i in $(seq 60); do [ -s {sib} ] && break; sleep 1; done",
        f'for id in $(cat {sib} 2>/dev/null); do [ "$id" = "$SLURM_JOB_ID" ] || scancel "$id" 2>/dev/null; done',
        'echo "shardship: job $SLURM_JOB_ID started first, in partition $SLURM_JOB_PARTITION; the other copies '
        'are cancelled"',
    ]


def check_partitions(spec: JobSpec) -> tuple[str, ...]:
    if spec.scheduler != "slurm":
        raise ShardshipError(f"[cluster.{spec.cluster.name}] --partitions: several partitions at once are for "
                             "SLURM; on Grid Engine give the queue in [cluster] queue")
    for p in spec.partitions:
        directive_value(p, "partition")
    return spec.partitions


def submit_copies(remote: Any, spec: JobSpec, parse_job_id: Any) -> list[tuple[str, str]]:
    """sbatch one copy per partition; [(job id, partition)]. A failed sbatch cancels the copies
    already queued, so no half group is left behind."""
    done: list[tuple[str, str]] = []
    # a previous race of this run name must not decide this one
    remote.run(["rm", "-rf", winner_path(spec.out_dir) + ".lock", winner_path(spec.out_dir), siblings_path(spec)],
               timeout=60).check("rm")
    for part in check_partitions(spec):
        argv = ["sbatch", f"--partition={part}", spec.script_path]
        res = remote.run(argv, cwd=posixpath.dirname(spec.script_path), timeout=120)
        job_id = parse_job_id(res.stdout) if res.ok else None
        if job_id is None:
            for jid, _ in done:
                remote.run(["scancel", jid], timeout=60)
            why = (res.stderr.strip() or res.stdout.strip())[:200]
            raise RemoteError(f"{remote.label}: sbatch to partition {part} failed ({why}); the copies already "
                              f"queued ({', '.join(j for j, _ in done) or 'none'}) were cancelled")
        done.append((job_id, part))
    remote.write_file(siblings_path(spec), ("\n".join(j for j, _ in done) + "\n").encode())
    return done


def follow(remote: Any, recs: list[Any]) -> Any:
    """The record to follow among `recs` (newest last): for a group of copies, the winner once
    one has started (else the newest copy); otherwise the newest record."""
    last = recs[-1]
    if not getattr(last, "group", ""):
        return last
    won = winner(remote, last.out_dir)
    return next((r for r in recs if r.group == last.group and r.job_id == won), last)


def winner(remote: Any, out_dir: str) -> str | None:
    """The job id that won the race for `out_dir`, once one has started."""
    path = winner_path(out_dir)
    try:
        if not remote.exists(path):
            return None
        return remote.read_file(path).decode().strip() or None
    except (RemoteError, OSError):
        return None
