"""How big the trainer's decoded-frame cache ([train] cache) is, from index.json alone.

The trainer decodes the training split's frames once and keeps them: on the GPU
("gpu", one copy per rank), in the node's shared memory ("host", one copy per node
for all its ranks), or not at all ("off"); "auto" picks gpu where it fits, else host,
else off. `packer budget` shows its size and `train submit` counts it in the job's
memory request, on machines without torch: so this module is pure arithmetic on the
index document (numpy-free too), and agrees with the trainer by construction: the
same session split (shardship.split, with the index's own copies of one recording
kept together) and the same frames (every sample with an action chunk: the reader's
ShardIndex keeps exactly those, and a window's earlier frames are such samples too).

In the trainer, with its ShardIndex at hand: `cache_bytes(train_ix.n_samples,
*train_ix.image_size)`."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardship.errors import ShardshipError
from shardship.split import SEED, VAL_FRACTION, split_sessions
from shardship.units import human
from train.config import CACHES, TrainConfig

CHANNELS = 3  # decoded frames are RGB uint8
MODES = CACHES  # [train] cache: "auto" | "gpu" | "host" | "off"
DEFAULT_MODE = TrainConfig.cache  # "auto"
HOST_MODES = ("host", "auto")  # the modes that may keep the frames in the node's memory
DEFAULT_SIZE = 224  # index.json options.size when it says none (train.data.index does the same)

WHERE = {  # where each mode keeps the frames, for people
    "auto": "host shared memory or GPU",
    "gpu": "GPU memory, one copy per GPU",
    "host": "host shared memory, one copy per node",
    "off": "",
}


def cache_bytes(n_frames: int, width: int, height: int) -> int:
    """Bytes of `n_frames` decoded width x height RGB uint8 frames."""
    if n_frames < 0 or width < 0 or height < 0:
        raise ValueError(f"cache_bytes: negative size ({n_frames} frames of {width}x{height})")
    return int(n_frames) * int(width) * int(height) * CHANNELS


@dataclass(frozen=True)
class CacheSize:
    """The training split's decoded frames: how many, their size, and the bytes they take."""

    frames: int
    width: int
    height: int
    sessions: tuple[str, ...]  # the training sessions

    @property
    def bytes(self) -> int:
        return cache_bytes(self.frames, self.width, self.height)

    def describe(self) -> str:
        """"12,000 training frames x 224x224x3" """
        return f"{self.frames:,} training frames x {self.width}x{self.height}x{CHANNELS}"


def frame_size(doc: Mapping[str, Any]) -> tuple[int, int]:
    """(width, height) of the packed frames: index.json options.size, one number or [w, h]."""
    size = (doc.get("options") or {}).get("size", DEFAULT_SIZE)
    if isinstance(size, (list, tuple)):
        return int(size[0]), int(size[1])
    return int(size), int(size)


def posed_frames(doc: Mapping[str, Any]) -> dict[str, int]:
    """Session -> its samples with an action chunk (`has_action`), for every session with any:
    the frames the trainer reads (and the sessions its split is made of)."""
    fields = doc.get("sample_fields") or []
    if "has_action" not in fields:
        raise ShardshipError("index.json: sample_fields has no has_action column: re-run `packer pack`")
    col = fields.index("has_action")
    out: dict[str, int] = {}
    for sh in doc.get("shards") or []:
        n = sum(1 for row in sh.get("samples") or () if row[col])
        if n:
            session = str(sh.get("session", ""))
            out[session] = out.get(session, 0) + n
    return out


def same_recording(doc: Mapping[str, Any]) -> dict[str, str]:
    """Session -> its content key (index.json sessions.*.content_key), as the trainer passes it
    to split_sessions: two names with one key are one recording, kept on one side."""
    sessions = doc.get("sessions") or {}
    return {n: str(e["content_key"]) for n, e in sessions.items() if isinstance(e, dict) and e.get("content_key")}


def training_cache(doc: Mapping[str, Any], val_fraction: float = VAL_FRACTION, seed: int = SEED,
                   val_sessions: Sequence[str] | None = None) -> CacheSize:
    """The cache of the training split `train run` makes with these [train] settings (its own
    split_sessions on the sessions that have posed frames). A split that cannot be made
    (every session held out) raises the trainer's ShardshipError."""
    per_session = posed_frames(doc)
    width, height = frame_size(doc)
    if not per_session:
        return CacheSize(0, width, height, ())
    train, _ = split_sessions(sorted(per_session), float(val_fraction), int(seed), list(val_sessions or ()) or None,
                              same_recording(doc))
    return CacheSize(sum(per_session[n] for n in train), width, height, tuple(train))


def cache_mode(train: Mapping[str, Any], where: str = "[train]") -> str:
    """[train] cache, checked (the trainer's default when absent)."""
    mode = train.get("cache", DEFAULT_MODE)
    if mode not in MODES:
        raise ShardshipError(f"{where}: cache must be {', '.join(MODES)} (got {mode!r})")
    return str(mode)


def for_train(doc: Mapping[str, Any], train: Mapping[str, Any]) -> CacheSize:
    """training_cache with the split settings of a [train] table (the trainer's defaults
    where it gives none)."""
    return training_cache(doc, float(train.get("val_fraction", VAL_FRACTION)), int(train.get("seed", SEED)),
                          train.get("val_sessions") or None)


def budget_line(size: CacheSize, mode: str) -> str:
    """One line for `packer budget`: the cache's size, where it lives, and that it is memory."""
    if mode == "off":
        return (f'decoded-frame cache: off ([train] cache = "off": frames are decoded every step; '
                f"{human(size.bytes)} of memory if it were on)")
    return (f"decoded-frame cache: {human(size.bytes)} of memory ({WHERE[mode]}; not on disk, not in the quota), "
            f'[train] cache = "{mode}": {size.describe()}')
