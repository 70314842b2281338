"""Normalisation of actions and proprio from the statistics `packer pack` wrote
into index.json (`stats`), as one per-dimension affine map `x_n = (x - offset) / scale`.

Two modes:

- "minmax" (the user's trainer, corneliusgruss/stack `NormalizationStats`):
  actions min-max to [-1, 1] (offset = (min + max) / 2, scale = (max - min) / 2),
  proprio z-scored (offset = mean, scale = std), exactly what that trainer does.
- "zscore" (shardship's own default before obs_horizon): both z-scored.

A dimension whose range or std is below 1e-6 (e.g. a joint never moved) gets
scale 1, so it maps to `x - offset` instead of dividing by zero.

Where the proprio statistics come from: with `obs_horizon` N the proprio is the
13-D pose of each observation step relative to frame t plus the joints, and
`packer pack` keeps its statistics per backward offset (`stats.obs`, one
mergeable count/sum/sumsq/min/max record for d = 0..3, computed at pack time over
every posed frame); the first N are pooled here, so N = 2 gets exactly the
statistics of the frames it reads. N > 4 pools the four there are. An
index.json packed before `stats.obs` existed gets them derived instead: the
pose dimensions from the action statistics (future steps relative to t, a close
stand-in for past ones) and the joints from `stats.proprio`; re-running
`packer pack` adds the exact ones without re-encoding a frame."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from packer.actions import POSE_DIMS, RunningStats
from shardship.errors import ShardshipError
from train.config import NORMALIZE

MODES = NORMALIZE  # the [train] normalize choices, defined once in train.config
_EPS = 1e-6


@dataclass
class Normalizer:
    """`normalize_*` maps raw units to the network's, `unnormalize_action` maps
    a predicted chunk back. Works on numpy arrays and torch tensors (last axis =
    dimensions). `state_dict()` is plain lists, so it goes into any checkpoint."""

    mode: str
    action_offset: np.ndarray
    action_scale: np.ndarray
    proprio_offset: np.ndarray
    proprio_scale: np.ndarray

    def normalize_action(self, a: Any) -> Any:
        return (a - _like(self.action_offset, a)) / _like(self.action_scale, a)

    def unnormalize_action(self, a: Any) -> Any:
        return a * _like(self.action_scale, a) + _like(self.action_offset, a)

    def normalize_proprio(self, p: Any) -> Any:
        return (p - _like(self.proprio_offset, p)) / _like(self.proprio_scale, p)

    def state_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, **{k: getattr(self, k).tolist() for k in
                                      ("action_offset", "action_scale", "proprio_offset", "proprio_scale")}}

    @classmethod
    def from_state_dict(cls, d: Mapping[str, Any]) -> Normalizer:
        arr = {k: np.asarray(d[k], dtype=np.float64) for k in
               ("action_offset", "action_scale", "proprio_offset", "proprio_scale")}
        return cls(mode=str(d["mode"]), **arr)

    def as_stats(self) -> dict[str, dict[str, list[float]]]:
        """The map in index.json's {"mean", "std"} shape: what DiffusionPolicy.set_normaliser
        takes (its buffers hold offset and scale, whichever the mode)."""
        return {"action": {"mean": self.action_offset.tolist(), "std": self.action_scale.tolist()},
                "proprio": {"mean": self.proprio_offset.tolist(), "std": self.proprio_scale.tolist()}}


def _like(x: np.ndarray, ref: Any) -> Any:
    if isinstance(ref, torch.Tensor):
        return torch.as_tensor(x, dtype=ref.dtype if ref.is_floating_point() else torch.float32, device=ref.device)
    return x


def _scale(values: np.ndarray) -> np.ndarray:
    return np.where(values > _EPS, values, 1.0).astype(np.float64)


def _part(stats: Mapping[str, Any], name: str, dim: int) -> dict[str, np.ndarray]:
    s = stats.get(name) or {}
    out: dict[str, np.ndarray] = {}
    for k in ("mean", "std", "min", "max"):
        v = s.get(k)
        if v is not None and len(v) == dim:
            out[k] = np.asarray(v, dtype=np.float64)
    return out


def obs_summary(stats: Mapping[str, Any], obs_horizon: int, joints: int) -> dict[str, np.ndarray]:
    """mean/std/min/max of the relative proprio (9 + joints dims) over the first
    `obs_horizon` backward offsets; derived when index.json predates `stats.obs`."""
    dim = POSE_DIMS + joints
    steps = stats.get("obs") or []
    if steps and all(isinstance(d, Mapping) and len(d.get("sum") or []) == dim for d in steps):
        total = RunningStats.from_json(steps[0])
        for d in steps[1:max(1, obs_horizon)]:
            total.merge(RunningStats.from_json(d))
        return {k: np.asarray(v, dtype=np.float64) for k, v in total.summary().items() if k != "count"}
    act, prop = _part(stats, "action", dim), _part(stats, "proprio", joints)
    out: dict[str, np.ndarray] = {}
    for k, fill in (("mean", 0.0), ("std", 1.0), ("min", -1.0), ("max", 1.0)):
        pose = act[k][:POSE_DIMS] if k in act else np.full(POSE_DIMS, fill)
        jnt = prop[k] if k in prop else np.full(joints, fill)
        out[k] = np.concatenate([pose, jnt])
    return out


def make_normalizer(stats: Mapping[str, Any], mode: str, action_dim: int, joints: int,
                    obs_horizon: int | None) -> Normalizer:
    """The normaliser for `mode` from index.json `stats`. `obs_horizon` None: the
    proprio is the joints alone (the single-frame layout), else the 13-D relative one."""
    if mode not in MODES:
        raise ShardshipError(f"normalize must be one of {', '.join(MODES)} (got {mode!r})")
    act = _part(stats, "action", action_dim)
    if obs_horizon is None:
        prop = _part(stats, "proprio", joints)
        pdim = joints
    else:
        prop = obs_summary(stats, obs_horizon, joints)
        pdim = POSE_DIMS + joints
    if mode == "minmax":
        if "min" not in act or "max" not in act:
            raise ShardshipError("index.json stats.action has no min/max (packed by an older shardship): "
                                 "re-run `packer pack`, or use normalize = \"zscore\"")
        a_off, a_scale = (act["min"] + act["max"]) / 2, (act["max"] - act["min"]) / 2
    else:
        a_off, a_scale = act.get("mean", np.zeros(action_dim)), act.get("std", np.ones(action_dim))
    p_off, p_scale = prop.get("mean", np.zeros(pdim)), prop.get("std", np.ones(pdim))
    for name, v in (("action", a_off), ("action", a_scale), ("proprio", p_off), ("proprio", p_scale)):
        if not np.isfinite(v).all():
            raise ShardshipError(f"index.json stats.{name} holds a non-finite value: re-run `packer pack`")
    return Normalizer(mode, a_off.astype(np.float64), _scale(a_scale), p_off.astype(np.float64), _scale(p_scale))
