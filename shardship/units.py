"""Sizes for machines and people: '10G' -> bytes and bytes -> '1.2 GB', in binary
units as quota tools, schedulers and `du -h` use them."""
from __future__ import annotations

from shardship.errors import ShardshipError

_UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}


def parse_size(text: str | int | float) -> int:
    """'10G' -> bytes (binary units, as quota tools and schedulers use them)."""
    if isinstance(text, (int, float)):
        return int(text)
    s = text.strip().upper().removesuffix("IB").removesuffix("B") if text.strip() else ""
    num = s.rstrip("KMGTP")
    unit = s[len(num):]
    try:
        return int(float(num) * _UNITS[unit])
    except (ValueError, KeyError):
        raise ShardshipError(f"cannot read size {text!r}: use e.g. 10G, 512M, 1.5T") from None


def human(n: float) -> str:
    """Bytes for people: 1.2 GB (binary units, like `quota -s` and `du -h`)."""
    n = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def plural(word: str, n: float) -> str:
    """"1 session", "15 shards", "0.5 img/s" stays "img" (an abbreviation: it, img, B)."""
    return word if round(n, 6) == 1 or word in ("it", "img", "B") or word.endswith("s") else word + "s"
