"""Where a job is: asked of the scheduler itself (qstat, then qacct for finished SGE
jobs; scontrol show job, then squeue for SLURM: no accounting database needed)."""
from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass
from typing import Any

from shardship.config import ClusterConfig, Config
from train.jobs.race import winner
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


@dataclass
class Progress:
    """Where the training itself is, from the run's metrics.jsonl and its job log."""

    step: int
    loss: float | None
    samples_per_s: float | None
    total_steps: int | None  # the schedule's length, as the trainer printed it
    eta_s: float | None

    def __str__(self) -> str:
        of = f"/{self.total_steps}" if self.total_steps else ""
        loss = f", loss {self.loss:.4f}" if self.loss is not None else ""
        sps = f", {self.samples_per_s:.1f} samples/s" if self.samples_per_s else ""
        eta = f", ETA {format_eta(self.eta_s)}" if self.eta_s is not None else ""
        return f"step {self.step}{of}{loss}{sps}{eta}"


def format_eta(seconds: float) -> str:
    s = int(seconds)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    return (f"{d}d " if d else "") + f"{h}h{s // 60:02d}m"


_TOTAL = re.compile(r"steps/epoch, (\d+) steps;")


def parse_progress(metrics_tail: str, log_text: str, global_batch: int) -> Progress | None:
    """The newest training record of metrics.jsonl (step, loss, samples/s), the schedule
    length from the trainer's start line in the log, and the ETA they give."""
    rec: dict[str, Any] | None = None
    for line in metrics_tail.splitlines():
        with contextlib.suppress(ValueError):
            r = json.loads(line)
            if isinstance(r, dict) and "loss" in r and "step" in r:
                rec = r
    if rec is None:
        return None
    totals = _TOTAL.findall(log_text)
    total = int(totals[-1]) if totals else None
    sps = rec.get("samples_per_s")
    sps = float(sps) if isinstance(sps, (int, float)) and sps > 0 else None
    eta = None
    if total and sps and global_batch:
        eta = max(0, total - int(rec["step"])) * global_batch / sps
    return Progress(int(rec["step"]), float(rec["loss"]), sps, total, eta)


def job_progress(remote: Any, rec: JobRecord) -> Progress | None:
    """Progress of the run `rec` writes (None before its first logged step)."""
    import posixpath

    tail = remote.run(["tail", "-n", "50", posixpath.join(rec.out_dir, "metrics.jsonl")], timeout=60)
    if not tail.ok:
        return None
    log = remote.run(["grep", "-a", "-o", "-E", "[0-9]+ steps/epoch, [0-9]+ steps;", rec.log], timeout=60)
    return parse_progress(tail.stdout, log.stdout if log.ok else "", rec.global_batch)


def job_status(cfg: Config, cluster: ClusterConfig, *, remote: Any = None, job_id: str | None = None,
               accept_new_host_key: bool = False) -> list[tuple[JobRecord, JobState, Progress | None]]:
    """Each recorded job's scheduler state, and its training progress where the run has logged."""
    recs = [r for r in load_records(jobs_file(cfg)) if r.cluster == cluster.name
            and (job_id is None or r.job_id == str(job_id))]
    if not recs:
        return []
    with connected(cluster, remote, accept_new_host_key) as r:
        out: list[tuple[JobRecord, JobState, Progress | None]] = []
        for rec in recs:
            st = query_state(r, rec.scheduler, rec.job_id)
            if rec.group:
                won = winner(r, rec.out_dir)
                mark = ("won the race" if won == rec.job_id else f"lost to {won}" if won else "racing")
                st.detail = f"{rec.partition}, {mark}" + (f"; {st.detail}" if st.detail else "")
                if won and won != rec.job_id:  # a cancelled copy: the winner's metrics are not its own
                    out.append((rec, st, None))
                    continue
            out.append((rec, st, job_progress(r, rec)))
        return out
