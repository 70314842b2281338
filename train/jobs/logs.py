"""`train logs [--follow]`: the scheduler log of a recorded job, read over the same
connection as `train status`. Following polls the file's size (no `tail -f` held
open over SSH) and stops when the scheduler no longer lists the job."""
from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from shardship.config import ClusterConfig, Config
from train.jobs.race import follow as follow_winner
from train.jobs.records import JobRecord, jobs_file, load_records
from train.jobs.remote import connected
from train.jobs.status import ACTIVE, query_state

POLL_S = 5.0


def pick_record(cfg: Config, cluster: ClusterConfig, *, name: str | None = None,
                job_id: str | None = None) -> JobRecord | None:
    """The newest recorded job of `cluster` (with that name / id)."""
    recs = [r for r in load_records(jobs_file(cfg)) if r.cluster == cluster.name
            and (name is None or r.name == name) and (job_id is None or r.job_id == str(job_id))]
    return recs[-1] if recs else None


def _new_bytes(remote: Any, path: str, offset: int) -> tuple[str, int]:
    """What `path` holds past `offset`, decoded, and the new offset (a log is small: read whole)."""
    if not remote.exists(path):
        return "", offset
    data = remote.read_file(path)
    if len(data) < offset:  # truncated or replaced: start over
        offset = 0
    return data[offset:].decode("utf-8", "replace"), len(data)


def follow_log(cfg: Config, cluster: ClusterConfig, rec: JobRecord, *, lines: int = 50, follow: bool = False,
               remote: Any = None, accept_new_host_key: bool = False, poll_s: float = POLL_S) -> Iterator[str]:
    """The last `lines` lines, then (follow) what the job appends until it leaves the queue."""
    with connected(cluster, remote, accept_new_host_key) as r:
        if rec.group:  # with --partitions: the copy that won
            rec = follow_winner(r, [x for x in load_records(jobs_file(cfg)) if x.group == rec.group])
        if not r.exists(rec.log):
            st = query_state(r, rec.scheduler, rec.job_id)
            yield f"no log yet at {rec.log} (job {rec.job_id} is {st.state.lower()})\n"
            if not follow:
                return
        else:
            res = r.run(["tail", "-n", str(lines), rec.log], timeout=120)
            yield res.stdout
        offset = len(r.read_file(rec.log)) if r.exists(rec.log) else 0
        while follow:
            time.sleep(poll_s)
            text, offset = _new_bytes(r, rec.log, offset)
            if text:
                yield text
            if query_state(r, rec.scheduler, rec.job_id).state not in ACTIVE:
                text, offset = _new_bytes(r, rec.log, offset)
                if text:
                    yield text
                return
