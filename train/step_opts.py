"""How the training step runs: [train] channels_last and compile (issue 40.4).

    model, net: the caller keeps two references. `model` is the policy itself: what
    EMA copies, the optimizer steps, clip_grad_norm_ measures and checkpoints save
    (its state_dict keys never change here). `net` is what computes the loss,
    `net(batch)`: `model`, its DDP wrapper, or either compiled. torch.compile's
    wrapper names every key "_orig_mod.<key>", so it is never what gets saved.

channels_last (CUDA and CPU; not MPS, unmeasured there): the stack preset's ResNet18
weights and its prepared images in NHWC memory. cuDNN's bf16/fp16 convolutions run
NHWC natively on tensor cores (A100, H100/H200); NCHW ones pay layout transposes
around the kernels. A CPU (oneDNN) gains too: bench/step.py on a 2-core AMD EPYC,
torch 2.13, batch 16 at 224x224, eager: 19.3 samples/s against 15.8 in NCHW
(bench/results/step.csv); at 96x96, batch 8: 69.8 against 63.1 (step_96.csv). The `shardship` presets' small
CNN (GroupNorm) keeps NCHW: nothing was measured for it.

compile: torch.compile (inductor) of `net`, with `fallback_random` so the step draws
the same random numbers as eager (noise, timesteps, crops, jitter from torch's global
RNG: a run resumed with compile on or off draws the same). Compilation happens at
the first call: where torch.compile is missing or that first call fails (no C++
compiler, no Triton, an unsupported Python), one warning line and the step runs
uncompiled; the RNG state is put back first, so the fallback step draws what an
eager step would have. A failure compiling the backward graph (AOTAutograd compiles
it at the first backward) is not caught here. Under DDP compile the DDP wrapper
(torch's documented order: DDPOptimizer splits the graph at gradient buckets)."""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from train.policy_stack import StackObsEncoder

Warn = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def channels_last_wanted(device: torch.device, enabled: bool) -> bool:
    """[train] channels_last applies on CUDA and CPU, where it was measured faster (see
    the module docstring); MPS keeps NCHW."""
    return bool(enabled) and device.type in ("cuda", "cpu")


def to_channels_last(model: nn.Module) -> int:
    """The stack encoders of `model` (ResNet18 weights and prepared images) in NHWC
    memory, in place: the same Parameter objects, so an optimizer made before still
    holds them (make EMA and the optimizer after, so their copies and state share the
    layout). Returns how many encoders were converted (0: nothing here benefits)."""
    n = 0
    for m in model.modules():
        if isinstance(m, StackObsEncoder):
            m.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # valid; not in the stubs
            m.memory_format = torch.channels_last
            n += 1
    return n


def _rng_states(device: torch.device | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    cuda = torch.cuda.get_rng_state(device) if device is not None and device.type == "cuda" else None
    return torch.random.get_rng_state(), cuda


def _set_rng_states(states: tuple[torch.Tensor, torch.Tensor | None], device: torch.device | None) -> None:
    torch.random.set_rng_state(states[0])
    if states[1] is not None and device is not None:
        torch.cuda.set_rng_state(states[1], device)


def _one_line(e: BaseException) -> str:
    """The exception's first line (and the next one where the first only introduces it,
    as dynamo's "backend='inductor' raised:" does), at most 240 characters."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    text = " ".join(lines[:2]) if len(lines) > 1 and lines[0].endswith(":") else (lines[0] if lines else "")
    return f"{type(e).__name__}: {text}"[:240].rstrip(": ")


class CompiledStep(nn.Module):
    """Calls the compiled module; if its first call raises, says so in one line and
    calls the eager one from then on. Holds both in a tuple, not as submodules: it has
    no parameters or state of its own (train()/eval() go to `model`, not here)."""

    def __init__(self, compiled: Callable[..., Any], eager: nn.Module, device: torch.device | None,
                 warn: Warn = _stderr):
        super().__init__()
        self._calls: tuple[Callable[..., Any], nn.Module] = (compiled, eager)
        self._device = device
        self._warn = warn
        self.first = True
        self.fell_back = False

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not self.first:
            return self._calls[0](*args, **kwargs)
        rng = _rng_states(self._device)
        try:
            out = self._calls[0](*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - any compiler failure: run eager instead
            _set_rng_states(rng, self._device)
            self._warn(f"warning: torch.compile failed at the first step ({_one_line(e)}); training uncompiled")
            self._calls = (self._calls[1], self._calls[1])
            self.fell_back = True
            out = self._calls[0](*args, **kwargs)
        self.first = False
        return out


def compile_net(net: nn.Module, device: torch.device | None = None, warn: Warn = _stderr,
                backend: str | Callable[..., Any] = "inductor") -> nn.Module:
    """`net` under torch.compile (see the module docstring), or `net` itself with one
    warning line where torch.compile is missing or refuses it."""
    compile_fn = getattr(torch, "compile", None)
    if compile_fn is None:
        warn(f"warning: torch {torch.__version__} has no torch.compile; training uncompiled")
        return net
    try:
        options = {"fallback_random": True} if backend == "inductor" else None
        compiled = compile_fn(net, backend=backend, options=options)
    except Exception as e:  # noqa: BLE001 - e.g. an unsupported Python version
        warn(f"warning: torch.compile unavailable ({_one_line(e)}); training uncompiled")
        return net
    return CompiledStep(compiled, net, device, warn)


def apply_step_options(model: nn.Module, device: torch.device, channels_last: bool, compile_: bool,
                       net: nn.Module | None = None, warn: Warn = _stderr) -> tuple[nn.Module, str]:
    """[train] channels_last and compile for `model`, already on `device`. Returns
    (the module to call for the loss, one line saying how it runs). `net`: what runs
    the loss when not `model` itself (its DDP wrapper); the caller saves `model`,
    runs the returned module. Call it before EMA, the optimizer and a resumed state are
    made or loaded, so they take the parameters' layout."""
    parts = []
    if channels_last_wanted(device, channels_last) and to_channels_last(model):
        parts.append("channels-last")
    run = model if net is None else net
    if compile_:
        run = compile_net(run, device, warn)
        parts.append("compiled" if isinstance(run, CompiledStep) else "compile unavailable")
    return run, ", ".join(parts) or "eager"
