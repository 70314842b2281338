"""The gripper's four joint encoders as the StackGlove ESP32 firmware and the
StackCapture app record them (firmware/encoder_reader.ino, BLE/BLEManager.swift).

Physics: a gripper that opens and closes smoothly (tanh-squashed slow sinusoid);
each joint follows the grip with its own range (MCP about 0-70 deg, PIP about
0-90 deg of flexion), a small lag, and peak speed <= ~150 deg/s.

Firmware: an AS5600 reads the magnet angle as a 12-bit count; the reported angle is
`(raw - offset)` (or `offset - raw` for the inverted three-finger magnets) folded
into [-2048, 2048] counts and scaled by 360/4096: a signed float32 in [-180, 180]
degrees, in steps of 0.087890625 deg, with no 0/360 wrap except where a joint's
calibration zero puts it near +-180 (`wrap_joint`). -1.0 exactly means an I2C read
error. The ESP samples every 10 ms of its own `millis()` clock (which drifts by
tens of ppm against the phone) and notifies every second sample over BLE (50 Hz):
20 bytes [uint32 millis, 4 x float32].

App: each notification is stamped with `Date().timeIntervalSince1970` when it is
RECEIVED (5-30 ms after the sample), and recorded only between startRecording
(capture start) and stopRecording (stop).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

JOINT_NAMES = ("index_mcp", "index_pip", "three_finger_mcp", "three_finger_pip")
INVERTED = (False, False, True, True)  # three-finger magnets mounted opposite
COUNTS = 4096  # AS5600: 12 bit per turn
SAMPLE_PERIOD_MS = 10  # SAMPLE_RATE_HZ 100
NOTIFY_INTERVAL = 2  # BLE every 2nd sample: 50 Hz
LATENCY_MIN = 0.005  # s, BLE sample-to-receive latency = LATENCY_MIN + U(0, LATENCY_JITTER)
LATENCY_JITTER = 0.025
NOISE_DEG = 0.03  # sensor noise (std) before quantisation
MAX_SPEED_DEG_S = 150.0
READ_ERROR = -1.0


@dataclass(frozen=True)
class Gripper:
    """Joint angle functions of frame-clock time s (seconds after frame 0).

    angle_j(s) = zero_j + lo_j + span_j * (0.5 + 0.5 tanh(k sin(2 pi f (s - lag_j) + phase)))
    in degrees, continuous (no wrapping): what an ideal encoder would read."""

    freq: float  # Hz
    phase: float  # rad
    steep: float  # k
    lo: np.ndarray  # (4,) deg of flexion when open
    span: np.ndarray  # (4,) deg from open to closed
    lag: np.ndarray  # (4,) s
    zero: np.ndarray  # (4,) deg: reading at zero flexion (0 when calibrated open)

    def flexion(self, s: np.ndarray) -> np.ndarray:
        s = np.atleast_1d(np.asarray(s, dtype=np.float64))
        arg = 2 * np.pi * self.freq * (s[:, None] - self.lag[None]) + self.phase
        grip = 0.5 + 0.5 * np.tanh(self.steep * np.sin(arg))
        return self.lo[None] + self.span[None] * grip

    def angles(self, s: np.ndarray) -> np.ndarray:
        """(N,4) continuous encoder angles in degrees."""
        return self.zero[None] + self.flexion(s)

    def peak_speed(self) -> float:
        """Upper bound of |d angle / ds| over all joints, deg/s."""
        return float(np.max(self.span) * 0.5 * self.steep * 2 * np.pi * self.freq)

    def describe(self) -> dict:
        return {
            "freq": self.freq,
            "phase": self.phase,
            "steepness": self.steep,
            "lo_deg": self.lo.tolist(),
            "span_deg": self.span.tolist(),
            "lag": self.lag.tolist(),
            "zero_deg": self.zero.tolist(),
        }


def make_gripper(rng: np.random.Generator) -> Gripper:
    """Random gripper motion (8 + 4*3 draws from `rng`, always the same number)."""
    freq = rng.uniform(0.12, 0.25)
    phase = rng.uniform(0, 2 * np.pi)
    steep = 2.0
    lo = rng.uniform(0.0, 4.0, 4)
    span = np.where(np.array([0, 1, 0, 1]) == 0, rng.uniform(55.0, 70.0, 4), rng.uniform(70.0, 90.0, 4))
    lag = np.concatenate([[0.0], rng.uniform(0.0, 0.06, 3)])
    g = Gripper(float(freq), float(phase), steep, lo, span, lag, np.zeros(4))
    if g.peak_speed() > MAX_SPEED_DEG_S:  # slow down rather than exceed a hand's speed
        g = Gripper(g.freq * MAX_SPEED_DEG_S / g.peak_speed(), g.phase, steep, lo, span, lag, g.zero)
    return g


def with_wrap(g: Gripper, joint: int, s_lo: float, s_hi: float) -> Gripper:
    """`g` with joint `joint`'s zero moved so that its readings straddle +-180 deg
    over [s_lo, s_hi] (a calibration taken with the magnet half a turn away)."""
    s = np.linspace(s_lo, s_hi, 2001)
    f = g.flexion(s)[:, joint]
    zero = g.zero.copy()
    zero[joint] = 180.0 - 0.5 * (f.min() + f.max())
    return Gripper(g.freq, g.phase, g.steep, g.lo, g.span, g.lag, zero)


def firmware_degrees(angles: np.ndarray, offsets_raw: np.ndarray) -> np.ndarray:
    """(N,4) float32 readings of (N,4) continuous angles, as readEncoderDegrees()
    computes them: 12-bit raw counts, calibration offset, invert, fold into
    [-2048, 2048] counts, * 360 / 4096."""
    c = np.floor(angles * (COUNTS / 360.0) + 0.5).astype(np.int64)  # counts of the angle
    inv = np.array(INVERTED)[None]
    off = offsets_raw.astype(np.int64)[None]
    raw = np.where(inv, off - c, off + c) % COUNTS  # what the AS5600 reports
    adjusted = np.where(inv, off - raw, raw - off)  # int16 arithmetic in the firmware
    adjusted = np.where(adjusted > 2048, adjusted - COUNTS, adjusted)
    adjusted = np.where(adjusted < -2048, adjusted + COUNTS, adjusted)
    return (adjusted * 360.0 / COUNTS).astype(np.float32)


@dataclass(frozen=True)
class EspClock:
    """The ESP32's millis() against the phone's epoch clock."""

    ms_at_capture_start: float  # millis() (continuous) at capture start
    drift_ppm: float  # the ESP clock runs (1 + drift_ppm 1e-6) times as fast
    capture_start: float  # epoch s

    def ms(self, epoch: float | np.ndarray) -> np.ndarray:
        rate = 1000.0 * (1 + self.drift_ppm * 1e-6)  # ESP ms per epoch second
        return self.ms_at_capture_start + (np.asarray(epoch) - self.capture_start) * rate

    def epoch(self, ms: np.ndarray) -> np.ndarray:
        return self.capture_start + (np.asarray(ms, dtype=np.float64) - self.ms_at_capture_start) / (
            1000.0 * (1 + self.drift_ppm * 1e-6)
        )


@dataclass
class EncoderStream:
    esp_ms: np.ndarray  # (M,) int, millis() of each recorded sample
    sample_epoch: np.ndarray  # (M,) true epoch of each sample
    receive_epoch: np.ndarray  # (M,) BLE receive stamp (what the app writes)
    values: np.ndarray  # (M,4) float32 as written (-1.0 = read error)
    truth_deg: np.ndarray  # (M,4) continuous true angles at sample_epoch
    clock: EspClock
    offsets_raw: np.ndarray  # (4,) firmware calibration offsets
    n_read_errors: int

    def records(self) -> list[dict]:
        out = []
        for m, t, row in zip(self.esp_ms, self.receive_epoch, self.values):
            d = {"esp_timestamp_ms": int(m), "timestamp": float(t)}
            d.update({k: np.float32(v) for k, v in zip(JOINT_NAMES, row)})
            out.append(d)
        return out


def synth_encoder_stream(
    g_clock: np.random.Generator,
    g_noise: np.random.Generator,
    g_ble: np.random.Generator,
    g_err: np.random.Generator,
    gripper: Gripper,
    *,
    capture_start: float,
    frame0_epoch: float,
    stop: float,
    read_errors: float = 0.0,
) -> EncoderStream:
    """The readings the app records between `capture_start` and `stop` (epoch s).
    Each generator draws a number of values that depends only on the clocks, so
    toggling `read_errors` changes nothing but the error values."""
    clock = EspClock(float(g_clock.uniform(15_000.0, 1_800_000.0)), float(g_clock.uniform(-30.0, 30.0)), capture_start)
    residue = int(g_clock.integers(0, SAMPLE_PERIOD_MS * NOTIFY_INTERVAL))  # which millis() values are sent
    offsets_raw = g_clock.integers(0, COUNTS, 4)
    period = SAMPLE_PERIOD_MS * NOTIFY_INTERVAL
    lo_ms = clock.ms(capture_start - 0.1)
    hi_ms = clock.ms(stop)
    m0 = int(np.ceil((lo_ms - residue) / period)) * period + residue
    esp_ms = np.arange(m0, int(np.floor(hi_ms)) + 1, period, dtype=np.int64)
    t = clock.epoch(esp_ms)
    truth = gripper.angles(t - frame0_epoch)
    noisy = truth + g_noise.normal(0.0, NOISE_DEG, truth.shape)
    values = firmware_degrees(noisy, offsets_raw)
    err = g_err.random(values.shape) < read_errors
    values[err] = np.float32(READ_ERROR)
    lat = LATENCY_MIN + g_ble.uniform(0.0, LATENCY_JITTER, len(t))
    rx = t + lat
    for k in range(1, len(rx)):  # BLE delivers notifications in order
        rx[k] = max(rx[k], rx[k - 1] + 1e-4)
    keep = (rx >= capture_start) & (rx <= stop)
    return EncoderStream(
        esp_ms[keep], t[keep], rx[keep], values[keep], truth[keep], clock, offsets_raw, int(err[keep].sum())
    )
