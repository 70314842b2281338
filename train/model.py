"""A small conditional diffusion policy, written out in full (no downloads).

    image (uint8, HxWx3) -> resize to obs_size -> CNN encoder -> image feature
    proprio (joints)     -> MLP                               -> proprio feature
    [image, proprio, diffusion-step embedding] -> FiLM -> 1-D temporal U-Net over the
    action chunk (T steps x D dims) -> predicted noise

Training is DDPM (epsilon or clean-sample prediction, cosine noise schedule); evaluation samples
with DDIM (deterministic, `ddim_steps` steps). Actions and proprio are z-scored
with the dataset statistics from index.json, which live in the model as buffers,
so a checkpoint carries its normaliser.

`parameter_count(cfg)` and `checkpoint_bytes(cfg)` size a config without
allocating it (meta tensors): `packer budget` uses them to put checkpoints in the
quota table."""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from packer.actions import POSE_DIMS
from shardship.errors import ShardshipError

# The model's config schema is torch-free (packer budget, job checks): it lives in
# train.config and is re-exported here for the callers that know it as train.model's.
from train.config import DEFAULTS, MODEL_KEYS, PRESETS, model_config  # noqa: F401


def _gn(channels: int, groups: int) -> nn.GroupNorm:
    return nn.GroupNorm(math.gcd(groups, channels), channels)


# ---------------------------------------------------------------- image encoder
class ResBlock2d(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, groups: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.norm1 = _gn(cout, groups)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.norm2 = _gn(cout, groups)
        self.skip = (nn.Conv2d(cin, cout, 1, stride=stride, bias=False) if (cin != cout or stride != 1)
                     else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.silu(self.norm1(self.conv1(x)))
        h = self.norm2(self.conv2(h))
        return F.silu(h + self.skip(x))


class ImageEncoder(nn.Module):
    """Stride-2 stem, one stride-2 residual block per extra stage, global average
    pool, linear projection: a ResNet in miniature, GroupNorm so small per-GPU
    batches behave."""

    def __init__(self, channels: list[int], out_dim: int, groups: int):
        super().__init__()
        c0 = channels[0]
        self.stem = nn.Sequential(nn.Conv2d(3, c0, 3, stride=2, padding=1, bias=False), _gn(c0, groups), nn.SiLU())
        self.stages = nn.Sequential(*[ResBlock2d(a, b, 2, groups) for a, b in zip(channels[:-1], channels[1:])])
        self.proj = nn.Sequential(nn.Linear(channels[-1], out_dim), nn.LayerNorm(out_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stages(self.stem(x))
        return self.proj(h.mean(dim=(2, 3)))


# ---------------------------------------------------------------- temporal U-Net
class SinusoidalEmbedding(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.dim // 2
        steps = torch.arange(half, device=t.device, dtype=torch.float32)
        freqs = torch.exp(-math.log(10000.0) * steps / max(1, half - 1))
        args = t.float()[:, None] * freqs[None, :]
        emb = torch.cat([args.sin(), args.cos()], dim=-1)
        return F.pad(emb, (0, self.dim - emb.shape[-1]))


class Conv1dBlock(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int, groups: int):
        super().__init__()
        self.block = nn.Sequential(nn.Conv1d(cin, cout, kernel, padding=kernel // 2), _gn(cout, groups), nn.Mish())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class CondResBlock1d(nn.Module):
    """Two conv blocks; the conditioning vector scales and shifts (FiLM) the first."""

    def __init__(self, cin: int, cout: int, cond_dim: int, kernel: int, groups: int):
        super().__init__()
        self.block1 = Conv1dBlock(cin, cout, kernel, groups)
        self.block2 = Conv1dBlock(cout, cout, kernel, groups)
        self.film = nn.Sequential(nn.Mish(), nn.Linear(cond_dim, 2 * cout))
        self.skip = nn.Conv1d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        h = self.block1(x)
        scale, shift = self.film(cond).unsqueeze(-1).chunk(2, dim=1)
        h = h * (1 + scale) + shift
        return self.block2(h) + self.skip(x)


class TemporalUNet(nn.Module):
    """1-D U-Net over the chunk (B, D, T); T is padded to a multiple of
    2**(levels-1) and cropped back."""

    def __init__(self, action_dim: int, cond_dim: int, dims: list[int], kernel: int, groups: int):
        super().__init__()
        all_dims = [action_dim] + list(dims)
        in_out = list(zip(all_dims[:-1], all_dims[1:]))
        self.levels = len(in_out)
        self.downs = nn.ModuleList()
        for i, (a, b) in enumerate(in_out):
            last = i == len(in_out) - 1
            self.downs.append(nn.ModuleList([
                CondResBlock1d(a, b, cond_dim, kernel, groups),
                CondResBlock1d(b, b, cond_dim, kernel, groups),
                nn.Conv1d(b, b, 3, stride=2, padding=1) if not last else nn.Identity(),
            ]))
        mid = dims[-1]
        self.mids = nn.ModuleList([CondResBlock1d(mid, mid, cond_dim, kernel, groups) for _ in range(2)])
        self.ups = nn.ModuleList()
        for a, b in reversed(in_out[1:]):  # one upsample per downsample
            self.ups.append(nn.ModuleList([
                CondResBlock1d(2 * b, a, cond_dim, kernel, groups),
                CondResBlock1d(a, a, cond_dim, kernel, groups),
                nn.ConvTranspose1d(a, a, 4, stride=2, padding=1),
            ]))
        self.final = nn.Sequential(Conv1dBlock(dims[0], dims[0], kernel, groups), nn.Conv1d(dims[0], action_dim, 1))

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        t = x.shape[-1]
        mult = 2 ** (self.levels - 1)
        pad = (-t) % mult
        if pad:
            x = F.pad(x, (0, pad), mode="replicate")
        skips = []
        for level in self.downs:
            assert isinstance(level, nn.ModuleList)  # built in __init__: (res block, res block, downsample)
            res1, res2, down = level
            x = res2(res1(x, cond), cond)
            skips.append(x)
            x = down(x)
        for res in self.mids:
            x = res(x, cond)
        for level in self.ups:
            assert isinstance(level, nn.ModuleList)  # built in __init__: (res block, res block, upsample)
            res1, res2, up = level
            x = torch.cat([x, skips.pop()], dim=1)
            x = up(res2(res1(x, cond), cond))
        return self.final(x)[..., :t]


# ---------------------------------------------------------------- diffusion
def cosine_alphas_cumprod(steps: int, s: float = 0.008) -> torch.Tensor:
    """Nichol & Dhariwal cosine schedule, betas clipped at 0.999 (float64)."""
    t = torch.linspace(0, steps, steps + 1, dtype=torch.float64) / steps
    f = torch.cos((t + s) / (1 + s) * math.pi / 2) ** 2
    ac = f / f[0]
    betas = (1 - ac[1:] / ac[:-1]).clamp(0, 0.999)
    return torch.cumprod(1 - betas, dim=0)


def ddim_timesteps(train_steps: int, sample_steps: int) -> list[int]:
    """Descending, distinct timesteps from train_steps-1 to 0."""
    n = max(1, min(sample_steps, train_steps))
    ts = torch.linspace(train_steps - 1, 0, n).round().long().tolist()
    out: list[int] = []
    for t in ts:
        if not out or t != out[-1]:
            out.append(int(t))
    return out


class DiffusionPolicy(nn.Module):
    """forward(batch) -> training loss; sample(image, proprio) -> action chunks."""

    # buffers, set by register_buffer in __init__ (declared here for type checkers)
    action_mean: torch.Tensor
    action_std: torch.Tensor
    proprio_mean: torch.Tensor
    proprio_std: torch.Tensor
    alphas_cumprod: torch.Tensor

    def __init__(self, cfg: Mapping[str, Any] | None = None):
        super().__init__()
        self.cfg = model_config(cfg)
        c = self.cfg
        self.encoder = ImageEncoder(c["enc_channels"], c["embed_dim"], c["groups"])
        obs_dim = c["embed_dim"]
        self.proprio_mlp: nn.Sequential | None
        if c["proprio_dim"] > 0:
            self.proprio_mlp = nn.Sequential(nn.Linear(c["proprio_dim"], c["proprio_embed"]), nn.Mish(),
                                             nn.Linear(c["proprio_embed"], c["proprio_embed"]))
            obs_dim += c["proprio_embed"]
        else:
            self.proprio_mlp = None
        obs_dim *= max(1, c["obs_horizon"])  # each frame encoded alone, the features concatenated
        te = c["time_embed"]
        self.time_mlp = nn.Sequential(SinusoidalEmbedding(te), nn.Linear(te, 4 * te), nn.Mish(), nn.Linear(4 * te, te))
        self.unet = TemporalUNet(c["action_dim"], obs_dim + te, c["unet_dims"], c["kernel_size"], c["groups"])
        d, j = c["action_dim"], c["proprio_dim"]
        self.register_buffer("action_mean", torch.zeros(d))
        self.register_buffer("action_std", torch.ones(d))
        self.register_buffer("proprio_mean", torch.zeros(j))
        self.register_buffer("proprio_std", torch.ones(j))
        self.register_buffer("alphas_cumprod", cosine_alphas_cumprod(c["diffusion_steps"]).float(), persistent=False)

    # ---------------------------------------------------------- normaliser
    def set_normaliser(self, stats: Mapping[str, Any]) -> None:
        """Mean/std from index.json `stats`; a (near) constant dimension gets std 1."""
        for name, dim in (("action", self.cfg["action_dim"]), ("proprio", self.cfg["proprio_dim"])):
            s = stats.get(name) or {}
            mean = torch.tensor(s.get("mean", [0.0] * dim), dtype=torch.float32)
            std = torch.tensor(s.get("std", [1.0] * dim), dtype=torch.float32)
            if mean.numel() != dim or std.numel() != dim:
                raise ShardshipError(f"index.json stats.{name} has {mean.numel()} dims, the data has {dim}: re-pack")
            for field, t in (("mean", mean), ("std", std)):
                if not bool(torch.isfinite(t).all()):
                    i = int((~torch.isfinite(t)).nonzero()[0])
                    raise ShardshipError(f"index.json: stats.{name}.{field}[{i}] is {float(t[i])}; "
                                         "re-run `packer pack`")
            std = torch.where(std > 1e-6, std, torch.ones_like(std))
            getattr(self, f"{name}_mean").copy_(mean)
            getattr(self, f"{name}_std").copy_(std)

    def normaliser(self) -> dict[str, list[float]]:
        return {k: getattr(self, k).tolist() for k in ("action_mean", "action_std", "proprio_mean", "proprio_std")}

    # ---------------------------------------------------------- observation
    def _images(self, image: torch.Tensor) -> torch.Tensor:
        """(B, H, W, 3) or (B, N, 3, H, W) uint8 -> (B or B*N, 3, S, S) float in [-1, 1],
        random shift (per frame) when training."""
        x = (image.flatten(0, 1) if image.dim() == 5 else image.permute(0, 3, 1, 2)).float().div_(255.0)
        s = self.cfg["obs_size"]
        if x.shape[-2:] != (s, s):
            x = F.interpolate(x, size=(s, s), mode="bilinear", antialias=True, align_corners=False)
        if self.training and self.cfg["aug_shift"] > 0:
            x = random_shift(x, self.cfg["aug_shift"])
        return x.sub_(0.5).mul_(2.0)

    def encode(self, image: torch.Tensor, proprio: torch.Tensor) -> torch.Tensor:
        """Observation features (B, F): with obs_horizon N, image (B, N, 3, H, W) and
        proprio (B, N, P) are encoded frame by frame and the N features concatenated."""
        b = image.shape[0]
        feats = [self.encoder(self._images(image)).reshape(b, -1)]
        if self.proprio_mlp is not None:
            p = (proprio.float() - self.proprio_mean) / self.proprio_std
            feats.append(self.proprio_mlp(p).reshape(b, -1))
        return torch.cat(feats, dim=-1)

    def denoise(self, x: torch.Tensor, t: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """Predicted noise for noisy normalised chunks x (B, T, D) at steps t (B,)."""
        cond = torch.cat([obs, self.time_mlp(t)], dim=-1)
        return self.unet(x.transpose(1, 2), cond).transpose(1, 2)

    # ---------------------------------------------------------- training
    def loss_terms(self, batch: Mapping[str, torch.Tensor],
                   generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(sum of weighted squared errors, sum of weights): the mean is their ratio.
        Weights = sample weight (0 for padding) x action_mask (0 past session end);
        a sample whose joints are masked (no glove) is scored on its pose dimensions."""
        x0 = (batch["action"].float() - self.action_mean) / self.action_std
        b = x0.shape[0]
        jv = batch.get("joints_valid")
        if jv is not None and x0.shape[-1] > POSE_DIMS:
            # masked joints (no glove) enter the noisy input as the mean, so their
            # placeholder values cannot leak into the pose predictions either
            x0 = torch.cat([x0[..., :POSE_DIMS], x0[..., POSE_DIMS:] * jv.float().view(b, 1, 1)], dim=-1)
        t = torch.randint(0, self.cfg["diffusion_steps"], (b,), device=x0.device, generator=generator)
        noise = torch.randn(x0.shape, device=x0.device, generator=generator, dtype=x0.dtype)
        ac = self.alphas_cumprod[t].view(b, 1, 1)
        xt = ac.sqrt() * x0 + (1 - ac).sqrt() * noise
        obs = self.encode(batch["image"], batch["proprio"])
        pred = self.denoise(xt, t, obs)
        target = noise if self.cfg["prediction"] == "epsilon" else x0
        sq = (pred.float() - target).pow(2)  # (B, T, D)
        if jv is not None and sq.shape[-1] > POSE_DIMS:
            # a session without the glove: its joint dimensions are zeros, not data
            dw = torch.ones(b, 1, sq.shape[-1], device=sq.device)
            dw[:, :, POSE_DIMS:] = jv.float().view(b, 1, 1)
            err = (sq * dw).sum(dim=-1) / dw.sum(dim=-1)
        else:
            err = sq.mean(dim=-1)  # (B, T)
        w = batch["action_mask"].float() * batch["weight"].float().view(b, 1)
        return (err * w).sum(), w.sum()

    def forward(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        num, den = self.loss_terms(batch)
        return num / den.clamp_min(1e-6)

    # ---------------------------------------------------------- sampling
    @torch.no_grad()
    def sample(self, image: torch.Tensor, proprio: torch.Tensor, steps: int | None = None,
               generator: torch.Generator | None = None) -> torch.Tensor:
        """DDIM (eta = 0) action chunks in raw units, (B, T, D) float32."""
        c = self.cfg
        obs = self.encode(image, proprio)
        b = obs.shape[0]
        x = torch.randn((b, c["horizon"], c["action_dim"]), device=obs.device, generator=generator)
        ts = ddim_timesteps(c["diffusion_steps"], steps or c["ddim_steps"])
        ac = self.alphas_cumprod
        x0 = x
        for i, t in enumerate(ts):
            a_t = ac[t]
            a_prev = ac[ts[i + 1]] if i + 1 < len(ts) else torch.ones((), device=ac.device)
            out = self.denoise(x, torch.full((b,), t, device=x.device, dtype=torch.long), obs).float()
            if c["prediction"] == "epsilon":
                out = (x - (1 - a_t).sqrt() * out) / a_t.sqrt()
            x0 = out.clamp(-c["clip_sample"], c["clip_sample"])
            eps = (x - a_t.sqrt() * x0) / (1 - a_t).sqrt()
            x = a_prev.sqrt() * x0 + (1 - a_prev).sqrt() * eps
        return x0 * self.action_std + self.action_mean


def random_shift(x: torch.Tensor, pad: int) -> torch.Tensor:
    """DrQ-style augmentation: replicate-pad by `pad` and crop back at a random
    integer offset per sample (torch global RNG, so it resumes exactly)."""
    n, _, h, w = x.shape
    padded = F.pad(x, (pad, pad, pad, pad), mode="replicate")
    eps = 1.0 / (h + 2 * pad)
    ar = torch.linspace(-1.0 + eps, 1.0 - eps, h + 2 * pad, device=x.device, dtype=x.dtype)[:h]
    ar_w = torch.linspace(-1.0 + eps, 1.0 - eps, w + 2 * pad, device=x.device, dtype=x.dtype)[:w]
    base = torch.stack(torch.meshgrid(ar_w, ar, indexing="xy"), dim=-1).unsqueeze(0).expand(n, h, w, 2)
    shift = torch.randint(0, 2 * pad + 1, (n, 1, 1, 2), device=x.device).to(x.dtype) * (2.0 / (h + 2 * pad))
    return F.grid_sample(padded, base + shift, padding_mode="zeros", align_corners=False)


# ---------------------------------------------------------------- sizing
def _meta_model(cfg: Mapping[str, Any] | None) -> DiffusionPolicy:
    with torch.device("meta"):
        return DiffusionPolicy(cfg)


def parameter_count(cfg: Mapping[str, Any] | None = None) -> int:
    """Trainable parameters of the policy for `cfg` (model keys of a [train]
    section plus action_dim/proprio_dim/horizon/image_size; others ignored)."""
    return sum(p.numel() for p in _meta_model(cfg).parameters())


# Measured torch.save overhead (zip records + pickle) per stored tensor, and the
# fixed part of a checkpoint (configs, RNG states of up to 8 ranks, metrics).
_PER_TENSOR_OVERHEAD = 320
_FIXED_OVERHEAD = 128 * 1024  # ~9 KB of RNG state per rank


def checkpoint_bytes(cfg: Mapping[str, Any] | None = None) -> int:
    """Bytes of one checkpoint file as the trainer writes it: model + EMA state
    dicts (fp32 parameters and buffers), AdamW state (exp_avg, exp_avg_sq and a
    step per parameter), plus torch.save framing and the small metadata."""
    m = _meta_model(cfg)
    state = m.state_dict()
    model_bytes = sum(t.numel() * t.element_size() for t in state.values())
    params = [p for p in m.parameters() if p.requires_grad]
    adam_bytes = sum(2 * p.numel() * 4 + 4 for p in params)
    n_tensors = 2 * len(state) + 3 * len(params)
    return int(2 * model_bytes + adam_bytes + n_tensors * _PER_TENSOR_OVERHEAD + _FIXED_OVERHEAD)
