"""The `stack` preset (the user's policy) and what came with it: parameter counts
against the published 17.5 M / 6.4 M, the built-in ResNet18's torchvision state-dict
layout, pretrained-weight loading without downloads, obs-window inputs, TensorBoard
event files, device selection, the warmup warning, the user's per-session eval
numbers, and `python -m train run --model stack` end to end on CPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from shardship.errors import ShardshipError
from tests.datasets import make_packed
from train import ddp
from train.backbone import HUB_FILE, ResNet18, load_imagenet, torchvision_available, weights_path
from train.config import TrainConfig
from train.evaluate import chunk_errors
from train.model import DiffusionPolicy, parameter_counts
from train.policy_stack import color_jitter, frames, random_crop
from train.state import warmup_warning
from train.tblog import ScalarLog

ROOT = Path(__file__).resolve().parent.parent
# the published model (docs/results_v2.md): 13-D proprio per frame, 13-D actions, 2 frames
STACK = {"preset": "stack", "action_dim": 13, "proprio_dim": 13, "horizon": 16}
SMALL_STACK = {**STACK, "obs_size": 32, "diffusion_steps": 10, "backbone_weights": "none"}  # fast forward passes


def torchvision_resnet18_keys() -> list[str]:
    """torchvision.models.resnet18().state_dict() key names, as documented by its
    source (conv1/bn1, layer1..4 of two BasicBlocks, downsample on layers 2-4, fc)."""
    bn = ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]
    keys = ["conv1.weight"] + [f"bn1.{b}" for b in bn]
    for layer in range(1, 5):
        for block in range(2):
            p = f"layer{layer}.{block}"
            keys += [f"{p}.conv1.weight"] + [f"{p}.bn1.{b}" for b in bn]
            keys += [f"{p}.conv2.weight"] + [f"{p}.bn2.{b}" for b in bn]
            if layer > 1 and block == 0:
                keys += [f"{p}.downsample.0.weight"] + [f"{p}.downsample.1.{b}" for b in bn]
    return keys + ["fc.weight", "fc.bias"]


def test_stack_parameter_counts_match_the_published_model() -> None:
    total, trainable = parameter_counts(STACK)
    assert round(total / 1e6, 1) == 17.5, total  # 17,528,397
    assert round(trainable / 1e6, 1) == 6.4, trainable  # 6,351,885: UNet + obs MLP + the ResNet's new fc
    frozen = total - trainable
    assert frozen == 11_689_512 - (512 * 1000 + 1000), "frozen = torchvision ResNet18 without its classifier"
    m = DiffusionPolicy(SMALL_STACK)
    assert (sum(p.numel() for p in m.parameters()), sum(p.numel() for p in m.parameters() if p.requires_grad)) \
        == (total, trainable), "the meta-device count is the real model's"
    # today's data (joints-only proprio): the same model to 0.01 M
    assert abs(parameter_counts({**STACK, "proprio_dim": 4})[1] - trainable) < 10_000


def test_builtin_resnet18_has_torchvision_layout_and_loads_its_weights(tmp_path: Path) -> None:
    net = ResNet18()
    sd = net.state_dict()
    assert list(sd) == torchvision_resnet18_keys()
    assert sum(p.numel() for p in net.parameters()) == 11_689_512  # torchvision's documented num_params
    if torchvision_available():
        import torchvision

        assert list(torchvision.models.resnet18().state_dict()) == list(sd)
    torch.manual_seed(1)
    donor = ResNet18()
    path = tmp_path / HUB_FILE
    torch.save(donor.state_dict(), path)
    m = DiffusionPolicy({**SMALL_STACK, "backbone_weights": str(path)})
    assert m.load_pretrained() == str(path)
    got = m.obs_encoder.backbone.state_dict()
    for k, v in donor.state_dict().items():
        if not k.startswith("fc."):
            assert torch.equal(got[k], v), k
    assert got["fc.weight"].shape == (64, 512), "the classifier is replaced, not loaded"


def test_missing_weights_are_one_clear_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    assert weights_path("hub") == tmp_path / "torch" / "hub" / "checkpoints" / HUB_FILE
    assert weights_path("none") is None
    with pytest.raises(ShardshipError, match=r"ResNet18 weights not found at .*resnet18-f37072fd.pth.*none"):
        DiffusionPolicy({**SMALL_STACK, "backbone_weights": "hub"}).load_pretrained()
    torch.save(ResNet18().state_dict(), tmp_path / "w.pth")
    with pytest.raises(ShardshipError, match="GroupNorm"):
        load_imagenet(ResNet18(norm=lambda c: torch.nn.GroupNorm(c // 16, c)), str(tmp_path / "w.pth"))


def _window_batch(b: int, n: int, j: int, layout: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    shape = {"nchw": (b, n, 3, 40, 40), "hwc": (b, 40, 40, 3)}[layout]
    return {"image": torch.randint(0, 256, shape, dtype=torch.uint8, generator=g),
            "proprio": torch.randn((b, n, j) if layout == "nchw" else (b, j), generator=g),
            "action": torch.randn(b, 16, 13, generator=g), "action_mask": torch.ones(b, 16), "weight": torch.ones(b)}


@pytest.mark.parametrize("layout, j", [("nchw", 13), ("hwc", 4)])
def test_stack_trains_on_windows_and_single_frames(layout: str, j: int) -> None:
    """(B, 2, 3, H, W) windows with (B, 2, 13) proprio, and today's single-frame
    (B, H, W, 3) + (B, 4) batch (a window of one, repeated)."""
    torch.manual_seed(0)
    m = DiffusionPolicy({**SMALL_STACK, "proprio_dim": j}).train()
    bn = m.obs_encoder.backbone.bn1
    before = bn.running_mean.clone()
    loss = m(_window_batch(3, 2, j, layout))
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.equal(bn.running_mean, before) and not bn.training, "a frozen backbone keeps ImageNet's BN stats"
    assert all(p.grad is None for n, p in m.obs_encoder.backbone.named_parameters() if not n.startswith("fc."))
    assert m.obs_encoder.backbone.fc.weight.grad is not None and m.unet.input_conv.weight.grad is not None
    m.eval()
    b = _window_batch(3, 2, j, layout)
    for sampler in ("ddpm", "ddim"):
        out = m.sample(b["image"], b["proprio"], steps=3, sampler=sampler, generator=torch.Generator().manual_seed(1))
        assert out.shape == (3, 16, 13) and torch.isfinite(out).all()


def test_frames_layouts_and_augmentation_ranges() -> None:
    x = torch.randint(0, 256, (2, 8, 8, 3), dtype=torch.uint8)
    f = frames(x, 2)
    assert f.shape == (2, 2, 3, 8, 8) and torch.equal(f[:, 0], f[:, 1]), "a single frame fills the window"
    assert torch.allclose(f[:, 1], x.permute(0, 3, 1, 2).float() / 255)
    assert frames(torch.rand(2, 3, 3, 8, 8), 2).shape == (2, 2, 3, 8, 8), "the last obs_horizon frames"
    img = torch.rand(6, 3, 20, 20)
    crop = random_crop(img, 20, 1.5)
    assert crop.shape == (6, 3, 20, 20)
    jit = color_jitter(img)
    assert jit.shape == img.shape and jit.min() >= 0 and jit.max() <= 1 and not torch.equal(jit, img)


def test_tensorboard_event_file_has_the_scalar_tags(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = ScalarLog.open(tmp_path)
    log.write({"step": 10, "epoch": 0, "consumed": 320, "loss": 0.5, "lr": 1e-4, "grad_norm": 1.0,
               "samples_per_s": 100.0, "data_wait": 0.1})
    log.write({"step": 10, "val_loss": 0.4})
    log.write({"step": 10, "event": "checkpoint:periodic"})  # not a scalar
    log.close()
    assert list(tmp_path.glob("events.out.tfevents.*"))
    ea = EventAccumulator(str(tmp_path))
    ea.Reload()
    assert set(ea.Tags()["scalars"]) == {"train/loss", "train/lr", "train/grad_norm", "train/samples_per_s",
                                         "train/data_wait", "val/loss"}
    assert [(e.step, e.value) for e in ea.Scalars("val/loss")] == [(10, pytest.approx(0.4))]


def test_device_auto_picks_cuda_then_mps_then_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    if not torch.cuda.is_available() and not ddp.mps_available():
        assert ddp.device_kind("auto") == "cpu" and ddp.pick_device("auto") == torch.device("cpu")
        with pytest.raises(ShardshipError, match="device=mps"):
            ddp.device_kind("mps")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(ddp, "mps_available", lambda: True)
    assert ddp.device_kind("auto") == "mps" and ddp.device_kind("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert ddp.device_kind("auto") == "cuda"
    with pytest.raises(ShardshipError, match="device must be"):
        ddp.device_kind("tpu")


def test_warmup_longer_than_the_run_warns() -> None:
    msg = warmup_warning(TrainConfig(warmup=200), 60)
    assert msg and "warmup 200" in msg and "60 steps" in msg
    assert warmup_warning(TrainConfig(warmup=20), 60) is None


def test_eval_numbers_are_per_session_means_like_the_users() -> None:
    """Two sessions, one with 3 chunks 1 cm off, one with 1 chunk 5 cm off: the
    user's position number is (1 + 5) / 2 = 3 cm, not the chunk mean 2 cm."""
    true = np.zeros((4, 2, 13))
    true[..., 3] = true[..., 7] = 1.0  # identity rotation in 6-D
    pred = true.copy()
    pred[:3, :, 0] += 0.01
    pred[3, :, 0] += 0.05
    pred[:, :, 9:] += 2.0  # 2 deg on every joint
    res = chunk_errors(pred, true, np.ones((4, 2)), np.ones(4, bool), np.array([0, 0, 0, 1]))
    assert res["position_error_cm"] == pytest.approx(2.0)
    assert res["position_cm"] == pytest.approx(3.0) and res["rotation_deg"] == pytest.approx(0.0, abs=1e-3)
    assert res["joint_deg"] == pytest.approx(2.0) and set(res["per_session"]) == {"0", "1"}


@pytest.mark.slow
def test_train_run_model_stack_on_cpu(tmp_path: Path) -> None:
    """`python -m train run --model stack` trains a few steps on CPU (ImageNet weights
    from a local file in the torchvision layout; no download), prints the parameter
    counts and the warmup warning, writes TensorBoard events; `train eval` reports
    the three numbers."""
    data = make_packed(tmp_path / "d", sessions=2, frames=40, seed=0)
    weights = tmp_path / HUB_FILE
    torch.save(ResNet18().state_dict(), weights)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "2"}
    cmd = [sys.executable, "-m", "train", "run", "--data", str(data), "--out", str(out), "--model", "stack",
           "--backbone-weights", str(weights), "--steps", "3", "--batch-size", "4", "--num-workers", "1",
           "--log-every", "1", "--val-every", "0", "--device", "auto"]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "model stack: 17.53 M parameters, 6.35 M trainable (ResNet18 frozen" in r.stdout + r.stderr
    assert "warmup 200 steps >= the run's 3 steps" in r.stderr
    assert list(out.glob("events.out.tfevents.*")) and (out / "last.pt").exists()
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if "loss" in x] == [1, 2, 3] and any("warning" in x for x in lines)
    r = subprocess.run([sys.executable, "-m", "train", "eval", "--data", str(data), "--out", str(out),
                        "--max-samples", "4", "--batch-size", "4", "--num-workers", "1", "--sampler", "ddim",
                        "--ddim-steps", "2"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "per-session means (the user's eval):" in r.stdout
    res = json.loads((out / "eval.json").read_text())
    assert {"position_cm", "rotation_deg", "joint_deg"} <= set(res) and res["sampler"] == "ddim"


def test_wandb_when_enabled_and_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """wandb is optional: a stub module stands in for it; the run id is kept for resume."""
    import types

    calls: list[tuple[str, object]] = []
    run = types.SimpleNamespace(log=lambda vals, step: calls.append(("log", (step, vals))),
                                finish=lambda: calls.append(("finish", None)))
    stub = types.SimpleNamespace(util=types.SimpleNamespace(generate_id=lambda: "abc123"),
                                 init=lambda **kw: calls.append(("init", kw)) or run)
    monkeypatch.setitem(sys.modules, "wandb", stub)
    log = ScalarLog.open(tmp_path, tensorboard=False, wandb=True, project="stack", config=TrainConfig())
    log.write({"step": 5, "loss": 0.25})
    log.close()
    init = dict(calls[0][1])  # type: ignore[call-overload]
    assert init["project"] == "stack" and init["id"] == "abc123" and init["resume"] == "allow"
    assert init["config"]["warmup"] == 200
    assert calls[1] == ("log", (5, {"train/loss": 0.25})) and calls[2][0] == "finish"
    assert (tmp_path / "wandb_id.txt").read_text().strip() == "abc123"
    monkeypatch.setitem(sys.modules, "wandb", None)  # not installed: a warning, no logger
    assert not ScalarLog.open(tmp_path, tensorboard=False, wandb=True).active
