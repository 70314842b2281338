"""The [train] schema: `TrainConfig` (loop settings) and the model keys it may
carry (`DEFAULTS`, `PRESETS`, `model_config`), with their parsing and validation.

Torch-free on purpose: `packer budget` and the pre-submit job checks
(train.jobs.spec) read a [train] section with the trainer's own defaults and
rules on machines that have no torch, so the schema cannot live next to the
code that trains. train.model and train.trainer import it from here."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shardship.config import check_fields, check_value
from shardship.errors import ShardshipError
from shardship.split import SEED, VAL_FRACTION

# ------------------------------------------------------------------ [train.model]
DEFAULTS: dict[str, Any] = {
    "preset": "small",  # a named starting point (PRESETS), the other keys override it
    # data-derived (index.json); callers pass the real values
    "image_size": 224,
    "action_dim": 13,  # 3 pos + 6 rot6d + 4 joints
    "proprio_dim": 13,  # per observation step: pose relative to frame t (3 + 6) + 4 joints
    "horizon": 16,
    # model
    "obs_size": 96,  # images are resized to obs_size x obs_size before the encoder
    "enc_channels": [32, 64, 128, 256],
    "embed_dim": 256,
    "proprio_embed": 64,
    "time_embed": 128,
    "unet_dims": [64, 128, 256],
    "kernel_size": 5,
    "groups": 8,
    "diffusion_steps": 100,
    "ddim_steps": 10,
    "prediction": "epsilon",  # what the denoiser predicts: "epsilon" (noise) or "sample" (clean chunk)
    "clip_sample": 5.0,  # clamp predicted x0 (z-scored units) while sampling
    "aug_shift": 4,  # random-shift augmentation (pixels at obs_size) while training
    "sampler": "ddim",  # train eval / sample(): "ddim" (ddim_steps, deterministic) or "ddpm" (every step)
    # the `stack` architecture (the user's policy); ignored by arch "shardship"
    "arch": "shardship",  # "shardship" (CNN from scratch + TemporalUNet) or "stack" (ResNet18 + ConditionalUnet1D)
    # frames per observation (t-N+1 .. t), each encoded alone and the features concatenated;
    # the reader reads this many (train.data.obs), a shorter batch repeats its first frame
    "obs_horizon": 2,
    "freeze_backbone": True,  # stack: only the ResNet's new fc layer trains
    "backbone_weights": "hub",  # stack: "hub" (torch hub cache file), a .pth path, or "none" (random init)
    "backbone_norm": "batch",  # stack: "batch" (ImageNet weights) or "group" (Chi et al.'s swap, random init)
    "crop_scale": 1.07,  # stack: resize to 1.07x, random crop back (training only; 1 = off)
    "color_jitter": True,  # stack: brightness/contrast/saturation jitter (training only)
}
MODEL_KEYS = frozenset(DEFAULTS)
# backbone_weights = "hub": torchvision's ResNet18_Weights.IMAGENET1K_V1 in the torch hub cache
# (train.backbone loads it; train.jobs.jobenv checks or ships it for a job)
HUB_FILE = "resnet18-f37072fd.pth"
HUB_URL = f"https://download.pytorch.org/models/{HUB_FILE}"

# Named sizes. "small" (the defaults, ~6.8M parameters, ~110 MB per checkpoint)
# suits a 10 GB home quota; "tiny" trains on a laptop CPU in minutes (the demo);
# "base" is closer to the published diffusion-policy U-Net (~20M parameters).
PRESETS: dict[str, dict[str, Any]] = {
    # tiny predicts the clean chunk: with few steps an epsilon model's DDIM samples
    # still run into the clip range, a sample model's stay near the data; one frame
    # per observation keeps the CPU demo quick (half the JPEG decoding)
    "tiny": {"obs_horizon": 1, "obs_size": 48, "enc_channels": [16, 32, 64], "embed_dim": 64, "proprio_embed": 16,
             "time_embed": 32,
             "unet_dims": [32, 64, 128], "diffusion_steps": 50, "ddim_steps": 8, "prediction": "sample"},
    "small": {},
    "base": {"unet_dims": [128, 256, 512]},
    # the user's policy (corneliusgruss/stack, docs/results_v2.md): ImageNet ResNet18 (frozen) per frame of a
    # 2-frame window at 224x224, embed/hidden 64, ConditionalUnet1D 64/128/256 with FiLM, DDPM 100 steps
    # (squaredcos_cap_v2) sampled with DDPM as published: 17.5 M parameters, 6.4 M trainable
    "stack": {"arch": "stack", "obs_size": 224, "embed_dim": 64, "time_embed": 64, "unet_dims": [64, 128, 256],
              "obs_horizon": 2, "diffusion_steps": 100, "sampler": "ddpm", "aug_shift": 0},
}
CHOICES: dict[str, tuple[str, ...]] = {"prediction": ("epsilon", "sample"), "sampler": ("ddim", "ddpm"),
                                       "arch": ("shardship", "stack"), "backbone_norm": ("batch", "group")}


def model_config(cfg: Mapping[str, Any] | None = None, **overrides: Any) -> dict[str, Any]:
    """DEFAULTS, then the named preset, then the model keys of `cfg` (other keys,
    e.g. the rest of a [train] section, are ignored), of its `model` sub-table,
    and `overrides`."""
    cfg = dict(cfg or {})
    nested: Mapping[str, Any] = cfg["model"] if isinstance(cfg.get("model"), Mapping) else {}  # [train.model] table
    preset = overrides.get("preset") or nested.get("preset") or cfg.get("preset") or DEFAULTS["preset"]
    if preset not in PRESETS:
        raise ShardshipError(f"model preset {preset!r} unknown (known: {', '.join(PRESETS)})")
    base = {**DEFAULTS, **PRESETS[preset]}
    out: dict[str, Any] = {k: (list(v) if isinstance(v, list) else v) for k, v in base.items()}
    out["preset"] = preset
    for src in cfg, nested, overrides:
        for k, v in src.items():
            if k in MODEL_KEYS and v is not None:
                out[k] = list(v) if isinstance(v, (list, tuple)) else v
    for k in ("image_size", "action_dim", "proprio_dim", "horizon", "obs_size", "embed_dim", "proprio_embed",
              "time_embed", "kernel_size", "groups", "diffusion_steps", "ddim_steps", "aug_shift", "obs_horizon"):
        out[k] = int(out[k])
    out["clip_sample"], out["crop_scale"] = float(out["clip_sample"]), float(out["crop_scale"])
    out["freeze_backbone"], out["color_jitter"] = bool(out["freeze_backbone"]), bool(out["color_jitter"])
    out["backbone_weights"] = str(out["backbone_weights"])
    for k, allowed in CHOICES.items():
        if out[k] not in allowed:
            raise ShardshipError(f"model config: {k} must be {' or '.join(allowed)} (got {out[k]!r})")
    if out["obs_horizon"] < 1:
        raise ShardshipError(f"model config: obs_horizon must be >= 1 (got {out['obs_horizon']})")
    if out["action_dim"] < 1 or out["horizon"] < 1 or out["proprio_dim"] < 0:
        raise ShardshipError(f"model config: action_dim/horizon must be >= 1, proprio_dim >= 0 "
                             f"(got {out['action_dim']}, {out['horizon']}, {out['proprio_dim']})")
    if not out["enc_channels"] or not out["unet_dims"]:
        raise ShardshipError("model config: enc_channels and unet_dims must not be empty")
    if out["kernel_size"] % 2 == 0:
        raise ShardshipError(f"model config: kernel_size must be odd (got {out['kernel_size']})")
    return out


# ------------------------------------------------------------------ [train]
DEVICES = ("auto", "cuda", "mps", "cpu")
EDGES = ("inside", "mask")  # [train] edges: the reader's sample set (train.data.obs)
NORMALIZE = ("minmax", "zscore")  # [train] normalize: train.data.normalize's modes
CACHES = ("auto", "gpu", "host", "off")  # [train] cache: where decoded frames are kept (train.data.cache)
DECODES = ("auto", "workers", "device")  # [train] decode: where JPEGs are decoded when frames are not cached

def model_table(value: Any, where: str) -> dict[str, Any]:
    """[train.model] as a dict; a value of another shape (`model = "tiny"`) is one line
    saying what to write (it was a ValueError traceback from dict())."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        hint = (f'write [train.model] with preset = "{value}" (or `train run --model {value}`)'
                if isinstance(value, str) else "write it as a [train.model] table")
        raise ShardshipError(f"{where}: model = {value!r} is a {type(value).__name__}, but model is a "
                             f"table of model settings: {hint}")
    return dict(value)


# (key, test, rule as said to the user): values the loop would run with, wrongly and silently
# (lr 0 never learns, a negative grad_clip flips the gradient, min_lr_ratio 5 climbs)
_RANGES: tuple[tuple[str, Callable[[float], bool], str], ...] = (
    ("lr", lambda v: v > 0, "> 0"),
    ("weight_decay", lambda v: v >= 0, ">= 0"),
    ("grad_clip", lambda v: v > 0, "> 0 (the gradient norm is clipped to it; a large value turns it off)"),
    ("min_lr_ratio", lambda v: 0 <= v <= 1, "in [0, 1] (the cosine's floor as a fraction of lr)"),
    ("val_fraction", lambda v: 0 <= v < 1, "in [0, 1) (the share of sessions held out for validation)"),
    ("ema_decay", lambda v: 0 <= v < 1, "in [0, 1)"),
)


@dataclass
class TrainConfig:
    """[train] in shardship.toml; CLI flags override. Model keys (obs_size,
    enc_channels, unet_dims, ...) may sit here or in a [train.model] table."""

    batch_size: int = 32  # per rank
    num_workers: int = 2  # DataLoader workers per rank
    lr: float = 3e-4
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    weight_decay: float = 1e-4
    warmup: int = 200  # steps
    steps: int | None = None  # total optimizer steps (schedule length); default: epochs
    epochs: int = 100
    checkpoint_every: int = 500
    keep: int = 2  # periodic step_N.pt files kept
    val_every: int = 500
    val_fraction: float = VAL_FRACTION
    val_sessions: list[str] = field(default_factory=list)
    ema_decay: float = 0.999
    grad_clip: float = 1.0
    seed: int = SEED
    window: int = 8  # shards shuffled together
    # observation frames per sample (t-N+1 .. t); None: the model preset's (stack 2,
    # small/base 2, tiny 1). Set here it overrides [train.model] obs_horizon too.
    obs_horizon: int | None = None
    # samples near a session's edges: "inside" keeps only windows whose frames and whole
    # action chunk lie inside the session (the user's trainer); "mask" keeps every frame,
    # padded steps masked. (Not `window`: that key already means the shuffle window.)
    edges: str = "inside"
    normalize: str = "minmax"  # "minmax": actions to [-1, 1], proprio z-scored (the user's); "zscore": both
    # samples drawn as runs of this many consecutive frames, which share their decoded frames (with a
    # 2-frame window, a run of 2 decodes 3 frames for 2 samples); None: the window's length (1 for tiny)
    consecutive: int | None = None
    # decoded frames kept for the whole run: "gpu" (on the device, batches built there), "host"
    # (shared memory of the node), "off" (decode every step), "auto" (gpu, then host, where they fit)
    cache: str = "auto"
    # where JPEGs are decoded when frames are not cached: "workers" (DataLoader workers, CPU),
    # "device" (nvJPEG through torchvision on CUDA; the workers only read bytes), "auto" (device on CUDA
    # when torchvision can decode there, else workers)
    decode: str = "auto"
    compile: bool = False  # torch.compile the model (the first steps take longer while it compiles)
    channels_last: bool = True  # stack: ResNet18 and its images in channels-last memory (CUDA and CPU; not MPS)
    log_every: int = 10
    amp: bool = True
    device: str = "auto"  # auto (cuda, then mps, then cpu) | cuda | mps | cpu
    tensorboard: bool = True  # event files next to metrics.jsonl (rank 0), when tensorboard is installed
    wandb: bool = False  # also log to Weights & Biases, when wandb is installed
    wandb_project: str = "shardship"
    time_limit: str | float | None = None  # "HH:MM:SS" or seconds: checkpoint and stop before it
    log_samples: bool = False  # per-rank samples/rankN.jsonl (which samples each step used)
    model: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "[train]") -> TrainConfig:
        """Parse a [train] table. A misspelt key is an error naming `where` and the
        known keys: silently ignoring it would train with a default nobody chose."""
        names = {f.name for f in dataclasses.fields(cls)}
        kw: dict[str, Any] = {}
        check_train_types(d, where)
        model = model_table(d.get("model"), where)
        for k, v in d.items():
            if k == "model":
                continue
            if k in names:
                kw[k] = v
            elif k in MODEL_KEYS:
                model[k] = v
            else:
                known = ", ".join(sorted(names | MODEL_KEYS))
                raise ShardshipError(f"{where}: unknown key {k!r} (known: {known})")
        bad = [k for k in model if k not in MODEL_KEYS]
        if bad:
            raise ShardshipError(f"{where} model: unknown key(s) {', '.join(bad)} "
                                 f"(known: {', '.join(sorted(MODEL_KEYS))})")
        cfg = cls(**kw, model=model)
        cfg.validate(where)
        return cfg

    def validate(self, where: str = "[train]") -> None:
        """Reject values the loop cannot run with, before any rank starts: a bad
        value found mid-run would cost a queued job."""
        for k in ("batch_size", "checkpoint_every", "log_every", "epochs"):
            if int(getattr(self, k)) < 1:
                raise ShardshipError(f"{where}: {k} must be >= 1 (got {getattr(self, k)})")
        for k in ("num_workers", "keep", "warmup", "val_every", "window"):
            if int(getattr(self, k)) < 0:
                raise ShardshipError(f"{where}: {k} must be >= 0 (got {getattr(self, k)})")
        if self.steps is not None and int(self.steps) < 1:
            raise ShardshipError(f"{where}: steps must be >= 1 (got {self.steps})")
        for k, ok, rule in _RANGES:
            v = float(getattr(self, k))
            if not (math.isfinite(v) and ok(v)):
                raise ShardshipError(f"{where}: {k} must be {rule} (got {getattr(self, k)})")
        if self.obs_horizon is not None and int(self.obs_horizon) < 1:
            raise ShardshipError(f"{where}: obs_horizon must be >= 1 (got {self.obs_horizon})")
        if self.edges not in EDGES:
            raise ShardshipError(f"{where}: edges must be {' or '.join(EDGES)} (got {self.edges!r})")
        if self.normalize not in NORMALIZE:
            raise ShardshipError(f"{where}: normalize must be {' or '.join(NORMALIZE)} (got {self.normalize!r})")
        if self.consecutive is not None and int(self.consecutive) < 1:
            raise ShardshipError(f"{where}: consecutive must be >= 1 (got {self.consecutive})")
        for k, allowed in (("cache", CACHES), ("decode", DECODES)):
            if getattr(self, k) not in allowed:
                raise ShardshipError(f"{where}: {k} must be {', '.join(allowed)} (got {getattr(self, k)!r})")
        if self.device not in DEVICES:
            raise ShardshipError(f"{where}: device must be {', '.join(DEVICES)} (got {self.device!r})")
        parse_duration(self.time_limit)

    def frames(self) -> int:
        """Observation frames per sample: [train] obs_horizon, else the model's."""
        return int(self.obs_horizon) if self.obs_horizon else int(model_config(self.model)["obs_horizon"])

    def run_length(self) -> int:
        """Samples drawn together as a run of consecutive frames: [train] consecutive, else the
        observation window's length."""
        return int(self.consecutive) if self.consecutive else self.frames()

    def merged(self, **overrides: Any) -> TrainConfig:
        """A copy with the non-None overrides (CLI flags) applied."""
        d = dataclasses.asdict(self)
        d.update({k: v for k, v in overrides.items() if v is not None})
        out = TrainConfig(**d)
        out.validate("command line")
        return out


def _model_type(default: Any) -> str:
    """A model key's type, from its default (DEFAULTS holds one of each)."""
    if isinstance(default, list):
        return "list[int]"  # enc_channels, unet_dims: channel counts
    return {bool: "bool", int: "int", float: "float"}.get(type(default), "str")


def check_train_types(d: Mapping[str, Any], where: str = "[train]") -> None:
    """Every [train] value, and every model key (in [train] or [train.model]), of the type
    the trainer reads, by shardship.config.check_value: `batch_size = "64"` is one line
    naming the file and key in every command that reads [train] (`train run`, `train
    submit`, `packer budget`), not a TypeError from deep inside the loop."""
    model = model_table(d.get("model"), where)
    check_fields(TrainConfig, {k: v for k, v in d.items() if k != "model"}, where)
    nested = f"{where[:-1]}.model]" if where.endswith("]") else f"{where} model"
    for table, keys in ((where, {k: v for k, v in d.items() if k not in _FIELDS}), (nested, model)):
        for k, v in keys.items():
            if k in DEFAULTS:
                check_value(k, v, _model_type(DEFAULTS[k]), table, DEFAULTS[k])


_FIELDS = frozenset(f.name for f in dataclasses.fields(TrainConfig))


def parse_duration(text: str | int | float | None) -> float | None:
    """'HH:MM:SS' (hours may exceed 24), 'D-HH:MM:SS' (SLURM), 'MM:SS' or seconds -> seconds."""
    if text is None or text == "":
        return None
    if isinstance(text, (int, float)):
        return float(text)
    days, dash, rest = str(text).strip().rpartition("-")
    try:
        parts = [float(p) for p in rest.split(":")]
        secs = float(days) * 86400 if days else 0.0
    except ValueError:
        raise ShardshipError(f"time_limit {text!r}: use HH:MM:SS or seconds") from None
    if len(parts) > 3 or (dash and (not days or len(parts) != 3)) or any(p < 0 for p in parts):
        raise ShardshipError(f"time_limit {text!r}: use HH:MM:SS or seconds")
    acc = 0.0
    for p in parts:
        acc = acc * 60 + p
    return secs + acc
