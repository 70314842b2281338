"""The synthetic session generator: the exact StackCapture layout and Swift JSON
formatting, realistic clocks (epoch IMU, ESP32 millis + BLE receive stamps, the
ARKit boot clock) with ground truth for each, the app's variants (30 fps, dropped
frames, no glove, read errors, wrapping joint, ARKit, zip export), the user's SLAM
scripts' output, determinism, and that the IMU, poses and images agree with each
other. Everything is checked from the files with json/numpy/cv2, not through the
project's loader."""
from __future__ import annotations

import json
import re
import zipfile
from datetime import datetime, timezone
from pathlib import Path

import cv2
import numpy as np
import pytest

from packer.synth import JOINT_NAMES, TRUTH_FILE, session_name, swift_json, synth_dataset, synth_session, truth
from packer.synth.trajectory import so3_exp, so3_log
from packer.synth.usertools import write_user_slam

N = 48  # frames: 0.8 s at 60 fps, enough motion for every check below
NAME = "session_2026-01-01_120000"
ENC_KEYS = ["esp_timestamp_ms", "index_mcp", "index_pip", "three_finger_mcp", "three_finger_pip", "timestamp"]
MD_ULTRAWIDE = [
    "bleConnected",
    "cameraIntrinsics",
    "captureSource",
    "deviceModel",
    "encoderCount",
    "endTime",
    "hasVideo",
    "imuCount",
    "iosVersion",
    "poseCount",
    "rgbFrameCount",
    "rgbResolution",
    "slamProcessed",
    "startTime",
]
MD_ARKIT = [
    "bleConnected",
    "captureSource",
    "deviceModel",
    "durationSeconds",
    "encoderCount",
    "endTime",
    "hasVideo",
    "iosVersion",
    "poseCount",
    "rgbFrameCount",
    "rgbResolution",
    "startTime",
]
STEP = 360.0 / 4096.0  # one AS5600 count in degrees


@pytest.fixture(scope="module")
def sess(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synth_session(tmp_path_factory.mktemp("synth"), NAME, N, seed=7)


@pytest.fixture(scope="module")
def variant(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Same seed as `sess`, with read errors and a joint whose readings wrap."""
    return synth_session(
        tmp_path_factory.mktemp("variant"), NAME, N, seed=7, read_errors=0.05, wrap_joint="index_pip"
    )


def _json(p: Path) -> object:
    return json.loads(p.read_bytes())


def _top_keys(p: Path) -> list[str]:
    """Keys of a pretty-printed object's first level, in file order."""
    return re.findall(r'^  "(\w+)" : ', p.read_text(), flags=re.M)


def _first_obj_keys(p: Path) -> list[str]:
    """Keys of the first object of a top-level array, in file order."""
    return re.findall(r'^    "(\w+)" : ', p.read_text().split("\n  },")[0], flags=re.M)


_LINE = re.compile(
    r'^(?P<ind>(  )*)("[A-Za-z_]+" : )?(\[|\{|\]|\}|-?\d+(\.\d+)?(e[-+]\d+)?|"[^"\\]*"|true|false|NaN)?,?$'
)


def assert_swift_layout(p: Path, float32_keys: tuple[str, ...] = ()) -> None:
    """JSONEncoder [.prettyPrinted, .sortedKeys]: 2-space indent, `"key" : value`,
    one element per line, no trailing newline, integral numbers without ".0"; and
    re-encoding the parsed content reproduces the bytes."""
    raw = p.read_bytes()
    text = raw.decode()
    assert not text.endswith("\n") and text[0] in "[{"
    depth = 0
    for line in text.split("\n"):
        if line == "":  # only inside an empty container: "[\n\n]"
            continue
        m = _LINE.match(line)
        assert m, f"{p.name}: not Swift pretty-print layout: {line!r}"
        closing = line.strip().rstrip(",") in ("]", "}")
        if closing:
            depth -= 1
        assert len(m.group("ind")) == 2 * depth, f"{p.name}: bad indent: {line!r}"
        if line.rstrip(",").endswith(("[", "{")):
            depth += 1
        assert not re.search(r"\d\.0,?$", line), f"{p.name}: integral number written with .0: {line!r}"
        assert '": ' not in line  # Python's separator, not Swift's
    assert depth == 0
    assert swift_json.dumps(json.loads(raw), float32_keys=float32_keys) == raw


# ---------------------------------------------------------------- Swift JSON


def test_swift_json_matches_hand_written_encoder_output() -> None:
    obj = {
        "timestamp": 1767268800.4116368,
        "rgbResolution": [480, 360],
        "poses": [],
        "nested": {"b": -1.0, "a": 60.0, "empty": {}},
        "url": "a/b \"q\"",
        "ok": True,
        "angles": [0.1, 12.3046875, -180.0, 1.2e-05],
        "small": 1e-05,
    }
    expected = (
        "{\n"
        '  "angles" : [\n'
        "    0.1,\n"
        "    12.3046875,\n"
        "    -180,\n"
        "    1.2e-05\n"
        "  ],\n"
        '  "nested" : {\n'
        '    "a" : 60,\n'
        '    "b" : -1,\n'
        '    "empty" : {\n'
        "\n"
        "    }\n"
        "  },\n"
        '  "ok" : true,\n'
        '  "poses" : [\n'
        "\n"
        "  ],\n"
        '  "rgbResolution" : [\n'
        "    480,\n"
        "    360\n"
        "  ],\n"
        '  "small" : 1e-05,\n'
        '  "timestamp" : 1767268800.4116368,\n'
        '  "url" : "a\\/b \\"q\\""\n'
        "}"
    )
    assert swift_json.dumps(obj, float32_keys=("angles",)).decode() == expected
    assert swift_json.dumps([]) == b"[\n\n]"
    # Float32: shortest digits of the float32, not of the double it widens to
    assert swift_json.format_float32(0.1) == "0.1" and swift_json.format_double(float(np.float32(0.1))) != "0.1"
    assert swift_json.format_float32(73.30078125) == "73.30078"
    assert swift_json.format_float32(400.0) == "400" and swift_json.format_double(-0.0) == "-0"


# ---------------------------------------------------------------- layout


def test_layout_metadata_and_formatting(sess: Path) -> None:
    t = truth(sess)
    names = sorted(p.name for p in sess.iterdir())
    assert names == sorted(["rgb", "imu.json", "encoders.json", "calib.txt", "metadata.json", "poses.json", TRUTH_FILE])
    assert sorted(p.name for p in (sess / "rgb").iterdir()) == [f"{i:06d}.jpg" for i in range(N)]
    assert (sess / "poses.json").read_bytes() == b"[\n\n]"
    assert (sess / "calib.txt").read_bytes() == b"400.0 400.0 240.0 180.0"

    md_path = sess / "metadata.json"
    assert _top_keys(md_path) == MD_ULTRAWIDE  # sorted, nothing else (no fps, no durationSeconds)
    md = _json(md_path)
    imu, enc = _json(sess / "imu.json"), _json(sess / "encoders.json")
    start = datetime.fromtimestamp(int(t["capture_start_epoch"]), tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    end = datetime.fromtimestamp(int(t["end_epoch"]), tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert md == {
        "bleConnected": True,
        "cameraIntrinsics": {"cx": 240, "cy": 180, "fx": 400, "fy": 400},
        "captureSource": "iphone_ultrawide",
        "deviceModel": "iPhone15,3",
        "encoderCount": len(enc),
        "endTime": end,
        "hasVideo": True,
        "imuCount": len(imu),
        "iosVersion": "17.5.1",
        "poseCount": 0,
        "rgbFrameCount": N,
        "rgbResolution": [480, 360],
        "slamProcessed": False,
        "startTime": start,
    }
    assert md["startTime"] == "2026-01-01T12:00:00Z"  # the name's time (UTC), sub-second truncated
    assert 0.7 <= t["end_epoch"] - t["stop_epoch"] <= 1.7

    assert_swift_layout(md_path, ("cameraIntrinsics",))
    assert_swift_layout(sess / "imu.json")
    assert_swift_layout(sess / "encoders.json", tuple(JOINT_NAMES))
    assert_swift_layout(sess / "poses.json")
    assert '"rgbResolution" : [\n    480,\n    360\n  ],' in md_path.read_text()
    assert _first_obj_keys(sess / "imu.json") == ["accel", "gyro", "timestamp"]
    assert _first_obj_keys(sess / "encoders.json") == ENC_KEYS
    assert all(list(d) == ["accel", "gyro", "timestamp"] and len(d["accel"]) == len(d["gyro"]) == 3 for d in imu)
    assert all(sorted(d) == ENC_KEYS for d in enc)

    from PIL import Image

    for i in (0, N - 1):
        with Image.open(sess / "rgb" / f"{i:06d}.jpg") as im:
            assert im.format == "JPEG" and im.size == (480, 360) and im.mode == "RGB"
            assert im.quantization[0][0] == 6  # libjpeg luminance DC step at quality 80 (16 * 0.4)

    tr = t
    assert tr["poses"].shape == (N, 4, 4) and tr["frame_timestamps"].shape == (N,)
    assert np.allclose(tr["frame_timestamps"], np.arange(N) / 60.0) and tr["fps"] == 60.0
    assert tr["frame_indices"].tolist() == list(range(N)) and tr["dropped_frames"].size == 0
    assert tr["joints_deg"].shape == (N, 4) and tr["joint_names"] == list(JOINT_NAMES)
    R = tr["R_imu_cam"]
    assert np.allclose(R @ R.T, np.eye(3), atol=1e-9) and np.linalg.det(R) == pytest.approx(1.0)
    assert np.abs(R - np.eye(3)).max() > 0.5  # not identity
    assert np.sort(np.abs(R), axis=1)[:, :2].max() > 0.02  # and not a bare axis permutation


def test_clocks_truth(sess: Path) -> None:
    t = truth(sess)
    ts = t["capture_start_epoch"]
    assert datetime.fromtimestamp(ts, tz=timezone.utc).strftime("session_%Y-%m-%d_%H%M%S") == NAME
    assert 0.010 <= t["frame0_epoch"] - ts <= 0.040
    assert t["imu_latency"] == 0.008  # the default: CoreMotion handler latency
    assert t["imu_offset"] == pytest.approx(t["frame0_epoch"] + 0.008, abs=1e-9)
    assert t["stop_epoch"] == pytest.approx(t["frame0_epoch"] + N / 60.0, abs=1e-9)


def test_imu_stamps_are_epoch_200hz(sess: Path) -> None:
    t = truth(sess)
    tau, _, _ = _imu_arrays(sess)
    assert 0.0 <= tau[0] - t["capture_start_epoch"] < 0.005
    assert t["stop_epoch"] - 0.005 < tau[-1] <= t["stop_epoch"]
    dt = np.diff(tau)
    assert np.allclose(dt, 0.005, atol=1e-6)
    assert 1.0 / np.median(dt) == pytest.approx(200.0, rel=1e-4)
    assert tau[0] > 1.7e9  # Unix epoch seconds, not seconds since start


def _imu_arrays(sess: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    imu = _json(sess / "imu.json")
    return (
        np.array([d["timestamp"] for d in imu]),
        np.array([d["accel"] for d in imu]),
        np.array([d["gyro"] for d in imu]),
    )


def _encoder_arrays(sess: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    enc = _json(sess / "encoders.json")
    return (
        np.array([d["esp_timestamp_ms"] for d in enc]),
        np.array([d["timestamp"] for d in enc]),
        np.array([[d[k] for k in JOINT_NAMES] for d in enc], dtype=np.float64),
    )


def _sample_epochs(t: dict, esp_ms: np.ndarray) -> np.ndarray:
    e = t["encoder"]
    rate = 1000.0 * (1 + e["esp_drift_ppm"] * 1e-6)  # ESP ms per epoch second
    return t["capture_start_epoch"] + (esp_ms - e["esp_ms_at_capture_start"]) / rate


def _joints_at_frames(t: dict, esp_ms: np.ndarray, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The recorded series, errors removed and unwrapped, interpolated on the TRUE
    sample times at the frames' epochs; returns (frames covered, (F,4) degrees)."""
    ts = _sample_epochs(t, esp_ms)
    frame_epoch = t["frame0_epoch"] + t["frame_timestamps"]
    inside = np.nonzero((frame_epoch >= ts[0]) & (frame_epoch <= ts[-1]))[0]
    out = np.zeros((len(inside), 4))
    for j in range(4):
        ok = vals[:, j] != -1.0
        u = np.rad2deg(np.unwrap(np.deg2rad(vals[ok, j])))
        u += 360.0 * np.round((t["joints_deg"][0, j] - u[0]) / 360.0)  # same branch as the truth
        out[:, j] = np.interp(frame_epoch[inside], ts[ok], u)
    return inside, out


def test_encoders_clocks_and_values(sess: Path) -> None:
    t = truth(sess)
    esp, rx, vals = _encoder_arrays(sess)
    enc = _json(sess / "encoders.json")
    assert all(isinstance(d["esp_timestamp_ms"], int) for d in enc)
    assert np.all(np.diff(esp) == 20)  # 100 Hz samples, every 2nd notified
    rate = (len(rx) - 1) / (rx[-1] - rx[0])
    assert 45.0 < rate < 55.0
    assert np.all(np.diff(rx) > 0)
    assert t["capture_start_epoch"] <= rx[0] and rx[-1] <= t["stop_epoch"]
    lat = rx - _sample_epochs(t, esp)
    assert lat.min() >= 0.005 - 1e-6 and lat.max() <= 0.030 + 1e-6
    assert np.ptp(lat) > 0.005  # jitter, not a constant
    assert abs(t["encoder"]["esp_drift_ppm"]) <= 30
    # firmware: 12-bit counts in [-180, 180], float32 shortest form in the file
    counts = vals / STEP
    assert np.allclose(counts, np.round(counts), atol=1e-3)
    assert vals.min() >= -180 and vals.max() <= 180 and not np.any(vals == -1.0)
    for line in re.findall(r'"(?:index|three_finger)_\w+" : (\S+?),?\n', (sess / "encoders.json").read_text()):
        assert swift_json.format_float32(float(line)) == line
    # the gripper really moves, within realistic ranges and speeds
    J = t["joints_deg"]
    assert np.ptp(J, axis=0).max() > 5.0
    assert J.min() > -5 and J[:, [0, 2]].max() < 75 and J[:, [1, 3]].max() < 95
    assert np.abs(np.diff(J, axis=0)).max() * 60 <= 155
    # recorded values interpolated on the true sample times match the truth at the frames
    inside, rec = _joints_at_frames(t, esp, vals)
    assert len(inside) >= N - 4
    err = np.abs(rec - J[inside]).max()
    assert err < 0.3  # quantisation (0.088 deg) + noise + interpolation
    # ... while interpolated on the BLE receive stamps they lag the truth (5-30 ms late)
    frame_epoch = t["frame0_epoch"] + t["frame_timestamps"][inside]
    late = np.stack([np.interp(frame_epoch, rx, vals[:, j]) for j in range(4)], 1)
    assert np.abs(late - J[inside]).max() > 3 * err


def test_read_errors_and_wrapping_joint(sess: Path, variant: Path) -> None:
    t = truth(variant)
    assert t["encoder"]["wrap_joint"] == "index_pip" and t["encoder"]["read_errors"] == 0.05
    esp, rx, vals = _encoder_arrays(variant)
    esp0, rx0, vals0 = _encoder_arrays(sess)
    assert np.array_equal(esp, esp0) and np.array_equal(rx, rx0)  # same clocks
    err = vals == -1.0
    assert err.sum() == t["encoder"]["read_error_values"] > 0
    assert ': -1,\n' in (variant / "encoders.json").read_text() or ": -1\n" in (variant / "encoders.json").read_text()
    j = JOINT_NAMES.index("index_pip")
    others = [k for k in range(4) if k != j]
    ok = ~err[:, others]
    assert np.array_equal(vals[:, others][ok], vals0[:, others][ok])  # errors replace values, nothing else moves
    w = vals[~err[:, j], j]
    assert (w > 170).any() and (w < -170).any()  # crosses +-180 and wraps
    assert w.min() >= -180 and w.max() <= 180
    assert np.ptp(t["joints_deg"][:, j]) < 180 and abs(t["joints_deg"][:, j].mean()) > 150  # continuous truth near 180
    assert -180 <= t["joints_deg"][0, j] < 180
    inside, rec = _joints_at_frames(t, esp, vals)
    assert np.abs(rec - t["joints_deg"][inside]).max() < 1.0
    # frames and IMU untouched by encoder options
    assert (variant / "imu.json").read_bytes() == (sess / "imu.json").read_bytes()
    assert (variant / "rgb/000017.jpg").read_bytes() == (sess / "rgb/000017.jpg").read_bytes()


def test_30fps_dropped_frames_and_no_glove(sess: Path, tmp_path: Path) -> None:
    n = 24
    d = synth_session(tmp_path, NAME, n, seed=7, fps=30, drop_frames=(3, 11, n - 1), encoders=False)
    t = truth(d)
    present = [i for i in range(n) if i not in (3, 11, n - 1)]
    assert sorted(p.name for p in (d / "rgb").iterdir()) == [f"{i:06d}.jpg" for i in present]
    assert t["frame_indices"].tolist() == present and t["dropped_frames"].tolist() == [3, 11, n - 1]
    assert t["fps"] == 30.0 and np.allclose(t["frame_timestamps"], np.arange(n) / 30.0)
    assert t["poses"].shape == (n, 4, 4) and t["joints_deg"].shape == (n, 4)
    assert t["stop_epoch"] == pytest.approx(t["frame0_epoch"] + n / 30.0, abs=1e-9)
    assert not (d / "encoders.json").exists()
    md = _json(d / "metadata.json")
    assert _top_keys(d / "metadata.json") == [k for k in MD_ULTRAWIDE if k != "encoderCount"]
    assert md["bleConnected"] is False and md["rgbFrameCount"] == n - 1  # the last WRITTEN index + 1
    tau, _, _ = _imu_arrays(d)
    assert md["imuCount"] == len(tau) and tau[-1] - tau[0] == pytest.approx(n / 30.0, abs=0.05)
    # a frame shows the same pose whatever the frame rate: frame 2 at 30 fps == frame 4 at 60 fps
    a = cv2.imread(str(d / "rgb/000002.jpg")).astype(float)
    b = cv2.imread(str(sess / "rgb/000004.jpg")).astype(float)
    assert np.abs(a - b).mean() < 1.0


def test_arkit_layout_and_poses(tmp_path: Path) -> None:
    n = 10
    d = synth_session(tmp_path, NAME, n, seed=7, capture="arkit", drop_frames=(4,))
    t = truth(d)
    files = ["rgb", "encoders.json", "metadata.json", "poses.json", TRUTH_FILE]
    assert sorted(p.name for p in d.iterdir()) == sorted(files)  # no imu.json, no calib.txt
    assert _top_keys(d / "metadata.json") == MD_ARKIT
    assert_swift_layout(d / "metadata.json")
    assert_swift_layout(d / "poses.json", ("transform", "depth"))
    assert _first_obj_keys(d / "poses.json") == ["depth", "rgbIndex", "timestamp", "transform"]
    entries = _json(d / "poses.json")
    present = [i for i in range(n) if i != 4]
    assert [e["rgbIndex"] for e in entries] == present
    md = _json(d / "metadata.json")
    assert md["captureSource"] == "iphone_arkit" and md["poseCount"] == n - 1 and md["rgbFrameCount"] == n
    ts = np.array([e["timestamp"] for e in entries])
    assert np.allclose(ts, t["boot_clock_offset"] + np.array(present) / 60.0, atol=1e-9)
    assert 1e4 < ts[0] < 1e6  # the phone's boot clock, not the epoch
    assert md["durationSeconds"] == pytest.approx(ts[-1] - ts[0], abs=1e-12)
    # inverting the ARKit conventions recovers the truth poses (Float32 precision)
    R, o = t["arkit_world_from_truth_world"], t["arkit_world_origin"]
    assert np.allclose(R @ R.T, np.eye(3)) and np.allclose(R @ [0, 0, -1.0], [0, -1.0, 0])  # gravity along -y
    A = np.eye(4)
    A[:3, :3], A[:3, 3] = R, -R @ o
    for e in entries:
        T_ar = np.array(e["transform"])
        assert np.allclose(T_ar[3], [0, 0, 0, 1])
        T_cv = np.linalg.inv(A) @ T_ar @ np.diag([1.0, -1, -1, 1])
        assert np.abs(T_cv - t["poses"][e["rgbIndex"]]).max() < 1e-5
        # camera y axis points UP-ish in ARKit (the camera is held upright)
        assert T_ar[1, 1] > 0.5
    depth = np.array([e["depth"] for e in entries])
    assert np.allclose(depth, t["arkit_depth"][present], rtol=1e-6) and (depth > 0.3).all() and (depth < 3.5).all()

    legacy = synth_session(tmp_path, "legacy", 3, seed=7, capture="arkit", legacy_metadata=True, lidar=False)
    assert _top_keys(legacy / "metadata.json") == [k for k in MD_ARKIT if k != "captureSource"]
    assert _first_obj_keys(legacy / "poses.json") == ["rgbIndex", "timestamp", "transform"]  # nil depth: no key
    with pytest.raises(ValueError):
        synth_session(tmp_path, "bad", 2, seed=7, legacy_metadata=True)


def test_zip_export(tmp_path: Path) -> None:
    out = tmp_path / "out"
    z = synth_session(out, NAME, 4, seed=7, export="zip", video=True)
    assert z == out / f"{NAME}.zip" and z.is_file()
    assert sorted(p.name for p in out.iterdir()) == sorted([f"{NAME}.zip", f"{NAME}.metadata.json"])  # folder gone
    with zipfile.ZipFile(z) as zf:
        names = zf.namelist()
        assert {n.split("/")[0] for n in names} == {NAME}  # one top folder
        files = sorted(n[len(NAME) + 1 :] for n in names if not n.endswith("/"))
        assert files == sorted(
            ["calib.txt", "encoders.json", "imu.json", "metadata.json", "poses.json", "video.mov", TRUTH_FILE]
            + [f"rgb/{i:06d}.jpg" for i in range(4)]
        )
        assert zf.read(f"{NAME}/metadata.json") == (out / f"{NAME}.metadata.json").read_bytes()
        assert zf.getinfo(f"{NAME}/metadata.json").compress_type == zipfile.ZIP_DEFLATED
        assert zf.testzip() is None
    assert truth(z)["frame_indices"].tolist() == [0, 1, 2, 3]
    first = z.read_bytes()
    again = synth_session(tmp_path / "again", NAME, 4, seed=7, export="zip", video=True)
    assert again.read_bytes() == first  # deterministic archive bytes


def test_usertools_slam_outputs(sess: Path, tmp_path: Path) -> None:
    import shutil

    t = truth(sess)
    u = shutil.copytree(sess, tmp_path / "u")
    info = write_user_slam(u, 2, 40, None)
    poses = _json(u / "poses.json")
    text = (u / "poses.json").read_text()
    assert text == json.dumps(poses, indent=2)  # Python's json.dump layout, not Swift's
    assert [e["rgbIndex"] for e in poses] == list(range(2, 41)) and poses[0]["depth"] is None
    assert list(poses[0]) == ["timestamp", "rgbIndex", "depth", "transform"]
    assert [e["timestamp"] for e in poses] == [i / 60.0 for i in range(2, 41)]
    P = np.array([e["transform"] for e in poses])
    assert np.allclose(P[:, :3, :3], t["poses"][2:41, :3, :3], atol=1e-12)
    assert np.allclose(P[:, :3, 3] * info["sfm_scale"], t["poses"][2:41, :3, 3], atol=1e-12)
    md_text = (u / "metadata.json").read_text()
    md = json.loads(md_text)
    assert md_text == json.dumps(md, indent=2)
    assert md["slamProcessed"] is True and md["poseCount"] == 39 and "scale_factor" not in md
    assert list(md) == MD_ULTRAWIDE  # keys keep the app's order
    assert (u / "calib.txt").read_text() == "400.0000 400.0000 240.0000 180.0000"
    assert info["scale_factor"] is None

    c = shutil.copytree(sess, tmp_path / "c")
    info = write_user_slam(c, 0, N - 1, "auto", truth_scale_error=0.03)
    md = _json(c / "metadata.json")
    assert list(md)[-1] == "scale_factor" and md["scale_factor"] == pytest.approx(info["sfm_scale"] * 1.03)
    P = np.array([e["transform"] for e in _json(c / "poses.json")])
    assert np.allclose(P[:, :3, 3], 1.03 * t["poses"][:, :3, 3], atol=1e-12)

    # 30 fps session with a gap: timestamps still i/60, rgbIndex = position in the file list
    g = synth_session(tmp_path, "gap", 20, seed=7, fps=30, drop_frames=(5,))
    info = write_user_slam(g, 0, 18, 1.0, subsample=6)
    poses = _json(g / "poses.json")
    assert [e["rgbIndex"] for e in poses] == list(range(19)) and poses[-1]["timestamp"] == 18 / 60.0
    assert info["frame_indices"] == [0, 1, 2, 3, 4] + list(range(6, 20))
    tg = truth(g)
    P = np.array([e["transform"] for e in poses])
    keys = [0, 6, 12, 18]
    sc = 1.0 / info["sfm_scale"]
    assert np.allclose(P[keys, :3, 3], tg["poses"][[info["frame_indices"][k] for k in keys], :3, 3] * sc, atol=1e-12)
    between = np.linalg.norm(P[:, :3, 3] / sc - tg["poses"][info["frame_indices"], :3, 3], axis=1)
    assert 0 < between.max() < 0.01  # interpolated between keyframes, close to the truth


# ---------------------------------------------------------------- determinism


def test_deterministic(sess: Path, tmp_path: Path) -> None:
    import packer.synth

    packer.synth._SCENES.clear()  # regenerate the room too, not just reuse it
    again = synth_session(tmp_path, sess.name, N, seed=7)
    files = sorted(p.relative_to(sess) for p in sess.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    for f in files:
        assert (sess / f).read_bytes() == (again / f).read_bytes(), f
    other = synth_session(tmp_path, "other", 2, seed=8)
    assert (other / "rgb/000000.jpg").read_bytes() != (sess / "rgb/000000.jpg").read_bytes()


# ---------------------------------------------------------------- physics


def test_gyro_integrates_to_truth_rotation(sess: Path) -> None:
    t = truth(sess)
    tau, _, gyro = _imu_arrays(sess)
    T, ts, R_ic = t["poses"], t["frame_timestamps"], t["R_imu_cam"]
    dt = 0.0005
    for i, j in ((3, 20), (20, 44)):
        grid = np.arange(ts[i], ts[j], dt) + dt / 2  # midpoints, frame clock
        w = np.stack([np.interp(grid + t["imu_offset"], tau, gyro[:, k]) for k in range(3)], 1) - t["gyro_bias"]
        R = np.eye(3)
        for wk in w:
            R = R @ so3_exp(wk * dt)
        rel_cam = T[i, :3, :3].T @ T[j, :3, :3]
        expect = R_ic @ rel_cam @ R_ic.T
        assert np.linalg.norm(so3_log(rel_cam)) > np.deg2rad(2)  # a real rotation to compare
        assert np.rad2deg(np.linalg.norm(so3_log(R.T @ expect))) < 0.1


def test_imu_offset_sign_and_recoverable(sess: Path) -> None:
    """imu_stamp = frame_time + imu_offset (an epoch): cross-correlating gyro speed
    with the visual rotation speed, searching from the first IMU stamp (the only
    epoch anchor in the files), finds it."""
    t = truth(sess)
    tau, _, gyro = _imu_arrays(sess)
    T, ts = t["poses"], t["frame_timestamps"]
    mid = (ts[1:] + ts[:-1]) / 2
    vis = np.array([np.linalg.norm(so3_log(a[:3, :3].T @ b[:3, :3])) for a, b in zip(T[:-1], T[1:])]) / np.diff(ts)
    speed = np.linalg.norm(gyro - t["gyro_bias"], axis=1)
    cands = tau[0] + np.arange(-0.05, 0.12, 0.0005)
    err = [np.mean((np.interp(mid[5:-5] + d, tau, speed) - vis[5:-5]) ** 2) for d in cands]
    assert cands[int(np.argmin(err))] == pytest.approx(t["imu_offset"], abs=0.002)
    assert t["imu_offset"] - tau[0] == pytest.approx(
        t["frame0_epoch"] - t["capture_start_epoch"] + t["imu_latency"], abs=0.006)


def test_accel_is_gravity_removed_linear_acceleration(sess: Path) -> None:
    t = truth(sess)
    tau, accel, _ = _imu_arrays(sess)
    T, ts = t["poses"], t["frame_timestamps"]
    assert np.linalg.norm(accel, axis=1).mean() < 0.3  # << 1 g: gravity is not in it
    h = ts[1] - ts[0]
    p = T[:, :3, 3]
    a_world = (p[2:] - 2 * p[1:-1] + p[:-2]) / h**2  # m/s^2 at frames 1..N-2
    a_imu = np.einsum("ij,njk,nk->ni", t["R_imu_cam"], T[1:-1, :3, :3].transpose(0, 2, 1), a_world) / 9.80665
    meas = np.stack([np.interp(ts[1:-1] + t["imu_offset"], tau, accel[:, k]) for k in range(3)], 1) - t["accel_bias"]
    assert np.abs(a_imu).max() > 0.03  # enough acceleration for scale to be observable
    assert np.abs(meas - a_imu).max() < 0.01


def test_texture_gives_many_sift_features(sess: Path) -> None:
    sift = cv2.SIFT_create()
    for i in (0, N - 1):
        gray = cv2.imread(str(sess / "rgb" / f"{i:06d}.jpg"), cv2.IMREAD_GRAYSCALE)
        assert len(sift.detect(gray, None)) >= 1000


def test_images_agree_with_truth_poses_and_have_depth(sess: Path) -> None:
    """SIFT matches between two frames, triangulated with the TRUE poses and calib.txt,
    reproject to within a fraction of a pixel (renderer, poses, intrinsics and pixel
    convention agree), and the points span 0.5-3 m of depth, not one plane."""
    t = truth(sess)
    T = t["poses"]
    fx, fy, cx, cy = (float(x) for x in (sess / "calib.txt").read_text().split())
    K = np.array([[fx, 0, cx - 0.5], [0, fy, cy - 0.5], [0, 0, 1.0]])  # COLMAP -> OpenCV pixel centres
    j = int(np.argmax(np.linalg.norm(T[:, :3, 3] - T[0, :3, 3], axis=1)))
    assert np.linalg.norm(T[j, :3, 3] - T[0, :3, 3]) > 0.05  # a real baseline
    sift = cv2.SIFT_create()
    a = cv2.imread(str(sess / "rgb/000000.jpg"), cv2.IMREAD_GRAYSCALE)
    b = cv2.imread(str(sess / "rgb" / f"{j:06d}.jpg"), cv2.IMREAD_GRAYSCALE)
    ka, da = sift.detectAndCompute(a, None)
    kb, db = sift.detectAndCompute(b, None)
    m = [x for x, y in cv2.BFMatcher().knnMatch(da, db, k=2) if x.distance < 0.7 * y.distance]
    assert len(m) > 200
    pa = np.float64([ka[x.queryIdx].pt for x in m])
    pb = np.float64([kb[x.trainIdx].pt for x in m])

    def proj(Tm: np.ndarray) -> np.ndarray:
        R, c = Tm[:3, :3], Tm[:3, 3]
        return K @ np.hstack([R.T, (-R.T @ c)[:, None]])

    Xh = cv2.triangulatePoints(proj(T[0]), proj(T[j]), pa.T, pb.T)
    X = (Xh[:3] / Xh[3]).T
    Xh1 = np.hstack([X, np.ones((len(X), 1))])
    err, depth = np.zeros(len(X)), None
    for Tm, pts in ((T[j], pb), (T[0], pa)):
        x = Xh1 @ proj(Tm).T
        err = np.maximum(err, np.linalg.norm(x[:, :2] / x[:, 2:] - pts, axis=1))
        depth = x[:, 2]
    good = (err < 1.0) & (depth > 0)
    assert good.mean() > 0.9 and np.median(err) < 0.3
    lo, hi = np.percentile(depth[good], [5, 95])
    assert lo > 0.3 and hi / lo > 2.0
    sv = np.linalg.svd(X[good] - X[good].mean(0), compute_uv=False)
    assert sv[2] / sv[0] > 0.05  # points on one plane would give ~0


def test_scale_hint_is_invisible_to_the_camera(tmp_path: Path) -> None:
    """A world twice as big looks the same (monocular scale ambiguity) but the IMU
    sees twice the acceleration: exactly what the scale estimator must resolve."""
    one = synth_session(tmp_path, "one", 12, seed=4)
    two = synth_session(tmp_path, "two", 12, seed=4, scale_hint=2.0)
    t1, t2 = truth(one), truth(two)
    assert t2["scale"] == 2.0
    assert np.allclose(t2["poses"][:, :3, 3], 2 * t1["poses"][:, :3, 3])
    for i in (0, 11):
        a = cv2.imread(str(one / "rgb" / f"{i:06d}.jpg")).astype(float)
        b = cv2.imread(str(two / "rgb" / f"{i:06d}.jpg")).astype(float)
        assert np.abs(a - b).mean() < 1.0
    _, acc1, gyr1 = _imu_arrays(one)
    _, acc2, gyr2 = _imu_arrays(two)
    assert np.allclose(acc2 - t2["accel_bias"], 2 * (acc1 - t1["accel_bias"]), atol=0.01)
    assert np.allclose(gyr1, gyr2, atol=1e-6)


def test_rotation_only_and_static(tmp_path: Path) -> None:
    rot = synth_session(tmp_path, "rot", 20, seed=3, motion="rotation-only")
    T = truth(rot)["poses"]
    assert np.ptp(T[:, :3, 3], axis=0).max() < 0.01
    assert np.rad2deg(np.linalg.norm(so3_log(T[0, :3, :3].T @ T[-1, :3, :3]))) > 1.0
    _, accel, _ = _imu_arrays(rot)
    assert np.abs(accel - truth(rot)["accel_bias"]).max() < 0.02  # noise only

    st = synth_session(tmp_path, "static", 5, seed=3, motion="static")
    frames = {p.read_bytes() for p in (st / "rgb").iterdir()}
    assert len(frames) == 1


def test_bad_imu_options(tmp_path: Path) -> None:
    short = synth_session(tmp_path, "short", 12, seed=1, imu_duration_factor=0.5)
    t = truth(short)
    tau, _, _ = _imu_arrays(short)
    span = t["stop_epoch"] - t["capture_start_epoch"]
    assert tau[-1] - t["capture_start_epoch"] == pytest.approx(0.5 * span, abs=0.0051)
    assert _json(short / "metadata.json")["imuCount"] == len(tau)

    bad = synth_session(tmp_path, "nan", 3, seed=1, nan_imu=True)
    assert "NaN" in (bad / "imu.json").read_text()
    _, acc, gyr = _imu_arrays(bad)
    assert np.isnan(acc).any(axis=1).nonzero()[0].tolist() == truth(bad)["nan_imu_samples"]
    # only the IMU differs from the clean session: frames are the same bytes
    clean = synth_session(tmp_path, "clean", 3, seed=1, video=True)
    assert (bad / "rgb/000002.jpg").read_bytes() == (clean / "rgb/000002.jpg").read_bytes()
    assert (bad / "encoders.json").read_bytes() == (clean / "encoders.json").read_bytes()
    from packer.video import frame_times  # a real container: the app's 1/600 s timescale, a sample per frame

    assert frame_times(clean / "video.mov") * 600 == pytest.approx(truth(clean)["frame_timestamps"] * 600, abs=0.5)
    assert _json(clean / "metadata.json")["hasVideo"] is True

    nocal = synth_session(tmp_path, "nocal", 2, seed=1, calib=False)
    assert not (nocal / "calib.txt").exists() and "cameraIntrinsics" not in _json(nocal / "metadata.json")


def test_dataset_names_and_seeds(tmp_path: Path) -> None:
    paths = synth_dataset(tmp_path / "a", 3, 2, seed=5, progress=False)
    assert [p.name for p in paths] == [session_name(5, i) for i in range(3)]
    assert len({p.name for p in paths}) == 3 and all(p.name.startswith("session_20") for p in paths)
    assert len({(p / "rgb/000000.jpg").read_bytes() for p in paths}) == 3  # own trajectories
    assert len({json.dumps(truth(p)["scene"]) for p in paths}) == 1  # one room
    assert not any(p.name.startswith(".") for p in (tmp_path / "a").iterdir())  # no temp dirs left
    # the start time follows the name (UTC)
    for p in paths:
        md = _json(p / "metadata.json")
        stamp = datetime.strptime(p.name, "session_%Y-%m-%d_%H%M%S").strftime("%Y-%m-%dT%H:%M:%SZ")
        assert md["startTime"] == stamp
    # parallel workers write the same bytes
    par = synth_dataset(tmp_path / "b", 2, 2, seed=5, progress=False, workers=2)
    for p, q in zip(paths, par):
        assert (p / "imu.json").read_bytes() == (q / "imu.json").read_bytes()
        assert (p / "rgb/000001.jpg").read_bytes() == (q / "rgb/000001.jpg").read_bytes()
    # session keywords pass through
    (z,) = synth_dataset(tmp_path / "z", 1, 2, seed=5, progress=False, export="zip", fps=30, encoders=False)
    assert z.suffix == ".zip" and truth(z)["fps"] == 30.0 and not truth(z)["encoder"]["connected"]
