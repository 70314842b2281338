"""Faults in the job files `train submit` writes: the [train] TOML must read back
exactly whatever the config holds, and no config value may become a live line of
the job script (comments escaped, directives refused, shell words quoted)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest


# ---------------------------------------------------------------- 12: the job's TOML
@pytest.mark.parametrize("name", ["grasp 😀", 'say "hi"', "back\\slash", "two\nlines", "tab\there", "bell\x07",
                                  "ünïcödé", "'single'", "del\x7f", "a\u2028b"])
def test_job_toml_round_trips_any_session_name(name: str) -> None:
    """The [train] TOML `train submit` writes is read back by the job (tomllib /
    tomli) to exactly the values it was written from."""
    from shardship.config import tomllib
    from train.jobs.submit import train_toml

    train = {"val_sessions": [name, "plain"], "lr": 3e-4, "amp": True, "time_limit": name,
             "model": {"preset": "tiny", "unet_dims": [32, 64], "note": name}}
    text = train_toml(train, f"shardship.toml {name}")
    back = tomllib.loads(text)
    assert back == {"train": train}


# ---------------------------------------------------------------- 13: job script injection
_SCHED = {"slurm": dict(scheduler="slurm", gpus=2, cpus=8, mem="32G", time="1:00:00", partition="gpu",
                        account="lab", constraint="a100"),
          "sge": dict(scheduler="sge", gpus=1, cpus=4, mem="32G", time="1:00:00", project="lab", queue="q",
                      gpu_c="7.0")}


def _script(sched: str, name: str = "hpc", source: str | None = None, root: str = "/scratch/u/run",
            **over: object) -> str:
    from shardship.config import ClusterConfig
    from train.jobs import build_spec, render

    cluster = ClusterConfig(name=name, host="login", **{**_SCHED[sched], **over})
    src = source if source is not None else f"shardship.toml [cluster.{name}] + [train]"
    return render(build_spec(cluster, {"num_workers": 2}, root, src))


def _header_runs_nothing(script: str, tmp: Path) -> None:
    """bash runs the script's header (comments and directives, up to its first
    command, `set -eo pipefail`): no line of it may execute anything."""
    head = script.split("\nset -eo pipefail\n")[0]
    mark = tmp / "pwned"
    r = subprocess.run(["bash", "-c", head], cwd=tmp, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and not mark.exists(), (head, r.stderr)


@pytest.mark.parametrize("sched", ["slurm", "sge"])
@pytest.mark.parametrize("evil", ["\ntouch pwned #", "\rtouch pwned #", "\x0btouch pwned #", "\u2028touch pwned #"])
def test_newline_in_cluster_name_or_config_path_stays_in_the_comment(sched: str, evil: str, tmp_path: Path) -> None:
    source = f"/home/u/conf{evil}/shardship.toml [cluster.hpc{evil}] + [train]"
    script = _script(sched, name=f"hpc{evil}", source=source)
    _header_runs_nothing(script, tmp_path)
    assert not any(ln.lstrip().startswith("touch") for ln in script.splitlines())


@pytest.mark.parametrize("sched, key", [("slurm", "partition"), ("slurm", "account"), ("slurm", "constraint"),
                                        ("slurm", "gres"), ("sge", "project"), ("sge", "queue"), ("sge", "gpu_c")])
@pytest.mark.parametrize("evil", ["\ntouch pwned", "x\n", "\x07", "\t"])
def test_control_characters_in_a_directive_are_refused_by_key(sched: str, key: str, evil: str) -> None:
    from shardship.errors import ShardshipError

    with pytest.raises(ShardshipError, match=rf"^{key} .*control character") as e:
        _script(sched, **{key: f"gpu{evil}"})
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("sched", ["slurm", "sge"])
def test_newline_in_the_remote_directory_is_refused_not_rendered(sched: str) -> None:
    from shardship.errors import ShardshipError

    with pytest.raises(ShardshipError, match="control character") as e:
        _script(sched, root="/scratch/u/run\ntouch pwned")
    assert "\n" not in str(e.value)
