"""Pre-submit checks (pure arithmetic, each shown to pass AND to refuse), the
parsers for what qsub/sbatch/qstat/qacct/scontrol print (texts captured from
the real Grid Engine 8.1.9 and SLURM 22.05 brought up by scripts/ci/*_up.sh),
and the submit path against a real local remote (`local:PATH`)."""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
import tomllib

from shardship.config import ClusterConfig, Config
from shardship.errors import QuotaError, ShardshipError
from train.jobs import build_spec, checks, measure
from train.jobs.records import JobRecord, append_record, load_records
from train.jobs.status import parse_qacct, parse_qstat, parse_scontrol
from train.jobs.submit import parse_job_id, submit_job, train_toml

GiB = 1024**3


def spec_for(**kw):
    train = kw.pop("train", {})
    ranks = kw.pop("ranks_per_node", None)
    base = dict(name="c", host="h", scheduler="slurm", gpus=1, cpus=4, mem="32G", time="12:00:00")
    base.update(kw)
    return build_spec(ClusterConfig(**base), train, "/home/u/shardship", "test", ranks_per_node=ranks)


# ---------------------------------------------------------------- memory
def test_ram_check_refuses_16_ranks_x_8_workers_on_a_256g_node() -> None:
    """The seed failure: 16 GPUs x num_workers=8 OOM-killed a 256 GB node."""
    s = spec_for(gpus=16, cpus=160, mem="256G", train={"num_workers": 8})
    found = checks.check_memory(s, 2 * GiB, "measured")
    assert [f.level for f in found] == ["error"]
    msg = found[0].message
    assert "16 ranks" in msg and "8 workers" in msg and "OOM" in msg
    # the suggested num_workers does fit
    fit = int(msg.split("num_workers = ")[1].split()[0])
    assert 1 <= fit < 8
    ok = spec_for(gpus=16, cpus=160, mem="256G", train={"num_workers": fit})
    assert checks.check_memory(ok, 2 * GiB, "measured") == []


def test_ram_check_against_the_biggest_node() -> None:
    s = spec_for(gpus=0, cpus=32, mem="256G", ranks_per_node=16, train={"num_workers": 8})
    # asking for more than any node has is refused even when the arithmetic would fit
    found = checks.check_memory(s, 100 * 2**20, "measured", node_mem=24 * GiB, node_mem_source="sinfo")
    assert any("biggest node" in f.message for f in found)
    assert any("OOM" in f.message for f in found)  # 16 x (1 GiB + 8 x 100 MiB) > 24 GiB
    small = spec_for(gpus=0, cpus=4, mem="8G", ranks_per_node=2, train={"num_workers": 1})
    assert checks.check_memory(small, 200 * 2**20, "measured", node_mem=24 * GiB) == []


def test_cpu_check() -> None:
    assert checks.check_cpus(spec_for(gpus=4, cpus=16, train={"num_workers": 3})) == []
    over = checks.check_cpus(spec_for(gpus=4, cpus=16, train={"num_workers": 8}))
    assert over and over[0].level == "error" and "4 cores" in over[0].message
    full = checks.check_cpus(spec_for(gpus=1, cpus=4, train={"num_workers": 4}))
    assert [f.level for f in full] == ["warning"]
    too_few = checks.check_cpus(spec_for(gpus=8, cpus=4, train={"num_workers": 0}))
    assert too_few and "one core per process" in too_few[0].message


def test_walltime_check() -> None:
    ok = spec_for(time="12:00:00", train={"checkpoint_every": 500})
    assert checks.check_walltime(ok, 0.5, "default") == []
    late = spec_for(time="01:00:00", train={"checkpoint_every": 20000})
    found = checks.check_walltime(late, 0.5, "default")
    assert found and found[0].level == "error" and "checkpoint_every" in found[0].message
    fit = int(found[0].message.split("checkpoint_every <= ")[1].split()[0])
    assert checks.check_walltime(spec_for(time="01:00:00", train={"checkpoint_every": fit}), 0.5, "d") == []


def test_quota_check() -> None:
    s = spec_for(train={"keep": 3})
    ck = 100 * 2**20
    assert checks.check_quota(s, ck, headroom_bytes=8 * GiB, quota_bytes=10 * GiB, quota_source="q") == []
    found = checks.check_quota(s, ck, headroom_bytes=300 * 2**20, quota_bytes=GiB, quota_source="quota -s")
    assert found and found[0].check == "quota" and "quota -s" in found[0].message
    # checkpoints a previous run already wrote are not counted twice
    assert checks.check_quota(s, ck, headroom_bytes=300 * 2**20, quota_bytes=GiB, quota_source="q",
                              existing_bytes=4 * ck) == []
    with pytest.raises(QuotaError):
        checks.raise_for(found, "x")
    assert checks.check_quota(s, ck, None, None, "none")[0].level == "warning"


def test_raise_for_names_every_error() -> None:
    s = spec_for(gpus=16, cpus=16, mem="64G", train={"num_workers": 8})
    found = checks.check_memory(s, GiB, "d") + checks.check_cpus(s)
    with pytest.raises(ShardshipError) as e:
        checks.raise_for(found, "[cluster.c] job shardship")
    assert "memory:" in str(e.value) and "cpus:" in str(e.value) and "\n" not in str(e.value)


# ---------------------------------------------------------------- numbers from files / schedulers
def test_worker_rss_from_loader_csv(tmp_path: Path) -> None:
    p = tmp_path / "loader.csv"
    # the columns bench/loader.py writes; only our loader's row counts
    p.write_text("loader,samples_per_s,rss_worker_peak_mb,uss_worker_peak_mb,machine\n"
                 "shardship,900,412.5,120.0,vm\nfiles,700,980,300,vm\nwebdataset,500,600,200,vm\n")
    assert measure.worker_rss_from_csv(p) == int(412.5 * 2**20)
    q = tmp_path / "b.csv"
    q.write_text("run,worker_rss_bytes\na,123456789\n")
    assert measure.worker_rss_from_csv(q) == 123456789
    assert measure.worker_rss_from_csv(tmp_path / "missing.csv") is None


def test_node_memory_parsers() -> None:
    assert measure.parse_sinfo_mem("24105\n") == 24105 * 2**20
    assert measure.parse_sinfo_mem("257000+\n515000\n") == 515000 * 2**20
    qhost = (
        "HOSTNAME                ARCH         NCPU NSOC NCOR NTHR  LOAD  MEMTOT  MEMUSE  SWAPTO  SWAPUS\n"
        "----------------------------------------------------------------------------------------------\n"
        "global                  -               -    -    -    -     -       -       -       -       -\n"
        "vm                      lx-amd64        2    1    2    2  3.39   23.5G  949.4M     0.0     0.0\n"
    )
    assert measure.parse_qhost_mem(qhost) == int(23.5 * GiB)


def test_job_id_parsing() -> None:
    assert parse_job_id('Your job 2 ("rqtest") has been submitted\n') == "2"
    assert parse_job_id("3\n") == "3"  # qsub -terse
    assert parse_job_id("Submitted batch job 17\n") == "17"
    assert parse_job_id("42;ci\n") == "42"  # sbatch --parsable on a federation
    assert parse_job_id('Your job-array 8.1-4:1 ("arr") has been submitted') == "8"
    assert parse_job_id("sbatch: error: Batch job submission failed") is None


def test_state_parsers_on_real_scheduler_output() -> None:
    sc = ("JobId=3 JobName=shardship UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901757 Nice=0 "
          "Account=(null) QOS=(null) JobState=COMPLETED Reason=None Dependency=(null) Requeue=1 Restarts=0 "
          "BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:09 TimeLimit=00:05:00 TimeMin=N/A\n")
    st = parse_scontrol(sc, "3")
    assert st.state == "COMPLETED" and st.exit_code == 0 and st.restarts == 0
    cancelled = sc.replace("JobState=COMPLETED", "JobState=CANCELLED").replace("ExitCode=0:0", "ExitCode=0:15")
    st = parse_scontrol(cancelled.replace("Restarts=0", "Restarts=1"), "3")
    assert st.state == "CANCELLED" and st.exit_code == 128 + 15 and st.restarts == 1
    assert parse_scontrol(sc, "4") is None

    # verbatim qstat output: one fixed-width row per line keeps the columns readable
    qstat = ("job-ID  prior   name       user         state submit/start at     queue                          slots ja-task-ID \n"  # noqa: E501
             "-----------------------------------------------------------------------------------------------------------------\n"
             "      3 0.50000 rqtest     shardship-te r     11/21/2026 22:32:15 all.q@vm                           2        \n"  # noqa: E501
             "      4 0.50000 rq99       shardship-te Rq    11/21/2026 22:34:06                                    1        \n")  # noqa: E501
    assert parse_qstat(qstat, "3").state == "RUNNING"
    assert parse_qstat(qstat, "4").state == "REQUEUED"
    assert parse_qstat(qstat, "5") is None

    sep = "=" * 62 + "\n"
    timeout = (sep + "jobname      rqtest              \njobnumber    2                   \n"
               "failed       37  : qmaster enforced h_rt, h_cpu, or h_vmem limit\n"
               "exit_status  137                  (Killed)\n")
    st = parse_qacct(timeout, "2")
    assert st.state == "TIMEOUT" and st.exit_code == 137
    resched = (sep + "jobnumber    4                   \nfailed       25  : rescheduling\n"
               "exit_status  99                  \n"
               + sep + "jobnumber    4                   \nfailed       0    \nexit_status  0                   \n")
    st = parse_qacct(resched, "4")
    assert st.state == "COMPLETED" and st.restarts == 1
    assert parse_qacct(resched.split(sep)[1] and sep + resched.split(sep)[1], "4").state == "REQUEUED"


def test_train_toml_round_trips_through_the_trainer_config() -> None:
    from train.trainer import TrainConfig

    train = {"batch_size": 8, "lr": 3e-4, "amp": False, "val_sessions": ["session_a"], "time_limit": "01:00:00",
             "model": {"enc_channels": [8, 16], "embed_dim": 32}}
    text = train_toml(train, "shardship.toml")
    back = tomllib.loads(text)["train"]
    assert back == train
    assert TrainConfig.from_dict(back).model == {"enc_channels": [8, 16], "embed_dim": 32}


def test_records_file(tmp_path: Path) -> None:
    p = tmp_path / "outputs" / "jobs.json"
    r = JobRecord("c", "h", "slurm", "7", "shardship", "/s.sh", "/l", "/o", "/d", "2026-01-01T00:00:00+00:00")
    append_record(p, r)
    append_record(p, JobRecord(**{**r.__dict__, "job_id": "8"}))
    assert [x.job_id for x in load_records(p)] == ["7", "8"]
    assert json.loads(p.read_text())["format"] == "shardship-jobs"


# ---------------------------------------------------------------- submit path on a real local remote
def _local_cfg(tmp_path: Path, **cluster_kw) -> tuple[Config, ClusterConfig]:
    home = tmp_path / "home"
    (home / "shardship").mkdir(parents=True)
    cl = ClusterConfig(name="loc", host=f"local:{home}", scheduler="slurm", gpus=0, cpus=2, mem="4G",
                       time="00:10:00", python=sys.executable, **cluster_kw)
    cfg = Config(outputs=tmp_path / "outputs", packed=tmp_path / "no-packed-here",
                 train={"batch_size": 4, "num_workers": 1, "checkpoint_every": 2, "keep": 1})
    cfg.clusters["loc"] = cl
    return cfg, cl


def test_dry_run_refuses_without_data_and_writes_nothing(tmp_path: Path) -> None:
    cfg, cl = _local_cfg(tmp_path)
    res = submit_job(cfg, cl, dry_run=True, probe=False, bench_csv=tmp_path / "none.csv")
    assert res.record is None
    assert "#SBATCH --ntasks=1" in res.plan.script
    assert any(f.check == "data" and "transfer upload" in f.message for f in checks.errors(res.plan.findings))
    assert not (tmp_path / "home" / "shardship" / "jobs").exists()
    with pytest.raises(ShardshipError, match="no packed data"):
        submit_job(cfg, cl, probe=False, bench_csv=tmp_path / "none.csv")
    assert not (tmp_path / "outputs" / "jobs.json").exists()


def test_damaged_remote_index_is_a_data_finding(tmp_path: Path) -> None:
    cfg, cl = _local_cfg(tmp_path)
    (tmp_path / "home" / "shardship" / "index.json").write_text('{"format": "shardship-index", "shards": [')
    res = submit_job(cfg, cl, dry_run=True, probe=False, bench_csv=tmp_path / "none.csv")
    data = [f.message for f in checks.errors(res.plan.findings) if f.check == "data"]
    assert data and "index.json: not valid JSON" in data[0] and "run `transfer upload` again" in data[0]
    assert "packer pack" not in data[0]


def _stub_index() -> str:
    """A valid index.json with no shards: what the checks read for sizing."""
    from shardship.format import index as fmt

    doc = fmt.empty({"horizon": 16}, "test")
    doc.update(action_dim=9, joints=[])
    return json.dumps(doc)


def test_submit_refuses_over_quota_before_writing(tmp_path: Path) -> None:
    cfg, cl = _local_cfg(tmp_path, quota="20M")
    root = tmp_path / "home" / "shardship"
    (root / "index.json").write_text(_stub_index())
    cfg.train = {"batch_size": 4, "num_workers": 1, "keep": 3}  # default model: ~100 MB checkpoints
    with pytest.raises(QuotaError, match="quota = 20M"):
        submit_job(cfg, cl, probe=False, bench_csv=tmp_path / "none.csv")
    assert not (root / "jobs").exists()


# ---------------------------------------------------------------- the CLI
def _write_local_config(tmp_path: Path, mem: str = "8G") -> Path:
    home = tmp_path / "home"
    (home / "shardship").mkdir(parents=True)
    (home / "shardship" / "index.json").write_text(_stub_index())
    cfg = tmp_path / "shardship.toml"
    cfg.write_text(
        f'[paths]\noutputs = "{tmp_path / "outputs"}"\npacked = "{tmp_path / "nothing"}"\n'
        '[train]\nbatch_size = 4\nnum_workers = 1\ncheckpoint_every = 10\nkeep = 1\n'
        'enc_channels = [8, 16]\nunet_dims = [16, 32]\nembed_dim = 32\n'
        f'[cluster.loc]\nhost = "local:{home}"\nscheduler = "sge"\ngpus = 0\ncpus = 2\nmem = "{mem}"\n'
        'time = "00:30:00"\nquota = "1G"\nsetup = ["module load python3"]\n')
    return cfg


def test_cli_submit_dry_run_prints_the_script(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from train.cli import main

    cfg = _write_local_config(tmp_path)
    r = CliRunner().invoke(main, ["submit", "--dry-run", "--config", str(cfg), "--nproc-per-node", "2",
                                  "--no-probe"])
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("#!/bin/bash -l\n") and "#$ -pe omp 2" in r.stdout
    assert "module load python3" in r.stdout and "--nproc_per_node 2" in r.stdout
    assert "nothing submitted" in r.stderr
    assert not (tmp_path / "home" / "shardship" / "jobs").exists()
    assert not (tmp_path / "outputs" / "jobs.json").exists()
    # the same with too little memory: refused, exit code 2, one line per problem
    cfg = _write_local_config(tmp_path / "small", mem="1G")
    r = CliRunner().invoke(main, ["submit", "--dry-run", "--config", str(cfg), "--nproc-per-node", "2",
                                  "--no-probe"])
    assert r.exit_code == 2
    assert "error: memory:" in r.stderr and "would refuse" in r.stderr and "Traceback" not in r.output


def test_cli_quiet_submit_and_fetch_print_only_the_result(tmp_path: Path) -> None:
    """--quiet (job logs, scripts): the dry run's script without the check notes; fetch
    prints only where the results are, not a line per file."""
    from click.testing import CliRunner

    from train.cli import main

    cfg = _write_local_config(tmp_path)
    loud = CliRunner().invoke(main, ["submit", "--dry-run", "--config", str(cfg), "--no-probe"])
    quiet = CliRunner().invoke(main, ["submit", "--dry-run", "--quiet", "--config", str(cfg), "--no-probe"])
    assert loud.exit_code == 0 and quiet.exit_code == 0, quiet.output
    assert "check: " in loud.stderr and "check: " not in quiet.stderr
    assert quiet.stdout == loud.stdout and quiet.stdout.startswith("#!/bin/bash -l\n")
    run = tmp_path / "home" / "shardship" / "outputs" / "shardship"
    run.mkdir(parents=True)
    (run / "last.pt").write_bytes(b"checkpoint")
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    loud = CliRunner().invoke(main, ["fetch", "--config", str(cfg), "--dest", str(tmp_path / "a")])
    quiet = CliRunner().invoke(main, ["fetch", "--quiet", "--config", str(cfg), "--dest", str(tmp_path / "b")])
    assert loud.exit_code == 0 and quiet.exit_code == 0, quiet.output
    assert "fetched" in loud.stdout and "last.pt" in loud.stdout
    assert quiet.stdout.strip() == f"results in {tmp_path / 'b'}"
    assert (tmp_path / "b" / "last.pt").read_bytes() == b"checkpoint"


def test_cli_status_without_jobs(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from train.cli import main

    cfg = _write_local_config(tmp_path)
    r = CliRunner().invoke(main, ["status", "--config", str(cfg)])
    assert r.exit_code == 0 and "no jobs recorded for [cluster.loc]" in r.output


@pytest.mark.slow
def test_local_probe_measures_a_real_dataloader_worker(tmp_path: Path) -> None:
    """No benchmark CSV: the RAM check measures one real DataLoader worker over the local shards."""
    from tests.datasets import make_packed

    packed = make_packed(tmp_path / "d", sessions=2, frames=30, seed=1)
    rss = measure.probe_worker_rss(packed, batch_size=8)
    assert rss is not None and 20 * 2**20 < rss < 4 * GiB  # a forked worker with torch loaded
    s = spec_for(gpus=0, cpus=2, ranks_per_node=2, train={"num_workers": 1, "batch_size": 8})
    v, src = measure.worker_rss(s, packed, bench_csv=tmp_path / "no.csv")
    assert "local probe" in src and v > 0
    assert measure.probe_worker_rss(tmp_path / "nothing", 8) is None


# ---------------------------------------------------------------- the decoded-frame cache in the memory request
def _cache(gib: float):
    """A CacheSize of about `gib` GiB of 224x224 frames."""
    from train.cachesize import CacheSize

    return CacheSize(int(gib * GiB) // (224 * 224 * 3), 224, 224, ("a",))


def _spec_default_mem(**kw):
    """spec_for without `mem`: the built-in default (shardship.config.DEFAULT_MEM), as a config without it."""
    train = kw.pop("train", {})
    base = dict(name="c", host="h", scheduler="slurm", gpus=1, cpus=4, time="12:00:00")
    base.update(kw)
    return build_spec(ClusterConfig(**base), train, "/home/u/shardship", "test")


def test_cache_off_or_on_the_gpu_leaves_the_memory_request_alone() -> None:
    from train.jobs import cachemem, render

    for mode in ("off", "gpu"):
        s = _spec_default_mem(train={"cache": mode})
        grown, notes = cachemem.count_cache(s, _cache(9.5), "index.json")
        assert grown == s and grown.mem == "32G" and grown.mem_cache == 0
        assert "#SBATCH --mem=32G" in render(grown)
    assert "off" in cachemem.count_cache(_spec_default_mem(train={"cache": "off"}), _cache(1), "i")[1][0]
    # a CPU job's "gpu" cache is a private copy in every rank's memory (train.data.cache)
    cpu = build_spec(ClusterConfig(name="c", gpus=0, cpus=4, time="1:00:00"), {"cache": "gpu"}, "/r", "t",
                     ranks_per_node=2)
    grown, notes = cachemem.count_cache(cpu, _cache(4), "i")
    assert grown.mem == "40G" and "2 copies per node" in notes[0]


def test_host_cache_grows_the_default_request_once_per_node() -> None:
    from train.jobs import cachemem, render
    from train.jobs.sge import mem_request

    size = _cache(9.5)
    for mode in ("host", "auto"):  # auto may fall back to host on a node with a smaller GPU
        s = _spec_default_mem(nodes=2, gpus=4, cpus=16, train={"cache": mode})
        grown, notes = cachemem.count_cache(s, size, "index.json")
        assert grown.mem == "42G" and grown.mem_bytes >= s.mem_bytes + size.bytes  # 32G + 9.5 GB, whole GiB
        assert grown.mem_bytes - s.mem_bytes - size.bytes < GiB
        script = render(grown)
        assert "#SBATCH --mem=42G" in script and "# memory:   42G (32G + 9.5 GB decoded-frame cache)" in script
        assert "32G (the default mem) + decoded-frame cache 9.5 GB" in notes[0] and "one copy per node" in notes[0]
    # SGE's per-slot memory: the whole request (with the cache) divided by the slots
    before = _spec_default_mem(scheduler="sge", gpus=1, cpus=4, mem_resource="mem_per_core", mem_per="slot",
                               train={"cache": "host"})
    after, notes = cachemem.count_cache(before, size, "index.json")
    assert mem_request(before) == "mem_per_core=8192M" and mem_request(after) == "mem_per_core=10752M"
    assert "#$ -l mem_per_core=10752M" in render(after) and "per slot (mem_per_core)" in notes[0]
    # the processes are still checked against what is left beside the cache
    assert checks.check_memory(after, GiB, "d") == []
    busy = _spec_default_mem(gpus=4, cpus=64, train={"cache": "host", "num_workers": 8})
    found = checks.check_memory(busy, GiB, "d")
    found_grown = checks.check_memory(cachemem.count_cache(busy, size, "i")[0], GiB, "d")
    assert [f.level for f in found] == [f.level for f in found_grown] == ["error"]
    # the same fix with the cache added as without it: the cache has its own room
    assert "num_workers = 4" in found[0].message and "num_workers = 4" in found_grown[0].message
    assert "mem = 42G (32G + 9.5 GB decoded-frame cache) per node less the cache" in found_grown[0].message


def test_auto_cache_does_not_push_the_request_past_the_biggest_node() -> None:
    from train.jobs import cachemem

    s = _spec_default_mem(train={"cache": "auto"})
    same, notes = cachemem.count_cache(s, _cache(9.5), "i", node_mem=40 * GiB, node_src="sinfo")
    assert same == s and "not added" in notes[0] and "40.0 GB (sinfo)" in notes[0]
    grown, _ = cachemem.count_cache(s, _cache(9.5), "i", node_mem=64 * GiB, node_src="sinfo")
    assert grown.mem == "42G"
    # "host" is asked for as it is, and the node check says it cannot be had
    host = cachemem.count_cache(_spec_default_mem(train={"cache": "host"}), _cache(9.5), "i", 40 * GiB, "sinfo")[0]
    found = checks.check_memory(host, GiB, "d", node_mem=40 * GiB, node_mem_source="sinfo")
    assert found and "mem = 42G (32G + 9.5 GB decoded-frame cache) per node, but the biggest node" in found[0].message


def test_a_written_mem_is_kept_and_warned_about_when_the_cache_does_not_fit() -> None:
    from train.jobs import cachemem

    size = _cache(20)
    for mode in ("host", "auto"):
        s = spec_for(mem="16G", train={"cache": mode, "num_workers": 2})
        kept, notes = cachemem.count_cache(s, size, "index.json")
        assert kept == s and "mem = 16G is set in [cluster.c] and taken as written" in notes[0]
        warn = cachemem.check_written_mem(kept, size, GiB)
        assert [f.level for f in warn] == ["warning"] and warn[0].check == "memory"
        msg = warn[0].message
        assert "\n" not in msg and msg.startswith("[cluster.c] mem = 16G per node is less than the decoded-frame cache")
        assert "20.0 GB" in msg and f'[train] cache = "{mode}"' in msg and 'set mem = "26G"' in msg, msg
        checks.raise_for(warn, "x")  # a warning: the job is not refused
    assert cachemem.check_written_mem(spec_for(mem="64G", train={"cache": "host"}), size, GiB) == []
    assert cachemem.check_written_mem(spec_for(mem="16G", train={"cache": "off"}), size, GiB) == []
    assert cachemem.check_written_mem(spec_for(mem="16G", train={"cache": "gpu"}), size, GiB) == []


def test_submit_counts_the_cache_of_the_uploaded_index(tmp_path: Path) -> None:
    """End to end on a local remote: the uploaded index sizes the cache; the script asks for it."""
    from tests.datasets import index_doc

    cfg, cl = _local_cfg(tmp_path)
    (tmp_path / "home" / "shardship" / "index.json").write_text(json.dumps(index_doc({"a": (40, 16), "b": (30, 0)})))
    cfg.train = {**cfg.train, "cache": "host", "val_fraction": 0}
    written = submit_job(cfg, cl, dry_run=True, probe=False, bench_csv=tmp_path / "none.csv").plan
    assert "#SBATCH --mem=4G" in written.script  # mem = "4G" in the config: as written
    default = dataclasses.replace(cl, mem=ClusterConfig(name="x").mem)
    p = submit_job(cfg, default, dry_run=True, probe=False, bench_csv=tmp_path / "none.csv").plan
    assert "#SBATCH --mem=33G" in p.script and p.spec.mem_cache == 70 * 224 * 224 * 3
    assert any("70 training frames x 224x224x3" in n and "= 33G per node" in n for n in p.notes), p.notes
    cfg.train["cache"] = "off"
    off = submit_job(cfg, default, dry_run=True, probe=False, bench_csv=tmp_path / "none.csv").plan
    assert "#SBATCH --mem=32G" in off.script
