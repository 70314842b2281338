"""`synth_session`: one session, written as a sequence of named steps, and
`synth_dataset`: many sessions (optionally in parallel processes).

The steps (plan clocks, build the world, render frames, write IMU, write encoders,
write poses/calib, write metadata, write the video placeholder, write the truth,
publish as folder or zip) live in their own modules; this module only orders them.
Each step draws from its own generator (`Rngs`), so the order matters only for
which files exist first, never for their bytes."""
from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from packer.effects import CameraEffects, PhoneRig
from packer.synth.clocks import plan_clocks, session_name
from packer.synth.encoders import make_gripper
from packer.synth.export import publish
from packer.synth.frames import FPS, JPEG_QUALITY, build_world, render_frames
from packer.synth.groundtruth import write_truth
from packer.synth.metadata import DEVICE_MODEL, IOS_VERSION, write_metadata, write_poses, write_video
from packer.synth.sensors import write_encoders, write_imu
from packer.synth.spec import Faults, Rngs, SessionSpec, draw_drops


def synth_session(
    out_dir: str | os.PathLike,
    name: str,
    n_frames: int = 180,
    seed: int = 0,
    *,
    motion: str = "hand",
    imu_offset: float = 0.008,
    scale_hint: float | None = None,
    imu_duration_factor: float = 1.0,
    nan_imu: bool = False,
    video: bool = False,
    scene_seed: int | None = None,
    jpeg_quality: int = JPEG_QUALITY,
    progress: bool = False,
    fps: float = FPS,
    drop_frames: tuple[int, ...] = (),
    encoders: bool = True,
    read_errors: float = 0.0,
    wrap_joint: bool | str = False,
    capture: str = "ultrawide",
    legacy_metadata: bool = False,
    calib: bool = True,
    lidar: bool = True,
    export: str = "folder",
    device_model: str = DEVICE_MODEL, ios_version: str = IOS_VERSION, clock_step: float = 0.0,
    clock_step_at: float = 0.5, effects: CameraEffects | None = None, rig: PhoneRig | None = None,
    faults: Faults | None = None,
) -> Path:
    """Write one session `out_dir/name` as the app does and return its path (the
    folder, or `out_dir/name.zip` with `export="zip"`).

    n_frames: frames captured (indices 0..n_frames-1, minus `drop_frames`).
    motion: "hand" (default), "weak" (the hand path at 0.3 of its size: scale still
    observable, with a fifth of the acceleration), "rotation-only" (fixed centre:
    metric scale is not observable and must be refused), "static" (every frame
    identical).
    imu_offset: seconds of extra IMU latency (CoreMotion's main-queue handler stamps
    with Date(): default 8 ms against the glove's 5 ms minimum BLE latency, the floor
    of the joint timing error): an IMU stamp is frame0_epoch + frame_time + imu_offset
    (truth "imu_latency"; truth "imu_offset" is that whole epoch offset).
    scale_hint: multiplies every length of the scene and the trajectory (a bigger or
    smaller world; truth poses stay metric in that world); None means 1.
    imu_duration_factor: < 1 makes the IMU stop early (covers that fraction of the capture).
    nan_imu: writes NaN into a few IMU samples (bad-input tests; the real app's
    encoder would refuse to write NaN).
    video: also write `video.mov`, a real HEVC file with every delivered frame at its time
    (`packer.video`; metadata hasVideo is true either way: the app always records one).
    scene_seed: the room (geometry and texture) comes from this seed instead of `seed`,
    so several sessions can be recorded in the same room.
    fps: camera rate, 60 (default) or 30 (the app's fallback); frame i is at i / fps.
    drop_frames: frame indices whose JPEG encode "failed": no file, the counter
    still advanced (a gap); rgbFrameCount = last written index + 1.
    encoders: False = glove not connected (no encoders.json, bleConnected false,
    no encoderCount).
    read_errors: probability per value of an I2C read error (-1.0 exactly).
    wrap_joint: True (a seeded joint) or a joint name: that joint's calibration zero
    sits half a turn away, so its readings cross +-180 and wrap.
    capture: "ultrawide" (AVFoundation + CoreMotion, the current app) or "arkit"
    (the legacy ARKit app: metric poses in poses.json, no IMU, no calib.txt).
    legacy_metadata: arkit only: metadata as the first app version wrote it (no
    captureSource key).
    calib: False = the camera delivered no intrinsic matrix (no calib.txt, no cameraIntrinsics).
    lidar: arkit only: the phone has LiDAR, each pose carries the centre depth
    (metres, Float32); False omits the key (nil optional).
    clock_step: Date() jumps this many seconds at `clock_step_at` of the capture (NTP; truth "clock_step").
    export: "folder" or "zip" (the app's auto-zip: `name.zip` with the folder as its
    one top folder, plus the sidecar `name.metadata.json`; the folder is removed).
    effects: what a real phone camera does to the frames (`packer.synth.camera`:
    glove in view, lens, blur, rolling shutter, exposure, low texture); None: none.
    rig: the phone's build (`packer.effects.PhoneRig`), drawn per seed; None: none.
    faults: what a phone and a Bluetooth glove do to the recording (`spec.Faults`); None: none.

    The session is assembled under a temporary name and renamed into place, so a
    killed run never leaves a half-written session that looks complete."""
    spec = SessionSpec(
        name=name, n_frames=n_frames, seed=seed, motion=motion, imu_offset=imu_offset, scale_hint=scale_hint,
        imu_duration_factor=imu_duration_factor, nan_imu=nan_imu, video=video, scene_seed=scene_seed,
        jpeg_quality=jpeg_quality, progress=progress, fps=fps, drop_frames=drop_frames, encoders=encoders,
        read_errors=read_errors, wrap_joint=wrap_joint, capture=capture, legacy_metadata=legacy_metadata,
        calib=calib, lidar=lidar, export=export, device_model=device_model, ios_version=ios_version,
        clock_step=clock_step, clock_step_at=clock_step_at, effects=effects or CameraEffects(), rig=rig or PhoneRig(),
        **_fault_fields(faults or Faults(), n_frames, seed))
    return write_session(out_dir, spec)


def _fault_fields(f: Faults, n_frames: int, seed: int) -> dict[str, Any]:
    drops = tuple(f.camera_drops) or (draw_drops(n_frames, f.drop_rate, seed) if f.drop_rate else ())
    return {"camera_drops": drops, "writer_skips": tuple(f.writer_skips), "glove_gaps": tuple(f.glove_gaps),
            "dead_joint": f.dead_joint}


def write_session(out_dir: str | os.PathLike, spec: SessionSpec) -> Path:
    """The steps of `synth_session` for an already validated `spec`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{spec.name}.synth-tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    (tmp / "rgb").mkdir(parents=True)

    rng = Rngs.from_seed(spec.seed)
    clocks = plan_clocks(spec.name, int(spec.slots[-1]) + 1, spec.fps, spec.imu_offset, rng.clock, spec.clock_step,
                         spec.clock_step_at, spec.phone.imu_lead)
    world = build_world(spec, rng.scene, rng.traj)
    joints = None
    if spec.effects.glove:  # the fingers in view follow the joints the glove records (same draws)
        joints = make_gripper(copy.deepcopy(rng.grip)).flexion(world.t_frames)
    render_frames(tmp / "rgb", spec, world, joints, rng.camera)
    imu = write_imu(tmp, spec, clocks, world.traj, rng.imu, rng.nan)
    enc = write_encoders(tmp, spec, clocks, world.t_frames, rng)
    poses = write_poses(tmp, spec, world, rng.arkit)
    md_bytes = write_metadata(tmp, spec, clocks, poses, enc.count, imu.count)
    if spec.video:
        write_video(tmp, spec, world.t_frames)
    write_truth(tmp, spec, clocks, world, imu, enc, poses)
    return publish(tmp, out_dir, spec.name, spec.export, md_bytes, clocks.capture_start)


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
    Extra keywords (fps, encoders, capture, export, ...) go to `synth_session`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if same_room:
        kw.setdefault("scene_seed", int(seed))
    jobs = [
        (out, session_name(seed, i), frames, int(np.random.SeedSequence([int(seed), i]).generate_state(1)[0]))
        for i in range(sessions)
    ]
    from shardship.progress import bar as progress_bar

    paths: list[Path] = []
    # a bar on a terminal, plain lines in a log (a tqdm bar wrote \r redraws there)
    with progress_bar(sessions, "synth", "session", None if progress else False) as bar:
        if workers <= 1 or sessions <= 1:
            for job in jobs:
                paths.append(synth_session(*job, **kw))
                bar.update(1)
        else:
            from concurrent.futures import ProcessPoolExecutor

            with ProcessPoolExecutor(min(workers, sessions)) as ex:
                futs = [ex.submit(synth_session, *job, **kw) for job in jobs]
                for f in futs:
                    paths.append(f.result())
                    bar.update(1)
    return paths
