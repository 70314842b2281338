"""Where a job is: asked of the scheduler itself (qstat, then qacct for finished SGE
jobs; scontrol show job, then squeue for SLURM: no accounting database needed)."""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Any

from shardship.config import ClusterConfig, Config
from train.jobs.records import JobRecord, jobs_file, load_records
from train.jobs.remote import connected

# states in which the job still holds (or waits for) a slot and may write its outputs
ACTIVE = {"PENDING", "RUNNING", "REQUEUED", "COMPLETING", "CONFIGURING", "SUSPENDED", "RESIZING", "ERROR"}


@dataclass
class JobState:
    job_id: str
    state: str  # PENDING RUNNING REQUEUED COMPLETED FAILED TIMEOUT CANCELLED ERROR GONE ...
    exit_code: int | None = None
    restarts: int = 0
    detail: str = ""
    source: str = ""


def _kv(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for tok in text.split():
        if "=" in tok:
            k, v = tok.split("=", 1)
            out.setdefault(k, v)
    return out


def parse_scontrol(text: str, job_id: str) -> JobState | None:
    """`scontrol show job -o N` (one line of Key=Value)."""
    for line in text.splitlines():
        kv = _kv(line)
        if kv.get("JobId") != str(job_id):
            continue
        code = None
        if "ExitCode" in kv:
            with contextlib.suppress(ValueError):
                status, sig = (int(x) for x in kv["ExitCode"].split(":"))
                code = status if not sig else 128 + sig
        detail = f"reason {kv.get('Reason')}" if kv.get("Reason") not in (None, "None") else ""
        if kv.get("RunTime"):
            detail = (detail + ", " if detail else "") + f"ran {kv['RunTime']} of {kv.get('TimeLimit', '?')}"
        return JobState(str(job_id), kv.get("JobState", "UNKNOWN"), code, int(kv.get("Restarts", "0") or 0), detail,
                        "scontrol show job")
    return None


def parse_qstat(text: str, job_id: str) -> JobState | None:
    """A row of the `qstat` table for job N -> PENDING / RUNNING / ERROR / CANCELLED."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0] == str(job_id):
            st = parts[4]
            if "E" in st:
                state = "ERROR"
            elif "d" in st:
                state = "CANCELLED"
            elif "r" in st or "t" in st:
                state = "RUNNING"
            elif "q" in st or "w" in st or "h" in st:
                state = "REQUEUED" if st.startswith("R") else "PENDING"
            else:
                state = "UNKNOWN"
            return JobState(str(job_id), state, None, 1 if st.startswith("R") else 0, f"qstat state {st}", "qstat")
    return None


def parse_qacct(text: str, job_id: str) -> JobState | None:
    """The last `qacct -j N` record (a rescheduled job has one per run)."""
    recs: list[dict[str, str]] = []
    for line in text.splitlines():
        if line.startswith("====="):
            recs.append({})
            continue
        if recs and line.strip():
            key, _, val = line.partition(" ")
            recs[-1][key] = val.strip()
    recs = [r for r in recs if r.get("jobnumber") == str(job_id)]
    if not recs:
        return None
    r = recs[-1]
    failed = r.get("failed", "0")
    fm = re.match(r"\d+", failed)
    fcode = int(fm.group()) if fm else 0
    m = re.match(r"-?\d+", r.get("exit_status", ""))
    code = int(m.group()) if m else None
    if fcode == 0 and code == 0:
        state = "COMPLETED"
    elif "h_rt" in failed or "h_cpu" in failed:
        state = "TIMEOUT"
    elif fcode == 25 or code == 99:
        state = "REQUEUED"
    elif fcode == 100 and code in (137, 143):
        state = "CANCELLED"
    else:
        state = "FAILED"
    detail = f"failed {failed}" if fcode else ""
    return JobState(str(job_id), state, code, len(recs) - 1, detail, "qacct")


def query_state(remote: Any, scheduler: str, job_id: str) -> JobState:
    """Ask the scheduler (no accounting database needed for SLURM)."""
    if scheduler == "slurm":
        res = remote.run(["scontrol", "show", "job", "-o", str(job_id)], timeout=60)
        st = parse_scontrol(res.stdout, job_id) if res.ok else None
        if st is None:
            q = remote.run(["squeue", "-h", "-j", str(job_id), "-o", "%T"], timeout=60)
            if q.ok and q.stdout.strip():
                return JobState(str(job_id), q.stdout.split()[0], source="squeue")
            return JobState(str(job_id), "GONE", detail="no longer known to SLURM; see the job's log",
                            source="scontrol")
        return st
    res = remote.run(["qstat", "-u", "*"], timeout=60)
    st = parse_qstat(res.stdout, job_id) if res.ok else None
    if st is not None:
        return st
    acct = remote.run(["qacct", "-j", str(job_id)], timeout=60)
    st = parse_qacct(acct.stdout, job_id) if acct.ok else None
    return st or JobState(str(job_id), "GONE", detail="not in qstat and no qacct record; see the job's log",
                          source="qstat")


def job_status(cfg: Config, cluster: ClusterConfig, *, remote: Any = None, job_id: str | None = None,
               accept_new_host_key: bool = False) -> list[tuple[JobRecord, JobState]]:
    recs = [r for r in load_records(jobs_file(cfg)) if r.cluster == cluster.name
            and (job_id is None or r.job_id == str(job_id))]
    if not recs:
        return []
    with connected(cluster, remote, accept_new_host_key) as r:
        return [(rec, query_state(r, rec.scheduler, rec.job_id)) for rec in recs]
