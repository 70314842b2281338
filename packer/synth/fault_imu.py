"""Sensor faults a real phone puts in imu.json, applied to a rendered session.

`imu_gap`: the app's CoreMotion handler runs on the main queue, so while the main
thread is busy (an encode, a UI hitch) no deviceMotion sample is delivered: 0.1-0.5 s
with none at all, and the samples after it stamped with their own delivery times.
Here the samples of such a stretch are deleted from a session already written, the
rest kept byte for byte in the app's JSON layout (`swift_json`), and metadata.json's
imuCount told the new count, as the app counts what it wrote."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from packer.synth import swift_json


def imu_gap(folder: Path, at: float, length: float) -> dict[str, Any]:
    """Delete the samples of `folder`/imu.json stamped in [at, at + length) seconds
    after its first sample. Returns the truth: what was asked, how many samples went,
    and the gap as the data now show it (`gap_at`: the last sample before it, seconds
    from the IMU start; `gap_length`: from that sample to the next one kept)."""
    folder = Path(folder)
    path = folder / "imu.json"
    samples = json.loads(path.read_bytes())
    t0 = float(samples[0]["timestamp"])
    rel = [float(s["timestamp"]) - t0 for s in samples]
    drop = [at <= r < at + length for r in rel]
    if not any(drop):
        raise ValueError(f"no IMU sample in [{at}, {at + length}) s of {rel[-1]:.3f} s")
    first = drop.index(True)
    last = len(drop) - 1 - drop[::-1].index(True)
    kept = [s for s, d in zip(samples, drop) if not d]
    path.write_bytes(swift_json.dumps(kept))
    _recount(folder / "metadata.json", len(kept))
    before = rel[first - 1] if first > 0 else None
    after = rel[last + 1] if last + 1 < len(rel) else None
    return {
        "at": float(at), "length": float(length), "removed": last - first + 1, "kept": len(kept),
        "gap_at": before, "gap_length": None if before is None or after is None else after - before,
        "imu_start": t0,
    }


def _recount(md_path: Path, count: int) -> None:
    """metadata.json's "imuCount" : N as the app writes it, the other bytes untouched."""
    if not md_path.exists():
        return
    text = md_path.read_bytes().decode("utf-8")
    new, n = re.subn(r'("imuCount" : )\d+', lambda m: f"{m.group(1)}{count}", text, count=1)
    if n:
        md_path.write_bytes(new.encode("utf-8"))
