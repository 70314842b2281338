"""Multi-node jobs on a REAL two-node SLURM on this machine (scripts/ci/slurm_2node_up.sh:
node1 and node2 each in their own network + UTS namespace; .ci/run starts it).

What only a second node shows: `srun torchrun --nnodes 2` with a c10d rendezvous
on the first node, 2 nodes x 2 CPU ranks (gloo) of the real trainer through
`train submit`; the wall clock -> requeue -> exact resume across nodes; a node
lost mid-run (every process in its namespace SIGKILLed, its slurmd included) ends
in a requeue (SLURM's own, for a --requeue job on a failed node) and an exact
resume, not a hang; the RAM check against ONE node's
memory, not the cluster's.

Skipped, with the reason, when the two-node SLURM is not up."""
from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from shardship.errors import ShardshipError
from tests import test_schedulers as sched
from tests.test_schedulers import SLURM, Site, cancel, last_checkpoint_step, make_cfg, read_log, upload, wait_for, wipe
from train.jobs.status import query_state
from train.jobs.submit import submit_job

# the scheduler tests' fixtures (the non-root job user, its python, the demo shards), shared
python_for_jobs, site, packed = sched.python_for_jobs, sched.site, sched.packed
ROOT = Path(__file__).resolve().parents[1]
NODE_SH = ROOT / "scripts" / "ci" / "slurm_node.sh"


_REASON = sched.two_nodes_reason() if not SLURM[1].args[0] else None
pytestmark = [*SLURM, pytest.mark.skipif(_REASON is not None, reason=str(_REASON))]


def _log_has(remote, rec, pattern: str):
    """The job log once `pattern` (a regex) occurs in it, else None (for wait_for)."""
    text = read_log(remote, rec)
    return text if re.search(pattern, text) else None


def _ranks_gone(remote_dir: str, name: str) -> bool:
    return subprocess.run(["pgrep", "-f", f"{remote_dir}/outputs/{name}"], capture_output=True).returncode == 1


def _release(remote, job_id: str) -> None:
    """SLURM holds a requeued job ~2 minutes; once it is back in the queue its owner may release it.
    (Too early, in the second of the requeue, slurmd still holds the old run's revoked credential.)"""
    wait_for("the job back in the queue", lambda: query_state(remote, "slurm", job_id).state == "PENDING", 120,
             every=1)
    time.sleep(5)
    assert remote.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now"]).ok


@pytest.mark.slow
def test_two_nodes_x_two_ranks_wall_clock_requeue_and_exact_resume(site: Site, packed: Path,
                                                                     tmp_path: Path) -> None:
    remote_dir = "two-wall"
    wipe(site, remote_dir)
    # 2 minutes; the trainer stops with a checkpoint 40 s before (clamped to a third)
    cluster = site.cluster(remote_dir, scheduler="slurm", nodes=2, gpus=0, cpus=2, mem="4G", time="00:02:00")
    cfg = make_cfg(tmp_path, packed, cluster, steps=100000, checkpoint_every=5)
    rec = None
    try:
        with site.connect(cluster) as remote:
            upload(remote, packed)
            res = submit_job(cfg, cluster, remote=remote, name="wall2", ranks_per_node=2, stop_before_s=45)
            rec = res.record
            assert rec is not None
            assert "#SBATCH --nodes=2" in res.plan.script and "#SBATCH --ntasks-per-node=1" in res.plan.script
            assert "--signal=B:USR1@40" in res.plan.script  # clamped to a third of the 2-minute wall clock
            assert 'torchrun --nnodes "$SLURM_NNODES" --nproc_per_node 2' in res.plan.script
            log = wait_for("the requeue", lambda: _log_has(remote, rec, "requeueing job"), 300)
            assert "on node[1-2]" in log and "4 rank(s)" in log, log
            m = re.search(r"stopped at step (\d+)/100000 \(time limit\)", log)
            assert m and int(m.group(1)) > 0, log
            stopped = int(m.group(1))
            _release(remote, rec.job_id)
            log = wait_for("run 2 to resume", lambda: _log_has(remote, rec, r"resuming from \S+last\.pt"), 240)
            assert "restart 1 on node[1-2]" in log, log
            m2 = re.search(r"resuming from \S+last\.pt at step (\d+)", log)
            assert m2 and int(m2.group(1)) == stopped, log
            assert query_state(remote, "slurm", rec.job_id).restarts >= 1
            cancel(remote, rec)
            rec = None
    finally:
        if rec is not None:
            with contextlib.suppress(Exception), site.connect(cluster) as remote:
                cancel(remote, rec)
        wipe(site, remote_dir)


@pytest.mark.slow
def test_node_lost_mid_run_requeues_and_resumes_exactly(site: Site, packed: Path, tmp_path: Path) -> None:
    remote_dir = "two-lost"
    wipe(site, remote_dir)
    cluster = site.cluster(remote_dir, scheduler="slurm", nodes=2, gpus=0, cpus=2, mem="4G", time="00:10:00")
    cfg = make_cfg(tmp_path, packed, cluster, steps=100000, checkpoint_every=3)
    last = site.home / remote_dir / "outputs" / "lost" / "last.pt"
    rec = None
    try:
        with site.connect(cluster) as remote:
            upload(remote, packed)
            rec = submit_job(cfg, cluster, remote=remote, name="lost", ranks_per_node=2).record
            assert rec is not None
            wait_for("a first checkpoint", lambda: last.exists(), 300, every=1)
            time.sleep(3)  # a few steps past it
            kill = subprocess.run(["bash", str(NODE_SH), "kill", "2"], capture_output=True, text=True)
            assert kill.returncode == 0, kill.stderr
            t0 = time.monotonic()
            # node1's ranks see their peers go (gloo: connection reset) and exit: no hang in a collective;
            # srun waits for node2 until SLURM declares it DOWN (SlurmdTimeout), then SLURM requeues the
            # job itself (--requeue): NODE_FAIL, Restarts=1, back in the queue
            wait_for("node1's ranks to exit", lambda: _ranks_gone(remote_dir, "lost"), 120, every=1)
            st = wait_for("SLURM to requeue the job", lambda: (lambda s: s if s.restarts >= 1 and s.state in (
                "PENDING", "REQUEUED") else None)(query_state(remote, "slurm", rec.job_id)), 180, every=1)
            print(f"node lost -> job {rec.job_id} {st.state}, restarts {st.restarts} after "
                  f"{time.monotonic() - t0:.0f}s")
            log = read_log(remote, rec)
            assert "DUE TO NODE FAILURE" in log and re.search(r"Connection (reset|closed) by peer", log), log
            k = last_checkpoint_step(site, remote_dir, "lost")
            assert k > 0
            subprocess.run(["bash", str(NODE_SH), "start", "2"], check=True)
            # not released early (as the wall-clock test does): slurmctld still owes the returning
            # node the old run's kill and delivers it within a minute; SLURM's own 2-minute hold on a
            # requeued job covers that (released at once, run 2 was SIGTERMed on node2 after ~40 s)
            log = wait_for("run 2 to resume", lambda: _log_has(remote, rec, r"resuming from \S+last\.pt"), 360)
            m = re.search(r"resuming from \S+last\.pt at step (\d+)", log)
            assert m and int(m.group(1)) == k, log
            assert "restart 1 on node[1-2]" in log, log
            cancel(remote, rec)
            rec = None
    finally:
        subprocess.run(["bash", str(NODE_SH), "start", "2"])
        if rec is not None:
            with contextlib.suppress(Exception), site.connect(cluster) as remote:
                cancel(remote, rec)
        wipe(site, remote_dir)


def test_ram_check_reads_one_nodes_memory_not_the_clusters(site: Site, packed: Path, tmp_path: Path) -> None:
    """Two nodes of N GiB each are not one node of 2N: `mem` is per node."""
    remote_dir = "two-ram"
    wipe(site, remote_dir)
    node_mb = max(int(x) for x in subprocess.run(["sinfo", "-h", "-N", "-o", "%m"], capture_output=True,
                                                 text=True).stdout.split())
    over = f"{node_mb * 3 // 2}M"  # more than one node, less than both together
    cluster = site.cluster(remote_dir, scheduler="slurm", nodes=2, gpus=0, cpus=2, mem=over, time="01:00:00")
    cfg = make_cfg(tmp_path, packed, cluster, num_workers=1)
    try:
        with site.connect(cluster) as remote:
            upload(remote, packed)
            with pytest.raises(ShardshipError) as e:
                submit_job(cfg, cluster, remote=remote, name="ram2", ranks_per_node=2, probe=False)
            msg = str(e.value)
            assert f"mem = {over} per node, but the biggest node has" in msg and "(sinfo)" in msg, msg
            cluster.mem = f"{node_mb // 2}M"
            ok = submit_job(cfg, cluster, remote=remote, name="ram2", ranks_per_node=2, dry_run=True, probe=False)
            assert not [f for f in ok.plan.findings if f.level == "error"], ok.plan.findings
    finally:
        wipe(site, remote_dir)


def _bare_python(where: Path) -> str:
    """A python whose site-packages lack shardship: a venv without pip that sees the test venv's
    site-packages (torch, numpy, ...) through a plain path line. A path line in a .pth file is
    not itself scanned for .pth files, so the editable install's finder is never loaded."""
    import sys
    import sysconfig

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    purelib = Path(subprocess.run([str(where / "bin" / "python"), "-c", "import sysconfig; "
                                   "print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True,
                                  check=True).stdout.strip())
    (purelib / "cluster_torch.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return str(where / "bin" / "python")


def test_job_without_shardship_installed_runs_from_the_shipped_code(site: Site, packed: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    from train.jobs.ship import build_archive, ship

    remote_dir = "shipped"
    wipe(site, remote_dir)
    # nothing of this test run's own PYTHONPATH may reach the job (runuser and sbatch pass the environment on)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    venv = Path(tempfile.mkdtemp(prefix="shardship-bare-"))
    venv.chmod(0o755)
    try:
        bare = _bare_python(venv / "venv")
        # as the job user: torch imports, shardship does not
        probe = subprocess.run(["runuser", "-u", site.user, "--", bare, "-c", "import torch, packer"],
                               capture_output=True, text=True, cwd="/")
        assert probe.returncode != 0 and "No module named 'packer'" in probe.stderr, probe.stderr
        assert subprocess.run(["runuser", "-u", site.user, "--", bare, "-c", "import torch, numpy, diffusers"],
                              cwd="/").returncode == 0
        cluster = site.cluster(remote_dir, scheduler="slurm", gpus=0, cpus=1, mem="3G", time="00:10:00",
                               python=bare, setup=[])
        cfg = make_cfg(tmp_path, packed, cluster, steps=2, num_workers=0)
        with site.connect(cluster) as remote:
            upload(remote, packed)
            res = submit_job(cfg, cluster, remote=remote, name="bare", ranks_per_node=1)
            rec = res.record
            assert rec is not None and res.plan.code is not None
            code_dir = res.plan.code.remote_dir(remote.root)
            assert f"export PYTHONPATH={code_dir}" in res.plan.script
            st = sched.finished(remote, rec, "the job to finish", 240)
            log = read_log(remote, rec)
            assert st.state == "COMPLETED" and "done: step 2/2" in log, f"{st}\n{log}"
            assert remote.exists(f"{code_dir}/train/jobs/ship.py")
            # unchanged code is not uploaded again
            assert build_archive().name == res.plan.code.name
            assert ship(remote, res.plan.code, remote.root) is False
    finally:
        shutil.rmtree(venv, ignore_errors=True)
        wipe(site, remote_dir)


def test_doctor_on_the_login_node(site: Site) -> None:
    """`train doctor` as the job user over the real connection: python and torch through the
    setup lines, the CUDA answer a login node can give, SLURM's commands, quota and space."""
    from train.jobs.doctor import run_doctor

    cluster = site.cluster("doctor", scheduler="slurm")
    with site.connect(cluster) as remote:
        remote.mkdir("")
        checks = {c.what: c for c in run_doctor(remote, cluster, 2**20, 4)}
        # the job user's home is a 64 MiB tmpfs: four 100 MiB checkpoints do not fit, and doctor says so
        [big] = [c for c in run_doctor(remote, cluster, 100 * 2**20, 4) if c.what == "space"]
    text = "\n".join(map(str, checks.values()))
    assert checks["python"].level == "ok" and checks["torch"].level == "ok", text
    assert "CPU-only build" in checks["cuda"].detail or "cannot be checked from here" in checks["cuda"].detail, text
    assert checks["slurm"].level == "ok" and "sbatch" in checks["slurm"].detail, text
    assert checks["space"].level == "ok" and "checkpoints need" in checks["space"].detail, text
    assert not [c for c in checks.values() if c.level == "fail"], text
    assert big.level == "fail" and "the run keeps 4 checkpoints = 400.0 MB" in big.detail, big


def test_two_partitions_first_to_start_wins_and_is_followed(site: Site, packed: Path, tmp_path: Path) -> None:
    """`train submit --partitions debug,short`: one copy per partition; the first to start cancels
    the other (or the other steps aside if it started too); status, logs and fetch follow the winner."""
    from train.jobs.fetch import fetch_results
    from train.jobs.logs import follow_log
    from train.jobs.race import winner
    from train.jobs.status import job_status

    remote_dir = "race"
    wipe(site, remote_dir)
    cluster = site.cluster(remote_dir, scheduler="slurm", gpus=0, cpus=1, mem="2G", time="00:10:00")
    cfg = make_cfg(tmp_path, packed, cluster, steps=2, num_workers=0)
    try:
        with site.connect(cluster) as remote:
            upload(remote, packed)
            res = submit_job(cfg, cluster, remote=remote, name="race", ranks_per_node=1, partitions=("debug", "short"))
            assert [c.partition for c in res.copies] == ["debug", "short"], res.copies
            assert len({c.group for c in res.copies}) == 1 and "steps aside" in res.plan.script
            states = {c.job_id: sched.finished(remote, c, f"copy {c.job_id} to end", 240) for c in res.copies}
            won = winner(remote, res.record.out_dir)
            assert won in states, (won, states)
            [loser] = [c for c in res.copies if c.job_id != won]
            [champ] = [c for c in res.copies if c.job_id == won]
            log = read_log(remote, champ)
            assert states[won].state == "COMPLETED" and "done: step 2/2" in log, log
            assert f"started first, in partition {champ.partition}" in log, log
            lost_log = read_log(remote, loser)
            assert states[loser.job_id].state == "CANCELLED" or "steps aside" in lost_log, (states, lost_log)
            rows = {rec.job_id: (st, prog) for rec, st, prog in job_status(cfg, cluster, remote=remote)}
            assert "won the race" in rows[won][0].detail and rows[won][1].step == 2, rows
            assert f"lost to {won}" in rows[loser.job_id][0].detail and rows[loser.job_id][1] is None, rows
            text = "".join(follow_log(cfg, cluster, res.copies[-1], remote=remote))
            assert "started first" in text, text
            _, outcomes = fetch_results(cfg, cluster, remote=remote, name="race")
        assert Path(champ.log).name in {o.local_path.name for o in outcomes}
    finally:
        wipe(site, remote_dir)


def test_where_lists_each_partition_with_slurms_own_estimate(site: Site) -> None:
    from train.jobs import build_spec
    from train.jobs.where import soonest, where

    cluster = site.cluster("where", scheduler="slurm", nodes=2, gpus=0, cpus=2, mem="2G", time="00:10:00")
    with site.connect(cluster) as remote:
        pools, _ = where(remote, "slurm", build_spec(cluster, {}, remote.root, "test"))
    by = {p.partition: p for p in pools}
    assert set(by) == {"debug", "short"} and (by["debug"].nodes, by["short"].nodes) == (2, 1), pools
    assert re.match(r"\d{4}-\d\d-\d\dT\S+ on node\[1-2\]", by["debug"].start), by["debug"]
    assert by["short"].start.startswith("cannot run here"), by["short"]  # 2 nodes asked, 1 in the partition
    best = soonest(pools)
    assert best is not None and best.partition == "debug"


DDP_SCRIPT = '''import os, socket, torch, torch.distributed as dist
dist.init_process_group("gloo")
r, w = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(r + 1)])
dist.all_reduce(t)
assert t.item() == w * (w + 1) / 2, t
with open(os.path.join(os.environ["SHARDSHIP_OUT"], f"rank{r}.done"), "w") as f:
    f.write(socket.gethostname())
print(f"plain ddp: rank {r}/{w} on {socket.gethostname()} sum {t.item():.0f}", flush=True)
dist.destroy_process_group()
'''


def test_someone_elses_ddp_script_runs_on_both_nodes(site: Site, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """`train submit --command "python ddp_plain.py"`: not shardship's trainer, the same launch
    (srun, one torchrun per node, c10d on node1) and checks; all 4 ranks finish."""
    from train.jobs.logs import follow_log

    remote_dir = "foreign"
    wipe(site, remote_dir)
    (tmp_path / "ddp_plain.py").write_text(DDP_SCRIPT)
    monkeypatch.chdir(tmp_path)  # the local copy the checks read
    cluster = site.cluster(remote_dir, scheduler="slurm", nodes=2, gpus=0, cpus=2, mem="3G", time="00:10:00")
    cfg = make_cfg(tmp_path, tmp_path, cluster, num_workers=0)
    try:
        with site.connect(cluster) as remote:
            remote.mkdir("")
            remote.write_file("ddp_plain.py", DDP_SCRIPT.encode())
            res = submit_job(cfg, cluster, remote=remote, name="plain", ranks_per_node=2,
                             command="python ddp_plain.py")
            rec = res.record
            assert rec is not None and not res.plan.findings, res.plan.findings
            assert "torchrun --nnodes \"$SLURM_NNODES\" --nproc_per_node 2" in res.plan.script
            assert "ddp_plain.py &" in res.plan.script and "train run" not in res.plan.script
            # `train logs --follow`: streams the log until the job leaves the queue
            followed = "".join(follow_log(cfg, cluster, rec, remote=remote, follow=True, poll_s=2))
            st = sched.finished(remote, rec, "the plain DDP job to finish", 240)
            log = read_log(remote, rec)
            assert st.state == "COMPLETED", f"{st}\n{log}"
            assert followed.count("plain ddp: rank") == 4 and "training exited with status 0" in followed, followed
            ranks = re.findall(r"plain ddp: rank (\d)/4 on (node\d) sum 10", log)
            assert sorted(r for r, _ in ranks) == ["0", "1", "2", "3"], log
            assert {n for _, n in ranks} == {"node1", "node2"}, log
        assert len(list((site.home / remote_dir / "outputs" / "plain").glob("rank*.done"))) == 4
    finally:
        wipe(site, remote_dir)
