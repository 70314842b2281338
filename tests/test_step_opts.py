"""The training step's speed-ups (issue 40.4): the frozen ResNet18 body under
torch.no_grad gives the loss and gradients of the old autograd path; channels-last
memory (CUDA and CPU) gives the same loss; torch.compile gives the same loss
and gradients and leaves the saved state_dict alone, or falls back in one line."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import torch.nn as nn

from train import step_opts
from train.backbone import ResNet18, features, resnet18, torchvision_available
from train.model import DiffusionPolicy
from train.step_opts import CompiledStep, apply_step_options, compile_net, to_channels_last

STACK = {"preset": "stack", "action_dim": 13, "proprio_dim": 13, "horizon": 16, "backbone_weights": "none",
         "diffusion_steps": 10}
CPU = torch.device("cpu")


def _batch(b: int, size: int, n: int = 2, seed: int = 0) -> dict[str, torch.Tensor]:
    """As the reader gives it: (B, N, 3, H, W) uint8, a permuted view of (B, N, H, W, 3)."""
    g = torch.Generator().manual_seed(seed)
    img = torch.randint(0, 256, (b, n, size, size, 3), dtype=torch.uint8, generator=g).permute(0, 1, 4, 2, 3)
    return {"image": img, "proprio": torch.randn(b, n, 13, generator=g), "action": torch.randn(b, 16, 13, generator=g),
            "action_mask": torch.ones(b, 16), "weight": torch.ones(b)}


def _model(size: int, seed: int = 0, **over: Any) -> DiffusionPolicy:
    torch.manual_seed(seed)
    return DiffusionPolicy({**STACK, "obs_size": size, "image_size": size, **over}).train()


def _step(net: Any, model: nn.Module, batch: dict[str, torch.Tensor],
          seed: int = 1) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(loss, gradients of the trainable parameters) of one forward+backward."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # noise, timesteps, crop offsets, jitter: the same draws on both sides
    loss = net(batch)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@contextmanager
def autograd_body(model: DiffusionPolicy) -> Iterator[None]:
    """The path before issue 40.4: the whole backbone called with autograd enabled
    (its BatchNorm already in eval: train() ran while still frozen)."""
    enc = model.obs_encoder
    assert enc is not None and enc.frozen and not enc.backbone.training
    enc.frozen = False
    try:
        yield
    finally:
        enc.frozen = True


def _assert_same(a: tuple[torch.Tensor, dict[str, torch.Tensor]], b: tuple[torch.Tensor, dict[str, torch.Tensor]],
                 rtol: float = 0.0, atol: float = 0.0) -> None:
    assert torch.allclose(a[0], b[0], rtol=rtol, atol=atol), (a[0].item(), b[0].item())
    assert a[1].keys() == b[1].keys()
    for k in a[1]:
        assert torch.allclose(a[1][k], b[1][k], rtol=rtol, atol=atol), (k, (a[1][k] - b[1][k]).abs().max().item())


@pytest.mark.parametrize("use_torchvision", [False, True])
def test_features_then_fc_is_the_backbone(use_torchvision: bool) -> None:
    if use_torchvision and not torchvision_available():
        pytest.skip("torchvision does not import here")
    torch.manual_seed(0)
    net = resnet18("batch", use_torchvision=use_torchvision).eval()
    assert isinstance(net, ResNet18) != use_torchvision
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(net.fc(features(net, x)), net(x))


def test_frozen_body_under_no_grad_gives_the_same_loss_and_gradients() -> None:
    m = _model(32)
    batch = _batch(3, 40)  # 40 -> 32: the resize path; training: crop and jitter too
    bn = m.obs_encoder.backbone.bn1
    stats = bn.running_mean.clone()
    with autograd_body(m):
        old = _step(m, m, batch)
    new = _step(m, m, batch)
    _assert_same(old, new)  # exactly: the same kernels, only autograd's bookkeeping differs
    assert "obs_encoder.backbone.fc.weight" in new[1] and "unet.input_conv.weight" in new[1]
    body = [k for k in new[1] if k.startswith("obs_encoder.backbone.") and not k.startswith("obs_encoder.backbone.fc.")]
    assert not body, "the body trains nothing"
    assert torch.equal(bn.running_mean, stats) and not bn.training
    # unfrozen (fine-tuning) still trains the body
    mt = _model(32, freeze_backbone=False)
    _, grads = _step(mt, mt, batch)
    assert "obs_encoder.backbone.conv1.weight" in grads


def test_channels_last_same_loss_and_state_dict_keys() -> None:
    batch = _batch(2, 32)
    m = _model(32)
    keys = list(m.state_dict())
    ref = _step(m, m, batch)
    assert m.obs_encoder.memory_format is None and m.obs_encoder.prepare(batch["image"]).is_contiguous()
    net, how = apply_step_options(m, CPU, channels_last=True, compile_=False)
    assert net is m and how == "channels-last"
    assert m.obs_encoder.backbone.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    assert m.obs_encoder.prepare(batch["image"]).is_contiguous(memory_format=torch.channels_last)
    _assert_same(ref, _step(m, m, batch), rtol=1e-4, atol=1e-5)
    assert list(m.state_dict()) == keys
    assert to_channels_last(DiffusionPolicy({"preset": "tiny"})) == 0, "the small CNN presets keep NCHW"
    m2 = _model(32)
    assert apply_step_options(m2, torch.device("mps"), True, False) == (m2, "eager"), "MPS: not measured, NCHW"
    assert m2.obs_encoder.memory_format is None


@pytest.mark.timeout(120)
def test_compile_same_loss_and_state_dict_keys() -> None:
    """torch.compile's graph capture and autograd (aot_eager: the tracing without
    inductor's C++ compile, seconds instead of minutes; the inductor run is below)."""
    batch = _batch(2, 32)
    m = _model(32)
    keys = list(m.state_dict())
    ref = _step(m, m, batch)
    net = compile_net(m, CPU, backend="aot_eager")
    assert isinstance(net, CompiledStep) and list(net.state_dict()) == [] and not list(net.parameters())
    got = _step(net, m, batch)
    assert not net.fell_back
    _assert_same(ref, got, rtol=1e-5, atol=1e-6)
    _assert_same(ref, _step(net, m, batch), rtol=1e-5, atol=1e-6)  # second call: the compiled graph alone
    assert list(m.state_dict()) == keys


def test_compile_failure_at_the_first_call_falls_back_in_one_line(capfd: pytest.CaptureFixture[str]) -> None:
    def broken(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        raise RuntimeError("no C++ compiler here\nsecond line of a long report")

    batch = _batch(2, 32)
    m = _model(32)
    ref = _step(m, m, batch)
    net = compile_net(m, CPU, backend=broken)
    got = _step(net, m, batch)  # the RNG was put back: the eager step draws what it would have
    assert isinstance(net, CompiledStep) and net.fell_back
    _assert_same(ref, got)
    _assert_same(ref, _step(net, m, batch))
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: torch.compile failed at the first step"), err
    assert "no C++ compiler here" in err[0] and "Traceback" not in err[0]


def test_no_torch_compile_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    lines: list[str] = []
    monkeypatch.delattr(torch, "compile")
    m = _model(32)
    net, how = apply_step_options(m, CPU, channels_last=False, compile_=True, warn=lines.append)
    assert net is m and how == "compile unavailable" and len(lines) == 1 and "no torch.compile" in lines[0]
    monkeypatch.setattr(torch, "compile", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("Python 3.99")),
                        raising=False)
    net, _ = apply_step_options(m, CPU, channels_last=False, compile_=True, warn=lines.append)
    assert net is m and len(lines) == 2 and "Python 3.99" in lines[1]
    assert step_opts.channels_last_wanted(torch.device("cuda", 0), True)
    assert not step_opts.channels_last_wanted(torch.device("cuda", 0), False)
    assert not step_opts.channels_last_wanted(torch.device("mps"), True)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_inductor_compile_on_cpu_same_loss() -> None:
    """The real thing on CPU: inductor (C++ kernels). 70 s (a quiet machine) to over 2 minutes
    on 2 cores with an empty inductor cache (compile time, whatever the image size); ~20 s warm."""
    batch = _batch(2, 64)
    m = _model(64)
    keys = list(m.state_dict())
    ref = _step(m, m, batch)
    lines: list[str] = []
    net, how = apply_step_options(m, CPU, channels_last=True, compile_=True, warn=lines.append)
    assert how == "channels-last, compiled" and isinstance(net, CompiledStep)
    got = _step(net, m, batch)
    assert not lines and not net.fell_back, lines
    _assert_same(ref, got, rtol=1e-4, atol=1e-5)  # fallback_random: the same noise and crops as eager
    assert list(m.state_dict()) == keys and all(k.startswith("_orig_mod.") for k in net._calls[0].state_dict())
