"""The session's descriptive files as the app writes them: `poses.json` (empty
for the ultrawide app, metric ARKit poses for the legacy app), `calib.txt`,
`metadata.json` (SessionMetadata; nil optionals omitted) and `video.mov`.

These are kept apart from the frames and sensor streams because they encode the
app's format quirks (Swift Float descriptions, key presence rules, the ARKit
boot clock), which the intake code is tested against byte for byte."""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cv2
import numpy as np

from packer.synth import swift_json
from packer.synth.clocks import iso8601
from packer.synth.frames import FX, FY, HEIGHT, WIDTH, World, center_depth, principal_point

if TYPE_CHECKING:
    from packer.synth.clocks import Clocks
    from packer.synth.spec import SessionSpec

DEVICE_MODEL = "iPhone15,3"
IOS_VERSION = "17.5.1"
CAPTURE_SOURCE = {"ultrawide": "iphone_ultrawide", "arkit": "iphone_arkit"}
# ARKit: camera x right, y up, z back; OpenCV: x right, y down, z forward
ARKIT_FROM_OPENCV_CAM = np.diag([1.0, -1.0, -1.0, 1.0])
# truth world (z up, camera looks along +y) -> ARKit world (y up, initial forward -z)
_ARKIT_BASE = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, -1.0, 0.0]])


def _describe_float32(x: float) -> str:
    """Swift `Float.description` (what "\\(fx)" interpolates): keeps the ".0"."""
    s = swift_json.format_float32(x)
    return s if any(c in s for c in ".eNI") else s + ".0"


@dataclass(frozen=True)
class PoseOutput:
    count: int  # entries in poses.json (metadata poseCount)
    timestamps: list[Any]  # each entry's timestamp (ARKit boot clock), for durationSeconds
    truth: dict[str, Any]  # the ARKit fields of the truth file; empty for ultrawide


def write_poses(folder: Path, spec: SessionSpec, world: World, g_arkit: np.random.Generator) -> PoseOutput:
    """poses.json (and calib.txt for the ultrawide app, unless `calib=False`)."""
    if spec.capture == "arkit":
        return _write_arkit_poses(folder, spec, world, g_arkit)
    (folder / "poses.json").write_bytes(swift_json.dumps([]))
    if spec.calib:
        (folder / "calib.txt").write_text(" ".join(_describe_float32(v) for v in (FX, FY, *principal_point(spec))))
    return PoseOutput(0, [], {})


def _write_arkit_poses(folder: Path, spec: SessionSpec, world: World, g_arkit: np.random.Generator) -> PoseOutput:
    """The legacy ARKit app's poses.json: metric camera-to-world in ARKit's world
    (y up, a random yaw, origin where tracking started) and camera axes, stamped
    on the phone's boot clock, with the LiDAR centre depth when the phone has one."""
    poses, t_frames = world.poses, world.t_frames
    boot_offset = float(g_arkit.uniform(20_000.0, 600_000.0))  # phone uptime at frame 0
    yaw = float(g_arkit.uniform(-0.3, 0.3))
    c, s_ = math.cos(yaw), math.sin(yaw)
    R_aw = np.array([[c, 0.0, s_], [0.0, 1.0, 0.0], [-s_, 0.0, c]]) @ _ARKIT_BASE
    origin = poses[0, :3, 3] + g_arkit.uniform(-0.1, 0.1, 3) * spec.scale  # where ARKit started tracking
    W = np.eye(4)
    W[:3, :3] = R_aw
    W[:3, 3] = -R_aw @ origin
    depth = center_depth(world.renderer, poses)
    entries = []
    for i in spec.present:
        e: dict[str, Any] = {
            "rgbIndex": i,
            "timestamp": boot_offset + t_frames[i],  # ARFrame.timestamp: boot clock
            "transform": (W @ poses[i] @ ARKIT_FROM_OPENCV_CAM).tolist(),
        }
        if spec.lidar and np.isfinite(depth[i]):
            e["depth"] = float(depth[i])
        entries.append(e)
    (folder / "poses.json").write_bytes(swift_json.dumps(entries, float32_keys=("transform", "depth")))
    arkit_truth = {
        "boot_clock_offset": boot_offset,
        "arkit_world_from_truth_world": R_aw.tolist(),
        "arkit_world_origin": origin.tolist(),
        "arkit_depth": depth.tolist(),
        "lidar": bool(spec.lidar),
    }
    return PoseOutput(len(entries), [e["timestamp"] for e in entries], arkit_truth)


def write_metadata(
    folder: Path, spec: SessionSpec, clocks: Clocks, poses: PoseOutput, encoder_count: int, imu_count: int
) -> bytes:
    """metadata.json; returns its bytes, which the zip export also writes as the
    `<name>.metadata.json` sidecar."""
    md: dict[str, Any] = {
        "bleConnected": bool(spec.encoders),
        "captureSource": CAPTURE_SOURCE[spec.capture],
        "deviceModel": spec.device_model,
        "endTime": iso8601(clocks.end_epoch),
        "hasVideo": True,
        "iosVersion": spec.ios_version,
        "poseCount": poses.count,
        "rgbFrameCount": spec.present[-1] + 1,
        "rgbResolution": [WIDTH, HEIGHT],
        "startTime": iso8601(clocks.capture_start),
    }
    if encoder_count:
        md["encoderCount"] = encoder_count
    if spec.capture == "ultrawide":
        md["slamProcessed"] = False
        if spec.calib:
            cx, cy = principal_point(spec)
            md["cameraIntrinsics"] = {"fx": FX, "fy": FY, "cx": cx, "cy": cy}
        if imu_count:
            md["imuCount"] = imu_count
    else:
        md["durationSeconds"] = poses.timestamps[-1] - poses.timestamps[0]
        if spec.legacy_metadata:
            del md["captureSource"]
    md_bytes = swift_json.dumps(md, float32_keys=("cameraIntrinsics",))
    (folder / "metadata.json").write_bytes(md_bytes)
    return md_bytes


def write_video(folder: Path, spec: SessionSpec, t_frames: np.ndarray) -> None:
    """video.mov as the app's VideoRecorder writes it: one sample per frame the camera
    delivered (a failed JPEG encode is still in the video: it shows the frame before),
    none for `writer_skips`, each at its true time on the 1/600 s timescale from the
    first sample (`packer.video`). The real one is full-resolution; ours is the JPEGs'."""
    from packer import video

    skips = {int(i) for i in spec.writer_skips}
    keep = [i for i in range(spec.n_frames) if i not in skips]

    def images() -> Iterator[np.ndarray]:
        last = None
        for i in keep:
            p = folder / "rgb" / f"{i:06d}.jpg"
            img = cv2.imread(str(p), cv2.IMREAD_COLOR) if p.exists() else None
            last = img[..., ::-1] if img is not None else last
            yield last if last is not None else np.zeros((HEIGHT, WIDTH, 3), np.uint8)

    video.write(folder / video.FILE, images(), t_frames[keep], width=WIDTH, height=HEIGHT)
