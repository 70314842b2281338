"""The diffusion policy: observation encoder -> FiLM-conditioned 1-D U-Net over the
action chunk, trained and sampled with diffusers' schedulers.

Two architectures (train.config PRESETS):
    "shardship" (tiny, small, base): image (uint8) -> resize to obs_size -> CNN
        trained from scratch; proprio -> MLP; [image, proprio, step embedding] ->
        FiLM -> TemporalUNet. Small enough for a laptop CPU (the demo).
    "stack": the user's policy (train.policy_stack): ImageNet ResNet18 per frame
        of an obs_horizon window at 224x224, fused with the proprio of every frame
        -> ConditionalUnet1D (train.unet1d).

Training is DDPM (epsilon or clean-sample prediction) with diffusers'
DDPMScheduler (`squaredcos_cap_v2` betas); sampling is diffusers' DDIM
(deterministic, `ddim_steps`) or DDPM (every step, as the user samples). Actions
and proprio are z-scored with the dataset statistics from index.json, which live
in the model as buffers, so a checkpoint carries its normaliser.

`parameter_count(cfg)`, `parameter_counts(cfg)` and `checkpoint_bytes(cfg)` size a
config without allocating it (meta tensors): `packer budget` uses them to put
checkpoints in the quota table, `train run` prints the counts."""
from __future__ import annotations

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
from train.policy_stack import StackObsEncoder, fill_window, frames
from train.unet1d import (  # noqa: F401  (re-exported: the blocks used to live here)
    ConditionalUnet1D,
    CondResBlock1d,
    Conv1dBlock,
    SinusoidalEmbedding,
    TemporalUNet,
    _gn,
    timestep_mlp,
)


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


# ---------------------------------------------------------------- diffusion (diffusers)
def noise_scheduler(cfg: Mapping[str, Any], sampler: str = "ddpm") -> Any:
    """diffusers' DDPMScheduler (training noise; "ddpm" sampling) or DDIMScheduler
    ("ddim" sampling, eta 0) on the same squaredcos_cap_v2 betas. Imported here:
    diffusers takes seconds to import and `packer budget` sizes models without it."""
    from diffusers import DDIMScheduler, DDPMScheduler

    kw = dict(num_train_timesteps=cfg["diffusion_steps"], beta_schedule="squaredcos_cap_v2",
              prediction_type=cfg["prediction"], clip_sample=True, clip_sample_range=cfg["clip_sample"])
    if sampler == "ddim":  # "trailing": the first of few steps starts from t = T-1 (pure noise), as trained
        return DDIMScheduler(**kw, set_alpha_to_one=True, steps_offset=0, timestep_spacing="trailing")
    return DDPMScheduler(**kw)


class DiffusionPolicy(nn.Module):
    """forward(batch) -> training loss; sample(image, proprio) -> action chunks.

    arch "shardship": ImageEncoder + proprio MLP + TemporalUNet (tiny/small/base).
    arch "stack": StackObsEncoder (ResNet18 per frame, fused with proprio across
    obs_horizon frames) + ConditionalUnet1D (the user's policy)."""

    # buffers, set by register_buffer in __init__ (declared here for type checkers)
    action_mean: torch.Tensor
    action_std: torch.Tensor
    proprio_mean: torch.Tensor
    proprio_std: torch.Tensor

    def __init__(self, cfg: Mapping[str, Any] | None = None):
        super().__init__()
        self.cfg = model_config(cfg)
        c = self.cfg
        self.encoder: ImageEncoder | None = None
        self.proprio_mlp: nn.Sequential | None = None
        self.time_mlp: nn.Sequential | None = None
        self.obs_encoder: StackObsEncoder | None = None
        self.unet: nn.Module
        if c["arch"] == "stack":
            self.obs_encoder = StackObsEncoder(c)
            self.unet = ConditionalUnet1D(c["action_dim"], c["embed_dim"], c["time_embed"], c["unet_dims"],
                                          c["kernel_size"], c["groups"])
        else:
            self.encoder = ImageEncoder(c["enc_channels"], c["embed_dim"], c["groups"])
            obs_dim = c["embed_dim"]
            if c["proprio_dim"] > 0:
                self.proprio_mlp = nn.Sequential(nn.Linear(c["proprio_dim"], c["proprio_embed"]), nn.Mish(),
                                                 nn.Linear(c["proprio_embed"], c["proprio_embed"]))
                obs_dim += c["proprio_embed"]
            obs_dim *= c["obs_horizon"]  # each frame encoded alone, the features concatenated
            self.time_mlp = timestep_mlp(c["time_embed"])
            self.unet = TemporalUNet(c["action_dim"], obs_dim + c["time_embed"], c["unet_dims"], c["kernel_size"],
                                     c["groups"])
        d, j = c["action_dim"], c["proprio_dim"]
        self.register_buffer("action_mean", torch.zeros(d))
        self.register_buffer("action_std", torch.ones(d))
        self.register_buffer("proprio_mean", torch.zeros(j))
        self.register_buffer("proprio_std", torch.ones(j))
        self.scheduler = noise_scheduler(c, "ddpm")  # diffusers DDPM: the training noise

    def load_pretrained(self) -> str | None:
        """Pretrained backbone weights where the architecture has some (stack: ImageNet
        ResNet18 per `backbone_weights`). Returns the file read, None if nothing was."""
        return self.obs_encoder.load_pretrained() if self.obs_encoder is not None else None

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
        """Reader images (B, [N,] H, W, 3 | 3, H, W) -> (B * obs_horizon, 3, S, S) float
        in [-1, 1], random shift (per frame) when training."""
        x = frames(image, self.cfg["obs_horizon"]).flatten(0, 1)
        s = self.cfg["obs_size"]
        if x.shape[-2:] != (s, s):
            x = F.interpolate(x, size=(s, s), mode="bilinear", antialias=True, align_corners=False)
        if self.training and self.cfg["aug_shift"] > 0:
            x = random_shift(x, self.cfg["aug_shift"])
        return x.sub(0.5).mul_(2.0)

    def encode(self, image: torch.Tensor, proprio: torch.Tensor) -> torch.Tensor:
        """Observation features (B, F): images (B, [N,] H, W, 3) or (B, [N,] 3, H, W),
        proprio (B, [N,] J) in raw units."""
        p = (proprio.float() - self.proprio_mean) / self.proprio_std if self.cfg["proprio_dim"] > 0 else None
        if self.obs_encoder is not None:
            return self.obs_encoder(image, p)
        assert self.encoder is not None  # arch "shardship": each frame alone, features concatenated
        b, n = image.shape[0], self.cfg["obs_horizon"]
        feats = [self.encoder(self._images(image)).reshape(b, -1)]
        if self.proprio_mlp is not None and p is not None:
            feats.append(self.proprio_mlp(fill_window(p if p.dim() == 3 else p.unsqueeze(1), n)).reshape(b, -1))
        return torch.cat(feats, dim=-1)

    def denoise(self, x: torch.Tensor, t: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """Predicted noise (or clean chunk) for noisy normalised chunks x (B, T, D) at steps t (B,)."""
        if self.time_mlp is None:
            return self.unet(x, t, obs)
        cond = torch.cat([obs, self.time_mlp(t)], dim=-1)
        return self.unet(x.transpose(1, 2), cond).transpose(1, 2)

    # ---------------------------------------------------------- training
    def loss_terms(self, batch: Mapping[str, torch.Tensor],
                   generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(sum of weighted squared errors, sum of weights): the mean is their ratio.
        Weights = sample weight (0 for padding) x action_mask (0 past session end or
        across a gap); a sample's masked joints (`_joint_weights`) are not scored."""
        x0 = (batch["action"].float() - self.action_mean) / self.action_std
        b = x0.shape[0]
        jw = _joint_weights(batch, b, x0.shape[-1] - POSE_DIMS)
        if jw is not None:
            # masked joints (no glove, the glove silent, a dead joint) enter the noisy input as
            # the mean, so their placeholder values cannot leak into the pose predictions either
            x0 = torch.cat([x0[..., :POSE_DIMS], x0[..., POSE_DIMS:] * jw], dim=-1)
        t = torch.randint(0, self.cfg["diffusion_steps"], (b,), device=x0.device, generator=generator)
        noise = torch.randn(x0.shape, device=x0.device, generator=generator, dtype=x0.dtype)
        xt = self.scheduler.add_noise(x0, noise, t)
        obs = self.encode(batch["image"], batch["proprio"])
        pred = self.denoise(xt, t, obs)
        target = noise if self.cfg["prediction"] == "epsilon" else x0
        sq = (pred.float() - target).pow(2)  # (B, T, D)
        if jw is not None:
            # masked joints are placeholders, not data: scored on the pose dimensions alone
            dw = torch.ones(b, jw.shape[1], sq.shape[-1], device=sq.device)
            dw[:, :, POSE_DIMS:] = jw
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
               generator: torch.Generator | None = None, sampler: str | None = None) -> torch.Tensor:
        """Action chunks in raw units, (B, T, D) float32, by diffusers' DDIM (eta 0,
        `steps` or ddim_steps) or DDPM (`steps` or every training step)."""
        c = self.cfg
        kind = sampler or c["sampler"]
        sched = noise_scheduler(c, kind)
        n = steps or (c["ddim_steps"] if kind == "ddim" else c["diffusion_steps"])
        obs = self.encode(image, proprio)
        b = obs.shape[0]
        sched.set_timesteps(min(int(n), c["diffusion_steps"]), device=obs.device)
        x = torch.randn((b, c["horizon"], c["action_dim"]), device=obs.device, generator=generator)
        for t in sched.timesteps:
            out = self.denoise(x, t.expand(b), obs).float()
            x = sched.step(out, t, x, generator=generator).prev_sample
        return x * self.action_std + self.action_mean


def _joint_weights(batch: Mapping[str, torch.Tensor], b: int, n_joints: int) -> torch.Tensor | None:
    """(B, 1 or T, J) weight of each sample's joint dimensions: frame t's joints
    known (`joints_valid`, B) times the joints its session read at all
    (`joint_mask`, B x J) times the steps whose joints are known (`joints_mask`,
    B x T); None without joints or masks (every joint counts)."""
    jv, jm, steps = batch.get("joints_valid"), batch.get("joint_mask"), batch.get("joints_mask")
    if n_joints <= 0 or (jv is None and jm is None and steps is None):
        return None
    w = torch.ones(b, 1, n_joints, device=batch["action"].device)
    if jv is not None:
        w = w * jv.float().view(b, 1, 1)
    if jm is not None and jm.shape[-1] == n_joints:
        w = w * jm.float().view(b, 1, n_joints)
    if steps is not None:
        w = w * steps.float().view(b, -1, 1)
    return w


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
    """All parameters of the policy for `cfg` (model keys of a [train] section plus
    action_dim/proprio_dim/horizon/image_size; others ignored), frozen ones included."""
    return sum(p.numel() for p in _meta_model(cfg).parameters())


def parameter_counts(cfg: Mapping[str, Any] | None = None) -> tuple[int, int]:
    """(all, trainable) parameters of the policy for `cfg`, without allocating it."""
    params = list(_meta_model(cfg).parameters())
    return sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad)


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
