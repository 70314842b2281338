"""A session's JSON files (imu.json, encoders.json, metadata.json, poses.json) as the
app writes them: parsed fast where orjson is installed, every failure one SessionError
naming the file, and a truncated export said to be one (only a new export fixes it)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

try:
    import orjson
except ImportError:  # optional: json parses the same
    orjson = None  # type: ignore[assignment]

from shardship.errors import SessionError


def read_json(session_name: str, path: Path) -> Any:
    """A session's JSON file. orjson (where installed) parses imu.json/poses.json 3-8x faster;
    a file it refuses goes through json, which loads NaN literals and words the error (a
    truncated export says so: only a new export fixes it)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
        if orjson is not None:
            try:
                return orjson.loads(raw)
            except orjson.JSONDecodeError:
                pass
        return json.loads(raw, parse_constant=_reject_constant)
    except FileNotFoundError:
        raise SessionError(session_name, path.name, "missing") from None
    except json.JSONDecodeError as e:
        if _ends_early(e):
            raise SessionError(session_name, path.name, f"truncated after {len(raw):,} bytes (the app was stopped "
                               "while writing?): re-export the session from the phone") from None
        raise SessionError(session_name, path.name, f"not valid JSON ({e})") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise SessionError(session_name, path.name, f"not valid JSON ({e})") from None


def _ends_early(e: json.JSONDecodeError) -> bool:
    """Did the text stop (a truncated file: the parser ran out, or no closing bracket and a failure
    near the end or in an unclosed string; a cut can land mid-number), rather than go wrong?"""
    text = e.doc.rstrip()
    return not e.msg.startswith("Extra data") and (e.pos >= len(text) or (not text.endswith(("}", "]")) and (
        len(text) - e.pos <= 64 or e.msg.startswith("Unterminated string"))))


def _reject_constant(name: str) -> float:
    return float("nan")  # NaN/Infinity literals load as NaN; callers check finiteness
