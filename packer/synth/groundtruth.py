"""`synth_truth.json`: everything the synthesiser knows and the pipeline must
recover (metric poses, clocks, IMU offset/rotation/biases, true joint angles).

The pipeline never reads this file; tests and benchmarks load it with `truth()`.
Writing and reading it sit together so the file's layout has one owner."""
from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from packer.synth import camera
from packer.synth.encoders import JOINT_NAMES, LATENCY_JITTER, LATENCY_MIN
from packer.synth.frames import FX, FY, World, principal_point
from packer.synth.trajectory import GRAVITY

if TYPE_CHECKING:
    from packer.synth.clocks import Clocks
    from packer.synth.metadata import PoseOutput
    from packer.synth.sensors import EncoderOutput, ImuOutput
    from packer.synth.spec import SessionSpec

TRUTH_FILE = "synth_truth.json"
TRUTH_VERSION = 2
CONVENTIONS = {
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
}
_ARRAYS = (  # keys `truth()` returns as float64 arrays
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


def _dumps(obj: Any) -> bytes:
    # the truth file (never read by the pipeline): plain Python JSON; NaN literals
    # only matter for nan_imu sessions
    return (json.dumps(obj, indent=None, separators=(", ", ": ")) + "\n").encode()


def _encoder_truth(spec: SessionSpec, enc: EncoderOutput) -> dict[str, Any]:
    stream = enc.stream
    return {
        "connected": bool(spec.encoders),
        "latency_min": LATENCY_MIN,
        "latency_jitter": LATENCY_JITTER,
        "esp_drift_ppm": stream.clock.drift_ppm,
        "esp_ms_at_capture_start": stream.clock.ms_at_capture_start,
        "read_errors": float(spec.read_errors),
        "read_error_values": stream.n_read_errors if spec.encoders else 0,
        "wrap_joint": JOINT_NAMES[enc.wrap_idx] if enc.wrap_idx >= 0 else None,
        "firmware_offsets_raw": [int(x) for x in stream.offsets_raw],
        "gripper": enc.gripper.describe(),
    }


def write_truth(
    folder: Path, spec: SessionSpec, clocks: Clocks, world: World, imu: ImuOutput, enc: EncoderOutput,
    poses: PoseOutput,
) -> None:
    """synth_truth.json. The key order is part of the file's bytes: append, never reorder."""
    model = imu.model
    truth_obj = {
        "version": TRUTH_VERSION,
        "seed": int(spec.seed),
        "scene_seed": int(spec.seed if spec.scene_seed is None else spec.scene_seed),
        "motion": spec.motion,
        "capture": spec.capture,
        "conventions": CONVENTIONS,
        "scale": spec.scale,
        "fps": spec.fps,
        "frame_timestamps": world.t_frames.tolist(),
        "frame_indices": spec.present,
        "dropped_frames": spec.dropped,
        "poses": world.poses.tolist(),
        "intrinsics": [FX, FY, *principal_point(spec)],
        "capture_start_epoch": clocks.capture_start,
        "frame0_epoch": clocks.frame0_epoch,
        "stop_epoch": clocks.stop_epoch,
        "end_epoch": clocks.end_epoch,
        "imu_offset": clocks.imu_offset_epoch,
        "imu_latency": float(spec.imu_offset),
        "R_imu_cam": model.R_imu_cam.tolist(),
        "gravity": [0.0, 0.0, -GRAVITY],
        "accel_bias": model.accel_bias.tolist(),
        "gyro_bias": model.gyro_bias.tolist(),
        "accel_noise": model.accel_noise,
        "gyro_noise": model.gyro_noise,
        "imu_duration_factor": float(spec.imu_duration_factor),
        "nan_imu_samples": imu.nan_idx,
        "joint_names": list(JOINT_NAMES),
        "joints_deg": enc.joints.tolist(),
        "encoder": _encoder_truth(spec, enc),
        "scene": world.scene.describe(),
        **poses.truth,
    }
    if clocks.step:  # only then: every other session's truth bytes stay as they were
        truth_obj["clock_step"] = {"seconds": clocks.step, "at_epoch": clocks.step_epoch}
    if spec.effects.any:  # appended (key order is part of the bytes): default sessions unchanged
        intr = camera.true_intrinsics(FX, FY, *principal_point(spec), spec.effects)
        truth_obj["camera_effects"] = spec.effects.describe()
        truth_obj["true_intrinsics"] = list(intr[:4])
        truth_obj["true_k1"] = intr[4]
    if spec.rig.any:  # appended, as above
        truth_obj["phone_rig"] = {"lever_arm": list(spec.phone.lever_arm), "imu_lead": spec.phone.imu_lead,
                                  "principal_offset": list(spec.phone.principal_offset)}
    faults = {"camera_drops": [int(x) for x in sorted(spec.camera_drops)],
              "writer_skips": [int(x) for x in sorted(spec.writer_skips)],
              "glove_gaps": [list(map(float, g)) for g in spec.glove_gaps], "dead_joint": spec.dead_joint}
    if any(faults.values()):  # appended, as above
        truth_obj["faults"] = faults
    (folder / TRUTH_FILE).write_bytes(_dumps(truth_obj))


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
