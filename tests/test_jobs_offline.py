"""`train submit` without a cluster: `--dry-run` renders and checks offline (an
unresolvable login node is not an error for a preview), a [train] value of the
wrong shape is one line naming the key, `--set` overrides reach the job's TOML,
and the shipped source archive is the same bytes for the same code."""
from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from shardship.config import ClusterConfig, load_config, tomllib
from shardship.errors import ShardshipError

CONFIG = """
[cluster.hpc]
host = "login.nonexistent.invalid"
user = "alice"
scheduler = "slurm"
nodes = 2
gpus = 4
cpus = 16
mem = "64G"
time = "24:00:00"
setup = ["module load python3/3.10 pytorch/2.1"]

[train]
num_workers = 3
"""


def _submit(tmp_path: Path, *args: str, config: str = CONFIG):
    from train.cli import main

    (tmp_path / "shardship.toml").write_text(config)
    return CliRunner().invoke(main, ["submit", "--config", str(tmp_path / "shardship.toml"), "--no-probe", *args])


def test_dry_run_with_an_unreachable_host_prints_the_script_and_exits_0(tmp_path: Path) -> None:
    res = _submit(tmp_path, "--dry-run")
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("#!/bin/bash\n"), res.stdout
    assert "#SBATCH --nodes=2" in res.stdout and "module load python3/3.10 pytorch/2.1" in res.stdout
    # shardship's code goes with the job, on top of the cluster's python
    assert "export PYTHONPATH=/home/alice/shardship/code/shardship-src-" in res.stdout
    err = res.stderr
    assert "offline (" in err and "login.nonexistent.invalid" in err, err
    for what in ("data: /home/alice/shardship/index.json not checked (offline)",
                 "biggest node unknown (not checked (offline))", "quota not checked (offline)",
                 "remote home not checked (offline): paths assume /home/alice"):
        assert what in err, err
    assert "nothing submitted" in err


def test_offline_still_runs_the_arithmetic(tmp_path: Path) -> None:
    """16 workers x 4 ranks on 16 cores is refused with no cluster at all."""
    res = _submit(tmp_path, "--dry-run", "--offline", "--set", "num_workers=16")
    assert res.exit_code == 2, res.output
    assert "cpus: num_workers = 16 per rank but each rank gets 4 cores" in res.stderr
    assert "would refuse this job" in res.stderr


def test_offline_needs_dry_run(tmp_path: Path) -> None:
    res = _submit(tmp_path, "--offline")
    assert res.exit_code == 2 and "--offline" in res.stderr and "--dry-run" in res.stderr, res.output


def test_a_real_submit_to_an_unreachable_host_is_exit_4(tmp_path: Path) -> None:
    res = _submit(tmp_path)
    assert res.exit_code == 4, res.output


@pytest.mark.parametrize("train, words", [
    ('model = "tiny"', ['model = \'tiny\' is a str', 'write [train.model] with preset = "tiny"']),
    ('num_workers = "2"', ["num_workers = '2' is a str", "reads int"]),
    ("val_sessions = \"a\"", ["val_sessions = 'a' is a str", "reads a list"]),
    ("unet_dims = 64", ["unet_dims = 64 is a int", "reads a list"]),
    ("amp = 1", ["amp = 1 is a int", "reads bool"]),
])
def test_a_value_of_the_wrong_shape_is_one_line_naming_the_key(tmp_path: Path, train: str,
                                                              words: list[str]) -> None:
    res = _submit(tmp_path, "--dry-run", "--offline", config=CONFIG.replace("num_workers = 3", train))
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "shardship.toml [train]:" in res.stderr
    for w in words:
        assert w in res.stderr, res.stderr


def test_train_run_gives_the_same_one_line_for_a_model_string(tmp_path: Path) -> None:
    """The trainer's own parser (train run, and the job on the cluster) says the same
    line as submit's check, not `ValueError: dictionary update sequence ...`."""
    from train.config import TrainConfig

    with pytest.raises(ShardshipError) as e:
        TrainConfig.from_dict({"model": "tiny"}, "shardship.toml [train]")
    assert str(e.value).startswith("shardship.toml [train]: model = 'tiny' is a str")
    assert 'write [train.model] with preset = "tiny"' in str(e.value)
    assert TrainConfig.from_dict({"model": {"preset": "tiny"}}).model == {"preset": "tiny"}


def test_set_overrides_reach_the_jobs_toml(tmp_path: Path) -> None:
    from train.jobs.submit import submit_job

    (tmp_path / "shardship.toml").write_text(CONFIG)
    cfg = load_config(tmp_path / "shardship.toml")
    res = submit_job(cfg, cfg.cluster("hpc"), dry_run=True, offline=True, probe=False,
                     sets=("lr=1e-4", "model.preset=tiny", "unet_dims=[32, 64]", "device=cpu", "num_workers=2"))
    train = tomllib.loads(res.plan.train_toml)["train"]
    assert train["lr"] == 1e-4 and train["model"] == {"preset": "tiny"} and train["unet_dims"] == [32, 64]
    assert train["device"] == "cpu" and train["num_workers"] == 2
    assert res.plan.spec.num_workers == 2  # the checks read the overridden value
    assert cfg.train == {"num_workers": 3}  # the config itself is untouched


@pytest.mark.parametrize("item, words", [("lrr=1", "unknown [train] key 'lrr'"), ("lr", "write KEY=VALUE"),
                                         ("model=tiny", "--set model.preset=tiny"),
                                         ("model.foo=1", "unknown model key 'foo'")])
def test_set_refuses_what_the_trainer_would_not_read(item: str, words: str) -> None:
    from train.jobs.overrides import apply_sets

    with pytest.raises(ShardshipError, match="--set") as e:
        apply_sets({}, [item])
    assert words in str(e.value)


def test_the_source_archive_is_named_by_its_content(tmp_path: Path) -> None:
    import io
    import tarfile

    from train.jobs.ship import build_archive, source_root

    a, b = build_archive(), build_archive()
    assert a == b and a.name.startswith("shardship-src-") and a.files > 50
    names = tarfile.open(fileobj=io.BytesIO(a.data)).getnames()
    assert "train/jobs/ship.py" in names and "shardship/config.py" in names
    assert not [n for n in names if "__pycache__" in n or not n.endswith(".py")]
    # one changed byte, another name
    copy = tmp_path / "src"
    for pkg in ("shardship", "packer", "transfer", "train"):
        for p in (source_root() / pkg).rglob("*.py"):
            if "__pycache__" not in p.parts:
                dst = copy / p.relative_to(source_root())
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.write_bytes(p.read_bytes())
    assert build_archive(copy).name == a.name
    (copy / "train" / "__init__.py").write_text("# changed\n")
    assert build_archive(copy).name != a.name


def test_where_reads_sinfo_test_only_and_qstat() -> None:
    from train.jobs.where import parse_qstat_gc, parse_sinfo, parse_test_only, soonest

    sinfo = """gpu* a1 mixed 16/48/0/64 gpu:a100:4(S:0-1) gpu:a100:3(IDX:0-2) 512000
gpu* a2 idle 0/64/0/64 gpu:a100:4(S:0-1) gpu:a100:0(IDX:N/A) 512000
gpu* v1 drained 0/0/32/32 gpu:v100:2 gpu:v100:0(IDX:N/A) 192000
cpu c1 allocated 64/0/0/64 (null) (null) 256000"""
    pools = {(p.partition, p.gpu_type): p for p in parse_sinfo(sinfo)}
    a100 = pools[("gpu", "a100")]
    assert (a100.gpus_free, a100.gpus_total, a100.nodes_idle, a100.cpus_free) == (5, 8, 1, 112)
    assert (pools[("gpu", "v100")].gpus_free, pools[("gpu", "v100")].gpus_total) == (0, 2)  # drained: none free
    assert pools[("cpu", "")].cpus_free == 0 and "no GPUs" in str(pools[("cpu", "")])
    assert parse_test_only("sbatch: Job 7 to start at 2026-11-23T20:29:29 using 2 processors on nodes node2 in "
                           "partition short") == "2026-11-23T20:29:29 on node2"
    assert parse_test_only("allocation failure: Requested node configuration is not available").startswith(
        "cannot run here: allocation failure")
    a100.start, pools[("cpu", "")].start = "2026-11-24T02:00:00 on a1", "2026-11-23T21:00:00 on c1"
    assert soonest(list(pools.values())) is pools[("cpu", "")]
    gc = """CLUSTER QUEUE                   CQLOAD   USED    RES  AVAIL  TOTAL aoACDS  cdsuE
--------------------------------------------------------------------------------
all.q                             0.12      1      0      1      2      0      0"""
    [q] = parse_qstat_gc(gc)
    assert (q.partition, q.cpus_free, q.cpus_total) == ("all.q", 1, 2) and "no start estimate" in q.start


def test_a_jobs_time_limit_counts_from_the_job_scripts_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Imports and rendezvous before training are on the scheduler's clock too."""
    import time

    from train.cli import _from_job_start

    monkeypatch.delenv("SHARDSHIP_JOB_START", raising=False)
    monkeypatch.setenv("RANK", "0")
    assert _from_job_start("00:01:20") == "00:01:20"
    monkeypatch.setenv("SHARDSHIP_JOB_START", str(int(time.time()) - 30))
    assert _from_job_start("00:01:20") in ("50", "49")
    assert _from_job_start(None) is None
    monkeypatch.setenv("RANK", "3")  # the others stop at the same window: rank 0 reports the time limit
    assert _from_job_start("00:01:20") in ("52", "51")
    monkeypatch.setenv("SHARDSHIP_JOB_START", str(int(time.time()) - 3600))
    assert _from_job_start("00:01:20") == "1"


def test_partitions_offline(tmp_path: Path) -> None:
    """One partition is the partition; several are copies that race (SLURM only)."""
    one = _submit(tmp_path, "--dry-run", "--offline", "--partitions", "gpu")
    assert one.exit_code == 0 and "#SBATCH --partition=gpu\n" in one.stdout and "steps aside" not in one.stdout
    two = _submit(tmp_path, "--dry-run", "--offline", "--partitions", "gpu,gpu-preempt")
    assert two.exit_code == 0, two.output
    assert "mkdir /home/alice/shardship/outputs/shardship/.shardship-winner.lock" in two.stdout
    assert "a copy to each of gpu, gpu-preempt" in two.stderr
    sge = _submit(tmp_path, "--dry-run", "--offline", "--partitions", "a,b",
                  config=CONFIG.replace('"slurm"', '"sge"').replace("nodes = 2", "nodes = 1"))
    assert sge.exit_code == 2 and "several partitions at once are for SLURM" in sge.stderr, sge.output
    bad = _submit(tmp_path, "--dry-run", "--offline", "--partitions", "a,b c")
    assert bad.exit_code == 2 and "partition" in bad.stderr, bad.output


def test_command_checks_the_launch_contract(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fit.py").write_text("import lightning as L\nL.Trainer(devices=4, num_nodes=2).fit()\n")
    (tmp_path / "alone.py").write_text("import torch\nprint(torch.ones(1))\n")
    ok = _submit(tmp_path, "--dry-run", "--offline", "--command", "python fit.py --epochs 3")
    assert ok.exit_code == 0, ok.output
    assert "#SBATCH --ntasks-per-node=4\n#SBATCH --cpus-per-task=4\n" in ok.stdout
    assert "srun --kill-on-bad-exit=1" in ok.stdout and "torchrun" not in ok.stdout and "train run" not in ok.stdout
    alone = _submit(tmp_path, "--dry-run", "--offline", "--command", "python alone.py")
    assert alone.exit_code == 0 and "never calls init_process_group" in alone.stderr, alone.output
    assert 'torchrun --nnodes "$SLURM_NNODES" --nproc_per_node 4' in alone.stdout
    for cmd, words in (("torchrun alone.py", "for ONE process"), ("bash x.sh", "start it with python"),
                       ("python", "name the script")):
        r = _submit(tmp_path, "--dry-run", "--offline", "--command", cmd)
        assert r.exit_code == 2 and words in r.stderr, r.output


def test_command_overrides_are_checked_against_the_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hydra-style overrides on the command win over the script: trainer.devices=1 on 4 GPUs
    per node, dataloader.params.num_workers past the node's memory, each one line naming the key."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fit.py").write_text("import lightning as L\nL.Trainer(devices=4, num_nodes=2).fit()\n")
    ok = _submit(tmp_path, "--dry-run", "--offline", "--command",
                 "python fit.py agent=hydra_mdp_v8192_w_ep dataloader.params.batch_size=22")
    assert ok.exit_code == 0 and "error" not in ok.stderr, ok.output
    assert "fit.py agent=hydra_mdp_v8192_w_ep dataloader.params.batch_size=22 &" in ok.stdout, ok.stdout
    dev = _submit(tmp_path, "--dry-run", "--offline", "--command", "python fit.py trainer.devices=1")
    assert dev.exit_code == 2, dev.output
    assert ("error: command: the command sets trainer.devices=1 but the job runs 2 node(s) x 4 rank(s), one srun "
            "task per rank" in dev.stderr and "set trainer.devices=4" in dev.stderr), dev.stderr
    nodes = _submit(tmp_path, "--dry-run", "--offline", "--command", "python fit.py +trainer.num_nodes=1")
    assert nodes.exit_code == 2 and "set trainer.num_nodes=2" in nodes.stderr, nodes.output
    # 4 GPU ranks x (3 GB + 16 workers x 1 GB) per node, past 64G - 10%: 11 workers per rank fit
    mem = _submit(tmp_path, "--dry-run", "--offline", "--command", "python fit.py dataloader.params.num_workers=16")
    assert mem.exit_code == 2, mem.output
    assert "4 ranks x (3.0 GB + 16 workers x 1.0 GB per worker" in mem.stderr, mem.stderr
    assert "set dataloader.params.num_workers=11 on the command" in mem.stderr, mem.stderr
    assert "set dataloader.params.num_workers=3 on the command or cpus = 68" in mem.stderr, mem.stderr


def test_a_wrapper_that_runs_python_itself_is_refused_naming_the_line(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run_training.sh").write_text("#!/bin/bash\nexport HYDRA_FULL_ERROR=1\n"
                                              "python $ROOT/run_training.py agent=ego_mlp_agent\n")
    for cmd in ("bash run_training.sh", "./run_training.sh"):
        r = _submit(tmp_path, "--dry-run", "--offline", "--command", cmd)
        assert r.exit_code == 2, r.output
        line = [ln for ln in r.stderr.splitlines() if ln.startswith("error")]
        assert len(line) == 1 and "run_training.sh starts python itself (line 3: 'python $ROOT/run_training.py " \
            "agent=ego_mlp_agent'), which in the job runs once without srun: only rank 0 would join" in line[0], line


def test_memory_fix_says_num_workers_0_when_only_that_fits() -> None:
    from train.jobs import build_spec
    from train.jobs.checks import check_memory

    cluster = ClusterConfig(name="c", scheduler="slurm", gpus=0, cpus=4, mem="3G", time="01:00:00")
    spec = build_spec(cluster, {"num_workers": 2}, "/r", "test", ranks_per_node=2)
    [f] = check_memory(spec, 2**30, "default")
    assert f.level == "error" and f.message.endswith("set [train] num_workers = 0"), f
    spec = build_spec(cluster, {"num_workers": 2}, "/r", "test", ranks_per_node=4)
    [f] = check_memory(spec, 2**30, "default")
    assert f.message.endswith("use fewer processes per node or a node with more memory"), f


def test_offline_sizes_the_frame_cache_from_the_local_index(tmp_path: Path) -> None:
    """Offline, the local packed index sizes [train] cache: no `mem` -> the request grows by it; a
    `mem` that cannot hold it beside the rank -> a one-line warning, the request as written."""
    import json

    from tests.datasets import index_doc

    packed = tmp_path / "packed"
    packed.mkdir()
    (packed / "index.json").write_text(json.dumps(index_doc({"a": (35_000, 16), "b": (10, 0)})))
    config = (CONFIG.replace("nodes = 2", "nodes = 1").replace("gpus = 4", "gpus = 1")
              .replace("[train]", f'[paths]\npacked = "{packed}"\n\n[train]\ncache = "host"\nval_sessions = ["b"]'))
    res = _submit(tmp_path, "--dry-run", "--offline", config=config.replace('mem = "64G"\n', ""))
    assert res.exit_code == 0, res.output
    assert "#SBATCH --mem=37G" in res.stdout, res.stdout  # 32G + 35,000 x 224x224x3 (4.9 GB), whole GiB
    assert "35,000 training frames x 224x224x3" in res.stderr and "offline" in res.stderr
    res = _submit(tmp_path, "--dry-run", "--offline", config=config.replace('mem = "64G"', 'mem = "7G"'))
    assert res.exit_code == 0, res.output
    assert "#SBATCH --mem=7G" in res.stdout
    warn = [ln for ln in res.stderr.splitlines() if ln.startswith("warning: memory:")]
    assert len(warn) == 1 and "[cluster.hpc] mem = 7G per node is less than the decoded-frame cache needs" in warn[0]
    assert "4.9 GB" in warn[0] and 'set mem = "' in warn[0], warn[0]
