"""Other people's training on the REAL two-node SLURM of CI (scripts/ci/slurm_2node_up.sh):
a PyTorch Lightning script (examples/lightning_train.py, Hydra-style overrides) through
`train submit --command ... --launcher lightning`, 2 nodes x 2 CPU ranks (gloo), a wall-clock
requeue that resumes from Lightning's own last.ckpt; the three ways hand-written Lightning
jobs failed for the people this serves, each run for real from a hand-written sbatch script
(and each refused by `train submit` before submission); the ICON case, a plain one-process
script that picks its device with torch.cuda.is_available(), on a GPU (GRES) partition.

The cluster's GPUs are GRES on null devices: `--gres=gpu:N` is scheduled as on a GPU cluster,
the job runs on CPU. Skipped, with the reason, when the two-node SLURM is not up."""
from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path

import pytest

from shardship.errors import ShardshipError
from tests import test_schedulers as sched
from tests.test_schedulers import PY, SLURM, Site, cancel, make_cfg, read_log, wait_for, wipe
from tests.test_slurm_2node import _release
from train.jobs.status import query_state
from train.jobs.submit import submit_job

python_for_jobs, site = sched.python_for_jobs, sched.site
ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "lightning_train.py"

_REASON = sched.two_nodes_reason() if not SLURM[1].args[0] else None
pytestmark = [*SLURM, pytest.mark.skipif(_REASON is not None, reason=str(_REASON))]


def _staged(site: Site, remote_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **files: str):
    """The example (and `files`) on the 'cluster' and in the local folder the checks read."""
    wipe(site, remote_dir)
    monkeypatch.chdir(tmp_path)
    files = {"lightning_train.py": EXAMPLE.read_text(), **files}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return files


def _put(remote, files: dict[str, str]) -> None:
    remote.mkdir("")
    for name, text in files.items():
        remote.write_file(name, text.encode())


def _requeued_or_ended(remote, rec, seen: int) -> str | None:
    """"requeued" once the log holds more than `seen` requeues, the final state once the job ended."""
    if read_log(remote, rec).count("requeueing job") > seen:
        return "requeued"
    state = query_state(remote, "slurm", rec.job_id).state
    return state if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL") else None


# ---------------------------------------------------------------- the NAVSIM-style job, end to end
@pytest.mark.slow
def test_lightning_2x2_trains_requeues_at_the_wall_clock_and_resumes_from_last_ckpt(
        site: Site, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from train.jobs.fetch import fetch_results
    from train.jobs.logs import follow_log
    from train.jobs.status import job_status

    remote_dir = "lightning"
    files = _staged(site, remote_dir, tmp_path, monkeypatch)
    # 2 minutes: the script saves last.ckpt and stops at 95 s (SHARDSHIP_TIME_LIMIT), the job requeues.
    # 2 epochs x 50 steps x 1 s of "compute" > 95 s: run 1 cannot finish; run 2 finishes what is left
    # unless the two start-ups (4 ranks importing Lightning) take more than ~90 s together: then it
    # stops at 95 s again and the loop below releases one more requeue.
    cluster = site.cluster(remote_dir, scheduler="slurm", nodes=2, gpus=0, cpus=2, mem="3G", time="00:02:00")
    cfg = make_cfg(tmp_path, tmp_path, cluster, num_workers=0)
    command = ("python lightning_train.py trainer.max_epochs=2 data.batch_size=8 data.size=1600 "
               "model.step_seconds=1.0")
    rec = None
    try:
        with site.connect(cluster) as remote:
            _put(remote, files)
            res = submit_job(cfg, cluster, remote=remote, name="lit", ranks_per_node=2, stop_before_s=25,
                             command=command, launcher="lightning")
            rec = res.record
            assert rec is not None and not res.plan.findings, res.plan.findings
            script = res.plan.script
            assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\n#SBATCH --cpus-per-task=1\n" in script, script
            assert re.search(r"srun --kill-on-bad-exit=1 .*python\S* \\\n    lightning_train.py trainer.max_epochs=2 "
                             r"data.batch_size=8 ", script), script
            assert "torchrun" not in script and "SHARDSHIP_TIME_LIMIT=95" in script
            # each run stops at 95 s with last.ckpt and is requeued; on a loaded machine (slow start-up) run 2
            # may stop again: release every requeue (SLURM would hold it 2 minutes) until the job completes
            requeues = 0
            while True:
                what = wait_for("a requeue or the end",
                                lambda seen=requeues: _requeued_or_ended(remote, rec, seen), 300)
                if what != "requeued":
                    break
                requeues += 1
                assert requeues <= 4, read_log(remote, rec)
                _release(remote, rec.job_id)
            st = query_state(remote, "slurm", rec.job_id)
            log = read_log(remote, rec)
            assert st.state == "COMPLETED" and st.restarts >= 1 and requeues >= 1, f"{st}\n{log}"
            runs = re.split(r"shardship: job \d+ \(lit\) restart \d+ on ", log)[1:]
            assert len(runs) == requeues + 1, log
            m = re.search(r"time limit: saved last.ckpt at global step (\d+)", runs[0])
            assert m and int(m.group(1)) > 0, runs[0]
            stopped = int(m.group(1))
            assert re.search(r"Restored all states from the checkpoint at \S+/last\.ckpt", runs[1]), runs[1]
            starts = re.findall(r"lightning: rank (\d)/4 on (node\d) .* world size 4, starting at global step (\d+)",
                                runs[1])
            assert sorted(r for r, _, _ in starts) == ["0", "1", "2", "3"], runs[1]
            assert {n for _, n, _ in starts} == {"node1", "node2"}, runs[1]
            assert {int(s) for _, _, s in starts} == {stopped}, runs[1]  # Lightning's own step, not 0
            done = re.findall(r"lightning: rank (\d)/4 done at global step 100 epoch 2", runs[-1])
            assert sorted(done) == ["0", "1", "2", "3"], runs[-1]
            print(f"lightning 2x2: {requeues} requeue(s), run 1 stopped at global step {stopped}")
            # train status / logs / fetch on it
            [(srec, sst, _)] = [row for row in job_status(cfg, cluster, remote=remote) if row[0].job_id == rec.job_id]
            assert sst.state == "COMPLETED" and sst.restarts >= 1, sst
            shown = "".join(follow_log(cfg, cluster, rec, remote=remote, lines=20))
            assert "rank 0/4 done at global step 100" in shown or "training exited with status 0" in shown, shown
            dest, outcomes = fetch_results(cfg, cluster, remote=remote, name="lit", dest=tmp_path / "fetched")
            rec = None
        # metrics.csv too, unless the last run had no step left to log (a run that ended right at its time
        # limit is requeued once more; Lightning's CSVLogger then starts an empty file)
        got = {o.local_path.name for o in outcomes}
        assert {"last.ckpt", Path(srec.log).name} <= got, got
        import torch

        ck = torch.load(dest / "last.ckpt", map_location="cpu", weights_only=False)
        # ModelCheckpoint saves last.ckpt every 5 steps: 100 is the final step
        assert ck["global_step"] == 100 and ck["epoch"] >= 1, {k: ck[k] for k in ("global_step", "epoch")}
    finally:
        if rec is not None:
            with contextlib.suppress(Exception), site.connect(cluster) as remote:
                cancel(remote, rec)
        wipe(site, remote_dir)


# ---------------------------------------------------------------- the three classic failures
RAW = """#!/bin/bash
#SBATCH --job-name=raw-{mode}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=2
#SBATCH --mem=3G
#SBATCH --time=00:05:00
#SBATCH --output={root}/raw-%j.out
{extra}
export PATH={pydir}:$PATH PYTHONPATH={repo} SHARDSHIP_OUT={root}/out-{mode}
cd {root}
{launch}
"""


def _raw_job(remote, site: Site, remote_dir: str, mode: str, launch: str, extra: str = "",
             nodes: int = 2) -> tuple[str, str]:
    """A hand-written sbatch script, submitted as the job user with sbatch itself: (job id, log path)."""
    root = str(site.home / remote_dir)
    text = RAW.format(mode=mode, root=root, extra=extra, pydir=Path(PY).parent, repo=ROOT, launch=launch,
                      nodes=nodes)
    remote.write_file(f"raw-{mode}.sh", text.encode())
    res = remote.run(["sbatch", "--parsable", f"{root}/raw-{mode}.sh"], cwd=root, timeout=60)
    assert res.ok, res.stderr
    job = res.stdout.strip().split(";")[0]
    return job, f"{root}/raw-{job}.out"


def _read(remote, path: str) -> str:
    return remote.read_file(path).decode("utf-8", "replace") if remote.exists(path) else ""


def _ended(remote, job: str, timeout: float):
    return wait_for(f"raw job {job} to end", lambda: (lambda s: s if s.state not in (
        "PENDING", "RUNNING", "CONFIGURING", "COMPLETING") else None)(query_state(remote, "slurm", job)), timeout)


def _refused(cfg, cluster, remote, command: str, **kw) -> str:
    with pytest.raises(ShardshipError) as e:
        submit_job(cfg, cluster, remote=remote, name="wrong", command=command, launcher="lightning", **kw)
    msg = str(e.value)
    assert "\n" not in msg, msg  # one line
    return msg


@pytest.mark.slow
def test_devices_1_on_one_task_per_gpu_is_refused_and_fails_when_run_by_hand(
        site: Site, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--ntasks-per-node = GPUs (2), Trainer(devices=1): Lightning 2.6 stops every rank at start
    (older Lightning hung at "MEMBER: 1/N"); `train submit` says which override to change."""
    remote_dir = "wrong-devices"
    files = _staged(site, remote_dir, tmp_path, monkeypatch)
    cluster = site.cluster(remote_dir, scheduler="slurm", nodes=2, gpus=2, cpus=2, mem="7G", time="00:10:00")
    cfg = make_cfg(tmp_path, tmp_path, cluster, num_workers=0)
    job = ""
    try:
        with site.connect(cluster) as remote:
            _put(remote, files)
            msg = _refused(cfg, cluster, remote, "python lightning_train.py trainer.devices=1 trainer.max_epochs=1")
            assert "the command sets trainer.devices=1 but the job runs 2 node(s) x 2 rank(s)" in msg, msg
            assert "set trainer.devices=2" in msg and not remote.exists("jobs/wrong.slurm.sh"), msg
            job, log_path = _raw_job(remote, site, remote_dir, "devices", extra="#SBATCH --gres=gpu:2",
                                     launch="srun python lightning_train.py trainer.devices=1 trainer.max_epochs=1")
            st = _ended(remote, job, 240)
            log = _read(remote, log_path)
            assert st.state == "FAILED", f"{st}\n{log}"
            assert "You set `devices=1` in Lightning, but the number of tasks per node configured in SLURM " \
                   "`--ntasks-per-node=2` does not match" in log, log
            assert "done at global step" not in log, log
            job = ""
    finally:
        if job:
            with contextlib.suppress(Exception), site.connect(cluster) as remote:
                remote.run(["scancel", job])
        wipe(site, remote_dir)


WRAPPER = "#!/bin/bash\n# NAVSIM style: the training wrapper runs python itself\n" \
          "python lightning_train.py trainer.max_epochs=1 data.batch_size=8\n"


@pytest.mark.slow
def test_python_without_srun_is_refused_and_hangs_at_member_1_of_4_when_run_by_hand(
        site: Site, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrapper that runs `python` without srun in a 2 x 2 allocation: only rank 0 starts and waits
    for 3 ranks that never come. Shown hanging (still RUNNING, 'MEMBER: 1/4', no 2/4), then cancelled."""
    remote_dir = "wrong-srun"
    files = _staged(site, remote_dir, tmp_path, monkeypatch, **{"run_training.sh": WRAPPER})
    cluster = site.cluster(remote_dir, scheduler="slurm", nodes=2, gpus=0, cpus=2, mem="3G", time="00:10:00")
    cfg = make_cfg(tmp_path, tmp_path, cluster, num_workers=0)
    job = ""
    try:
        with site.connect(cluster) as remote:
            _put(remote, files)
            msg = _refused(cfg, cluster, remote, "bash run_training.sh", ranks_per_node=2)
            assert "run_training.sh starts python itself (line 3:" in msg and "without srun" in msg, msg
            assert "give that python line as --command" in msg, msg
            job, log_path = _raw_job(remote, site, remote_dir, "srun", launch="bash run_training.sh")
            log = wait_for("rank 0 to wait for its peers",
                           lambda: (lambda t: t if "MEMBER: 1/4" in t else None)(_read(remote, log_path)), 180)
            time.sleep(20)  # a run that works has all 4 ranks in by now; this one never will
            log = _read(remote, log_path)
            assert query_state(remote, "slurm", job).state == "RUNNING", log
            assert "MEMBER: 1/4" in log and not re.search(r"MEMBER: [234]/4", log), log
            assert "starting at global step" not in log, log
    finally:
        if job:
            with contextlib.suppress(Exception), site.connect(cluster) as remote:
                remote.run(["scancel", job])
                wait_for(f"job {job} to leave the queue",
                         lambda: job not in sched.queued_ids(remote, "slurm"), 120)
        wipe(site, remote_dir)


def _node_cgroups(user: str, tag: str, limit: str) -> list[Path]:
    """The node's memory as SLURM's task/cgroup would enforce `--mem` (this CI cluster runs
    task/none): one memory cgroup per node, which the job user's tasks join themselves."""
    base = Path("/sys/fs/cgroup/memory")
    if not (base / "cgroup.procs").exists():
        pytest.skip("no cgroup v1 memory controller here to stand for the node's memory")
    import pwd

    pw = pwd.getpwnam(user)
    out = []
    for n in (0, 1):
        cg = base / f"{tag}{n}"
        cg.mkdir(exist_ok=True)
        (cg / "memory.limit_in_bytes").write_text(limit)
        for f in ("cgroup.procs", "tasks"):
            os.chown(cg / f, pw.pw_uid, pw.pw_gid)
        out.append(cg)
    return out


@pytest.mark.slow
def test_num_workers_past_the_nodes_memory_is_refused_and_oom_killed_when_run_by_hand(
        site: Site, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """2 ranks x 4 workers x 400 MiB on a node of 3G: `train submit` refuses with the num_workers
    that fits; run by hand (on one node of the two: the memory is per node), the kernel OOM-kills
    inside the node's memory and the job fails."""
    remote_dir = "wrong-workers"
    files = _staged(site, remote_dir, tmp_path, monkeypatch)
    cluster = site.cluster(remote_dir, scheduler="slurm", nodes=2, gpus=0, cpus=2, mem="3G", time="00:10:00")
    cfg = make_cfg(tmp_path, tmp_path, cluster, num_workers=0)
    args = "trainer.max_epochs=1 data.num_workers=4 data.worker_buffer_mb=400"
    tag = f"shardship-oom-{os.getpid()}-node"
    job, cgroups = "", []
    try:
        with site.connect(cluster) as remote:
            _put(remote, files)
            msg = _refused(cfg, cluster, remote, f"python lightning_train.py {args}", ranks_per_node=2)
            assert "memory: 2 ranks x (1.0 GB + 4 workers x 1.0 GB per worker" in msg, msg
            assert "the job would be OOM-killed; set data.num_workers=0 on the command" in msg, msg
            cgroups = _node_cgroups(site.user, tag, "3G")
            join = f"echo $$ > /sys/fs/cgroup/memory/{tag}$SLURM_NODEID/cgroup.procs && exec python"
            # one node is enough to show it (the memory is per node), and starts twice as fast
            job, log_path = _raw_job(remote, site, remote_dir, "workers", nodes=1,
                                     launch=f"srun bash -c '{join} lightning_train.py {args}'")
            t0 = time.monotonic()
            st = _ended(remote, job, 240)
            log = _read(remote, log_path)
            kills = sum(int(re.search(r"oom_kill (\d+)", (cg / "memory.oom_control").read_text()).group(1))
                        for cg in cgroups)
            print(f"raw job {job}: {st.state} after {time.monotonic() - t0:.0f}s, {kills} OOM kill(s) in the node's "
                  "memory")
            assert st.state == "FAILED" and kills >= 1, f"{st} kills={kills}\n{log}"
            assert re.search(r"killed by signal: Killed|exited unexpectedly|Killed", log), log
            assert "done at global step" not in log, log
            job = ""
    finally:
        if job:
            with contextlib.suppress(Exception), site.connect(cluster) as remote:
                remote.run(["scancel", job])
                wait_for(f"job {job} to leave the queue", lambda: job not in sched.queued_ids(remote, "slurm"), 120)
        for cg in cgroups:
            with contextlib.suppress(OSError):
                wait_for(f"{cg} to empty", lambda cg=cg: not (cg / "cgroup.procs").read_text().strip(), 60, every=1)
                cg.rmdir()
        wipe(site, remote_dir)


# ---------------------------------------------------------------- the ICON case
ICON = '''import os, socket, torch
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = torch.nn.Linear(4, 1).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(1, 21):
    x = torch.randn(32, 4, device=device)
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"icon: {step} steps on {device} ({socket.gethostname()}), "
      f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}, loss {loss.item():.4f}", flush=True)
torch.save({"step": step, "model": model.state_dict()}, os.path.join(os.environ["SHARDSHIP_OUT"], "last.pt"))
'''


def test_icon_plain_script_on_a_gpu_partition_renders_gres_and_runs(site: Site, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """One process that picks its device itself: `--gres=gpu:1` on the GPU partition, plain
    `python`, no launcher; runs on CPU here, with status / logs / fetch as for any job."""
    from train.jobs.fetch import fetch_results
    from train.jobs.logs import follow_log
    from train.jobs.status import job_status

    remote_dir = "icon"
    files = _staged(site, remote_dir, tmp_path, monkeypatch, **{"icon_train.py": ICON})
    del files["lightning_train.py"]
    cluster = site.cluster(remote_dir, scheduler="slurm", partition="debug", gpus=1, cpus=1, mem="4G",
                           time="00:10:00")
    cfg = make_cfg(tmp_path, tmp_path, cluster, num_workers=0)
    try:
        with site.connect(cluster) as remote:
            _put(remote, files)
            res = submit_job(cfg, cluster, remote=remote, name="icon", command="python icon_train.py")
            rec = res.record
            assert rec is not None and not [f for f in res.plan.findings if f.level == "error"], res.plan.findings
            script = res.plan.script
            for want in ("#SBATCH --partition=debug", "#SBATCH --ntasks=1", "#SBATCH --gres=gpu:1"):
                assert want in script, script
            assert re.search(r"^\S*python\S* icon_train.py &$", script, re.M) and "srun" not in script.split(
                "set +e")[1] and "torchrun" not in script, script
            st = sched.finished(remote, rec, "the ICON job to finish", 180)
            log = read_log(remote, rec)
            assert st.state == "COMPLETED", f"{st}\n{log}"
            assert re.search(r"icon: 20 steps on cpu \(node\d\), CUDA_VISIBLE_DEVICES=0, loss", log), log
            rows = [row for row in job_status(cfg, cluster, remote=remote) if row[0].job_id == rec.job_id]
            assert rows and rows[0][1].state == "COMPLETED", rows
            assert "icon: 20 steps" in "".join(follow_log(cfg, cluster, rec, remote=remote))
            dest, outcomes = fetch_results(cfg, cluster, remote=remote, name="icon", dest=tmp_path / "fetched")
        assert {"last.pt", Path(rec.log).name} <= {o.local_path.name for o in outcomes}
        import torch

        assert torch.load(dest / "last.pt", map_location="cpu")["step"] == 20
    finally:
        wipe(site, remote_dir)
