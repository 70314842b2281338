"""`train bench` (the loader, the cache, the model, both together, the choice)
and the same summary in a `train run` log; a run with the frame cache resumes
to the same weights as one that never stopped. Real trainer, real shards, CPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.datasets import make_packed
from train import trainer
from train.checkpoint import load_checkpoint
from train.config import TrainConfig

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
SMALL = {"preset": "tiny", "obs_horizon": 2, "obs_size": 32, "enc_channels": [8, 16], "embed_dim": 32,
         "proprio_embed": 8, "time_embed": 16, "unet_dims": [16, 32], "diffusion_steps": 20, "ddim_steps": 4}


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_packed(tmp_path_factory.mktemp("speed"), sessions=3, frames=40, seed=6, shard_bytes=200_000)


def _cfg(**kw: object) -> TrainConfig:
    base: dict = {"batch_size": 8, "num_workers": 1, "steps": 8, "warmup": 2, "checkpoint_every": 4, "val_every": 0,
                  "log_every": 1, "seed": 4, "device": "cpu", "tensorboard": False, "model": dict(SMALL)}
    return TrainConfig(**{**base, **kw})


@pytest.mark.timeout(300)
def test_a_cached_run_resumes_to_the_weights_of_one_that_never_stopped(packed: Path, tmp_path: Path) -> None:
    whole = trainer.train(packed, tmp_path / "a", _cfg(cache="host"), progress=False)
    assert whole.step == 8
    trainer.train(packed, tmp_path / "b", _cfg(cache="host"), max_steps=4, progress=False)
    again = trainer.train(packed, tmp_path / "b", _cfg(cache="host"), progress=False)
    assert again.step == 8
    a, b = (load_checkpoint(tmp_path / d / "last.pt")["model"] for d in ("a", "b"))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), "the resumed run drifted from the uninterrupted one"
    streamed = trainer.train(packed, tmp_path / "c", _cfg(cache="off"), progress=False)
    assert streamed.step == 8
    c = load_checkpoint(tmp_path / "c" / "last.pt")["model"]
    assert all(torch.equal(a[k], c[k]) for k in a), "the cache changed what the model learned"


@pytest.mark.timeout(300)
def test_a_run_logs_the_speed_summary_after_its_first_minute(packed: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(trainer, "SPEED_AFTER_S", 0.5)  # a minute, for a test
    trainer.train(packed, tmp_path / "out", _cfg(cache="host", steps=40), progress=False)
    text = capsys.readouterr()
    out = text.out + text.err
    assert "speed over the first" in out, out[-2000:]
    for line in ("loader cache: >= ", "model: ", "together: ", "data-wait", "choice: cache = \"host\""):
        assert line in out, (line, out[-2000:])
    rows = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    speed = [r for r in rows if "speed" in r]
    assert len(speed) == 1 and speed[0]["speed"][0].startswith("loader cache:")


@pytest.mark.timeout(400)
def test_train_bench_prints_the_loader_the_cache_the_model_together_and_a_choice(packed: Path,
                                                                                 tmp_path: Path) -> None:
    cfg = tmp_path / "shardship.toml"
    cfg.write_text("[train]\nbatch_size = 8\nnum_workers = 1\n[train.model]\n"
                   + "".join(f"{k} = {json.dumps(v)}\n" for k, v in SMALL.items()))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([PY, "-m", "train", "bench", "--data", str(packed), "--config", str(cfg), "--seconds", "1",
                        "--device", "cpu", "--quiet"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=350)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["machine", "loader streaming", "loader cache", "model", "together",
                                                  "choice"], r.stdout
    assert "CPU cores" in lines[0] and "batch 8" in lines[0]
    for ln in lines[1:4]:
        assert float(ln.split(": ")[1].split(" samples/s")[0].replace(",", "")) > 0, ln
    assert "data-wait" in lines[4] and "choice: cache = \"host\"" in lines[5], r.stdout
    # off: the cache is not used together, and the choice says so
    r = subprocess.run([PY, "-m", "train", "bench", "--data", str(packed), "--config", str(cfg), "--seconds", "1",
                        "--device", "cpu", "--quiet", "--cache", "off"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=350)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "(streaming)" in r.stdout.splitlines()[4] and "choice: cache = \"off\"" in r.stdout, r.stdout


@pytest.mark.timeout(400)
def test_the_gpu_check_script_writes_a_row_per_mode_here_on_the_cpu(packed: Path, tmp_path: Path) -> None:
    """bench/gpu_check.sh as the GPU machine runs it, on this CPU with the tiny preset:
    a row per mode; the nvJPEG mode says why it cannot run here instead of failing."""
    out = tmp_path / "gpu_check.csv"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "GPU_CHECK_CSV": str(out),
           "GPU_CHECK_DEVICE": "cpu", "GPU_CHECK_MODEL": "tiny", "GPU_CHECK_COMBOS": "fp32:off", "PY": PY,
           "GPU_CHECK_BATCH": "8"}
    r = subprocess.run(["bash", "bench/gpu_check.sh", str(packed), "1"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=380)
    assert r.returncode == 0, r.stderr[-3000:]
    import csv

    rows = list(csv.DictReader(out.open()))
    assert [row["mode"] for row in rows] == ["streaming", "host", "gpu", "gpu_decode"], rows
    for row in rows[:3]:
        assert float(row["samples_per_s"]) > 0 and 0 <= float(row["data_wait"]) <= 1, row
        assert row["precision"] == "fp32" and row["compile"] == "off" and row["device"] == "cpu"
    assert rows[0]["feed"].startswith("streaming") and rows[1]["feed"].startswith("host cache")
    assert rows[2]["feed"].startswith("gpu cache")
    assert "no nvJPEG here" in rows[3]["note"] and not rows[3]["samples_per_s"], rows[3]
