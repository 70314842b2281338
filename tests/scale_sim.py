"""Synthetic visual-inertial sessions for the scale solve, without images, and its
calibration table.

A session here is what `packer.slam` hands the solve: registered keyframe times
(regular or irregular, as an adaptive keyframe picker would give), SfM-like camera
centres (true path in an arbitrary similarity frame, plus white jitter and,
optionally, a smooth distortion) and rotations (plus noise), and the IMU of
`packer.synth.imu` (200 Hz, gravity removed or raw, bias, white noise, a clock
offset). The path comes from `packer.synth.trajectory` with its size multiplied by
`amp` (0.3 is the "weak" motion), so the same script runs against an older solve:

    python -m tests.scale_sim [--draws 40]                        # this checkout's solve
    PYTHONPATH=/path/to/other/checkout python tests/scale_sim.py  # another one's

It prints, per configuration, the median reported std(s)/s, the empirical spread
of the scale error over noise draws, the mean error and how many draws the solve
refused. An honest uncertainty has reported / empirical near 1."""
from __future__ import annotations

import argparse
import functools
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

import packer.slam.scale.scale
from packer.slam.inertial.imu_align import align_imu
from packer.slam.rotations import so3_exp, umeyama
from packer.slam.scale.scale import ScaleOptions, ScaleRefused, solve_scale
from packer.synth.imu import IMU_RATE, make_imu_model
from packer.synth.trajectory import GRAVITY, make_trajectory

S_TRUE = 0.07  # metres per SfM unit
FPS = 60.0


@dataclass(frozen=True)
class Config:
    name: str
    duration: float = 6.0  # s
    amp: float = 0.3  # path size relative to "hand" (0.3 = "weak")
    frames: tuple[int, int] = (3, 3)  # keyframe spacing in frames: fixed, or drawn in [lo, hi]
    raw: bool = False  # accelerometer with gravity
    sign: float = 1.0  # -1: the accelerometer reports minus the specific force
    offset: float = 0.25  # s, IMU clock - frame clock
    jitter: float = 0.001  # m, white SfM position noise
    rot_noise: float = 0.1  # deg, SfM rotation noise
    smooth: float = 0.0  # m, amplitude of a smooth (0.2-1 Hz) SfM distortion
    scale_drift: float = 0.0  # the SfM scale changes linearly by this fraction over the session
    stretch: float = 0.0  # the SfM path is stretched by this fraction along a direction drawn per draw
    bias_walk: float = 0.0  # g/sqrt(s): the accelerometer bias wanders (a random walk per axis)
    motion: str = "hand"  # "hand" or "rotation-only"


@functools.lru_cache(maxsize=16)
def _truth(seed: int, duration: float, amp: float, offset: float) -> dict[str, Any]:
    """Noise-free path and IMU signals of trajectory `seed` (cached: the synth
    trajectory is evaluated sample by sample)."""
    traj = make_trajectory(np.random.default_rng(seed), "hand", np.zeros(3), np.array([0.1, 0.7, -0.4]))
    traj = replace(traj, pos_amp=traj.pos_amp * amp)
    model = make_imu_model(np.random.default_rng(seed + 1000), offset)
    tf = np.arange(int(round(duration * FPS))) / FPS
    tau = np.arange(-0.02, duration + 0.02, 1 / IMU_RATE) + offset  # IMU clock
    R_imu = traj.rotation(tau - offset)
    acc = np.einsum("nji,nj->ni", R_imu, traj.acceleration(tau - offset)) @ model.R_imu_cam.T / GRAVITY
    grav = np.einsum("nji,j->ni", R_imu, np.array([0.0, 0.0, GRAVITY])) @ model.R_imu_cam.T / GRAVITY
    gyr = traj.angular_velocity(tau - offset) @ model.R_imu_cam.T
    return dict(tf=tf, P=traj.position(tf), R=traj.rotation(tf), tau=tau, acc=acc, grav=grav, gyr=gyr, model=model)


def session(cfg: Config, seed: int, draw: int) -> dict[str, Any]:
    """Trajectory `seed`, noise draw `draw`: the solve's inputs plus the truth."""
    T = _truth(seed, cfg.duration, cfg.amp, cfg.offset)
    rng = np.random.default_rng([seed, draw, 7])
    lo, hi = cfg.frames
    kf = [0]
    while kf[-1] + hi < len(T["tf"]):
        kf.append(kf[-1] + int(rng.integers(lo, hi + 1)))
    kt = T["tf"][kf]
    P = T["P"][kf] if cfg.motion == "hand" else np.repeat(T["P"][:1], len(kf), axis=0)
    P = P + rng.normal(size=P.shape) * cfg.jitter
    for _ in range(3):
        f, ph = rng.uniform(0.2, 1.0), rng.uniform(0, 2 * np.pi)
        P = P + cfg.smooth * rng.normal(size=3) * np.sin(2 * np.pi * f * kt + ph)[:, None]
    P = P * (1.0 + cfg.scale_drift * (kt / cfg.duration - 0.5))[:, None]
    s_ref = S_TRUE
    if cfg.stretch:  # an SfM path that is no similarity of the true one: the reference is its best similarity
        u = rng.normal(size=3)
        u /= np.linalg.norm(u)
        mid = P.mean(axis=0)
        P = P + cfg.stretch * np.outer((P - mid) @ u, u)
        s_ref = S_TRUE * umeyama(P, T["P"][kf])[0]
    R = T["R"][kf] @ so3_exp(rng.normal(size=(len(kf), 3)) * np.deg2rad(cfg.rot_noise))
    Rs = so3_exp(np.array([0.3, -0.5, 1.1]))  # the SfM frame: rotated, shifted, unscaled
    m = T["model"]
    acc = (T["acc"] if cfg.motion == "hand" else 0.0 * T["acc"]) + (T["grav"] if cfg.raw else 0.0)
    acc = cfg.sign * acc + m.accel_bias + rng.normal(0.0, m.accel_noise, acc.shape)
    if cfg.bias_walk:
        acc = acc + np.cumsum(rng.normal(0.0, cfg.bias_walk / np.sqrt(IMU_RATE), acc.shape), axis=0)
    gyr = T["gyr"] + m.gyro_bias + rng.normal(0.0, m.gyro_noise, T["gyr"].shape)
    return dict(kt=kt, p=P @ Rs.T / S_TRUE + np.array([1.0, 2.0, 3.0]), R=Rs @ R, imu_t=T["tau"], acc=acc,
                gyr=gyr, model=m, s_ref=s_ref)


def solve(s: dict[str, Any], estimate_alignment: bool = True) -> tuple[float, float, str]:
    """(scale error, reported std(s)/s, the refusal message or ""): the gyro alignment
    estimated (as the pipeline does) or the true one. The error and std are those of
    the solve with its thresholds off, so a refused draw still counts in the scatter;
    a refusal before any fit (too little data) gives NaN."""
    if estimate_alignment:
        al = align_imu(s["kt"], s["R"], s["imu_t"], s["gyr"])
        offset, R_ic, bias = al.offset, al.R_ic, al.gyro_bias
    else:
        offset, R_ic, bias = s["model"].offset, s["model"].R_imu_cam, s["model"].gyro_bias
    off = replace(ScaleOptions(), max_rel_std=1e9, min_explained=-1e9, min_excitation=0.0)
    try:
        r = solve_scale(s["kt"], s["p"], s["R"], s["imu_t"], s["acc"], s["gyr"], offset=offset, R_ic=R_ic,
                        gyro_bias=bias, options=off)
    except ScaleRefused as e:
        return np.nan, np.nan, str(e)
    try:
        packer.slam.scale.scale._check(r, ScaleOptions())  # the default refusals, on the same fit
    except ScaleRefused as e:
        return r.scale / s["s_ref"] - 1.0, r.rel_std, str(e)
    return r.scale / s["s_ref"] - 1.0, r.rel_std, ""


def calibrate(cfg: Config, seed: int, draws: int, estimate_alignment: bool = False) -> dict[str, float]:
    """Over `draws` noise draws: median reported std, empirical std and mean of the
    error, and the count of draws the solve refuses."""
    errs, stds, refused = [], [], 0
    for k in range(draws):
        e, sd, refusal = solve(session(cfg, seed, k), estimate_alignment)
        errs.append(e)
        stds.append(sd)
        refused += bool(refusal)
    e = np.array(errs)
    emp = float(np.sqrt(np.mean((e - e.mean()) ** 2)))
    return dict(reported=float(np.median(stds)), empirical=emp, mean_err=float(e.mean()),
                rms_err=float(np.sqrt(np.mean(e**2))), refused=refused)


CONFIGS = [
    Config("hand 6 s, every 3rd frame", amp=1.0),
    Config("weak 6 s, every 3rd frame"),
    Config("weak 6 s, keyframes 6-12 frames apart", frames=(6, 12)),
    Config("weak 6 s, raw accel, 6-12 frames", raw=True, frames=(6, 12)),
    Config("weak 6 s, smooth 1 mm SfM distortion", smooth=0.001),
    Config("weak 30 s, keyframes 6-12 frames apart", duration=30.0, frames=(6, 12)),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draws", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0, help="trajectory seed")
    ap.add_argument("--true-alignment", action="store_true", help="skip the gyro alignment (faster)")
    a = ap.parse_args()
    print(f"solve: {packer.slam.scale.scale.__file__}; trajectory seed {a.seed}, {a.draws} noise draws, "
          f"{'true' if a.true_alignment else 'estimated'} gyro alignment")
    print(f"{'configuration':42s} {'reported':>9s} {'empirical':>9s} {'ratio':>6s} {'mean err':>9s} "
          f"{'rms err':>8s} {'refused':>8s} {'s':>6s}")
    for cfg in CONFIGS:
        t0 = time.perf_counter()
        c = calibrate(cfg, a.seed, a.draws, estimate_alignment=not a.true_alignment)
        print(f"{cfg.name:42s} {c['reported']:9.3%} {c['empirical']:9.3%} {c['reported'] / c['empirical']:6.2f} "
              f"{c['mean_err']:+9.3%} {c['rms_err']:8.3%} {c['refused']:4d}/{a.draws:<3d} "
              f"{time.perf_counter() - t0:6.1f}", flush=True)


if __name__ == "__main__":
    main()
