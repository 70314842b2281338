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
MIN_GAP, MAX_GAP = 0.10, 0.15  # s: bounds of the longest normal stretch between readings (max_gap)


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
        """(N, 4) degrees at epoch times, linear between readings and on from the two
        end readings past the ends (`valid_at` says where that is a reading and where it
        would be a guess); a joint without two readings is 0."""
        return np.stack([_line(epoch, t, v) if len(t) >= 2 else np.zeros(len(np.atleast_1d(epoch)))
                         for t, v in zip(self.t, self.values)], axis=1)


def _line(epoch: np.ndarray, t: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Linear interpolation, and the end readings' line continued past the ends (a
    frame a few ms after the last notification is on that line, not at its value)."""
    out = np.interp(epoch, t, v)
    lo, hi = epoch < t[0], epoch > t[-1]
    if lo.any() and t[1] > t[0]:
        out[lo] = v[0] + (epoch[lo] - t[0]) * (v[1] - v[0]) / (t[1] - t[0])
    if hi.any() and t[-1] > t[-2]:
        out[hi] = v[-1] + (epoch[hi] - t[-1]) * (v[-1] - v[-2]) / (t[-1] - t[-2])
    return out


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
            warnings.append(f"{name}: {nbad} of {len(t)} readings are read errors (-1): that joint is masked")
        elif nbad > 0.2 * len(t):
            warnings.append(f"{name}: {nbad} of {len(t)} readings are read errors (-1); check the encoder wiring")
        elif float(np.ptp(vj)) < MIN_MOTION_DEG:
            warnings.append(f"{name} never moves (stays at {vj[0]:.1f} deg): encoder loose or unplugged?")
    return Encoders(ts, vs, clock, len(t), errs, warnings)


def usable(enc: Encoders) -> np.ndarray:
    """(J,) bool: joints with at least two readings (a joint that only ever read -1
    is masked alone; the others keep their readings)."""
    return np.array([len(t) >= 2 for t in enc.t], bool)


def max_gap(enc: Encoders) -> float:
    """The longest stretch between two readings that is still the glove's normal
    cadence: 6 notification periods (BLE delivers ~50 Hz, a few late connection
    events and the odd read error stretch that), clipped to [MIN_GAP, MAX_GAP]:
    over 0.15 s a finger moving at hand speed curves enough that a straight line
    between the readings is off by more than a degree or two."""
    return float(np.clip(6.0 * cadence(enc), MIN_GAP, MAX_GAP))


def cadence(enc: Encoders) -> float:
    """The glove's normal interval between notifications (s): the median interval
    of the joint read most often (0 without two readings)."""
    ts = [t for t in enc.t if len(t) >= 2]
    return float(np.median(np.diff(max(ts, key=len)))) if ts else 0.0


def valid_at(enc: Encoders, epoch: np.ndarray) -> np.ndarray:
    """(N, J) bool: the joint is known at each epoch time: between two of its
    readings no further apart than `max_gap` (before the first reading, after the
    last, or inside a dropout it is not: never held, never straight-lined). Within
    two notification periods of the first or last reading it is (`Encoders.at`
    continues their line there): the glove starts and stops with the recording, and
    the frame that closes it comes up to ~40 ms after the last notification received
    (a 20 ms cadence plus up to 35 ms of BLE latency, cut at the stop)."""
    epoch = np.asarray(epoch, dtype=np.float64)
    out = np.zeros((len(epoch), len(enc.t)), bool)
    gap, edge = max_gap(enc), 2.0 * cadence(enc)
    for j, t in enumerate(enc.t):
        if len(t) < 2:
            continue
        k = np.clip(np.searchsorted(t, epoch, side="right"), 1, len(t) - 1)  # t[k-1] <= e < t[k] inside
        out[:, j] = (epoch >= t[0] - edge) & (epoch <= t[-1] + edge) & (t[k] - t[k - 1] <= gap)
    return out


def reading_gaps(enc: Encoders, lo: float, hi: float) -> list[tuple[float, float]]:
    """(start, length) epoch seconds of every stretch of [lo, hi] where no joint has
    a usable reading for longer than `max_gap`: a glove that connected late, dropped
    out or disconnected early (the ends count: a recording starts at lo)."""
    ts = [t for t in enc.t if len(t) >= 2]
    if not ts:
        return [(lo, hi - lo)] if hi > lo else []
    t = np.unique(np.concatenate(ts))
    edges = np.concatenate([[lo], t[(t >= lo) & (t <= hi)], [hi]])
    d = np.diff(edges)
    gap = max_gap(enc)
    return [(float(edges[i]), float(d[i])) for i in np.nonzero(d > gap)[0]]


def coverage(enc: Encoders, frame_epoch: np.ndarray) -> float:
    """Fraction of the frames at which every usable joint has a reading."""
    if not len(frame_epoch):
        return 0.0
    use = usable(enc)
    if not use.any():
        return 0.0
    return float(valid_at(enc, frame_epoch)[:, use].all(1).mean())
