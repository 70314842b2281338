"""Job scripts rendered from config: golden files for the four layouts the issue
names, plus the properties each golden must keep (so a regenerated golden that
reintroduces an old failure still fails here).

Regenerate goldens after an intended change: SHARDSHIP_UPDATE_GOLDEN=1 pytest tests/test_jobs_render.py
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from shardship.config import ClusterConfig
from shardship.errors import ShardshipError
from train.jobs import build_spec, render
from train.jobs.spec import format_walltime, job_name, parse_walltime

GOLDEN = Path(__file__).parent / "golden"
SOURCE = "shardship.toml [cluster.{name}] + [train]"

SCC_SETUP = ["module load python3/3.10.12", "source /projectnb/mylab/venvs/shardship/bin/activate"]
SLURM_SETUP = ["module load cuda/12.1", "source $HOME/venvs/shardship/bin/activate"]

CASES = {
    # the reference scc_train.sh case: BU SCC, 1 GPU, 4 cores
    "sge_1gpu": (ClusterConfig(name="scc", host="scc1.bu.edu", scheduler="sge", gpus=1, cpus=4, mem="32G",
                               time="12:00:00", gpu_c="7.0", project="mylab", setup=SCC_SETUP),
                 {"num_workers": 3}, "/projectnb/mylab/shardship"),
    "sge_4gpu": (ClusterConfig(name="scc", host="scc1.bu.edu", scheduler="sge", gpus=4, cpus=16, mem="128G",
                               time="24:00:00", gpu_c="8.0", gpu_memory="48G", project="mylab", setup=SCC_SETUP,
                               mem_resource="mem_per_core", mem_per="slot"),
                 {"num_workers": 3, "batch_size": 64}, "/projectnb/mylab/shardship"),
    "slurm_1x4": (ClusterConfig(name="hpc", host="login.hpc.example.edu", scheduler="slurm", gpus=4, cpus=32,
                                mem="128G", time="12:00:00", partition="gpu", account="mylab", constraint="a100",
                                setup=SLURM_SETUP),
                  {"num_workers": 6}, "/home/student/shardship"),
    "slurm_4x4": (ClusterConfig(name="hpc", host="login.hpc.example.edu", scheduler="slurm", nodes=4, gpus=4,
                                cpus=32, mem="256G", time="2-00:00:00", partition="gpu", account="mylab",
                                gres="gpu:a100:4", setup=SLURM_SETUP),
                  {"num_workers": 6}, "/scratch/student/shardship"),
}


def _render(case: str) -> str:
    cluster, train, root = CASES[case]
    return render(build_spec(cluster, train, root, SOURCE.format(name=cluster.name)))


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_golden(case: str) -> None:
    text = _render(case)
    path = GOLDEN / f"{case}.sh"
    if os.environ.get("SHARDSHIP_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"missing golden {path}: run with SHARDSHIP_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{case}: rendered script differs from {path}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_deterministic_and_valid_bash(case: str) -> None:
    a, b = _render(case), _render(case)
    assert a == b
    assert shutil.which("bash")
    res = subprocess.run(["bash", "-n"], input=a, text=True, capture_output=True)
    assert res.returncode == 0, res.stderr
    # the header says what it came from and what it will do
    assert "Generated from shardship.toml [cluster." in a
    assert re.search(r"^# run:\s+\d+ nodes? x .*process", a, re.M)


def _directives(text: str, prefix: str) -> list[str]:
    return [ln[len(prefix):].strip() for ln in text.splitlines() if ln.startswith(prefix)]


@pytest.mark.parametrize("case", ["sge_1gpu", "sge_4gpu"])
def test_sge_rules(case: str) -> None:
    text = _render(case)
    d = _directives(text, "#$ ")
    assert "-j y" in d
    assert "-S /bin/bash" in d
    (o,) = [x for x in d if x.startswith("-o ")]
    path = o.split(" ", 1)[1]
    # absolute, no ~ or $VARS (SGE expands neither reliably), a directory created before submission
    assert path.startswith("/") and "~" not in path and "$" not in path and path.endswith("/")
    # never set CUDA_VISIBLE_DEVICES by hand under SGE
    assert not re.search(r"(export\s+)?CUDA_VISIBLE_DEVICES\s*=", text)
    # a job resubmits itself by exiting 99 after a clean stop for the time limit
    assert "exit 99" in text and "--time-limit" in text


def test_sge_1gpu_is_the_scc_case() -> None:
    d = _directives(_render("sge_1gpu"), "#$ ")
    for want in ("-pe omp 4", "-l gpus=1", "-l gpu_c=7.0", "-l h_rt=12:00:00", "-P mylab", "-N shardship"):
        assert want in d, want
    text = _render("sge_1gpu")
    assert "torchrun" not in text
    assert re.search(r"^python3 -m train run --data /projectnb/mylab/shardship ", text, re.M)
    # setup lines come from the config, in order, before the training command
    assert text.index(SCC_SETUP[0]) < text.index(SCC_SETUP[1]) < text.index("-m train run")


def test_sge_4gpu_uses_torchrun_standalone() -> None:
    text = _render("sge_4gpu")
    d = _directives(text, "#$ ")
    assert "-l gpus=4" in d and "-pe omp 16" in d and "-l gpu_memory=48G" in d
    assert "torchrun --standalone --nnodes 1 --nproc_per_node 4" in text
    assert "srun" not in text


def test_slurm_single_node_one_task_and_torchrun() -> None:
    text = _render("slurm_1x4")
    d = _directives(text, "#SBATCH ")
    assert "--nodes=1" in d and "--ntasks=1" in d  # one launcher; --ntasks=4 is the DDP hang
    assert not any(x.startswith("--ntasks=4") or x.startswith("--ntasks-per-node") for x in d)
    assert "--gres=gpu:4" in d and "--cpus-per-task=32" in d and "--mem=128G" in d and "--constraint=a100" in d
    assert any(x.startswith("--signal=B:USR1@") for x in d) and "--requeue" in d
    assert "torchrun --standalone --nnodes 1 --nproc_per_node 4" in text
    assert "srun" not in text
    assert 'scontrol requeue "$SLURM_JOB_ID"' in text


def test_slurm_multi_node_srun_torchrun_c10d() -> None:
    text = _render("slurm_4x4")
    d = _directives(text, "#SBATCH ")
    assert "--nodes=4" in d and "--ntasks-per-node=1" in d
    assert "--gres=gpu:a100:4" in d and "--time=48:00:00" in d
    assert any(x.startswith("--signal=B:USR1@") for x in d)
    assert 'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in text
    launch = text[text.index("srun "):text.index(" &\n", text.index("srun "))]
    assert "torchrun" in launch and "--rdzv_backend c10d" in launch and '--rdzv_endpoint "$head:29500"' in launch
    assert '--nnodes "$SLURM_NNODES"' in launch and "--nproc_per_node 4" in launch
    assert "--standalone" not in launch
    # srun in SLURM 22.05 does not inherit --cpus-per-task from sbatch
    assert '--cpus-per-task "$SLURM_CPUS_PER_TASK"' in launch


def test_cpu_job_runs_n_processes_and_no_gpu_directives() -> None:
    c = ClusterConfig(name="ci", host="local:/tmp/x", scheduler="sge", gpus=0, cpus=2, mem="4G", time="00:10:00")
    text = render(build_spec(c, {"num_workers": 1}, "/tmp/x/shardship", "test", ranks_per_node=2))
    assert "gpus=" not in text and "gpu_c" not in text
    assert "--nproc_per_node 2" in text


def test_refusals() -> None:
    base = dict(name="c", host="h", gpus=4, cpus=16, time="01:00:00")
    with pytest.raises(ShardshipError, match="multi-node"):
        build_spec(ClusterConfig(scheduler="sge", nodes=2, **base), {}, "/r", "t")
    with pytest.raises(ShardshipError, match="scheduler"):
        build_spec(ClusterConfig(scheduler="pbs", **base), {}, "/r", "t")
    with pytest.raises(ShardshipError, match="one process per GPU"):
        build_spec(ClusterConfig(scheduler="slurm", **base), {}, "/r", "t", ranks_per_node=2)
    with pytest.raises(ShardshipError, match="absolute"):
        build_spec(ClusterConfig(scheduler="slurm", **base), {}, "shardship", "t")
    with pytest.raises(ShardshipError, match="directive"):
        render(build_spec(ClusterConfig(scheduler="sge", project="my lab", **base), {}, "/r", "t"))
    with pytest.raises(ShardshipError, match="wall clock"):
        build_spec(ClusterConfig(scheduler="slurm", **{**base, "time": "soon"}), {}, "/r", "t")
    with pytest.raises(ShardshipError, match="unknown key"):
        build_spec(ClusterConfig(scheduler="slurm", **base), {"num_wrkers": 2}, "/r", "t")


def test_walltime_and_names() -> None:
    assert parse_walltime("12:00:00") == 43200
    assert parse_walltime("1-00:00:00") == 86400
    assert parse_walltime("90:00") == 5400  # SLURM reads MM:SS
    assert parse_walltime("30") == 1800  # minutes
    assert parse_walltime("2-06") == 2 * 86400 + 6 * 3600
    assert format_walltime(2 * 86400) == "48:00:00"
    # SLURM counts whole minutes: the spec uses what SLURM will enforce
    c = ClusterConfig(name="c", host="h", scheduler="slurm", gpus=1, cpus=4, time="00:01:30")
    assert build_spec(c, {}, "/r", "t").wall_seconds == 120
    assert job_name("3 runs/a:b") == "j3_runs_a_b"


def test_sge_memory_is_requested_in_the_sites_form() -> None:
    """`mem` is per node; SGE sites take it as a per-host check (mem_free, the default) or per
    slot (BU SCC's mem_per_core): 128G over 16 slots is 8192M a slot; "" requests none."""
    assert "#$ -l mem_free=32G\n" in _render("sge_1gpu")
    assert "#$ -l mem_per_core=8192M\n" in _render("sge_4gpu") and "mem_free" not in _render("sge_4gpu")
    cluster, train, root = CASES["sge_1gpu"]
    bare = ClusterConfig(**{**cluster.__dict__, "mem_resource": ""})
    assert "mem_" not in render(build_spec(bare, train, root, "x")).split("#$ -l h_rt")[0].split("# config:")[1]
    bad = ClusterConfig(**{**cluster.__dict__, "mem_per": "node"})
    with pytest.raises(ShardshipError, match="mem_per = 'node'"):
        render(build_spec(bad, train, root, "x"))
    evil = ClusterConfig(**{**cluster.__dict__, "mem_resource": "h_vmem=1G -l x"})
    with pytest.raises(ShardshipError, match="mem_resource"):
        render(build_spec(evil, train, root, "x"))


# the ICON case: someone else's one-process script that picks its device with torch.cuda.is_available()
ICON_CASES = {
    "slurm_icon": (ClusterConfig(name="hpc", host="login.hpc.example.edu", scheduler="slurm", gpus=1, cpus=8,
                                 mem="32G", time="12:00:00", partition="gpu", account="mylab", setup=SLURM_SETUP),
                   "/home/student/icon"),
    "sge_icon": (ClusterConfig(name="scc", host="scc1.bu.edu", scheduler="sge", gpus=1, cpus=4, mem="32G",
                               time="12:00:00", gpu_c="7.0", project="mylab", setup=SCC_SETUP),
                 "/projectnb/mylab/icon"),
}
ICON_COMMAND = ("train_icon.py", "--config", "configs/icon.yaml", "model.lr=3e-4")


def _render_icon(case: str) -> str:
    cluster, root = ICON_CASES[case]
    return render(build_spec(cluster, {"num_workers": 3}, root, SOURCE.format(name=cluster.name),
                             name="icon", command=ICON_COMMAND))


@pytest.mark.parametrize("case", sorted(ICON_CASES))
def test_icon_plain_script_on_one_gpu_golden(case: str) -> None:
    """The GPU is asked for (--gres=gpu:1 / -l gpus=1); the script runs as given, one process, no
    launcher, from the remote root, with the run's places in SHARDSHIP_*."""
    text = _render_icon(case)
    path = GOLDEN / f"{case}.sh"
    if os.environ.get("SHARDSHIP_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"{case}: rendered script differs from {path}"
    assert subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True).returncode == 0
    sched = "#SBATCH " if case.startswith("slurm") else "#$ "
    d = _directives(text, sched)
    if case.startswith("slurm"):
        assert "--gres=gpu:1" in d and "--ntasks=1" in d and "--partition=gpu" in d and "--cpus-per-task=8" in d, d
    else:
        assert "-l gpus=1" in d and "-l gpu_c=7.0" in d and "-pe omp 4" in d, d
        assert not re.search(r"CUDA_VISIBLE_DEVICES\s*=", text)
    assert re.search(r"^python3 train_icon.py --config configs/icon.yaml model.lr=3e-4 &$", text, re.M), text
    body = text[text.index("set +e"):]
    assert "srun" not in body and "torchrun" not in body and "train run" not in text
    assert re.search(r"^export SHARDSHIP_DATA=\S+ SHARDSHIP_OUT=\S+/outputs/icon SHARDSHIP_TIME_LIMIT=\d+$", text, re.M)
    assert f"cd {ICON_CASES[case][1]}\n" in text
