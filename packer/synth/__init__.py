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
      video.mov            only with `video=True`: HEVC, one sample per delivered frame at its
                           time on the 1/600 s timescale (`packer.video`); the camera's
                           dropped frames (`drop_rate`) are gaps in it, the numbering runs on

every JSON file as Foundation's JSONEncoder [.prettyPrinted, .sortedKeys] writes it
(`packer.synth.swift_json`). `capture="arkit"` writes the legacy ARKit layout
(metric poses on the phone's boot clock, no IMU, no calib), `export="zip"` what the
app leaves after its auto-zip (`<name>.zip` + `<name>.metadata.json`).

The truth (metric poses, clocks, IMU offset/rotation/biases, true joint angles) is in
`synth_truth.json`, which the pipeline never reads; `truth()` loads it.

Deterministic: the same arguments give byte-identical files (one seeded generator
per component, so toggling e.g. `nan_imu` or `read_errors` leaves the frames and
every other stream unchanged).

Layout (one module per step of `synth_session`, in the order it runs them):
`spec` (arguments checked, seeded generators), `clocks` (names and capture
clocks), `frames` (room, trajectory, rgb/), `sensors` (imu.json, encoders.json),
`metadata` (poses.json, calib.txt, metadata.json, video.mov), `groundtruth`
(synth_truth.json and `truth()`), `export` (folder or zip), `session` (the order).
"""
from __future__ import annotations

# Besides __all__, the old single-module names stay importable from here (noqa
# F401): the scene cache (tests clear it), camera/device constants, name helpers.
from packer.synth.clocks import iso8601, name_epoch, session_name  # noqa: F401
from packer.synth.encoders import JOINT_NAMES
from packer.synth.frames import _SCENES, CX, CY, FPS, FX, FY, HEIGHT, JPEG_QUALITY, WIDTH  # noqa: F401
from packer.synth.groundtruth import TRUTH_FILE, TRUTH_VERSION, truth  # noqa: F401
from packer.synth.metadata import DEVICE_MODEL, IOS_VERSION  # noqa: F401
from packer.synth.session import synth_dataset, synth_session
from packer.synth.spec import CAPTURES, EXPORTS, Faults
from packer.synth.trajectory import MOTIONS

__all__ = [
    "synth_session",
    "synth_dataset",
    "Faults",
    "truth",
    "session_name",
    "TRUTH_FILE",
    "MOTIONS",
    "CAPTURES",
    "EXPORTS",
    "JOINT_NAMES",
]
