"""What a real phone camera does to the frames, each effect switchable, for the
hard sessions that `packer slam` must survive (`packer synth --profile`).

Our default renders are an ideal pinhole camera in a richly textured room; the
sessions that broke the stage elsewhere had what a handheld gripper's phone really
records: the glove and its mount in view (rigid to the camera, so its corners never
move in the image), a lens whose true focal length, principal point and distortion
differ from calib.txt, motion blur and a rolling shutter at hand speeds,
auto-exposure and white-balance drift, and plain surfaces. Each is modelled here
as simply as gives the same failure, with its truth written to synth_truth.json:

- lens: the frames come from a camera with fx, fy 3% longer than calib.txt says,
  the principal point 1 px off and radial distortion k1 = -0.10 (9 px at the side
  edges, 17 px in the corners); calib.txt keeps the nominal pinhole values;
- rolling shutter: row r is exposed `rolling_shutter` * (r / H - 1/2) s after the
  frame time (rendered per band of rows with that band's pose, so it is exact);
- blur: the exposure's `blur` seconds averaged over 5 sub-exposures, each the
  frame warped by the camera rotation since the frame time (a homography: the
  rotation is what blurs a hand-held camera; translation adds < 3 px here);
- exposure: a global gain drifting +-25%, a 30% drop over 0.5 s and back 2-4 s
  later (walking into a shadow), white balance +-8% per channel;
- glove: a dark textured palm over the bottom 20-26% of the frame (stitching and a
  logo give it trackable corners) and three fingers curling with the recorded joints;
- low texture: the table and two walls plain (one colour, a faint grain of
  `low_texture` grey levels), the boxes on the table and the other walls textured.
"""
from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from packer.effects import LENS_FOCAL, LENS_K1, LENS_PP, CameraEffects

_BLUR_SUBSAMPLES = 5
_RS_BANDS = 24


def true_intrinsics(fx: float, fy: float, cx: float, cy: float, effects: CameraEffects) -> tuple[float, ...]:
    """(fx, fy, cx, cy, k1) of the camera that really took the frames (OpenCV pixels)."""
    if not effects.lens:
        return fx, fy, cx, cy, 0.0
    return fx * LENS_FOCAL, fy * LENS_FOCAL, cx + LENS_PP[0], cy + LENS_PP[1], LENS_K1


def pixel_rays(width: int, height: int, intr: tuple[float, ...]) -> np.ndarray:
    """(3, H*W) camera-frame rays (z = 1) through every pixel centre of a camera with
    (fx, fy, cx, cy, k1): x_d = x (1 + k1 |x|^2) inverted by fixed-point iteration
    (converges to 1e-12 in a few dozen steps for |k1| r^2 << 1)."""
    fx, fy, cx, cy, k1 = intr
    u, v = np.meshgrid(np.arange(width, dtype=np.float64), np.arange(height, dtype=np.float64))
    xd, yd = (u.ravel() - cx) / fx, (v.ravel() - cy) / fy
    x, y = xd.copy(), yd.copy()
    for _ in range(50 if k1 else 0):
        f = 1.0 + k1 * (x * x + y * y)
        x, y = xd / f, yd / f
    return np.stack([x, y, np.ones(u.size)])


def row_bands(height: int, readout: float) -> list[tuple[slice, float]]:
    """(rows, time offset from the frame time) per band: one band without a rolling shutter."""
    if readout <= 0:
        return [(slice(0, height), 0.0)]
    edges = np.linspace(0, height, _RS_BANDS + 1).astype(int)
    return [(slice(a, b), readout * ((a + b) / 2 / height - 0.5)) for a, b in zip(edges[:-1], edges[1:])]


def blur_offsets(exposure: float) -> np.ndarray:
    """Sub-exposure times relative to the frame time (centred)."""
    if exposure <= 0:
        return np.zeros(1)
    return (np.arange(_BLUR_SUBSAMPLES) + 0.5) / _BLUR_SUBSAMPLES * exposure - exposure / 2


def rotation_blur(img: np.ndarray, R_t: np.ndarray, R_subs: np.ndarray, K: np.ndarray) -> np.ndarray:
    """The mean of `img` warped to each sub-exposure's rotation (camera-to-world R_subs,
    img taken at R_t): pixel x_s = K R_s^T R_t K^-1 x_t."""
    if len(R_subs) <= 1:
        return img
    h, w = img.shape[:2]
    Kinv = np.linalg.inv(K)
    acc = np.zeros(img.shape, np.float32)
    for R_s in R_subs:
        H = K @ R_s.T @ R_t @ Kinv
        acc += cv2.warpPerspective(img, H, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    return np.clip(acc / len(R_subs) + 0.5, 0, 255).astype(np.uint8)


@dataclass(frozen=True)
class Exposure:
    """Gain and white balance as functions of frame time."""

    freq: np.ndarray  # (2,) Hz of the gain drift
    phase: np.ndarray  # (2,)
    drop_at: float  # s
    recover_at: float  # s
    wb_freq: np.ndarray  # (3,)
    wb_phase: np.ndarray  # (3,)

    def gains(self, t: float) -> np.ndarray:
        """(3,) per-channel multipliers (RGB) at frame time t."""
        drift = 0.25 * float(np.mean(np.sin(2 * np.pi * self.freq * t + self.phase))) * np.sqrt(2)
        drop = 1.0 - 0.3 * (_smoothstep((t - self.drop_at) / 0.5) - _smoothstep((t - self.recover_at) / 0.5))
        wb = 1.0 + 0.08 * np.sin(2 * np.pi * self.wb_freq * t + self.wb_phase)
        return float(np.clip(1.0 + drift, 0.7, 1.3)) * drop * wb


def make_exposure(rng: np.random.Generator, duration: float) -> Exposure:
    drop_at = float(rng.uniform(0.2, 0.6)) * max(duration, 1.0)
    return Exposure(rng.uniform(0.05, 0.2, 2), rng.uniform(0, 2 * np.pi, 2), drop_at,
                    drop_at + float(rng.uniform(2.0, 4.0)), rng.uniform(0.03, 0.15, 3), rng.uniform(0, 2 * np.pi, 3))


def _smoothstep(x: float) -> float:
    x = min(max(x, 0.0), 1.0)
    return x * x * (3 - 2 * x)


def apply_gains(img: np.ndarray, gains: np.ndarray) -> np.ndarray:
    return np.clip(img.astype(np.float32) * gains[None, None, :].astype(np.float32) + 0.5, 0, 255).astype(np.uint8)


@dataclass(frozen=True)
class Glove:
    """The palm layer (drawn once: rigid to the camera) and the fingers' geometry."""

    palm: np.ndarray  # (H, W, 3) uint8 colour where mask
    mask: np.ndarray  # (H, W) bool
    finger_x: np.ndarray  # (3,) px, finger bases on the palm's top edge
    finger_y: float  # px
    finger_len: np.ndarray  # (3,) px, open
    finger_width: float
    color: np.ndarray  # (3,)


def make_glove(rng: np.random.Generator, width: int, height: int) -> Glove:
    """A dark palm over the bottom 20-26% of a (width, height) frame, with a fabric
    grain, stitching lines and a small light logo: high-contrast corners that stay
    put in the image whatever the camera does."""
    frac = float(rng.uniform(0.20, 0.26))
    top = int(height * (1 - frac))
    mask = np.zeros((height, width), np.uint8)
    cx = width / 2 + float(rng.uniform(-30, 30))
    cv2.ellipse(mask, (int(cx), height + int(0.25 * height * frac)), (int(width * 0.42), int(height * frac * 1.25)),
                0, 180, 360, 255, -1)
    mask[top:, int(cx - width * 0.3):int(cx + width * 0.3)] = 255
    base = rng.uniform(25, 50, 3)
    grain = rng.normal(0.0, 6.0, (height, width, 1))
    palm = np.clip(base[None, None, :] + grain, 0, 255).astype(np.uint8)
    for _ in range(3):  # stitching
        y = int(rng.uniform(top + 10, height - 5))
        cv2.line(palm, (int(cx - width * 0.3), y), (int(cx + width * 0.3), y + int(rng.uniform(-8, 8))),
                 (150, 150, 150), 1, cv2.LINE_AA)
    lx, ly = int(cx + rng.uniform(-60, 60)), int((top + height) / 2)
    cv2.rectangle(palm, (lx - 14, ly - 7), (lx + 14, ly + 7), (210, 210, 210), -1)
    cv2.putText(palm, "S", (lx - 6, ly + 6), cv2.FONT_HERSHEY_SIMPLEX, 0.45, (20, 20, 20), 1, cv2.LINE_AA)
    fx = cx + np.array([-0.22, 0.0, 0.22]) * width + rng.uniform(-8, 8, 3)
    return Glove(palm, mask > 0, fx, float(top + 4), rng.uniform(0.16, 0.22, 3) * height, 0.06 * width,
                 base * 1.2)


def draw_glove(img: np.ndarray, glove: Glove, joints_deg: np.ndarray) -> np.ndarray:
    """The palm over `img`, then three fingers: finger 0 curls with the index joints
    (0, 1), fingers 1 and 2 with the three-finger joints (2, 3). Curling shortens a
    finger in the image (it bends towards the lens) and tilts it."""
    out = img.copy()
    out[glove.mask] = glove.palm[glove.mask]
    for f in range(3):
        mcp, pip = (joints_deg[0], joints_deg[1]) if f == 0 else (joints_deg[2], joints_deg[3])
        flex = np.deg2rad(np.clip(0.6 * mcp + 0.4 * pip, 0.0, 110.0))
        length = glove.finger_len[f] * max(np.cos(0.8 * flex), 0.15)
        tilt = (f - 1) * 0.15 + 0.2 * np.sin(flex)
        x0, y0 = glove.finger_x[f], glove.finger_y
        x1, y1 = x0 + length * np.sin(tilt), y0 - length * np.cos(tilt)
        cv2.line(out, (int(x0), int(y0)), (int(x1), int(y1)), tuple(int(c) for c in glove.color),
                 int(glove.finger_width), cv2.LINE_AA)
        cv2.circle(out, (int(x1), int(y1)), int(glove.finger_width / 2), (200, 200, 200), 2, cv2.LINE_AA)
    return out
