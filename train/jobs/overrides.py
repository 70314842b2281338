"""The [train] table as a job will read it: its shape checked before anything is
rendered, and `train submit --set key=value` applied to a copy before it is
written into the job's TOML.

A value of the wrong shape (`model = "tiny"`, a string where a table goes) would
die on the cluster after the job's queue wait: the check is the trainer's own
(train.config.check_train_types, built on shardship.config.check_value, which
checks every table of shardship.toml), run on the job's copy of [train] with its
`--set` overrides, so it names which key, in which file, and what to write."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from shardship.config import tomllib
from shardship.errors import ShardshipError
from train.config import MODEL_KEYS, TrainConfig, check_train_types


def check_shapes(train: Mapping[str, Any], where: str) -> None:
    """Every [train] key of the trainer's own TrainConfig, and every model key, holds a
    value of the kind the trainer reads (table, list, number, string, bool): the
    trainer's own check (train.config.check_train_types), so a job is refused here,
    before its queue wait, with the line `train run` would say on the cluster."""
    check_train_types(train, where)


def parse_value(text: str) -> Any:
    """A TOML value (`3e-4`, `true`, `[32, 64]`, `"cpu"`), or the bare text as a string (`cpu`)."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_sets(train: Mapping[str, Any], sets: Sequence[str], where: str = "--set") -> dict[str, Any]:
    """A copy of [train] with each `key=value` applied: `lr=1e-4`, `model.preset=tiny`,
    `unet_dims=[32,64]` (a model key, as in [train]). Unknown keys are refused by name."""
    out: dict[str, Any] = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in train.items()}
    names = {f.name for f in dataclasses.fields(TrainConfig)} - {"model"}
    for item in sets:
        key, eq, text = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ShardshipError(f"{where} {item!r}: write KEY=VALUE, e.g. --set lr=1e-4 or --set model.preset=tiny")
        value = parse_value(text.strip())
        if key.startswith("model."):
            sub = key.removeprefix("model.")
            if sub not in MODEL_KEYS:
                raise ShardshipError(f"{where} {item!r}: unknown model key {sub!r} "
                                     f"(known: {', '.join(sorted(MODEL_KEYS))})")
            model = out.get("model")
            out["model"] = {**(model if isinstance(model, Mapping) else {}), sub: value}
        elif key == "model":
            raise ShardshipError(f"{where} {item!r}: model is a table of model settings: set one of them, "
                                 f"e.g. --set model.preset={text.strip() or 'tiny'}")
        elif key in names or key in MODEL_KEYS:
            out[key] = value
        else:
            raise ShardshipError(f"{where} {item!r}: unknown [train] key {key!r} "
                                 f"(known: {', '.join(sorted(names))}, or model.KEY)")
    return out
