"""The session's two sensor streams: `imu.json` (CoreMotion, ultrawide capture only)
and `encoders.json` (the glove's joint encoders over BLE).

Both models are drawn even when their file is not written (an ARKit capture has no
IMU, a disconnected glove no encoders), because the truth file describes them and
the generators must advance the same way whatever the options."""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from packer.synth import swift_json
from packer.synth.encoders import (
    JOINT_NAMES,
    READ_ERROR,
    EncoderStream,
    Gripper,
    make_gripper,
    synth_encoder_stream,
    with_wrap,
)
from packer.synth.imu import ImuModel, imu_timestamps, make_imu_model, synth_imu
from packer.synth.trajectory import Trajectory

if TYPE_CHECKING:
    from packer.synth.clocks import Clocks
    from packer.synth.spec import Rngs, SessionSpec


@dataclass(frozen=True)
class ImuOutput:
    model: ImuModel  # offset, camera-to-IMU rotation, biases, noise (for the truth)
    nan_idx: list[int]  # samples made NaN (`nan_imu`)
    count: int  # samples written (metadata imuCount; 0 = no imu.json)


def write_imu(
    folder: Path, spec: SessionSpec, clocks: Clocks, traj: Trajectory, g_imu: np.random.Generator,
    g_nan: np.random.Generator,
) -> ImuOutput:
    """imu.json: accel [g, gravity removed], gyro [rad/s], timestamp [epoch s] at 200 Hz
    from capture start to stop (or the `imu_duration_factor` part of it)."""
    model = make_imu_model(g_imu, clocks.imu_offset_epoch, spec.phone.lever_arm)
    nan_idx: list[int] = []
    imu_count = 0
    if spec.capture == "ultrawide":
        tau = imu_timestamps(clocks.capture_start, clocks.stop_epoch, clocks.imu_phase, spec.imu_duration_factor)
        accel, gyro = synth_imu(g_imu, traj, model, tau)
        if spec.nan_imu and len(tau):
            nan_idx = sorted(int(i) for i in g_nan.choice(len(tau), size=min(3, len(tau)), replace=False))
            for i in nan_idx:
                accel[i, int(g_nan.integers(0, 3))] = np.nan
                gyro[i, int(g_nan.integers(0, 3))] = np.nan
        imu = [
            {"accel": [float(x) for x in a], "gyro": [float(x) for x in w], "timestamp": float(t)}
            for t, a, w in zip(clocks.stamped(tau), accel, gyro)
        ]
        imu_count = len(imu)
        if imu:  # the app writes imu.json only when it has readings
            (folder / "imu.json").write_bytes(swift_json.dumps(imu))
    return ImuOutput(model, nan_idx, imu_count)


@dataclass(frozen=True)
class EncoderOutput:
    gripper: Gripper  # the joint-angle model (wrapped when `wrap_joint`)
    wrap_idx: int  # joint whose readings wrap, -1 for none
    stream: EncoderStream  # what the app received (written only when connected)
    count: int  # readings written (metadata encoderCount; 0 = no encoders.json)
    joints: np.ndarray  # (n_frames, 4) true angle at each frame time, degrees


def _wrap_index(wrap_joint: bool | str, g_wrap: np.random.Generator) -> int:
    """The wrapping joint: always drawn (so `wrap_joint` never shifts the other
    generators), then overridden by a name or cleared by False."""
    wrap_idx = int(g_wrap.integers(0, len(JOINT_NAMES)))
    if isinstance(wrap_joint, str):
        wrap_idx = JOINT_NAMES.index(wrap_joint)
    elif not wrap_joint:
        wrap_idx = -1
    return wrap_idx


def write_encoders(folder: Path, spec: SessionSpec, clocks: Clocks, t_frames: np.ndarray, rng: Rngs) -> EncoderOutput:
    """encoders.json: the gripper's joints as the firmware reports them, stamped
    at BLE receive; absent when the glove is not connected (`encoders=False`)."""
    gripper = make_gripper(rng.grip)
    wrap_idx = _wrap_index(spec.wrap_joint, rng.wrap)
    if wrap_idx >= 0:
        s_lo, s_hi = clocks.capture_start - clocks.frame0_epoch, clocks.stop_epoch - clocks.frame0_epoch
        gripper = with_wrap(gripper, wrap_idx, s_lo, s_hi)
    stream = synth_encoder_stream(
        rng.esp,
        rng.enc_noise,
        rng.ble,
        rng.err,
        gripper,
        capture_start=clocks.capture_start,
        frame0_epoch=clocks.frame0_epoch,
        stop=clocks.stop_epoch,
        read_errors=spec.read_errors,
    )
    stream = _glove_faults(stream, spec, clocks.frame0_epoch)
    encoder_count = len(stream.esp_ms) if spec.encoders else 0
    if encoder_count:
        records = stream.records()
        if clocks.step:  # the receive stamps are Date(); millis() is the ESP's own clock
            for r, t in zip(records, clocks.stamped(stream.receive_epoch)):
                r["timestamp"] = float(t)
        (folder / "encoders.json").write_bytes(swift_json.dumps(records, float32_keys=JOINT_NAMES))
    joints = gripper.angles(t_frames)
    joints -= 360.0 * np.floor((joints[0] + 180.0) / 360.0)[None]  # first value in [-180, 180)
    return EncoderOutput(gripper, wrap_idx, stream, encoder_count, joints)


def _glove_faults(stream: EncoderStream, spec: SessionSpec, frame0_epoch: float) -> EncoderStream:
    """What a Bluetooth glove does to the recording: no notification during each of
    `glove_gaps` (a dropout, a late connect from before frame 0, an early disconnect
    to past the stop) and `dead_joint` reading -1.0 throughout. Unchanged without them."""
    if not spec.glove_gaps and spec.dead_joint is None:
        return stream
    t = stream.receive_epoch - frame0_epoch
    keep = np.ones(len(t), bool)
    for start, length in spec.glove_gaps:
        keep &= ~((t >= start) & (t < start + length))
    values = stream.values[keep].copy()
    if spec.dead_joint is not None:
        values[:, JOINT_NAMES.index(spec.dead_joint)] = np.float32(READ_ERROR)
    return replace(stream, esp_ms=stream.esp_ms[keep], sample_epoch=stream.sample_epoch[keep],
                   receive_epoch=stream.receive_epoch[keep], values=values, truth_deg=stream.truth_deg[keep])
