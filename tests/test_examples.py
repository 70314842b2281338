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
