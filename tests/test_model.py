"""The diffusion policy: shapes, masking, schedule, sampling, augmentation, the
rotation metric, and the sizes `packer budget` relies on (checked against a real
torch.save of the trainer's checkpoint payload)."""
from __future__ import annotations

import copy
import io
import math

import numpy as np
import pytest
import torch

from train.evaluate import chunk_errors, rot6d_to_matrix, rotation_error_deg
from train.model import (
    DiffusionPolicy,
    checkpoint_bytes,
    model_config,
    noise_scheduler,
    parameter_count,
    random_shift,
)
from train.trainer import EMA, TrainConfig, checkpoint_payload, lr_lambda, make_optimizer, make_scaler, rng_state

TINY = dict(obs_size=32, enc_channels=[8, 16, 32], embed_dim=32, proprio_embed=8, time_embed=16,
            unet_dims=[16, 32], diffusion_steps=20, ddim_steps=4, action_dim=13, proprio_dim=4, horizon=16)


def _batch(b: int = 4, horizon: int = 16, d: int = 13, j: int = 4, size: int = 48) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "image": torch.randint(0, 256, (b, size, size, 3), dtype=torch.uint8, generator=g),
        "proprio": torch.randn(b, j, generator=g),
        "action": torch.randn(b, horizon, d, generator=g),
        "action_mask": torch.ones(b, horizon),
        "weight": torch.ones(b),
    }


def test_model_config_ignores_other_train_keys_and_reads_model_table() -> None:
    cfg = model_config({"batch_size": 8, "lr": 1.0, "obs_size": 64, "model": {"unet_dims": [8, 16]}})
    assert cfg["obs_size"] == 64 and cfg["unet_dims"] == [8, 16]
    assert "batch_size" not in cfg


@pytest.mark.parametrize("horizon", [16, 7])
def test_loss_backward_and_sample_shapes(horizon: int) -> None:
    torch.manual_seed(0)
    m = DiffusionPolicy({**TINY, "horizon": horizon})
    b = _batch(horizon=horizon)
    loss = m(b)
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None for p in m.parameters())
    m.eval()
    out = m.sample(b["image"], b["proprio"], generator=torch.Generator().manual_seed(1))
    assert out.shape == (4, horizon, 13)
    again = m.sample(b["image"], b["proprio"], generator=torch.Generator().manual_seed(1))
    assert torch.equal(out, again), "DDIM with a fixed generator must be deterministic"


def test_padding_and_masked_steps_do_not_count() -> None:
    m = DiffusionPolicy(TINY).eval()  # eval: no random-shift augmentation
    b = _batch()
    b["weight"][1] = 0.0
    b["action_mask"][0, 10:] = 0.0
    base = m.loss_terms(b, generator=torch.Generator().manual_seed(3))
    b2 = {k: v.clone() for k, v in b.items()}
    b2["action"][1] += 100.0  # a padding sample (GroupNorm is per sample: no leak into the others)
    other = m.loss_terms(b2, generator=torch.Generator().manual_seed(3))
    assert torch.allclose(base[0], other[0]) and torch.equal(base[1], other[1])
    assert base[1].item() == 3 * 16 - 6  # steps past the session end carry no weight
    b2["action"][2] += 1.0  # a real sample does count
    assert not torch.allclose(m.loss_terms(b2, generator=torch.Generator().manual_seed(3))[0], base[0])


def test_normaliser_roundtrip_and_constant_dims() -> None:
    m = DiffusionPolicy(TINY)
    stats = {"action": {"mean": list(range(13)), "std": [0.0] + [2.0] * 12},
             "proprio": {"mean": [1, 2, 3, 4], "std": [1, 1, 1, 1]}}
    m.set_normaliser(stats)
    assert m.action_std[0].item() == 1.0  # a constant dimension must not divide by zero
    assert m.normaliser()["action_mean"] == [float(i) for i in range(13)]
    m2 = DiffusionPolicy(TINY)
    m2.load_state_dict(m.state_dict())
    assert torch.equal(m2.action_mean, m.action_mean), "the normaliser travels with the weights"


def test_diffusers_schedule_round_trip() -> None:
    """diffusers' DDPM (squaredcos_cap_v2) noises a chunk with the cosine alphas, and
    one DDPM / DDIM step from a perfect noise prediction lands back on the chunk's path."""
    cfg = model_config(TINY, diffusion_steps=100)
    ddpm = noise_scheduler(cfg, "ddpm")
    ac = ddpm.alphas_cumprod
    assert ac.shape == (100,) and 0.99 < ac[0] <= 1 and ac[-1] < 1e-3 and torch.all(ac[1:] < ac[:-1])
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(4, 16, 13, generator=g)
    noise = torch.randn(4, 16, 13, generator=g)
    t = torch.tensor([0, 10, 50, 99])
    xt = ddpm.add_noise(x0, noise, t)
    assert xt.shape == x0.shape
    a = ac[t].view(4, 1, 1)
    assert torch.allclose(xt, a.sqrt() * x0 + (1 - a).sqrt() * noise, atol=1e-5)
    for kind, n in (("ddpm", 100), ("ddim", 10)):
        s = noise_scheduler(cfg, kind)
        s.set_timesteps(n)
        assert len(s.timesteps) == n and int(s.timesteps[0]) == 99 and list(s.timesteps) == sorted(s.timesteps)[::-1]
        t0 = int(s.timesteps[-1])
        last = s.step(noise[:1], t0, ddpm.add_noise(x0[:1], noise[:1], torch.tensor([t0])),
                      generator=torch.Generator().manual_seed(1))
        assert last.prev_sample.shape == (1, 16, 13)
        assert torch.allclose(last.pred_original_sample, x0[:1].clamp(-5, 5), atol=1e-3), kind


def test_lr_warmup_then_cosine() -> None:
    f = lr_lambda(10, 110, 0.1)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(10) == pytest.approx(1.0) and f(60) == pytest.approx(0.55) and f(110) == pytest.approx(0.1)
    assert f(500) == pytest.approx(0.1)


def test_random_shift_moves_by_whole_pixels_within_pad() -> None:
    torch.manual_seed(0)
    x = torch.zeros(16, 1, 20, 20)
    x[:, :, 10, 10] = 1.0
    y = random_shift(x, 3)
    assert y.shape == x.shape
    for i in range(16):
        r, c = divmod(int(y[i, 0].argmax()), 20)
        assert abs(r - 10) <= 3 and abs(c - 10) <= 3
        assert y[i, 0, r, c].item() == pytest.approx(1.0, abs=1e-4), "shift must be an integer pixel shift"
    assert len({int(y[i, 0].argmax()) for i in range(16)}) > 1, "shifts must differ per sample"


def test_rotation_error_and_chunk_errors() -> None:
    def rz(deg: float) -> np.ndarray:
        a = math.radians(deg)
        return np.array([[math.cos(a), -math.sin(a), 0], [math.sin(a), math.cos(a), 0], [0, 0, 1]])

    def six(r: np.ndarray) -> np.ndarray:
        return np.concatenate([r[:, 0], r[:, 1]])

    assert np.allclose(rot6d_to_matrix(six(rz(30))), rz(30))
    assert rotation_error_deg(six(rz(30)), six(rz(-60))) == pytest.approx(90.0)
    true = np.zeros((2, 3, 13))
    pred = np.zeros((2, 3, 13))
    true[..., 3:9] = six(np.eye(3))
    pred[..., 3:9] = six(rz(10))
    pred[..., 0] = 0.03  # 3 cm off in x
    mask = np.ones((2, 3))
    mask[1, 2] = 0
    res = chunk_errors(pred, true, mask)
    assert res["position_error_cm"] == pytest.approx(3.0)
    assert res["rotation_error_deg"] == pytest.approx(10.0)
    assert res["samples"] == 2 and len(res["position_error_cm_per_step"]) == 3


@pytest.mark.parametrize("cfg", [TINY, {**TINY, "unet_dims": [16, 32, 64], "proprio_dim": 0, "action_dim": 9}])
def test_parameter_count_and_checkpoint_bytes_match_reality(cfg: dict) -> None:
    torch.manual_seed(0)
    model = DiffusionPolicy(cfg)
    assert parameter_count(cfg) == sum(p.numel() for p in model.parameters())
    tc = TrainConfig(model=cfg)
    ema = EMA(model, 0.99)
    opt = make_optimizer(model, tc, torch.device("cpu"))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(2, 10, 0.1))
    b = _batch(j=cfg["proprio_dim"], d=cfg["action_dim"])
    model(b).backward()
    opt.step()
    sched.step()
    ema.update(model)
    state = checkpoint_payload(
        model, ema, opt, sched, make_scaler(False), step=1, total_steps=10,
        reader={"seed": 0, "epoch": 0, "consumed": 8, "n_samples": 100, "fingerprint": "0" * 16},
        rngs=[copy.deepcopy(rng_state(torch.device("cpu"))) for _ in range(8)], world_size=8, global_batch=32,
        cfg=tc, best_val=None,
        sessions=(["a", "b"], ["c"]), data={"root": "/x"})
    buf = io.BytesIO()
    torch.save(state, buf)
    real = len(buf.getvalue())
    est = checkpoint_bytes(cfg)
    assert abs(est - real) <= 0.02 * real + 64 * 1024, (est, real)
    assert est >= real - 16 * 1024, "an underestimate could blow the quota"
