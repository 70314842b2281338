"""The job's environment, checked before it queues (issue 21.6): a cluster whose `setup`
gives a Python too old for the shipped source (a wrapper that reports 3.6, as an old
module would), and the stack preset's ResNet18 weights missing where the job looks,
or shipped once from here. A `local:` cluster: the same login-bash probe as over SSH."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from shardship.config import ClusterConfig, Config
from tests.conftest import ROOT
from train.backbone import HUB_FILE, HUB_URL
from train.jobs import checks
from train.jobs.remote import connected
from train.jobs.submit import submit_job

OLD_PYTHON = f"""#!/bin/sh
# an old python3 as a module would give: it reports 3.6.15 to whatever runs on it
exec {sys.executable} -c 'import sys; sys.version = "3.6.15 (default) [GCC 8.5.0]"; \\
sys.version_info = (3, 6, 15, "final", 0); exec(compile(sys.stdin.read(), "<stdin>", "exec"))'
"""


def write_config(tmp: Path, setup: list[str], train: str = "") -> Path:
    home = tmp / "home"
    (home / "shardship").mkdir(parents=True, exist_ok=True)
    lines = ", ".join(repr(s).replace("'", '"') for s in setup)
    cfg = tmp / "shardship.toml"
    cfg.write_text(f'[paths]\noutputs = "{tmp / "outputs"}"\npacked = "{tmp / "none"}"\n'
                   f'[cluster.old]\nhost = "local:{home}"\nscheduler = "slurm"\ngpus = 0\ncpus = 2\nmem = "4G"\n'
                   f'time = "00:10:00"\nsetup = [{lines}]\n{train}')
    return cfg


def train_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "train", *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def test_python_36_through_setup_fails_doctor_and_dry_run(tmp_path: Path) -> None:
    bin_dir = tmp_path / "old-module" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python3").write_text(OLD_PYTHON)
    (bin_dir / "python3").chmod(0o755)
    cfg = write_config(tmp_path, [f"export PATH={bin_dir}:$PATH"])

    r = train_cli("doctor", "--config", str(cfg))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stdout + r.stderr
    (line,) = [ln for ln in r.stdout.splitlines() if ln.strip().startswith("fail  python")]
    assert "3.6.15" in line and "needs Python >= 3.10" in line and "setup" in line, line

    r = train_cli("submit", "--dry-run", "--config", str(cfg), "--no-probe")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "error: python: the job's python is 3.6.15" in r.stderr and "would refuse" in r.stderr, r.stderr


def _stack_cfg(tmp: Path, remote_torch: Path) -> tuple[Config, ClusterConfig]:
    from shardship.config import load_config

    cfg = load_config(write_config(tmp, [f"export TORCH_HOME={remote_torch}"],
                                   '[train]\nbatch_size = 2\nnum_workers = 1\n[train.model]\npreset = "stack"\n'))
    return cfg, cfg.cluster("old")


def test_stack_weights_missing_everywhere_is_an_early_error(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, [f"export TORCH_HOME={tmp_path / 'cluster-torch'}"],
                       '[train.model]\npreset = "stack"\n')
    here = {"TORCH_HOME": str(tmp_path / "my-torch")}
    r = train_cli("submit", "--dry-run", "--config", str(cfg), "--no-probe", env=here)
    assert r.returncode == 2, r.stderr
    (line,) = [ln for ln in r.stderr.splitlines() if ln.startswith("error: weights: ResNet18 weights")]
    assert str(tmp_path / "cluster-torch" / "hub" / "checkpoints" / HUB_FILE) in line and HUB_URL in line, line
    assert str(tmp_path / "my-torch" / "hub" / "checkpoints" / HUB_FILE) in line, line
    r = train_cli("doctor", "--config", str(cfg), env=here)
    assert any(ln.strip().startswith("fail  weights") for ln in r.stdout.splitlines()), r.stdout


def test_stack_weights_on_the_cluster_are_found(tmp_path: Path) -> None:
    remote_torch = tmp_path / "cluster-torch"
    (remote_torch / "hub" / "checkpoints").mkdir(parents=True)
    (remote_torch / "hub" / "checkpoints" / HUB_FILE).write_bytes(b"w" * 1000)
    cfg, cl = _stack_cfg(tmp_path, remote_torch)
    res = submit_job(cfg, cl, dry_run=True, probe=False, bench_csv=tmp_path / "none.csv")
    assert not [f for f in checks.errors(res.plan.findings) if f.check in ("weights", "python")]
    assert res.plan.weights is None and "backbone_weights" not in res.plan.train_toml


def test_stack_weights_here_are_shipped_once_and_counted(tmp_path: Path, monkeypatch) -> None:
    from train.jobs import jobenv

    mine = tmp_path / "my-torch" / "hub" / "checkpoints" / HUB_FILE
    mine.parent.mkdir(parents=True)
    mine.write_bytes(os.urandom(3 * 2**20))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "my-torch"))
    cfg, cl = _stack_cfg(tmp_path, tmp_path / "cluster-torch")
    res = submit_job(cfg, cl, dry_run=True, probe=False, bench_csv=tmp_path / "none.csv")
    w = res.plan.weights
    assert w is not None and w.local == mine and w.size == 3 * 2**20
    assert not [f for f in checks.errors(res.plan.findings) if f.check == "weights"]
    assert f'backbone_weights = "{w.remote}"' in res.plan.train_toml  # the job reads the shipped copy
    assert any("less 3 MiB shipped with the job" in n for n in res.plan.notes), res.plan.notes
    assert not Path(w.remote).exists()  # a dry run ships nothing
    with connected(cl, None, False) as remote:
        assert jobenv.ship_weights(remote, w) is True
        assert jobenv.ship_weights(remote, w) is False  # content-addressed: once
    assert Path(w.remote).read_bytes() == mine.read_bytes()
    assert not list(Path(w.remote).parent.glob("*.part"))


def test_budget_counts_the_stack_weights_and_takes_cluster(tmp_path: Path) -> None:
    from tests.datasets import make_packed

    out = make_packed(tmp_path / "data", sessions=1, frames=20, seed=1)
    cfg = tmp_path / "stack.toml"
    cfg.write_text('[train.model]\npreset = "stack"\n')
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TORCH_HOME": str(tmp_path / "none")}
    for flag in ("--cluster", "--remote"):  # --remote: the old name, still accepted, with a warning
        r = subprocess.run([sys.executable, "-m", "packer", "budget", "--config", str(cfg), "--out", str(out),
                            flag, f"local:{home}"], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode in (0, 3) and "Traceback" not in r.stderr, r.stderr
        (row,) = [ln for ln in r.stdout.splitlines() if ln.startswith("ResNet18 weights")]
        assert "44.7 MB" in row or "44.7 MiB" in row, row
        assert f"on local:{home}" in r.stdout, r.stdout
        assert ("--remote is deprecated" in r.stderr) == (flag == "--remote"), r.stderr
