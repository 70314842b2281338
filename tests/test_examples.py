"""examples/own_loop.py, the README's "own training loop" API, run on packed
synthetic sessions: its loop trains and resumes, and it calls a `train run`
checkpoint's policy."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.datasets import make_packed

ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    return env


def _run(*args: str) -> str:
    res = subprocess.run([sys.executable, *args], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout


@pytest.mark.timeout(600)
def test_own_loop_example_trains_resumes_and_calls_a_checkpoint(tmp_path: Path) -> None:
    packed = make_packed(tmp_path, sessions=3, frames=40, seed=1)
    out = tmp_path / "own"
    first = _run("examples/own_loop.py", "--data", str(packed), "--out", str(out), "--steps", "3", "--workers", "0")
    assert "own loop: 3 steps" in first
    again = _run("examples/own_loop.py", "--data", str(packed), "--out", str(out), "--steps", "2", "--workers", "1",
                 "--resume")
    assert "own loop: 5 steps" in again and "reader at epoch 0 sample 40" in again  # 5 steps x 8 samples

    run = tmp_path / "run"
    _run("-m", "train", "run", "--data", str(packed), "--out", str(run), "--model", "tiny", "--steps", "2",
         "--batch-size", "4", "--num-workers", "0", "--warmup", "0", "--val-every", "0")
    called = _run("examples/own_loop.py", "--data", str(packed), "--steps", "0", "--checkpoint", str(run / "last.pt"))
    assert "action chunk (8, 16, 13)" in called and "position error" in called


@pytest.mark.timeout(600)
def test_lightning_example_takes_hydra_overrides_checkpoints_and_resumes_from_last(tmp_path: Path) -> None:
    """examples/lightning_train.py on one CPU process: `a.b=v` overrides, last.ckpt, and a second
    run with more epochs resumes from it (ckpt_path="last"), not from step 0; what it refuses."""
    pytest.importorskip("pytorch_lightning")
    out = tmp_path / "lit"
    env = {**_env(), "SHARDSHIP_OUT": str(out)}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "examples/lightning_train.py", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)

    first = run("trainer.max_epochs=1", "data.batch_size=16", "data.size=160")
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    assert "lightning: rank 0/1 on" in first.stdout and "world size 1, starting at global step 0" in first.stdout
    assert "done at global step 10 epoch 1" in first.stdout, first.stdout
    assert (out / "last.ckpt").is_file() and (out / "metrics.csv").is_file()
    again = run("trainer.max_epochs=2", "data.batch_size=16", "data.size=160", "+trainer.max_steps=15")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "starting at global step 10 epoch 1" in again.stdout, again.stdout + again.stderr[-2000:]
    assert "done at global step 15" in again.stdout, again.stdout
    bad = run("trainer.max_epoch=1")
    assert bad.returncode != 0 and "key 'trainer.max_epoch' is not in the config (add it with +trainer.max_epoch)" \
        in bad.stderr, bad.stderr[-2000:]
