"""Synthetic StackCapture v3 sessions with known ground truth (`packer synth`).

The demo's data and every test's data: a textured 3-D room rendered along a smooth
hand-like trajectory at 60 fps, with IMU, encoders, calib and metadata in the exact
raw layout of DESIGN.md, and the truth (metric poses, IMU offset and rotation,
biases) in `synth_truth.json`, which the pipeline never reads.

Deterministic: the same arguments give byte-identical files (one seeded generator
per component, so toggling e.g. `nan_imu` leaves the frames unchanged).
"""
from __future__ import annotations

import json
import os
import shutil
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from packer.synth.imu import ENCODER_KEYS, IMU_RATE, imu_timestamps, make_imu_model, synth_encoders, synth_imu
from packer.synth.render import Renderer, Scene, make_scene
from packer.synth.trajectory import GRAVITY, MOTIONS, make_trajectory

__all__ = ["synth_session", "synth_dataset", "truth", "session_name", "TRUTH_FILE", "MOTIONS"]

WIDTH, HEIGHT, FPS = 480, 360, 60.0
FX = FY = 400.0
CX, CY = 240.0, 180.0  # COLMAP convention: pixel (i, j) has its centre at (i + 0.5, j + 0.5)
JPEG_QUALITY = 92
TRUTH_FILE = "synth_truth.json"
TRUTH_VERSION = 1


def session_name(seed: int, index: int) -> str:
    """`session_2026-01-01_1200SS`-style name: the date moves with the seed, the
    clock with the index (unique for any index)."""
    t = datetime(2026, 1, 1, 12, 0, 0) + timedelta(days=seed % 3650, seconds=index)
    return t.strftime("session_%Y-%m-%d_%H%M%S")


def _dumps(obj: Any) -> bytes:
    # allow_nan only matters for nan_imu sessions (NaN literals, as buggy exporters write)
    return (json.dumps(obj, indent=None, separators=(", ", ": ")) + "\n").encode()


def synth_session(
    out_dir: str | os.PathLike,
    name: str,
    n_frames: int = 180,
    seed: int = 0,
    *,
    motion: str = "hand",
    imu_offset: float = 0.0237,
    scale_hint: float | None = None,
    imu_duration_factor: float = 1.0,
    nan_imu: bool = False,
    video: bool = False,
    scene_seed: int | None = None,
    jpeg_quality: int = JPEG_QUALITY,
    progress: bool = False,
) -> Path:
    """Write one session directory `out_dir/name` and return its path.

    motion: "hand" (default), "rotation-only" (fixed centre: metric scale is not
    observable and must be refused), "static" (every frame identical).
    imu_offset: seconds; imu_time = frame_time + imu_offset.
    scale_hint: multiplies every length of the scene and the trajectory (a bigger or
    smaller world; truth poses stay metric in that world); None means 1.
    imu_duration_factor: < 1 makes the IMU stop early (covers that fraction of the video).
    nan_imu: writes NaN into a few IMU samples (bad-input tests).
    video: also write a placeholder `video.mov` (opaque bytes, never read) so raw-vs-packed
    byte counts include a video as real captures do.
    scene_seed: the room (geometry and texture) comes from this seed instead of `seed`,
    so several sessions can be recorded in the same room.

    The directory is assembled under a temporary name and renamed into place, so a
    killed run never leaves a half-written session that looks complete."""
    if motion not in MOTIONS:
        raise ValueError(f"motion must be one of {MOTIONS}, got {motion!r}")
    if n_frames < 1:
        raise ValueError("n_frames must be >= 1")
    if not 0.0 < imu_duration_factor <= 1.0:
        raise ValueError("imu_duration_factor must be in (0, 1]")
    scale = 1.0 if scale_hint is None else float(scale_hint)
    out_dir = Path(out_dir)
    final = out_dir / name
    tmp = out_dir / f".{name}.synth-tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    (tmp / "rgb").mkdir(parents=True)

    ss = np.random.SeedSequence([int(seed), 0x5EED])
    g_scene, g_traj, g_imu, g_enc, g_nan, g_vid = (np.random.default_rng(s) for s in ss.spawn(6))

    if scene_seed is None:
        scene = _scene(int(seed), scale, g_scene)
    else:
        ss_scene = np.random.SeedSequence([int(scene_seed), 0x5EED]).spawn(1)[0]
        scene = _scene(int(scene_seed), scale, np.random.default_rng(ss_scene))
    table = scene.boxes[0]
    target = np.array(
        [
            (table.lo[0] + table.hi[0]) / 2 + g_traj.uniform(-0.2, 0.2) * scale,
            (table.lo[1] + table.hi[1]) / 2 + g_traj.uniform(-0.1, 0.3) * scale,
            table.hi[2],
        ]
    )
    start = np.array([g_traj.uniform(-0.1, 0.1), g_traj.uniform(-0.1, 0.1), g_traj.uniform(-0.1, 0.05)]) * scale
    traj = make_trajectory(g_traj, motion, start, target)
    if scale != 1.0:
        traj = _scaled(traj, scale)

    t_frames = np.arange(n_frames, dtype=np.float64) / FPS
    poses = traj.poses(t_frames)
    renderer = Renderer(scene, WIDTH, HEIGHT, FX, FY, CX - 0.5, CY - 0.5)
    frames: range | Any = range(n_frames)
    if progress:
        from tqdm import tqdm

        frames = tqdm(frames, desc=name, unit="frame", leave=False)
    params = [int(cv2.IMWRITE_JPEG_QUALITY), int(jpeg_quality)]
    jpeg_bytes = 0
    static_jpg: bytes | None = None
    for i in frames:
        if static_jpg is None or motion != "static":
            ok, buf = cv2.imencode(".jpg", renderer.render(poses[i])[..., ::-1], params)
            if not ok:
                raise RuntimeError("JPEG encoding failed")
            static_jpg = buf.tobytes()
        (tmp / "rgb" / f"{i:06d}.jpg").write_bytes(static_jpg)
        jpeg_bytes += len(static_jpg)

    duration = (n_frames - 1) / FPS
    model = make_imu_model(g_imu, imu_offset)
    tau = imu_timestamps(duration, imu_offset, imu_duration_factor)
    accel, gyro = synth_imu(g_imu, traj, model, tau)
    nan_idx: list[int] = []
    if nan_imu:
        nan_idx = sorted(int(i) for i in g_nan.choice(len(tau), size=min(3, len(tau)), replace=False))
        for i in nan_idx:
            accel[i, int(g_nan.integers(0, 3))] = np.nan
            gyro[i, int(g_nan.integers(0, 3))] = np.nan
    imu = [
        {
            "timestamp": round(float(t), 6),
            "accel": [round(float(x), 8) for x in a],
            "gyro": [round(float(x), 8) for x in w],
        }
        for t, a, w in zip(tau, accel, gyro)
    ]
    (tmp / "imu.json").write_bytes(_dumps(imu))

    t_enc, enc = synth_encoders(g_enc, duration)
    encoders = [
        {"timestamp": round(float(t), 6), **{k: round(float(v), 6) for k, v in zip(ENCODER_KEYS, row)}}
        for t, row in zip(t_enc, enc)
    ]
    (tmp / "encoders.json").write_bytes(_dumps(encoders))
    (tmp / "calib.txt").write_text(f"{FX:.6f} {FY:.6f} {CX:.6f} {CY:.6f}\n")
    (tmp / "poses.json").write_bytes(b"[]")
    metadata = {
        "device": "shardship synthetic camera",
        "captureSource": "StackCapture",
        "formatVersion": 3,
        "rgbResolution": [WIDTH, HEIGHT],
        "fps": FPS,
        "frameCount": n_frames,
        "imuRate": IMU_RATE,
        "synthetic": True,
    }
    (tmp / "metadata.json").write_bytes(_dumps(metadata))
    if video:
        # opaque placeholder about 40% of the frames' size (an H.264 video of the same
        # capture is of that order); starts like an ISO-BMFF/QuickTime file
        size = max(64, int(jpeg_bytes * 0.4))
        (tmp / "video.mov").write_bytes(b"\x00\x00\x00\x14ftypqt  " + g_vid.bytes(size - 12))

    truth_obj = {
        "version": TRUTH_VERSION,
        "seed": int(seed),
        "scene_seed": int(seed if scene_seed is None else scene_seed),
        "motion": motion,
        "conventions": {
            "pose": "camera-to-world 4x4, metres, OpenCV camera (x right, y down, z forward)",
            "world": "z up; gravity = (0, 0, -9.80665) m/s^2",
            "imu_clock": "imu_time = frame_time + imu_offset",
            "R_imu_cam": "v_imu = R_imu_cam @ v_cam; IMU at the optical centre (no lever arm)",
            "accel": "g, gravity removed, IMU frame, + accel_bias + white noise",
            "gyro": "rad/s, IMU frame, + gyro_bias + white noise",
            "pixel": "COLMAP: pixel (i, j) centre at (i + 0.5, j + 0.5); calib.txt cx cy in that convention",
        },
        "scale": scale,
        "frame_timestamps": t_frames.tolist(),
        "poses": poses.tolist(),
        "intrinsics": [FX, FY, CX, CY],
        "imu_offset": float(imu_offset),
        "R_imu_cam": model.R_imu_cam.tolist(),
        "gravity": [0.0, 0.0, -GRAVITY],
        "accel_bias": model.accel_bias.tolist(),
        "gyro_bias": model.gyro_bias.tolist(),
        "accel_noise": model.accel_noise,
        "gyro_noise": model.gyro_noise,
        "imu_duration_factor": float(imu_duration_factor),
        "nan_imu_samples": nan_idx,
        "scene": scene.describe(),
    }
    (tmp / TRUTH_FILE).write_bytes(_dumps(truth_obj))

    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


_SCENES: dict[tuple[int, float], Scene] = {}


def _scene(seed: int, scale: float, rng: np.random.Generator) -> Scene:
    """make_scene, remembered for the last few (seed, scale): texture generation is
    the slow part of a short session, and tests re-synthesise the same seed."""
    key = (seed, scale)
    if key not in _SCENES:
        while len(_SCENES) >= 4:
            _SCENES.pop(next(iter(_SCENES)))
        _SCENES[key] = make_scene(rng, scale)
    return _SCENES[key]


def _scaled(traj: Any, s: float) -> Any:
    from dataclasses import replace

    return replace(traj, pos_amp=traj.pos_amp * s)


def synth_dataset(
    out: str | os.PathLike,
    sessions: int,
    frames: int,
    seed: int,
    *,
    same_room: bool = True,
    workers: int = 1,
    progress: bool = True,
    **kw: Any,
) -> list[Path]:
    """Write `sessions` sessions of `frames` frames under `out`; returns their paths.
    Session i gets name `session_name(seed, i)` and its own seed derived from
    (seed, i) (its own trajectory, IMU and gripper); with `same_room` (default, like
    a student recording every demo in one lab) they share the room of `seed`.
    `workers` > 1 renders sessions in parallel processes (same bytes either way).
    Extra keywords go to `synth_session`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if same_room:
        kw.setdefault("scene_seed", int(seed))
    jobs = [
        (out, session_name(seed, i), frames, int(np.random.SeedSequence([int(seed), i]).generate_state(1)[0]))
        for i in range(sessions)
    ]
    bar: Any = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=sessions, desc="synth", unit="session")
    paths: list[Path] = []
    try:
        if workers <= 1 or sessions <= 1:
            for job in jobs:
                paths.append(synth_session(*job, **kw))
                if bar is not None:
                    bar.update()
        else:
            from concurrent.futures import ProcessPoolExecutor

            with ProcessPoolExecutor(min(workers, sessions)) as ex:
                futs = [ex.submit(synth_session, *job, **kw) for job in jobs]
                for f in futs:
                    paths.append(f.result())
                    if bar is not None:
                        bar.update()
    finally:
        if bar is not None:
            bar.close()
    return paths


def truth(session_dir: str | os.PathLike) -> dict[str, Any]:
    """Ground truth of a synthetic session with arrays as numpy (poses (N,4,4),
    frame_timestamps (N,), R_imu_cam (3,3), gravity, biases, intrinsics)."""
    with open(Path(session_dir) / TRUTH_FILE, "rb") as f:
        d = json.load(f)
    for k in ("frame_timestamps", "poses", "intrinsics", "R_imu_cam", "gravity", "accel_bias", "gyro_bias"):
        d[k] = np.asarray(d[k], dtype=np.float64)
    return d
