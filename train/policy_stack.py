"""The observation side of the `stack` preset (the user's policy, corneliusgruss/stack):
every frame of the obs_horizon window through an ImageNet ResNet18 whose classifier
is replaced by Linear(512, embed_dim), the features concatenated with that frame's
normalised proprio, all frames flattened into one MLP -> embed_dim conditioning vector.

Images arrive as the reader gives them and are prepared on the device, so the
DataLoader workers only decode JPEGs: uint8 (or float in [0, 1]), channels last
or first, with or without the frame axis (a batch of single frames is a window of
one, its frame repeated to fill obs_horizon, as Chi et al. pad the start of a
session). While training: the user's augmentation, per frame (resize to 1.07x and
a random crop back, brightness/contrast in [0.7, 1.3], saturation in [0.8, 1.2]),
drawn from torch's global RNG so a resumed run draws the same. Then ImageNet
normalisation, which the pretrained weights expect.

Frozen backbone (the default, as published: 6.4 M of 17.5 M parameters train): its
BatchNorm layers stay in eval mode, using ImageNet's running statistics, whatever
mode the policy is in; training mode would let small robot batches overwrite them.
Its body (all but the new fc) runs under torch.no_grad(): nothing in it trains, so
autograd has nothing to record there; fc gets its gradients as before.
GroupNorm (Chi et al.'s swap, `backbone_norm = "group"`) is for a backbone trained
from random init (`backbone_weights = "none"`): ImageNet weights were learnt with
BatchNorm and do not load into it."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from train.backbone import FEATURES, features, load_imagenet, resnet18

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def frames(image: torch.Tensor, n: int) -> torch.Tensor:
    """Any reader layout -> (B, n, 3, H, W) float in [0, 1]: (B, H, W, 3),
    (B, 3, H, W), (B, N, H, W, 3) or (B, N, 3, H, W); uint8 is divided by 255,
    float is taken as [0, 1]. Fewer than n frames: the first repeats; more: the last n."""
    x = image if image.dim() == 5 else image.unsqueeze(1)
    if x.shape[-1] == 3 and x.shape[-3] != 3:  # channels last
        x = x.permute(0, 1, 4, 2, 3)
    x = x.float().div_(255.0) if not x.is_floating_point() else x.float()  # in place on the new float copy
    return fill_window(x, n)


def fill_window(x: torch.Tensor, n: int) -> torch.Tensor:
    """(B, N, ...) -> (B, n, ...): the first step repeated in front, or the last n kept."""
    have = x.shape[1]
    if have < n:
        x = torch.cat([x[:, :1].expand(-1, n - have, *x.shape[2:]), x], dim=1)
    return x[:, -n:]


def random_crop(x: torch.Tensor, size: int, scale: float) -> torch.Tensor:
    """(M, 3, H, W) -> resize to round(size * scale) and crop size x size at a random
    offset per image (the user's 1.07x random crop)."""
    big = max(size, int(size * scale))
    x = F.interpolate(x, size=(big, big), mode="bilinear", antialias=True, align_corners=False)
    if big == size:
        return x
    m, c = x.shape[:2]
    off = torch.randint(0, big - size + 1, (m, 2)).to(x.device)
    ar = torch.arange(size, device=x.device)
    rows = (off[:, 0:1] + ar)[:, None, :, None].expand(m, c, size, big)
    x = x.gather(2, rows)
    cols = (off[:, 1:2] + ar)[:, None, None, :].expand(m, c, size, size)
    return x.gather(3, cols)


def color_jitter(x: torch.Tensor) -> torch.Tensor:
    """PIL ImageEnhance's brightness, contrast, colour (saturation) with the user's
    ranges, one draw per image, clipped to [0, 1] after each like 8-bit PIL."""
    m = x.shape[0]
    u = torch.rand(m, 3).to(x.device)
    brightness, contrast, saturation = 0.7 + 0.6 * u[:, 0], 0.7 + 0.6 * u[:, 1], 0.8 + 0.4 * u[:, 2]
    w = torch.tensor([0.299, 0.587, 0.114], device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
    x = (x * brightness.view(m, 1, 1, 1)).clamp(0, 1)
    mean = (x * w).sum(1, keepdim=True).mean(dim=(2, 3), keepdim=True)
    x = ((x - mean) * contrast.view(m, 1, 1, 1) + mean).clamp(0, 1)
    gray = (x * w).sum(1, keepdim=True)
    return ((x - gray) * saturation.view(m, 1, 1, 1) + gray).clamp(0, 1)


class StackObsEncoder(nn.Module):
    """(images, normalised proprio) of an obs_horizon window -> (B, embed_dim)."""

    img_mean: torch.Tensor  # buffers (ImageNet statistics), declared for type checkers
    img_std: torch.Tensor
    # the prepared images' memory layout (train.step_opts sets channels_last on CUDA and CPU); None: as they come
    memory_format: torch.memory_format | None = None

    def __init__(self, cfg: Mapping[str, Any]):
        super().__init__()
        self.cfg = dict(cfg)
        d, n, j = cfg["embed_dim"], cfg["obs_horizon"], cfg["proprio_dim"]
        self.backbone = resnet18(cfg["backbone_norm"])
        self.backbone.fc = nn.Linear(FEATURES, d)
        self.frozen = bool(cfg["freeze_backbone"])
        if self.frozen:
            for name, p in self.backbone.named_parameters():
                p.requires_grad_(name.startswith("fc."))
        self.mlp = nn.Sequential(nn.Linear((d + j) * n, d), nn.ReLU(), nn.Linear(d, d))
        self.register_buffer("img_mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("img_std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    def load_pretrained(self) -> str | None:
        """ImageNet weights per `backbone_weights`; returns the file, None for random init."""
        path = load_imagenet(self.backbone, str(self.cfg["backbone_weights"]))
        return str(path) if path else None

    def train(self, mode: bool = True) -> StackObsEncoder:
        super().train(mode)
        if self.frozen:
            self.backbone.eval()  # ImageNet BatchNorm statistics stay as they are
        return self

    def prepare(self, image: torch.Tensor) -> torch.Tensor:
        """Reader images -> (B * obs_horizon, 3, S, S), augmented when training, ImageNet-normalised."""
        c = self.cfg
        x = frames(image, c["obs_horizon"]).flatten(0, 1)
        s = c["obs_size"]
        if self.training and c["crop_scale"] > 1:
            x = random_crop(x, s, c["crop_scale"])
        elif x.shape[-2:] != (s, s):
            x = F.interpolate(x, size=(s, s), mode="bilinear", antialias=True, align_corners=False)
        if self.training and c["color_jitter"]:
            x = color_jitter(x)
        x = (x - self.img_mean) / self.img_std
        return x if self.memory_format is None else x.contiguous(memory_format=self.memory_format)

    def forward(self, image: torch.Tensor, proprio: torch.Tensor | None) -> torch.Tensor:
        b, n = image.shape[0], self.cfg["obs_horizon"]
        x = self.prepare(image)
        if self.frozen:  # the body trains nothing: no autograd there; BatchNorm stays in eval (train())
            with torch.no_grad():
                x = features(self.backbone, x)
            feats = self.backbone.get_submodule("fc")(x).view(b, n, -1)
        else:
            feats = self.backbone(x).view(b, n, -1)
        if proprio is not None and self.cfg["proprio_dim"] > 0:
            p = proprio if proprio.dim() == 3 else proprio.unsqueeze(1)
            feats = torch.cat([feats, fill_window(p.float(), n)], dim=-1)
        return self.mlp(feats.flatten(1))
