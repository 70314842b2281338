"""Job scripts on REAL schedulers: a single-node SLURM 22.05 and a Grid Engine 8.1.9
on this machine (scripts/ci/slurm_up.sh, scripts/ci/sge_up.sh; .ci/run starts them).

Jobs are submitted by `train.jobs.submit` as a NON-ROOT user: through the real
sshd of tests/sshd.py (a user with a 64 MiB tmpfs home), or, where sshd cannot
run, with `runuser` on a local remote. Each job is a 2-process CPU torchrun (gloo)
of the real trainer on demo shards; the tests assert on the scheduler's own
record of the job (scontrol / qstat / qacct) and on the job's log and outputs.

Skipped, with the reason, when a scheduler is not up."""
from __future__ import annotations

import contextlib
import json
import os
import posixpath
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shardship.config import ClusterConfig, Config
from shardship.errors import ShardshipError
from train.jobs.fetch import fetch_results
from train.jobs.records import JobRecord, jobs_file, load_records
from train.jobs.status import ACTIVE, job_status, query_state
from train.jobs.submit import submit_job

ROOT = Path(__file__).resolve().parents[1]
JOB_USER = "shardship-test"  # the local (runuser) route's user; scripts/ci/*_up.sh create it
PY = sys.executable

# a small model and short runs: a few seconds per job on 2 CPU cores
TRAIN = {"batch_size": 8, "num_workers": 1, "checkpoint_every": 2, "keep": 1, "val_every": 0, "log_every": 1,
         "warmup": 0, "enc_channels": [8, 16], "unet_dims": [16, 32], "embed_dim": 32, "proprio_embed": 16,
         "time_embed": 32}


# ---------------------------------------------------------------- is the scheduler up?
def _ok(argv: list[str]) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout if p.returncode == 0 else None


def slurm_down_reason() -> str | None:
    out = _ok(["sinfo", "-h", "-o", "%T"])
    if out is None:
        return "SLURM is not up here (no sinfo answer): run `bash scripts/ci/slurm_up.sh` as root"
    if not re.search(r"idle|mixed|allocated", out):
        return f"SLURM node not usable (sinfo: {out.strip()!r})"
    return None


def two_nodes_reason() -> str | None:
    """None when the two-node SLURM of scripts/ci/slurm_2node_up.sh is up, else why not."""
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "SLURM is not up here: run `bash scripts/ci/slurm_2node_up.sh` as root"
    if {"node1", "node2"} - set(out.split()):
        return f"not the two-node SLURM (nodes {out.split()}): run `bash scripts/ci/slurm_2node_up.sh` as root"
    return None


def sge_down_reason() -> str | None:
    out = _ok(["qstat", "-f"])
    if out is None:
        return "Grid Engine is not up here (no qstat answer): run `bash scripts/ci/sge_up.sh` as root"
    if "all.q@" not in out:
        return "Grid Engine has no all.q queue instance: run `bash scripts/ci/sge_up.sh` as root"
    return None


_ROOT_REASON = None if os.geteuid() == 0 else "scheduler tests need root (to create the non-root job user)"
_SLURM_REASON = _ROOT_REASON or slurm_down_reason()
_SGE_REASON = _ROOT_REASON or sge_down_reason()
# checked at collection, so a skipped test does not build data or start sshd first
SLURM = [pytest.mark.slurm, pytest.mark.skipif(_SLURM_REASON is not None, reason=str(_SLURM_REASON))]
SGE = [pytest.mark.sge, pytest.mark.skipif(_SGE_REASON is not None, reason=str(_SGE_REASON))]
BOTH = [pytest.param("slurm", marks=SLURM), pytest.param("sge", marks=SGE)]


# ---------------------------------------------------------------- the job user can run this python
def _grant_search(path: Path) -> list[str]:
    """o+x (search, not read) on every ancestor directory of `path` that lacks it,
    so the job user reaches the interpreter (a venv python often links into /root)."""
    changed = []
    for d in reversed(path.parents):
        st = d.stat()
        if not st.st_mode & 0o001:
            d.chmod(st.st_mode | 0o001)
            changed.append(str(d))
    return changed


@pytest.fixture(scope="module")
def python_for_jobs() -> str:
    if os.geteuid() == 0:
        for p in (Path(os.path.realpath(PY)), Path(PY), ROOT / "train"):
            _grant_search(p)
    return PY


# ---------------------------------------------------------------- where jobs are submitted from
class RunAsRemote:
    """A local remote whose commands run as `user` (runuser) and whose files belong to
    them: the fallback when the real sshd of tests/sshd.py cannot run here."""

    def __init__(self, home: Path, remote_dir: str, user: str):
        from transfer import LocalRemote

        self._r = LocalRemote(home, remote_dir, PY)
        self.user = user
        self.pw = pwd.getpwnam(user)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._r, name)

    def _chown(self, path: str) -> None:
        p = Path(self._r.path(path))
        while p != Path(self._r.home).parent and p.exists():
            os.chown(p, self.pw.pw_uid, self.pw.pw_gid)
            p = p.parent

    def run(self, argv, *, cwd=None, stdin=None, timeout=None):
        return self._r.run(["runuser", "-u", self.user, "--", *argv], cwd=cwd, stdin=stdin, timeout=timeout)

    def mkdir(self, path: str = "", parents: bool = True) -> None:
        self._r.mkdir(path, parents)
        self._chown(path)

    def write_file(self, path: str, data: bytes, atomic: bool = True) -> None:
        self._r.write_file(path, data, atomic)
        self._chown(path)

    def put(self, local, path, *a, **kw):
        n = self._r.put(local, path, *a, **kw)
        self._chown(path)
        return n

    def sh(self, script: str, *args: str, cwd=None, timeout=None):
        return self.run(["sh", "-s", "--", *args], cwd=cwd, stdin=script.encode(), timeout=timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


class Site:
    """A non-root job user and how to reach them: sshd (preferred) or runuser."""

    def __init__(self, kind: str, user: str, uid: int, home: Path, sshd: Any = None):
        self.kind, self.user, self.uid, self.home, self.sshd = kind, user, uid, home, sshd

    def cluster(self, remote_dir: str, **kw: Any) -> ClusterConfig:
        kw.setdefault("python", PY)
        kw.setdefault("setup", [f"export PATH={Path(PY).parent}:$PATH", f"export PYTHONPATH={ROOT}"])
        if self.sshd is not None:
            return self.sshd.cluster(remote_dir=remote_dir, **kw)
        return ClusterConfig(name="test", host=f"local:{self.home}", remote_dir=remote_dir, quota="auto", **kw)

    def connect(self, cluster: ClusterConfig):
        if self.sshd is not None:
            from transfer import connect

            return connect(cluster)
        return RunAsRemote(self.home, cluster.remote_dir, self.user)


@pytest.fixture(scope="module")
def site(python_for_jobs: str) -> Iterator[Site]:
    if os.geteuid() != 0:
        pytest.skip("scheduler tests need root (to create the non-root job user)")
    try:
        from tests.sshd import skip_reason, start_sshd
    except ImportError:
        skip_reason, start_sshd = (lambda: "tests/sshd.py missing"), None
    # SHARDSHIP_JOBS_VIA=runuser forces the fallback route (to test it where sshd works)
    if skip_reason() is None and os.environ.get("SHARDSHIP_JOBS_VIA") != "runuser":
        with start_sshd() as s:
            old = os.environ.get("HOME")
            os.environ["HOME"] = str(s.client_home)  # Fabric reads ~/.ssh/config through $HOME
            try:
                yield Site("sshd", s.user, s.uid, s.home, s)
            finally:
                if old is None:
                    os.environ.pop("HOME", None)
                else:
                    os.environ["HOME"] = old
        return
    if subprocess.run(["id", JOB_USER], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "-m", "-s", "/bin/bash", JOB_USER], check=True)
    pw = pwd.getpwnam(JOB_USER)
    home = Path(tempfile.mkdtemp(prefix="shardship-jobs-"))
    home.chmod(0o755)
    os.chown(home, pw.pw_uid, pw.pw_gid)
    try:
        yield Site("local", JOB_USER, pw.pw_uid, home)
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.datasets import make_packed

    return make_packed(tmp_path_factory.mktemp("jobs-data"), sessions=3, frames=60, seed=0)


def upload(remote: Any, packed: Path) -> None:
    remote.mkdir("")
    for f in sorted(packed.iterdir()):
        if f.is_file():
            remote.put(f, f.name)


def wipe(site: Site, remote_dir: str) -> None:
    shutil.rmtree(site.home / remote_dir, ignore_errors=True)


def make_cfg(tmp_path: Path, packed: Path, cluster: ClusterConfig, **train: Any) -> Config:
    cfg = Config(outputs=tmp_path / "outputs", packed=packed, train={**TRAIN, **train})
    cfg.clusters[cluster.name] = cluster
    return cfg


def wait_for(what: str, pred: Callable[[], Any], timeout: float, every: float = 2.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


def finished(remote: Any, rec: JobRecord, what: str, timeout: float):
    """The job's final state once the scheduler has recorded it (SGE's qacct may lag)."""
    def done():
        st = query_state(remote, rec.scheduler, rec.job_id)
        return st if st.state not in ACTIVE and st.state != "GONE" else None

    return wait_for(what, done, timeout)


def read_log(remote: Any, rec: JobRecord) -> str:
    return remote.read_file(rec.log).decode("utf-8", "replace") if remote.exists(rec.log) else ""


def queued_ids(remote: Any, scheduler: str) -> set[str]:
    """Every job id the scheduler still lists, whatever its state (SGE keeps a qdel'd job as `dr` for a while)."""
    out = remote.run(["squeue", "-h", "-o", "%i"] if scheduler == "slurm" else ["qstat", "-u", "*"]).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip() and line.split()[0].isdigit()}


def cancel(remote: Any, rec: JobRecord) -> None:
    """Cancel and wait until the job is out of the queue, so the next test starts from an empty one."""
    remote.run(["scancel", rec.job_id] if rec.scheduler == "slurm" else ["qdel", rec.job_id])
    wait_for(f"job {rec.job_id} to leave the queue", lambda: rec.job_id not in queued_ids(remote, rec.scheduler), 120)


def last_checkpoint_step(site: Site, remote_dir: str, name: str) -> int:
    """The step `last.pt` holds (read here: the remote home is on this machine)."""
    import torch

    ck = torch.load(site.home / remote_dir / "outputs" / name / "last.pt", map_location="cpu", weights_only=False)
    return int(ck["step"])


# ---------------------------------------------------------------- a 2-process torchrun job completes
@pytest.mark.slow
@pytest.mark.parametrize("scheduler", BOTH)
def test_two_process_torchrun_job_runs_to_completion(scheduler: str, site: Site, packed: Path,
                                                     tmp_path: Path) -> None:
    remote_dir = f"run-{scheduler}"
    wipe(site, remote_dir)
    cluster = site.cluster(remote_dir, scheduler=scheduler, gpus=0, cpus=2, mem="6G", time="00:10:00")
    cfg = make_cfg(tmp_path, packed, cluster, steps=6)
    try:
        with site.connect(cluster) as remote:
            upload(remote, packed)
            res = submit_job(cfg, cluster, remote=remote, name="ddp", ranks_per_node=2)
            rec = res.record
            assert rec is not None and rec.job_id.isdigit()
            assert "torchrun --standalone --nnodes 1 --nproc_per_node 2" in res.plan.script
            # the RAM check used a measured per-worker RSS (loader benchmark CSV or a real local probe)
            assert any(n.startswith("per-worker RSS") and "measured" in n for n in res.plan.notes), res.plan.notes
            # the script and the trainer's config are on the remote, as the job user wrote them
            assert remote.read_file(rec.script).decode() == res.plan.script
            st = finished(remote, rec, f"{scheduler} job {rec.job_id} to finish", 300)
            log = read_log(remote, rec)
            assert st.state == "COMPLETED" and st.exit_code == 0, f"{st}\n{log}"
            assert "2 rank(s)" in log and "device cpu" in log, log
            assert "done: step 6/6" in log, log
            assert "training exited with status 0" in log
            metrics = remote.read_file(posixpath.join(rec.out_dir, "metrics.jsonl")).decode().splitlines()
            assert max(json.loads(ln)["step"] for ln in metrics) == 6
            # `train status` and `train fetch` over the same kind of connection
            [(r2, st2, prog)] = job_status(cfg, cluster, remote=remote)
            assert r2.job_id == rec.job_id and st2.state == "COMPLETED"
            assert prog is not None and (prog.step, prog.total_steps, prog.eta_s) == (6, 6, 0), prog
            assert prog.loss is not None and prog.samples_per_s and "step 6/6, loss" in str(prog)
            dest, outcomes = fetch_results(cfg, cluster, remote=remote, name="ddp")
        names = {o.local_path.name for o in outcomes}
        assert {"best.pt", "metrics.jsonl", "loss.png", Path(rec.log).name} <= names
        assert (dest / "best.pt").stat().st_size > 0
        # the job ran as the non-root user: its outputs belong to them
        assert (site.home / remote_dir / "outputs" / "ddp" / "last.pt").stat().st_uid == site.uid != 0
        assert load_records(jobs_file(cfg))[-1].job_id == rec.job_id
    finally:
        wipe(site, remote_dir)


# ---------------------------------------------------------------- wall clock -> go again -> resume from last
@pytest.mark.slow
@SLURM[0]
@SLURM[1]
@pytest.mark.skipif(_SLURM_REASON is None and two_nodes_reason() is None,
                    reason="the two-node SLURM is up: test_slurm_2node's 2 x 2 wall-clock test covers this "
                           "(requeue at the wall clock, exact resume), across nodes; ~3 min of CI each")
def test_slurm_job_at_its_wall_clock_requeues_and_resumes(site: Site, packed: Path, tmp_path: Path) -> None:
    remote_dir = "wall-slurm"
    wipe(site, remote_dir)
    # 2 minutes (SLURM counts minutes); the trainer stops with a checkpoint 40 s before
    cluster = site.cluster(remote_dir, scheduler="slurm", gpus=0, cpus=2, mem="6G", time="00:02:00")
    cfg = make_cfg(tmp_path, packed, cluster, steps=100000, checkpoint_every=5)
    rec = None
    try:
        with site.connect(cluster) as remote:
            upload(remote, packed)
            res = submit_job(cfg, cluster, remote=remote, name="wall", ranks_per_node=2, stop_before_s=45)
            rec = res.record
            assert "--signal=B:USR1@40" in res.plan.script  # clamped to a third of the wall clock
            assert "--time-limit 00:01:20" in res.plan.script
            # a second submission on the same outputs is refused while the first is queued/running
            with pytest.raises(ShardshipError, match="same outputs"):
                submit_job(cfg, cluster, remote=remote, name="wall", ranks_per_node=2, stop_before_s=45)
            # run 1 stops for the time limit with a checkpoint, the script requeues the job
            log = wait_for("the requeue", lambda: (lambda t: t if "requeueing job" in t else None)(
                read_log(remote, rec)), 240)
            m = re.search(r"stopped at step (\d+)/100000 \(time limit\)", log)
            assert m, log
            stopped = int(m.group(1))
            assert stopped > 0
            # SLURM holds a requeued job for ~2 minutes; once it is back in the queue its owner may
            # release it. (Too early, in the second of the requeue, slurmd still holds the old run's
            # revoked credential and the new run fails: "Job credential revoked".)
            wait_for("the job back in the queue", lambda: query_state(remote, "slurm", rec.job_id).state == "PENDING",
                     60, every=1)
            time.sleep(5)
            assert remote.run(["scontrol", "update", f"jobid={rec.job_id}", "StartTime=now"]).ok
            log = wait_for("run 2 to resume", lambda: (lambda t: t if "resuming from" in t else None)(
                read_log(remote, rec)), 180)
            st = query_state(remote, "slurm", rec.job_id)
            assert st.restarts >= 1, st
            assert "restart 1 on" in log
            m2 = re.search(r"resuming from \S+last\.pt at step (\d+)", log)
            assert m2 and int(m2.group(1)) == stopped, log
            cancel(remote, rec)
            assert query_state(remote, "slurm", rec.job_id).state == "CANCELLED"
            # scancel's SIGTERM makes the ranks save a last checkpoint; SLURM may drop the job
            # from squeue before they finish writing it: read last.pt once they are gone
            wait_for("the cancelled run's ranks to exit", lambda: subprocess.run(
                ["pgrep", "-f", f"{remote_dir}/outputs/wall"], capture_output=True).returncode == 1, 90, every=1)

            # resubmitting by hand (`train submit` again) also continues from last
            k = last_checkpoint_step(site, remote_dir, "wall")
            res2 = submit_job(cfg, cluster, remote=remote, name="wall", ranks_per_node=2, stop_before_s=45,
                              train_args=("--max-steps", str(k + 3)))
            rec = res2.record
            st = finished(remote, rec, "the resubmitted job to finish", 240)
            log = read_log(remote, rec)
            assert st.state == "COMPLETED" and st.exit_code == 0, f"{st}\n{log}"
            assert f"at step {k}," in log, log
            assert f"done: step {k + 3}/{k + 3} (--max-steps; the schedule has 100000 steps" in log, log
            rec = None
    finally:
        if rec is not None:
            with contextlib.suppress(Exception), site.connect(cluster) as remote:
                cancel(remote, rec)
        wipe(site, remote_dir)


@pytest.mark.slow
@SGE[0]
@SGE[1]
def test_sge_job_at_its_wall_clock_is_rescheduled_and_resumes(site: Site, packed: Path, tmp_path: Path) -> None:
    remote_dir = "wall-sge"
    wipe(site, remote_dir)
    # h_rt 90 s; the trainer stops with a checkpoint at 60 s, the script exits 99
    cluster = site.cluster(remote_dir, scheduler="sge", gpus=0, cpus=2, mem="6G", time="00:01:30")
    cfg = make_cfg(tmp_path, packed, cluster, steps=100000, checkpoint_every=5)
    rec = None
    try:
        with site.connect(cluster) as remote:
            upload(remote, packed)
            res = submit_job(cfg, cluster, remote=remote, name="wall", ranks_per_node=2, stop_before_s=45)
            rec = res.record
            assert "#$ -l h_rt=00:01:30" in res.plan.script and "--time-limit 00:01:00" in res.plan.script
            log = wait_for("the reschedule", lambda: (lambda t: t if "rescheduling job" in t else None)(
                read_log(remote, rec)), 240)
            m = re.search(r"stopped at step (\d+)/100000 \(time limit\)", log)
            assert m, log
            stopped = int(m.group(1))
            log = wait_for("run 2 to resume", lambda: (lambda t: t if "resuming from" in t else None)(
                read_log(remote, rec)), 240)
            assert "run 1 on" in log  # SGE's $RESTARTED: the same job id ran again
            m2 = re.search(r"resuming from \S+last\.pt at step (\d+)", log)
            assert m2 and int(m2.group(1)) == stopped, log
            acct = remote.run(["qacct", "-j", rec.job_id])
            assert "rescheduling" in acct.stdout and re.search(r"exit_status\s+99", acct.stdout), acct.stdout
            cancel(remote, rec)
            rec = None
    finally:
        if rec is not None:
            with contextlib.suppress(Exception), site.connect(cluster) as remote:
                cancel(remote, rec)
        wipe(site, remote_dir)


# ---------------------------------------------------------------- the RAM check against the real node
@pytest.mark.parametrize("scheduler", BOTH)
def test_ram_check_refuses_16_ranks_x_8_workers_on_this_node(scheduler: str, site: Site, packed: Path,
                                                             tmp_path: Path) -> None:
    remote_dir = f"ram-{scheduler}"
    wipe(site, remote_dir)
    node_gib = (int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30) if scheduler == "sge" else  # one
                max(int(m) for m in _ok(["sinfo", "-h", "-N", "-o", "%m"]).split()) // 1024)  # node as SLURM has it
    cluster = site.cluster(remote_dir, scheduler=scheduler, gpus=0, cpus=16, mem=f"{node_gib}G", time="01:00:00")
    cfg = make_cfg(tmp_path, packed, cluster, num_workers=8)
    try:
        with site.connect(cluster) as remote:
            upload(remote, packed)
            before = queued_ids(remote, scheduler)
            with pytest.raises(ShardshipError) as e:
                submit_job(cfg, cluster, remote=remote, name="big", ranks_per_node=16)
            msg = str(e.value)
            assert "memory:" in msg and "16 ranks" in msg and "8 workers" in msg and "OOM" in msg, msg
            # nothing was written or submitted
            assert not remote.exists(posixpath.join(remote.root, "jobs"))
            # no new job id (jobs of earlier tests may still be draining out of the queue meanwhile)
            assert queued_ids(remote, scheduler) <= before
            assert not jobs_file(cfg).exists()
            # the same request with 2 ranks x 1 worker passes the check (dry run: nothing submitted)
            cfg.train["num_workers"] = 1
            cluster.cpus = 2
            ok = submit_job(cfg, cluster, remote=remote, name="big", ranks_per_node=2, dry_run=True)
            assert not [f for f in ok.plan.findings if f.level == "error"], ok.plan.findings
    finally:
        wipe(site, remote_dir)
