"""encoders.json, as the StackCapture app and the glove's ESP32 write it.

Each row (~50 Hz) is one BLE notification:
``{"timestamp": phone receive time (Unix epoch s), "esp_timestamp_ms": ESP32 millis()
when the encoders were read, "index_mcp", "index_pip", "three_finger_mcp",
"three_finger_pip": degrees, signed in [-180, 180), -1.0 = I2C read error}``.
The file is absent when no notification arrived (glove not connected).

Why the ESP clock matters: the receive time carries 5-30 ms of BLE connection-interval
jitter, the ESP's millis() does not. Receive time = read time + latency >= read time,
so a line fitted under the (ESP ms, receive time) cloud maps every reading onto the
phone's clock with only the minimal latency left. Read errors are dropped per joint;
angles are unwrapped across the +-180 seam. Pure numpy after the JSON is read."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

JOINTS = ("index_mcp", "index_pip", "three_finger_mcp", "three_finger_pip")
UNITS = "degrees"
READ_ERROR = -1.0  # the firmware's error value; never a real reading (not a multiple of 360/4096)
ESP_WRAP = 2 ** 32  # millis() is a uint32
MIN_MOTION_DEG = 1.0  # a joint whose range is below this "never moves"
MAX_SPREAD = 0.25  # s: BLE delivers within a few connection intervals; more is not this clock


@dataclass
class Encoders:
    """Joint angles on the phone's epoch clock; per joint only its valid readings."""
    t: list[np.ndarray]  # per joint: epoch seconds of valid readings (sorted)
    values: list[np.ndarray]  # per joint: degrees, unwrapped (continuous)
    clock: str  # "esp" (de-jittered) | "receive" (BLE receive times as they are)
    rows: int
    read_errors: list[int]  # per joint
    warnings: list[str] = field(default_factory=list)
    names: tuple[str, ...] = JOINTS

    @property
    def valid(self) -> bool:
        """Every joint has at least two readings to interpolate between."""
        return all(len(t) >= 2 for t in self.t)

    @property
    def span(self) -> tuple[float, float]:
        """(first, last) epoch time at which every joint has a reading."""
        return max(float(t[0]) for t in self.t), min(float(t[-1]) for t in self.t)

    def at(self, epoch: np.ndarray) -> np.ndarray:
        """(N, 4) degrees at epoch times, linear between readings, held at the ends."""
        return np.stack([np.interp(epoch, t, v) for t, v in zip(self.t, self.values)], axis=1)


class EncoderFormatError(ValueError):
    """encoders.json does not have the app's fields; the message says which."""


def parse_rows(rows: object) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """(receive epoch (N,), esp ms (N,) or None when absent, degrees (N, 4)) from the
    decoded JSON list. Raises EncoderFormatError naming what is missing."""
    if not isinstance(rows, list) or not rows:
        raise EncoderFormatError("expected a non-empty JSON list of readings")
    if not all(isinstance(r, dict) for r in rows):
        raise EncoderFormatError("every reading must be a JSON object")
    missing = [k for k in ("timestamp", *JOINTS) if k not in rows[0]]
    if missing:
        raise EncoderFormatError(f"readings lack {', '.join(missing)} (have {', '.join(sorted(rows[0]))})")
    try:
        t = np.array([r["timestamp"] for r in rows], dtype=np.float64)
        v = np.array([[r[k] for k in JOINTS] for r in rows], dtype=np.float64)
        esp = None
        if all("esp_timestamp_ms" in r for r in rows):
            esp = np.array([r["esp_timestamp_ms"] for r in rows], dtype=np.float64)
    except (KeyError, TypeError, ValueError) as e:
        raise EncoderFormatError(f"every reading needs timestamp and {', '.join(JOINTS)} as numbers ({e})") from None
    if not np.all(np.isfinite(t)):
        raise EncoderFormatError("NaN/inf timestamps")
    return t, esp, v


def esp_clock(esp_ms: np.ndarray, receive: np.ndarray) -> np.ndarray | None:
    """Epoch time of each reading from the ESP's millis(): receive - esp is the
    delivery latency plus a constant; its floor (2nd percentile) is the constant plus
    the fastest delivery, so esp + floor removes the BLE jitter. The ESP crystal's
    drift (< 50 ppm: 1.5 ms over a 30 s session) is below what the jitter lets one
    fit, so the slope is 1. None when the ESP clock is unusable: a reboot resets
    millis() mid-session, or deliveries spread over more than MAX_SPREAD."""
    ms = np.asarray(esp_ms, dtype=np.float64).copy()
    back = np.diff(ms) < -ESP_WRAP / 2  # a uint32 wrap (49.7 days of uptime)
    if back.any():
        ms[1:] += ESP_WRAP * np.cumsum(back)
    if len(ms) < 10 or np.any(np.diff(ms) <= 0) or not np.all(np.isfinite(ms)):
        return None
    x = ms / 1000.0
    lag = receive - x
    floor, top = np.quantile(lag, [0.02, 0.98])
    if top - floor > MAX_SPREAD:
        return None
    return x + floor


def unwrap_valid(t: np.ndarray, deg: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """(times, continuous degrees, read errors) of one joint: -1.0 readings dropped,
    +-180 seam crossings unwrapped."""
    bad = (deg == READ_ERROR) | ~np.isfinite(deg)
    tv, dv = t[~bad], deg[~bad]
    if len(dv):
        dv = np.unwrap(dv, period=360.0)
    return tv, dv, int(bad.sum())


def from_rows(rows: object) -> Encoders:
    """Encoders from the decoded encoders.json (see the module docstring)."""
    receive, esp, deg = parse_rows(rows)
    warnings: list[str] = []
    order = np.argsort(receive, kind="stable")
    receive, deg = receive[order], deg[order]
    esp = esp[order] if esp is not None else None
    t = esp_clock(esp, receive) if esp is not None else None
    clock = "esp"
    if t is None:
        clock, t = "receive", receive
        if esp is not None:
            warnings.append("esp_timestamp_ms is not a steady clock (ESP reboot?): using BLE receive times "
                            "(+-30 ms jitter)")
    ts, vs, errs = [], [], []
    for j, name in enumerate(JOINTS):
        tj, vj, nbad = unwrap_valid(t, deg[:, j])
        ts.append(tj)
        vs.append(vj)
        errs.append(nbad)
        if len(tj) < 2:
            warnings.append(f"{name}: {nbad} of {len(t)} readings are read errors (-1): joints masked")
        elif nbad > 0.2 * len(t):
            warnings.append(f"{name}: {nbad} of {len(t)} readings are read errors (-1); check the encoder wiring")
        elif float(np.ptp(vj)) < MIN_MOTION_DEG:
            warnings.append(f"{name} never moves (stays at {vj[0]:.1f} deg): encoder loose or unplugged?")
    return Encoders(ts, vs, clock, len(t), errs, warnings)


def coverage(enc: Encoders, frame_epoch: np.ndarray) -> float:
    """Fraction of the video's time span that the encoder readings cover."""
    lo, hi = enc.span
    f0, f1 = float(frame_epoch[0]), float(frame_epoch[-1])
    if f1 <= f0:
        return 1.0 if lo <= f0 <= hi else 0.0
    return max(0.0, min(hi, f1) - max(lo, f0)) / (f1 - f0)
