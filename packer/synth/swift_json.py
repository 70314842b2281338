"""JSON bytes exactly as Foundation's `JSONEncoder` writes them on iOS 17 with
`outputFormatting = [.prettyPrinted, .sortedKeys]` (what StackCapture uses for every
JSON file it writes).

What that encoder does, and this module reproduces:
- 2-space indentation; an object member is `"key" : value` (a space on both sides
  of the colon); members and array elements are separated by ",\\n", every element
  on its own line, nested containers indented one more level;
- an empty array is `[`, newline, newline, indent, `]` (`[\\n\\n]` at top level),
  an empty object likewise with braces;
- no trailing newline after the top-level value;
- keys sorted (every key set StackCapture writes sorts the same in code-point and
  in Foundation's case-insensitive order, see `_sorted_items`);
- numbers: integers as integers; a `Double` as Swift's `description` (the shortest
  string that round-trips, same digits and same exponent thresholds as Python's
  `repr` for every value this project writes) with a trailing ".0" removed, so
  `60.0` -> `60`, `-1.0` -> `-1`; a `Float` (Float32 fields: encoder angles,
  intrinsics, ARKit transforms, depth) as the shortest string that round-trips
  *the float32*, e.g. float32(0.1) -> `0.1` (not 0.10000000149011612);
- strings with `"` `\\\\` and `/` escaped (`\\/`: no `.withoutEscapingSlashes`),
  control characters as `\\n`, `\\t`, ... or `\\u00xx`, everything else raw UTF-8;
- NaN/infinity: Swift's default strategy throws; here they are written as the bare
  literals `NaN`/`Infinity` (only the `nan_imu` bad-input knob produces them).

Which numbers are Float32 is a property of the Swift type, not of the value, so the
caller says so: wrap a value in `Float32(...)`, or name the keys whose numbers
(recursively, e.g. the 4x4 `transform`) are Float32 with `float32_keys`.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = ["dumps", "Float32", "format_double", "format_float32"]


class Float32(float):
    """A float serialised as a Swift `Float` (value rounded to float32 first)."""

    def __new__(cls, x: float) -> Float32:
        return super().__new__(cls, float(np.float32(x)))


def _nonfinite(x: float) -> str:
    if math.isnan(x):
        return "NaN"
    return "Infinity" if x > 0 else "-Infinity"


def format_double(x: float) -> str:
    """A Swift `Double` as JSONEncoder writes it: `description`, minus a trailing ".0"."""
    x = float(x)
    if not math.isfinite(x):
        return _nonfinite(x)
    s = repr(x)
    return s[:-2] if s.endswith(".0") else s


def format_float32(x: float) -> str:
    """A Swift `Float` as JSONEncoder writes it: shortest round-trip digits of the
    float32, `description` layout, minus a trailing ".0"."""
    f = np.float32(x)
    if not np.isfinite(f):
        return _nonfinite(float(f))
    # the shortest digits that round-trip the float32 (<= 9 significant digits),
    # laid out like Swift's description (= Python's repr layout for these digits)
    digits = np.format_float_positional(f, unique=True, trim="-")
    return format_double(float(digits))


_ESCAPES = {'"': '\\"', "\\": "\\\\", "/": "\\/", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b",
            "\f": "\\f"}  # Foundation's JSON escapes (it escapes "/" too)


def _escape(s: str) -> str:
    out = ['"']
    for ch in s:
        esc = _ESCAPES.get(ch)
        out.append(esc if esc is not None else f"\\u{ord(ch):04x}" if ord(ch) < 0x20 else ch)
    out.append('"')
    return "".join(out)


def _sorted_items(d: dict) -> list[tuple[str, Any]]:
    # Foundation sorts with String.compare(options: [.numeric, .caseInsensitive,
    # .forcedOrdering]); for the key sets StackCapture writes (camelCase and
    # snake_case words that never differ only by case or at an underscore/digit
    # position) that is the plain code-point order used here.
    return sorted(d.items(), key=lambda kv: kv[0])


def _number(x: Any, f32: bool) -> str:
    if isinstance(x, (bool, np.bool_)):
        return "true" if x else "false"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    if f32 or isinstance(x, (Float32, np.float32)):
        return format_float32(float(x))
    return format_double(float(x))


def _write(obj: Any, out: list[str], indent: int, f32: bool, float32_keys: frozenset[str]) -> None:
    pad = "  " * indent
    if obj is None:
        out.append("null")
    elif isinstance(obj, (bool, np.bool_)):
        out.append("true" if obj else "false")
    elif isinstance(obj, str):
        out.append(_escape(obj))
    elif isinstance(obj, (int, float, np.integer, np.floating)):
        out.append(_number(obj, f32))
    elif isinstance(obj, dict):
        out.append("{\n")
        first = True
        for k, v in _sorted_items(obj):
            if not isinstance(k, str):
                raise TypeError(f"JSON object keys must be str, got {k!r}")
            if not first:
                out.append(",\n")
            first = False
            out.append(pad + "  " + _escape(k) + " : ")
            _write(v, out, indent + 1, f32 or k in float32_keys, float32_keys)
        out.append("\n" + pad + "}")
    elif isinstance(obj, (list, tuple, np.ndarray)):
        out.append("[\n")
        first = True
        for v in obj:
            if not first:
                out.append(",\n")
            first = False
            out.append(pad + "  ")
            _write(v, out, indent + 1, f32, float32_keys)
        out.append("\n" + pad + "]")
    else:
        raise TypeError(f"cannot encode {type(obj).__name__} as JSON")


def dumps(obj: Any, float32_keys: Iterable[str] = ()) -> bytes:
    """UTF-8 bytes of `obj` as `JSONEncoder` with [.prettyPrinted, .sortedKeys]
    writes it. Numbers under a key in `float32_keys` (at any depth below it) and
    `Float32`/np.float32 values are Swift `Float`s; other floats are `Double`s."""
    out: list[str] = []
    _write(obj, out, 0, False, frozenset(float32_keys))
    return "".join(out).encode("utf-8")
