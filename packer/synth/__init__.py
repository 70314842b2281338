"""Synthetic StackCapture sessions with known ground truth (`packer synth`).

The demo's data and every test's data: a textured 3-D room rendered along a smooth
hand-like trajectory, written EXACTLY as the StackCapture iPhone app writes a
session (Capture/StorageManager.swift, CaptureCoordinator.swift,
RawCaptureSession.swift, BLE/BLEManager.swift, firmware encoder_reader.ino):

ultrawide capture (the default, the app's current mode)::

    session_YYYY-MM-DD_HHMMSS/
      rgb/000000.jpg ...   480x360 JPEG q80; index = frame counter (a failed encode
                           leaves a gap: `drop_frames`)
      imu.json             [{accel [g, gravity removed], gyro [rad/s], timestamp [epoch s]}] 200 Hz
      encoders.json        [{esp_timestamp_ms, index_mcp, ..., timestamp [epoch s at BLE receive]}]
                           ~50 Hz, Float32 degrees in [-180, 180], -1 = read error;
                           absent when no reading arrived (`encoders=False`)
      poses.json           [] (filled later by SLAM)
      calib.txt            "fx fy cx cy" (Swift Float descriptions, no newline)
      metadata.json        sorted keys, ISO-8601 dates, captureSource "iphone_ultrawide"
      video.mov            only with `video=True` (opaque placeholder)

every JSON file as Foundation's JSONEncoder [.prettyPrinted, .sortedKeys] writes it
(`packer.synth.swift_json`). `capture="arkit"` writes the legacy ARKit layout
(metric poses on the phone's boot clock, no IMU, no calib), `export="zip"` what the
app leaves after its auto-zip (`<name>.zip` + `<name>.metadata.json`).

The truth (metric poses, clocks, IMU offset/rotation/biases, true joint angles) is in
`synth_truth.json`, which the pipeline never reads; `truth()` loads it.

Deterministic: the same arguments give byte-identical files (one seeded generator
per component, so toggling e.g. `nan_imu` or `read_errors` leaves the frames and
every other stream unchanged).
"""
from __future__ import annotations

import json
import math
import os
import shutil
import zipfile
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from packer.synth import swift_json
from packer.synth.encoders import (
    JOINT_NAMES,
    LATENCY_JITTER,
    LATENCY_MIN,
    make_gripper,
    synth_encoder_stream,
    with_wrap,
)
from packer.synth.imu import IMU_RATE, imu_timestamps, make_imu_model, synth_imu
from packer.synth.render import Renderer, Scene, make_scene
from packer.synth.trajectory import GRAVITY, MOTIONS, make_trajectory

__all__ = [
    "synth_session",
    "synth_dataset",
    "truth",
    "session_name",
    "TRUTH_FILE",
    "MOTIONS",
    "CAPTURES",
    "EXPORTS",
    "JOINT_NAMES",
]

WIDTH, HEIGHT, FPS = 480, 360, 60.0
FX = FY = 400.0
CX, CY = 240.0, 180.0  # COLMAP convention: pixel (i, j) has its centre at (i + 0.5, j + 0.5)
JPEG_QUALITY = 80  # the app: UIImage.jpegData(compressionQuality: 0.8)
TRUTH_FILE = "synth_truth.json"
TRUTH_VERSION = 2
DEVICE_MODEL = "iPhone15,3"
IOS_VERSION = "17.5.1"
CAPTURES = ("ultrawide", "arkit")
EXPORTS = ("folder", "zip")
CAPTURE_SOURCE = {"ultrawide": "iphone_ultrawide", "arkit": "iphone_arkit"}
FRAME0_DELAY = (0.010, 0.040)  # s from capture start to frame 0
FINALIZE_DELAY = (0.8, 1.6)  # s from stop to metadata's endTime = Date() in finalize
DEFAULT_START = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)  # for names that carry no time
# ARKit: camera x right, y up, z back; OpenCV: x right, y down, z forward
ARKIT_FROM_OPENCV_CAM = np.diag([1.0, -1.0, -1.0, 1.0])
# truth world (z up, camera looks along +y) -> ARKit world (y up, initial forward -z)
_ARKIT_BASE = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, -1.0, 0.0]])
_DEPTH_MAP = (256, 192)  # ARKit sceneDepth resolution; the app takes a 5x5 median at its centre


def session_name(seed: int, index: int) -> str:
    """`session_2026-01-01_1200SS`-style name: the date moves with the seed, the
    clock with the index (unique for any index)."""
    t = datetime(2026, 1, 1, 12, 0, 0) + timedelta(days=seed % 3650, seconds=index)
    return t.strftime("session_%Y-%m-%d_%H%M%S")


def name_epoch(name: str) -> float:
    """The session name's time read as UTC (the app names the folder from Date()
    just before startTime = Date()); names without one give 2026-01-01 12:00:00 UTC."""
    try:
        t = datetime.strptime(name, "session_%Y-%m-%d_%H%M%S").replace(tzinfo=timezone.utc)
    except ValueError:
        t = DEFAULT_START
    return float(t.timestamp())


def iso8601(epoch: float) -> str:
    """JSONEncoder .iso8601 date: UTC, whole seconds (fraction truncated), 'Z'."""
    return datetime.fromtimestamp(math.floor(epoch), tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _describe_float32(x: float) -> str:
    """Swift `Float.description` (what "\\(fx)" interpolates): keeps the ".0"."""
    s = swift_json.format_float32(x)
    return s if any(c in s for c in ".eNI") else s + ".0"


def _dumps(obj: Any) -> bytes:
    # the truth file (never read by the pipeline): plain Python JSON; NaN literals
    # only matter for nan_imu sessions
    return (json.dumps(obj, indent=None, separators=(", ", ": ")) + "\n").encode()


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
    device_model: str = DEVICE_MODEL,
    ios_version: str = IOS_VERSION,
) -> Path:
    """Write one session `out_dir/name` as the app does and return its path (the
    folder, or `out_dir/name.zip` with `export="zip"`).

    n_frames: frames captured (indices 0..n_frames-1, minus `drop_frames`).
    motion: "hand" (default), "rotation-only" (fixed centre: metric scale is not
    observable and must be refused), "static" (every frame identical).
    imu_offset: seconds of extra IMU latency (CoreMotion's main-queue handler stamps
    with Date(): a few ms after the sample; default 8 ms against the glove's 5 ms
    minimum BLE latency. The difference is not observable from the data, so it is
    the floor of the joint timing error): an IMU stamp is frame0_epoch +
    frame_time + imu_offset (truth: "imu_latency"; truth "imu_offset" is that whole
    epoch offset, imu_stamp = frame_time + imu_offset).
    scale_hint: multiplies every length of the scene and the trajectory (a bigger or
    smaller world; truth poses stay metric in that world); None means 1.
    imu_duration_factor: < 1 makes the IMU stop early (covers that fraction of the capture).
    nan_imu: writes NaN into a few IMU samples (bad-input tests; the real app's
    encoder would refuse to write NaN).
    video: also write a placeholder `video.mov` (opaque bytes, never read) so raw-vs-packed
    byte counts include a video as real captures do (metadata hasVideo is true either
    way: the app always records one).
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
    calib: False = the camera delivered no intrinsic matrix (no calib.txt, no
    cameraIntrinsics).
    lidar: arkit only: the phone has LiDAR, each pose carries the centre depth
    (metres, Float32); False omits the key (nil optional).
    export: "folder" or "zip" (the app's auto-zip: `name.zip` with the folder as its
    one top folder, plus the sidecar `name.metadata.json`; the folder is removed).

    The session is assembled under a temporary name and renamed into place, so a
    killed run never leaves a half-written session that looks complete."""
    if motion not in MOTIONS:
        raise ValueError(f"motion must be one of {MOTIONS}, got {motion!r}")
    if capture not in CAPTURES:
        raise ValueError(f"capture must be one of {CAPTURES}, got {capture!r}")
    if export not in EXPORTS:
        raise ValueError(f"export must be one of {EXPORTS}, got {export!r}")
    if n_frames < 1:
        raise ValueError("n_frames must be >= 1")
    if not fps > 0:
        raise ValueError("fps must be > 0")
    if not 0.0 < imu_duration_factor <= 1.0:
        raise ValueError("imu_duration_factor must be in (0, 1]")
    if not 0.0 <= read_errors <= 1.0:
        raise ValueError("read_errors must be in [0, 1]")
    if legacy_metadata and capture != "arkit":
        raise ValueError("legacy_metadata is the first (ARKit) app's metadata: use capture='arkit'")
    dropped = sorted({int(i) for i in drop_frames})
    if any(not 0 <= i < n_frames for i in dropped):
        raise ValueError(f"drop_frames must be frame indices in [0, {n_frames})")
    present = [i for i in range(n_frames) if i not in set(dropped)]
    if not present:
        raise ValueError("drop_frames drops every frame")
    if isinstance(wrap_joint, str) and wrap_joint not in JOINT_NAMES:
        raise ValueError(f"wrap_joint must be a bool or one of {JOINT_NAMES}, got {wrap_joint!r}")
    scale = 1.0 if scale_hint is None else float(scale_hint)
    fps = float(fps)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / name
    tmp = out_dir / f".{name}.synth-tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    (tmp / "rgb").mkdir(parents=True)

    # one generator per component: spawn keys 0..5 are the historical ones
    ss = np.random.SeedSequence([int(seed), 0x5EED])
    (g_scene, g_traj, g_imu, g_grip, g_nan, g_vid, g_clock, g_esp, g_enc_noise, g_ble, g_err, g_arkit, g_wrap) = (
        np.random.default_rng(s) for s in ss.spawn(13)
    )

    # --- clocks (epoch seconds) ---
    capture_start = name_epoch(name) + float(g_clock.uniform(0.0, 0.999))  # startTime = Date()
    frame0_epoch = capture_start + float(g_clock.uniform(*FRAME0_DELAY))
    imu_phase = float(g_clock.uniform(0.0, 1.0 / IMU_RATE))
    finalize_delay = float(g_clock.uniform(*FINALIZE_DELAY))
    stop_epoch = frame0_epoch + n_frames / fps  # stop pressed one frame period after the last frame
    end_epoch = stop_epoch + finalize_delay
    imu_offset_epoch = frame0_epoch + float(imu_offset)

    # --- scene, trajectory, frames ---
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

    t_frames = np.arange(n_frames, dtype=np.float64) / fps
    poses = traj.poses(t_frames)
    renderer = Renderer(scene, WIDTH, HEIGHT, FX, FY, CX - 0.5, CY - 0.5)
    frames: Any = present
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

    # --- IMU (ultrawide only; the model is drawn either way for the truth) ---
    model = make_imu_model(g_imu, imu_offset_epoch)
    nan_idx: list[int] = []
    imu_count = 0
    if capture == "ultrawide":
        tau = imu_timestamps(capture_start, stop_epoch, imu_phase, imu_duration_factor)
        accel, gyro = synth_imu(g_imu, traj, model, tau)
        if nan_imu and len(tau):
            nan_idx = sorted(int(i) for i in g_nan.choice(len(tau), size=min(3, len(tau)), replace=False))
            for i in nan_idx:
                accel[i, int(g_nan.integers(0, 3))] = np.nan
                gyro[i, int(g_nan.integers(0, 3))] = np.nan
        imu = [
            {"accel": [float(x) for x in a], "gyro": [float(x) for x in w], "timestamp": float(t)}
            for t, a, w in zip(tau, accel, gyro)
        ]
        imu_count = len(imu)
        if imu:  # the app writes imu.json only when it has readings
            (tmp / "imu.json").write_bytes(swift_json.dumps(imu))

    # --- gripper encoders over BLE ---
    gripper = make_gripper(g_grip)
    wrap_idx = int(g_wrap.integers(0, len(JOINT_NAMES)))
    if isinstance(wrap_joint, str):
        wrap_idx = JOINT_NAMES.index(wrap_joint)
    elif not wrap_joint:
        wrap_idx = -1
    if wrap_idx >= 0:
        gripper = with_wrap(gripper, wrap_idx, capture_start - frame0_epoch, stop_epoch - frame0_epoch)
    stream = synth_encoder_stream(
        g_esp,
        g_enc_noise,
        g_ble,
        g_err,
        gripper,
        capture_start=capture_start,
        frame0_epoch=frame0_epoch,
        stop=stop_epoch,
        read_errors=read_errors,
    )
    encoder_count = len(stream.esp_ms) if encoders else 0
    if encoder_count:
        (tmp / "encoders.json").write_bytes(swift_json.dumps(stream.records(), float32_keys=JOINT_NAMES))
    joints = gripper.angles(t_frames)
    joints -= 360.0 * np.floor((joints[0] + 180.0) / 360.0)[None]  # first value in [-180, 180)

    # --- poses.json, calib.txt ---
    arkit_truth: dict[str, Any] = {}
    if capture == "arkit":
        boot_offset = float(g_arkit.uniform(20_000.0, 600_000.0))  # phone uptime at frame 0
        yaw = float(g_arkit.uniform(-0.3, 0.3))
        c, s_ = math.cos(yaw), math.sin(yaw)
        R_aw = np.array([[c, 0.0, s_], [0.0, 1.0, 0.0], [-s_, 0.0, c]]) @ _ARKIT_BASE
        origin = poses[0, :3, 3] + g_arkit.uniform(-0.1, 0.1, 3) * scale  # where ARKit started tracking
        W = np.eye(4)
        W[:3, :3] = R_aw
        W[:3, 3] = -R_aw @ origin
        depth = _center_depth(renderer, poses)
        entries = []
        for i in present:
            e: dict[str, Any] = {
                "rgbIndex": i,
                "timestamp": boot_offset + t_frames[i],  # ARFrame.timestamp: boot clock
                "transform": (W @ poses[i] @ ARKIT_FROM_OPENCV_CAM).tolist(),
            }
            if lidar and np.isfinite(depth[i]):
                e["depth"] = float(depth[i])
            entries.append(e)
        (tmp / "poses.json").write_bytes(swift_json.dumps(entries, float32_keys=("transform", "depth")))
        pose_ts = [e["timestamp"] for e in entries]
        arkit_truth = {
            "boot_clock_offset": boot_offset,
            "arkit_world_from_truth_world": R_aw.tolist(),
            "arkit_world_origin": origin.tolist(),
            "arkit_depth": depth.tolist(),
            "lidar": bool(lidar),
        }
    else:
        (tmp / "poses.json").write_bytes(swift_json.dumps([]))
        entries, pose_ts = [], []
        if calib:
            (tmp / "calib.txt").write_text(" ".join(_describe_float32(v) for v in (FX, FY, CX, CY)))

    # --- metadata.json (SessionMetadata; nil optionals are omitted) ---
    md: dict[str, Any] = {
        "bleConnected": bool(encoders),
        "captureSource": CAPTURE_SOURCE[capture],
        "deviceModel": device_model,
        "endTime": iso8601(end_epoch),
        "hasVideo": True,
        "iosVersion": ios_version,
        "poseCount": len(entries),
        "rgbFrameCount": present[-1] + 1,
        "rgbResolution": [WIDTH, HEIGHT],
        "startTime": iso8601(capture_start),
    }
    if encoder_count:
        md["encoderCount"] = encoder_count
    if capture == "ultrawide":
        md["slamProcessed"] = False
        if calib:
            md["cameraIntrinsics"] = {"fx": FX, "fy": FY, "cx": CX, "cy": CY}
        if imu_count:
            md["imuCount"] = imu_count
    else:
        md["durationSeconds"] = pose_ts[-1] - pose_ts[0]
        if legacy_metadata:
            del md["captureSource"]
    md_bytes = swift_json.dumps(md, float32_keys=("cameraIntrinsics",))
    (tmp / "metadata.json").write_bytes(md_bytes)
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
        "capture": capture,
        "conventions": {
            "pose": "camera-to-world 4x4, metres, OpenCV camera (x right, y down, z forward)",
            "world": "z up; gravity = (0, 0, -9.80665) m/s^2",
            "frame_clock": "frame i is at frame_time i / fps (seconds since frame 0) = epoch frame0_epoch + i / fps",
            "imu_clock": "imu_time = frame_time + imu_offset (imu_offset is an epoch: frame0_epoch + imu_latency)",
            "encoder_clock": "a reading with esp_timestamp_ms m was sampled at epoch capture_start_epoch + "
            "(m - encoder.esp_ms_at_capture_start) / (1000 (1 + encoder.esp_drift_ppm 1e-6)) and "
            "stamped (timestamp) at that + latency in [latency_min, latency_min + latency_jitter]",
            "joints_deg": "true encoder angle of each joint at each frame's time, degrees, continuous "
            "(the recorded values are these folded into [-180, 180], quantised to 360/4096, + noise)",
            "R_imu_cam": "v_imu = R_imu_cam @ v_cam; IMU at the optical centre (no lever arm)",
            "accel": "g, gravity removed, IMU frame, + accel_bias + white noise",
            "gyro": "rad/s, IMU frame, + gyro_bias + white noise",
            "pixel": "COLMAP: pixel (i, j) centre at (i + 0.5, j + 0.5); calib.txt cx cy in that convention",
            "arkit": "transform = A @ pose @ diag(1,-1,-1,1), A = [[R, -R o], [0, 1]] with "
            "R = arkit_world_from_truth_world, o = arkit_world_origin; timestamp = frame_time + boot_clock_offset",
        },
        "scale": scale,
        "fps": fps,
        "frame_timestamps": t_frames.tolist(),
        "frame_indices": present,
        "dropped_frames": dropped,
        "poses": poses.tolist(),
        "intrinsics": [FX, FY, CX, CY],
        "capture_start_epoch": capture_start,
        "frame0_epoch": frame0_epoch,
        "stop_epoch": stop_epoch,
        "end_epoch": end_epoch,
        "imu_offset": imu_offset_epoch,
        "imu_latency": float(imu_offset),
        "R_imu_cam": model.R_imu_cam.tolist(),
        "gravity": [0.0, 0.0, -GRAVITY],
        "accel_bias": model.accel_bias.tolist(),
        "gyro_bias": model.gyro_bias.tolist(),
        "accel_noise": model.accel_noise,
        "gyro_noise": model.gyro_noise,
        "imu_duration_factor": float(imu_duration_factor),
        "nan_imu_samples": nan_idx,
        "joint_names": list(JOINT_NAMES),
        "joints_deg": joints.tolist(),
        "encoder": {
            "connected": bool(encoders),
            "latency_min": LATENCY_MIN,
            "latency_jitter": LATENCY_JITTER,
            "esp_drift_ppm": stream.clock.drift_ppm,
            "esp_ms_at_capture_start": stream.clock.ms_at_capture_start,
            "read_errors": float(read_errors),
            "read_error_values": stream.n_read_errors if encoders else 0,
            "wrap_joint": JOINT_NAMES[wrap_idx] if wrap_idx >= 0 else None,
            "firmware_offsets_raw": [int(x) for x in stream.offsets_raw],
            "gripper": gripper.describe(),
        },
        "scene": scene.describe(),
        **arkit_truth,
    }
    (tmp / TRUTH_FILE).write_bytes(_dumps(truth_obj))

    if final.exists():
        shutil.rmtree(final)
    if export == "zip":
        zpath = out_dir / f"{name}.zip"
        part = out_dir / f".{name}.zip.synth-tmp"
        _zip_folder(tmp, part, name, capture_start)
        os.replace(part, zpath)
        (out_dir / f"{name}.metadata.json").write_bytes(md_bytes)
        shutil.rmtree(tmp)
        return zpath
    os.replace(tmp, final)
    return final


def _center_depth(renderer: Renderer, poses: np.ndarray) -> np.ndarray:
    """The ARKit app's single-point LiDAR depth per frame: median of the 5x5 centre
    pixels of the 256x192 depth map (z-depth, metres)."""
    w, h = _DEPTH_MAP
    xs = w // 2 + np.arange(-2, 3)
    ys = h // 2 + np.arange(-2, 3)
    u = (xs + 0.5) * WIDTH / w - 0.5  # depth-map pixel centre -> OpenCV image pixel coordinates
    v = (ys + 0.5) * HEIGHT / h - 0.5
    uv = np.stack(np.meshgrid(u, v), -1).reshape(-1, 2)
    out = np.empty(len(poses))
    for i, T in enumerate(poses):
        d = np.sort(renderer.depth(T, uv, FX, FY, CX - 0.5, CY - 0.5))
        out[i] = d[len(d) // 2]
    return out


def _zip_folder(folder: Path, dst: Path, name: str, epoch: float) -> None:
    """`folder` zipped with `name/` as its one top folder, deterministic bytes:
    sorted members, directory entries, a fixed timestamp (the capture's start)."""
    dt = datetime.fromtimestamp(math.floor(epoch), tz=timezone.utc)
    date_time = (max(dt.year, 1980), dt.month, dt.day, dt.hour, dt.minute, dt.second)
    entries: list[tuple[str, Path | None]] = [(f"{name}/", None)]
    for p in sorted(folder.rglob("*"), key=lambda q: q.relative_to(folder).as_posix()):
        rel = p.relative_to(folder).as_posix()
        entries.append((f"{name}/{rel}/", None) if p.is_dir() else (f"{name}/{rel}", p))
    with zipfile.ZipFile(dst, "w") as zf:
        for arc, p in entries:
            zi = zipfile.ZipInfo(arc, date_time)
            zi.create_system = 3
            if p is None:
                zi.external_attr = (0o40755 << 16) | 0x10
                zi.compress_type = zipfile.ZIP_STORED
                zf.writestr(zi, b"")
            else:
                zi.external_attr = 0o100644 << 16
                stored = p.suffix.lower() in (".jpg", ".jpeg", ".mov")
                zi.compress_type = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
                zf.writestr(zi, p.read_bytes(), compresslevel=None if stored else 6)


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
    Extra keywords (fps, encoders, capture, export, ...) go to `synth_session`."""
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


_ARRAYS = (
    "frame_timestamps",
    "poses",
    "intrinsics",
    "R_imu_cam",
    "gravity",
    "accel_bias",
    "gyro_bias",
    "joints_deg",
    "arkit_world_from_truth_world",
    "arkit_world_origin",
    "arkit_depth",
)


def truth(session: str | os.PathLike) -> dict[str, Any]:
    """Ground truth of a synthetic session (its folder, or its `.zip` export) with
    arrays as numpy: float64 poses (N,4,4), frame_timestamps (N,), joints_deg (N,4),
    R_imu_cam (3,3), gravity, biases, intrinsics, and for ARKit sessions
    arkit_world_from_truth_world (3,3), arkit_world_origin (3,), arkit_depth (N,);
    int64 frame_indices and dropped_frames."""
    p = Path(session)
    if p.suffix == ".zip" and p.is_file():
        with zipfile.ZipFile(p) as zf:
            member = next(n for n in zf.namelist() if n.count("/") == 1 and n.endswith("/" + TRUTH_FILE))
            d = json.loads(zf.read(member))
    else:
        with open(p / TRUTH_FILE, "rb") as f:
            d = json.load(f)
    for k in _ARRAYS:
        if k in d:
            d[k] = np.asarray(d[k], dtype=np.float64)
    for k in ("frame_indices", "dropped_frames"):
        if k in d:
            d[k] = np.asarray(d[k], dtype=np.int64)
    return d
