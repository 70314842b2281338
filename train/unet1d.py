"""The 1-D temporal U-Nets that denoise an action chunk (B, T, D), conditioned by
FiLM on a vector (observation features and the diffusion-step embedding).

`TemporalUNet` is shardship's own (the tiny/small/base presets). `ConditionalUnet1D`
is the layout of Chi et al.'s Diffusion Policy as the user's `stack` policy builds
it (an input projection to down_dims[0], two FiLM residual blocks per level,
strided-conv downsampling that changes width, a decoder level per encoder level,
the timestep MLP inside): the same modules and sizes, so its parameter count
matches the published one."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def _gn(channels: int, groups: int) -> nn.GroupNorm:
    return nn.GroupNorm(math.gcd(groups, channels), channels)


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


def timestep_mlp(dim: int) -> nn.Sequential:
    """Sinusoidal embedding -> Linear(4 dim) -> Mish -> Linear(dim) (DDPM's)."""
    return nn.Sequential(SinusoidalEmbedding(dim), nn.Linear(dim, 4 * dim), nn.Mish(), nn.Linear(4 * dim, dim))


def _pair(a: int, b: int, cond_dim: int, kernel: int, groups: int) -> nn.ModuleList:
    return nn.ModuleList([CondResBlock1d(a, b, cond_dim, kernel, groups),
                          CondResBlock1d(b, b, cond_dim, kernel, groups)])


class ConditionalUnet1D(nn.Module):
    """Chi et al.'s 1-D U-Net over (B, T, D) chunks, with `time_dim` timestep features
    and a `global_dim` observation vector as FiLM conditioning. T is padded to a
    multiple of 2**(levels-1) and cropped back."""

    def __init__(self, action_dim: int, global_dim: int, time_dim: int, dims: list[int], kernel: int = 5,
                 groups: int = 8):
        super().__init__()
        self.timestep_encoder = timestep_mlp(time_dim)
        cond = time_dim + global_dim
        n = len(dims)
        self.input_conv = nn.Conv1d(action_dim, dims[0], 1)
        self.encoder_blocks = nn.ModuleList([_pair(d, d, cond, kernel, groups) for d in dims])
        self.downsamples = nn.ModuleList([nn.Conv1d(dims[i], dims[i + 1], 3, stride=2, padding=1)
                                          for i in range(n - 1)])
        self.mid_blocks = _pair(dims[-1], dims[-1], cond, kernel, groups)
        self.decoder_blocks = nn.ModuleList([_pair(2 * dims[i], dims[i], cond, kernel, groups)
                                             for i in reversed(range(n))])
        self.upsamples = nn.ModuleList([nn.ConvTranspose1d(dims[i], dims[i - 1], 4, stride=2, padding=1)
                                        for i in reversed(range(1, n))])
        self.output_conv = nn.Sequential(Conv1dBlock(dims[0], dims[0], kernel, groups),
                                         nn.Conv1d(dims[0], action_dim, 1))
        self.levels = n

    def forward(self, x: torch.Tensor, t: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """Predicted noise (or clean chunk) for noisy chunks x (B, T, D) at steps t (B,)."""
        cond = torch.cat([self.timestep_encoder(t), obs], dim=-1)
        length = x.shape[1]
        h = self.input_conv(x.transpose(1, 2))
        pad = (-length) % (2 ** (self.levels - 1))
        if pad:
            h = F.pad(h, (0, pad), mode="replicate")
        skips = []
        for i, blocks in enumerate(self.encoder_blocks):
            assert isinstance(blocks, nn.ModuleList)  # built in __init__: two FiLM residual blocks
            for block in blocks:
                h = block(h, cond)
            skips.append(h)
            if i < len(self.downsamples):
                h = self.downsamples[i](h)
        for block in self.mid_blocks:
            h = block(h, cond)
        for i, blocks in enumerate(self.decoder_blocks):
            h = torch.cat([h, skips.pop()], dim=1)
            assert isinstance(blocks, nn.ModuleList)
            for block in blocks:
                h = block(h, cond)
            if i < len(self.upsamples):
                h = self.upsamples[i](h)
        return self.output_conv(h)[..., :length].transpose(1, 2)
