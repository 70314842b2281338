"""The [train] table as a job will read it: its shape checked before anything is
rendered, and `train submit --set key=value` applied to a copy before it is
written into the job's TOML.

Why here and not in train.config: a value of the wrong shape (`model = "tiny"`,
a string where a table goes) reached TrainConfig as a Python traceback
(`ValueError: dictionary update sequence element #0 ...`) from deep inside
`dict()`; a job submitted with it would die on the cluster after its queue wait.
The jobs layer is what turns config into a job, so it says which key, in which
file, and what to write instead, and the trainer's own parser stays as it is."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from shardship.config import tomllib
from shardship.errors import ShardshipError
from train.config import DEFAULTS, MODEL_KEYS, TrainConfig, model_table

_KINDS = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}


def _expected(type_text: str) -> tuple[str, tuple[type, ...], bool]:
    """('int', (int,), optional) from a dataclass annotation string such as 'int | None'."""
    parts = [p.strip() for p in str(type_text).split("|")]
    optional = "None" in parts
    base = next((p for p in parts if p != "None"), "Any")
    if base.startswith("list"):
        return "a list", (list, tuple), optional
    if base.startswith("dict"):
        return "a table", (Mapping,), optional
    return base, _KINDS.get(base, (object,)), optional


def _wrong(value: Any, kinds: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in kinds:  # TOML true is no number of workers
        return True
    return not isinstance(value, kinds)


def check_shapes(train: Mapping[str, Any], where: str) -> None:
    """Every [train] key of the trainer's own TrainConfig, and every model key, holds a
    value of the kind the trainer reads (table, list, number, string, bool)."""
    fields = {f.name: f.type for f in dataclasses.fields(TrainConfig)}
    for key, value in train.items():
        if key == "model":
            for k, v in model_table(value, where).items():
                _check_model_key(k, v, f"{where} model")
            continue
        if key in fields:
            what, kinds, optional = _expected(str(fields[key]))
            if (value is None and optional) or not _wrong(value, kinds):
                continue
            raise ShardshipError(f"{where}: {key} = {value!r} is a {type(value).__name__}; the trainer reads "
                                 f"{what} here (default {getattr(TrainConfig, key, None)!r})")
        elif key in MODEL_KEYS:
            _check_model_key(key, value, where)


def _check_model_key(key: str, value: Any, where: str) -> None:
    if key not in DEFAULTS:
        return  # TrainConfig names unknown keys itself
    default = DEFAULTS[key]
    if isinstance(default, list):
        kinds: tuple[type, ...] = (list, tuple)
    elif isinstance(default, bool):
        kinds = (bool,)
    elif isinstance(default, (int, float)):
        kinds = (int, float)
    else:
        kinds = (str,)
    if _wrong(value, kinds):
        raise ShardshipError(f"{where}: {key} = {value!r} is a {type(value).__name__}; the model reads a "
                             f"{type(default).__name__} here (default {default!r})")


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
