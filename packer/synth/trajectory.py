"""Smooth hand-like 6-DoF camera trajectories as closed-form functions of time.

A trajectory is a function, not a table of samples, so the IMU can be evaluated at
its own timestamps (another rate, another clock) exactly, with no resampling error
that a scale/offset estimator would then have to absorb.

Conventions (also written into synth_truth.json):
- world: z up, gravity = (0, 0, -9.80665) m/s^2;
- camera: OpenCV (x right, y down, z forward); poses are camera-to-world
  (x_world = R_wc x_cam + p).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

GRAVITY = 9.80665
MOTIONS = ("hand", "weak", "rotation-only", "static", "fast", "vigorous")
WEAK = 0.3  # "weak": the hand path at this fraction of its size


def _empty() -> np.ndarray:
    return np.zeros(0)

def hat(v: np.ndarray) -> np.ndarray:
    """Skew-symmetric matrix of a 3-vector (cross-product operator)."""
    x, y, z = v
    return np.array([[0.0, -z, y], [z, 0.0, -x], [-y, x, 0.0]])


def so3_exp(r: np.ndarray) -> np.ndarray:
    """Rotation matrix of a rotation vector (Rodrigues)."""
    r = np.asarray(r, dtype=np.float64)
    th = float(np.linalg.norm(r))
    K = hat(r)
    if th < 1e-12:
        return np.eye(3) + K
    return np.eye(3) + (np.sin(th) / th) * K + ((1.0 - np.cos(th)) / th**2) * (K @ K)


def so3_log(R: np.ndarray) -> np.ndarray:
    """Rotation vector of a rotation matrix (angles < pi)."""
    c = np.clip((np.trace(R) - 1.0) / 2.0, -1.0, 1.0)
    th = float(np.arccos(c))
    w = np.array([R[2, 1] - R[1, 2], R[0, 2] - R[2, 0], R[1, 0] - R[0, 1]])
    if th < 1e-8:
        return 0.5 * w
    return w * (th / (2.0 * np.sin(th)))


@dataclass(frozen=True)
class Trajectory:
    """p(t) = p0 + sum_k A_k sin(2 pi f_k t + phi_k) per axis;
    R(t) = LookAt(p(t), target) Exp(sum_k B_k sin(2 pi g_k t + psi_k)) (rotation
    vector in the camera frame): a hand keeps the workspace in view while it moves,
    with its own wobble on top."""

    p0: np.ndarray  # (3,)
    pos_amp: np.ndarray  # (K, 3) m
    pos_freq: np.ndarray  # (K, 3) Hz
    pos_phase: np.ndarray  # (K, 3) rad
    target: np.ndarray  # (3,) point the camera keeps looking at (the workspace)
    rot_amp: np.ndarray  # (K, 3) rad
    rot_freq: np.ndarray  # (K, 3) Hz
    rot_phase: np.ndarray  # (K, 3) rad
    # pauses ("fast"): the motion runs on a warped clock tau(t) whose rate 1 - sum h_j b_j(t)
    # drops to 1 - h_j inside raised-cosine bumps b_j centred at pause_c (half-width pause_w)
    pause_c: np.ndarray = field(default_factory=_empty)
    pause_w: np.ndarray = field(default_factory=_empty)
    pause_h: np.ndarray = field(default_factory=_empty)
    # flicks ("fast"): quick wrist turns, Gaussian bumps (sigma flick_s) added to the rotation vector
    flick_c: np.ndarray = field(default_factory=_empty)
    flick_s: np.ndarray = field(default_factory=_empty)
    flick_amp: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))

    def warp(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tau, dtau/dt, d2tau/dt2) of the pause clock at t (identity without pauses)."""
        t = np.atleast_1d(np.asarray(t, dtype=np.float64))
        tau, d1, d2 = t.copy(), np.ones_like(t), np.zeros_like(t)
        for c, w, h in zip(self.pause_c, self.pause_w, self.pause_h):
            x = np.clip((t - c) / w, -1.0, 1.0)
            inside = np.abs(t - c) < w
            tau -= h * (w * (x + 1.0) / 2 + np.where(inside, w / (2 * np.pi) * np.sin(np.pi * x), 0.0))
            d1 -= h * np.where(inside, 0.5 * (1 + np.cos(np.pi * x)), 0.0)
            d2 += h * np.where(inside, 0.5 * np.pi / w * np.sin(np.pi * x), 0.0)
        return tau, d1, d2

    def position(self, t: np.ndarray) -> np.ndarray:
        """(N,3) camera centre in world metres at frame-clock times t."""
        t = np.atleast_1d(np.asarray(t, dtype=np.float64))
        if len(self.pause_c):
            t = self.warp(t)[0]
        arg = 2 * np.pi * self.pos_freq[None] * t[:, None, None] + self.pos_phase[None]
        return self.p0[None] + np.sum(self.pos_amp[None] * np.sin(arg), axis=1)

    def acceleration(self, t: np.ndarray) -> np.ndarray:
        """(N,3) second derivative of position, analytic (world, m/s^2, gravity excluded);
        with pauses p(tau(t))'' = p''(tau) tau'^2 + p'(tau) tau''."""
        t = np.atleast_1d(np.asarray(t, dtype=np.float64))
        w = 2 * np.pi * self.pos_freq[None]
        if not len(self.pause_c):
            arg = w * t[:, None, None] + self.pos_phase[None]
            return -np.sum(self.pos_amp[None] * w**2 * np.sin(arg), axis=1)
        tau, d1, d2 = self.warp(t)
        arg = w * tau[:, None, None] + self.pos_phase[None]
        acc = -np.sum(self.pos_amp[None] * w**2 * np.sin(arg), axis=1)
        vel = np.sum(self.pos_amp[None] * w * np.cos(arg), axis=1)
        return acc * d1[:, None] ** 2 + vel * d2[:, None]

    def _rotvec(self, t: np.ndarray) -> np.ndarray:
        tau = self.warp(t)[0] if len(self.pause_c) else t
        arg = 2 * np.pi * self.rot_freq[None] * tau[:, None, None] + self.rot_phase[None]
        r = np.sum(self.rot_amp[None] * np.sin(arg), axis=1)
        for c, sd, a in zip(self.flick_c, self.flick_s, self.flick_amp):
            r = r + np.exp(-0.5 * ((t - c) / sd) ** 2)[:, None] * a[None]
        return r

    def rotation(self, t: np.ndarray) -> np.ndarray:
        """(N,3,3) camera-to-world rotations."""
        t = np.atleast_1d(np.asarray(t, dtype=np.float64))
        return np.stack([look_at(p, self.target) @ so3_exp(r) for p, r in zip(self.position(t), self._rotvec(t))])

    def angular_velocity(self, t: np.ndarray, h: float = 1e-4) -> np.ndarray:
        """(N,3) body (camera-frame) angular velocity in rad/s: Log(R(t-h)^T R(t+h)) / 2h.
        Central difference of a smooth function: error O(h^2), ~1e-9 rad/s here."""
        t = np.atleast_1d(np.asarray(t, dtype=np.float64))
        Ra, Rb = self.rotation(t - h), self.rotation(t + h)
        return np.stack([so3_log(a.T @ b) for a, b in zip(Ra, Rb)]) / (2 * h)

    def poses(self, t: np.ndarray) -> np.ndarray:
        """(N,4,4) camera-to-world matrices."""
        t = np.atleast_1d(np.asarray(t, dtype=np.float64))
        T = np.tile(np.eye(4), (len(t), 1, 1))
        T[:, :3, :3] = self.rotation(t)
        T[:, :3, 3] = self.position(t)
        return T


def look_at(p: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Camera-to-world rotation of an OpenCV camera at p looking at target, no roll
    (camera x stays horizontal)."""
    z = target - p
    z = z / np.linalg.norm(z)
    x = np.cross(z, [0.0, 0.0, 1.0])
    x = x / np.linalg.norm(x)
    return np.stack([x, np.cross(z, x), z], axis=1)


def make_trajectory(rng: np.random.Generator, motion: str, start: np.ndarray, target: np.ndarray) -> Trajectory:
    """Random hand-like motion, per axis a slow sweep (0.1-0.25 Hz, 8-20 cm), a
    medium swing (0.3-0.6 Hz, 3-7 cm) and a fast jiggle (0.7-1.3 Hz, 1-3 cm),
    weighted sideways > forward > vertical: 0.2-0.5 m of travel, peak accelerations
    of 0.1-0.25 g (enough for the IMU to make scale observable), and 10-25 deg of
    rotation around keeping `target` in view.

    "weak": the same draws with the path at WEAK (0.3) of its size: 5-15 cm of
    travel, RMS motion acceleration ~0.25 m/s^2 (a hand that barely moves; the IMU
    still fixes the scale, but with a fifth of the signal over the same noise);
    "rotation-only": the same rotation with the centre fixed (scale unobservable);
    "static": a fixed pose (every frame identical);
    "fast": real hand speeds (`make_fast_trajectory`); "vigorous": faster and sustained
    (`make_vigorous_trajectory`)."""
    if motion not in MOTIONS:
        raise ValueError(f"motion must be one of {MOTIONS}, got {motion!r}")
    if motion == "fast":
        return make_fast_trajectory(rng, start, target)
    if motion == "vigorous":
        return make_vigorous_trajectory(rng, start, target)
    K = 3
    lo_amp, hi_amp = np.array([[0.08], [0.03], [0.01]]), np.array([[0.2], [0.07], [0.03]])
    pos_amp = rng.uniform(lo_amp, hi_amp, (K, 3)) * np.array([1.0, 0.6, 0.5])
    pos_freq = rng.uniform(np.array([[0.1], [0.3], [0.7]]), np.array([[0.25], [0.6], [1.3]]), (K, 3))
    pos_phase = rng.uniform(0, 2 * np.pi, (K, 3))
    rot_amp = rng.uniform(0.02, 0.07, (K, 3))
    rot_freq = rng.uniform(0.1, 0.8, (K, 3))
    rot_phase = rng.uniform(0, 2 * np.pi, (K, 3))
    if motion == "weak":
        pos_amp = pos_amp * WEAK
    elif motion != "hand":
        pos_amp = np.zeros_like(pos_amp)
    if motion == "static":
        rot_amp = np.zeros_like(rot_amp)
    return Trajectory(
        np.asarray(start, dtype=np.float64),
        pos_amp,
        pos_freq,
        pos_phase,
        np.asarray(target, dtype=np.float64),
        rot_amp,
        rot_freq,
        rot_phase,
    )


def make_fast_trajectory(rng: np.random.Generator, start: np.ndarray, target: np.ndarray,
                         duration: float = 60.0) -> Trajectory:
    """A hand at the speeds people really move a handheld gripper: per axis sums of
    sinusoids at 0.25-1.1 Hz with ~0.2 m of sweep (peak speeds ~0.5-0.9 m/s), wrist
    rotation of +-0.15-0.45 rad at 0.3-1.1 Hz (rates to ~2.5 rad/s), a pause (the
    hand slows to 5-15% of its speed for 0.6-1.2 s) every ~4 s and a quick wrist
    flick (a 0.12-0.22 rad turn in ~0.2 s, to ~3 rad/s) every ~3 s over `duration`."""
    K = 3
    lo_f, hi_f = np.array([[0.25], [0.45], [0.75]]), np.array([[0.45], [0.75], [1.1]])
    lo_a, hi_a = np.array([[0.12], [0.04], [0.015]]), np.array([[0.22], [0.08], [0.03]])
    pos_amp = rng.uniform(lo_a, hi_a, (K, 3)) * np.array([1.0, 0.6, 0.5])
    pos_freq = rng.uniform(lo_f, hi_f, (K, 3))
    pos_phase = rng.uniform(0, 2 * np.pi, (K, 3))
    rot_amp = rng.uniform(np.array([[0.12], [0.06], [0.03]]), np.array([[0.25], [0.12], [0.06]]), (K, 3))
    rot_freq = rng.uniform(np.array([[0.3], [0.5], [0.8]]), np.array([[0.5], [0.8], [1.1]]), (K, 3))
    rot_phase = rng.uniform(0, 2 * np.pi, (K, 3))
    n_p = int(duration / 4.0)
    pause_c = np.arange(n_p) * 4.0 + rng.uniform(2.0, 3.0, n_p)
    pause_w = rng.uniform(0.3, 0.6, n_p)
    pause_h = rng.uniform(0.85, 0.95, n_p)
    n_f = int(duration / 3.0)
    flick_c = np.arange(n_f) * 3.0 + rng.uniform(0.5, 2.5, n_f)
    flick_s = rng.uniform(0.05, 0.07, n_f)
    axis = rng.normal(0.0, 1.0, (n_f, 3)) * np.array([0.5, 1.0, 0.3])  # mostly a turn about camera y
    flick_amp = axis / np.linalg.norm(axis, axis=1, keepdims=True) * rng.uniform(0.12, 0.22, (n_f, 1))
    return Trajectory(np.asarray(start, dtype=np.float64), pos_amp, pos_freq, pos_phase,
                      np.asarray(target, dtype=np.float64), rot_amp, rot_freq, rot_phase,
                      pause_c, pause_w, pause_h, flick_c, flick_s, flick_amp)


def make_vigorous_trajectory(rng: np.random.Generator, start: np.ndarray, target: np.ndarray) -> Trajectory:
    """Fast hand motion sustained, as a session made outside the project had it: per axis
    sums of sinusoids at 0.35-1.4 Hz with up to ~0.35 m of sweep sideways, accelerations
    to ~1 g (RMS ~5 m/s^2), rotation to ~2.5-3.5 rad/s (RMS ~1.3), 26-34 m of path in
    30 s; no pauses (the hand never rests)."""
    K = 3
    pos_freq = rng.uniform(np.array([[0.35], [0.65], [1.0]]), np.array([[0.6], [0.95], [1.4]]), (K, 3))
    pos_amp = rng.uniform(np.array([[0.18], [0.08], [0.04]]), np.array([[0.26], [0.12], [0.06]]), (K, 3))
    pos_amp = pos_amp * np.array([1.3, 0.55, 0.8])
    pos_phase = rng.uniform(0, 2 * np.pi, (K, 3))
    rot_amp = rng.uniform(np.array([[0.1], [0.05], [0.03]]), np.array([[0.2], [0.1], [0.05]]), (K, 3))
    rot_freq = rng.uniform(np.array([[0.3], [0.6], [0.9]]), np.array([[0.6], [0.9], [1.3]]), (K, 3))
    rot_phase = rng.uniform(0, 2 * np.pi, (K, 3))
    return Trajectory(np.asarray(start, dtype=np.float64), pos_amp, pos_freq, pos_phase,
                      np.asarray(target, dtype=np.float64), rot_amp, rot_freq, rot_phase)
