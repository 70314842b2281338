"""Which sessions look unlike the rest of the dataset: a robust z-score per
quantity (Iglewicz and Hoaglin's modified z, 0.6745 (x - median) / MAD), flagged
beyond 3.5. Median and MAD, not mean and std, so one broken session cannot hide
itself by inflating the spread it is measured against.

Quantities: the metric scale (metres per SfM unit: a session far off the others
was likely calibrated wrong, since one phone in one room gives similar maps), the
median camera speed, the joint range (a glove that stopped or a joint that never
moved), and the gyro alignment residual (a clock or a rotation that did not fit)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

THRESHOLD = 3.5
MIN_SESSIONS = 4  # below this a median says little about what is usual
QUANTITIES = {
    "scale": ("scale", "m per SfM unit"),
    "speed": ("median speed", "m/s"),
    "joint_range": ("joint range", "deg, mean over joints"),
    "gyro_residual": ("alignment residual", "rad/s"),
}


@dataclass
class Flag:
    quantity: str  # a key of QUANTITIES
    value: float
    median: float
    z: float

    def __str__(self) -> str:
        label, unit = QUANTITIES[self.quantity]
        side = "above" if self.z > 0 else "below"
        return (f"{label} {self.value:.3g} {unit}: far {side} the dataset's median {self.median:.3g} "
                f"(robust z {self.z:+.1f})")


def robust_z(values: np.ndarray) -> np.ndarray:
    """Modified z-scores of the finite entries (NaN elsewhere); zeros when the
    spread is zero. A MAD of zero (most sessions identical) falls back to the mean
    absolute deviation, scaled to match a normal's."""
    x = np.asarray(values, dtype=np.float64)
    ok = np.isfinite(x)
    z = np.full(x.shape, np.nan)
    if not ok.any():
        return z
    med = float(np.median(x[ok]))
    mad = float(np.median(np.abs(x[ok] - med)))
    if mad > 0:
        z[ok] = 0.6745 * (x[ok] - med) / mad
    else:
        meanad = float(np.mean(np.abs(x[ok] - med)))
        z[ok] = (x[ok] - med) / (1.2533 * meanad) if meanad > 0 else 0.0
    return z


def flag_sessions(metrics: dict[str, dict[str, float | None]]) -> tuple[dict[str, list[Flag]], str]:
    """metrics: session -> quantity -> value (None: not measured). Returns (session ->
    its flags, a note for the page: empty, or why nothing was compared)."""
    names = sorted(metrics)
    out: dict[str, list[Flag]] = {n: [] for n in names}
    if len(names) < MIN_SESSIONS:
        return out, f"{len(names)} packed session(s): outliers are looked for from {MIN_SESSIONS} on"
    for q in QUANTITIES:
        vals = np.array([np.nan if metrics[n].get(q) is None else float(metrics[n][q]) for n in names])  # type: ignore[arg-type]
        if np.isfinite(vals).sum() < MIN_SESSIONS:
            continue
        z = robust_z(vals)
        med = float(np.nanmedian(vals))
        for n, v, zi in zip(names, vals, z):
            if np.isfinite(zi) and abs(zi) > THRESHOLD:
                out[n].append(Flag(q, float(v), med, float(zi)))
    return out, ""
