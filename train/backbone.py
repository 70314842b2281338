"""ResNet18 for the `stack` preset: torchvision's when it imports, else a built-in
copy with the same module names, so torchvision's ImageNet state dict
(resnet18-f37072fd.pth) loads into either.

Why a copy: torchvision wheels are built against one exact torch; where the pair
does not match (a CPU torch next to a CUDA torchvision, or this machine's local
torch 2.13.0, where `import torchvision` fails with "operator torchvision::nms
does not exist") the policy must still build, train and load the same weights.
The copy is the textbook ResNet-18 (He et al. 2016; torchvision's layout), no more.

Weights are never downloaded here: `backbone_weights` names a local file, or
"hub" (the torch hub cache file torchvision itself would use, when present), or
"none" (random init, e.g. to fine-tune from scratch). A missing file is one
line saying where to put it."""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn as nn

from shardship.errors import ShardshipError
from train.config import HUB_FILE, HUB_URL

FEATURES = 512  # ResNet18's pooled feature width
BODY = ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4", "avgpool")  # all but fc, in order


class BasicBlock(nn.Module):
    """torchvision.models.resnet.BasicBlock: two 3x3 convs, identity or 1x1 skip."""

    def __init__(self, cin: int, cout: int, stride: int, norm: Callable[[int], nn.Module]):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = norm(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = norm(cout)
        self.downsample: nn.Module | None = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), norm(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        skip = x if self.downsample is None else self.downsample(x)
        return self.relu(out + skip)


class ResNet18(nn.Module):
    """torchvision.models.resnet18's modules under the same names (conv1, bn1,
    layer1..layer4 of two BasicBlocks, avgpool, fc), hence the same state dict."""

    def __init__(self, num_classes: int = 1000, norm: Callable[[int], nn.Module] = nn.BatchNorm2d):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = norm(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        widths = [64, 128, 256, 512]
        cin = 64
        for i, w in enumerate(widths):
            stride = 1 if i == 0 else 2
            setattr(self, f"layer{i + 1}", nn.Sequential(BasicBlock(cin, w, stride, norm), BasicBlock(w, w, 1, norm)))
            cin = w
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(FEATURES, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(features(self, x))


def features(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """(M, 3, H, W) -> (M, 512): a ResNet18's body, every module but `fc`, in the order
    of torchvision's ResNet._forward_impl; `net` is torchvision's resnet18 or the copy
    (the same module names), so `net.fc(features(net, x))` is `net(x)`."""
    for name in BODY:
        x = net.get_submodule(name)(x)
    return torch.flatten(x, 1)


def group_norm(channels: int) -> nn.GroupNorm:
    """Chi et al.'s swap: GroupNorm with 16 channels per group."""
    return nn.GroupNorm(max(1, channels // 16), channels)


def torchvision_available() -> bool:
    try:
        import torchvision.models  # noqa: F401
    except Exception:  # noqa: BLE001 - ImportError, or a torch/torchvision mismatch (RuntimeError)
        return False
    return True


def resnet18(norm: str = "batch", use_torchvision: bool | None = None) -> nn.Module:
    """An untrained ResNet18 (torchvision's when it imports, else the copy), with
    BatchNorm ("batch") or GroupNorm ("group") layers."""
    layer: Callable[[int], nn.Module] = group_norm if norm == "group" else nn.BatchNorm2d
    if use_torchvision is None:
        use_torchvision = torchvision_available()
    if use_torchvision:
        import torchvision.models as tvm

        return tvm.resnet18(weights=None, norm_layer=layer)
    return ResNet18(norm=layer)


def weights_path(spec: str) -> Path | None:
    """The file `backbone_weights` names: None for "none", the torch hub cache file
    for "hub", else the path itself."""
    if spec in ("", "none"):
        return None
    if spec == "hub":
        return Path(torch.hub.get_dir()) / "checkpoints" / HUB_FILE
    return Path(os.path.expanduser(spec))


def load_imagenet(net: nn.Module, spec: str) -> Path | None:
    """Load torchvision's ImageNet ResNet18 weights into `net` (the classifier `fc`
    is skipped: the policy replaces it). Returns the file used, None for random init."""
    path = weights_path(spec)
    if path is None:
        return None
    if not path.is_file():
        raise ShardshipError(f"ResNet18 weights not found at {path}: download {HUB_URL} there (or set "
                             "[train.model] backbone_weights = \"/path/to/file\", or \"none\" for random init)")
    state = torch.load(path, map_location="cpu", weights_only=True)
    state = {k: v for k, v in state.items() if not k.startswith("fc.")}
    own = net.state_dict()
    wrong = [k for k, v in state.items() if k not in own or own[k].shape != v.shape]
    wrong += [k for k in own if k not in state and not k.startswith("fc.") and not k.endswith("num_batches_tracked")]
    if wrong:
        raise ShardshipError(f"{path} is not a torchvision ResNet18 state dict for this backbone "
                             f"(GroupNorm cannot take BatchNorm statistics: use norm = \"batch\"); "
                             f"mismatched: {wrong[:3]}")
    net.load_state_dict(state, strict=False)
    return path
