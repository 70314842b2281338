"""The glove's encoders.json, the frame clock and the capture mode: the pure
functions on made-up numbers, and each bad-input case through `packer pack` /
`packer check` on sessions written as the app writes them."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from packer.encoders import JOINTS, EncoderFormatError, esp_clock, from_rows, unwrap_valid
from packer.pack import pack
from packer.session import capture_mode, poses_provenance
from packer.timebase import estimate_fps
from shardship.config import PackOptions

ROOT = Path(__file__).resolve().parent.parent


def rows(t: np.ndarray, esp_ms: np.ndarray, deg: np.ndarray) -> list[dict]:
    return [{"timestamp": float(a), "esp_timestamp_ms": int(b), **{k: float(v) for k, v in zip(JOINTS, d)}}
            for a, b, d in zip(t, esp_ms, deg)]


def test_esp_clock_removes_ble_jitter():
    rng = np.random.default_rng(0)
    true = 1.77e9 + np.arange(0, 20, 0.02)  # 50 Hz for 20 s
    esp = np.round(123456 + (true - true[0]) * 1000)
    receive = true + 0.005 + rng.uniform(0, 0.025, true.shape)
    est = esp_clock(esp, receive)
    assert est is not None
    assert np.abs(est - (true + 0.005)).max() < 0.002  # the floor latency is all that is left
    assert np.abs(receive - (true + 0.005)).max() > 0.02  # what it removed


def test_esp_reboot_falls_back_to_receive_times_with_a_warning():
    t = 1.77e9 + np.arange(0, 2, 0.02)
    esp = np.round(5000 + (t - t[0]) * 1000)
    esp[50:] -= esp[50] - 10  # millis() restarts mid-session
    enc = from_rows(rows(t, esp, np.tile([10.0, 20.0, 30.0, 40.0], (len(t), 1)) + t[:, None] - t[0]))
    assert enc.clock == "receive" and any("not a steady clock" in w for w in enc.warnings)
    assert np.allclose(enc.t[0], t)


def test_unwrap_and_read_errors():
    t = np.arange(6, dtype=float)
    tv, dv, bad = unwrap_valid(t, np.array([170.0, 178.0, -1.0, -176.0, -170.0, 179.9]))
    assert bad == 1 and list(tv) == [0, 1, 3, 4, 5]
    assert dv == pytest.approx([170.0, 178.0, 184.0, 190.0, 179.9])


def test_joint_warnings_name_the_joint():
    t = 1.77e9 + np.arange(0, 2, 0.02)
    esp = np.round((t - t[0]) * 1000)
    deg = np.stack([np.linspace(0, 60, len(t)), np.full(len(t), 12.5), np.linspace(0, 40, len(t)),
                    np.full(len(t), -1.0)], axis=1)
    enc = from_rows(rows(t, esp, deg))
    assert not enc.valid  # three_finger_pip never read: the session's joints get masked
    assert any(w.startswith("index_pip never moves (stays at 12.5 deg)") for w in enc.warnings)
    assert any(w.startswith("three_finger_pip: 100 of 100 readings are read errors") for w in enc.warnings)


@pytest.mark.parametrize("bad, why", [
    ([{"timestamp": 1.0, "esp_timestamp_ms": 1, "index_mcp": 1, "index_pip": 1, "three_finger_mcp": 1}],
     "lack three_finger_pip"),
    ([], "non-empty JSON list"),
    ([{"timestamp": "x", "index_mcp": 1, "index_pip": 1, "three_finger_mcp": 1, "three_finger_pip": 1}],
     "as numbers"),
])
def test_encoder_format_errors_say_what_is_missing(bad, why):
    with pytest.raises(EncoderFormatError, match=why):
        from_rows(bad)


def test_frame_rate_from_spans():
    assert estimate_fps(1800, [("imu.json span", 30.02)])[:1] == (60.0,)
    assert estimate_fps(900, [("imu.json span", 30.02)])[:1] == (30.0,)
    # an IMU that stopped half way matches neither 30 nor 60: the glove's span decides
    fps, src, warn = estimate_fps(1800, [("imu.json span", 15.0), ("encoders.json span", 30.1)])
    assert fps == 60.0 and src.startswith("encoders.json span") and not warn
    fps, src, _ = estimate_fps(900, [("metadata startTime/endTime", 31.0)])  # 1 s resolution: 30 vs 60 only
    assert fps == 30.0
    fps, src, warn = estimate_fps(900, [])
    assert fps == 60.0 and src == "default" and "assuming 60 fps" in warn[0]
    assert estimate_fps(10, [], pose_dt=1 / 59.94)[0] == 60.0


def test_capture_mode_and_pose_provenance():
    assert capture_mode({"captureSource": "iphone_ultrawide"}, True, True) == "ultrawide"
    assert capture_mode({"captureSource": "iphone_arkit"}, True, False) == "arkit"
    assert capture_mode({}, True, False) == "arkit"  # the first app version wrote no captureSource
    assert capture_mode({}, False, True) == "ultrawide"
    e = [{"rgbIndex": 0, "transform": []}]
    assert poses_provenance({"slamProcessed": True, "scale_factor": 0.37}, e, "h", "ultrawide") == "user-calibrated"
    assert poses_provenance({"slamProcessed": True}, e, "h", "ultrawide") == "user-slam"
    assert poses_provenance({"shardship": {"poses_sha256": "h"}, "slamProcessed": True}, e, "h",
                            "ultrawide") == "shardship"
    assert poses_provenance({}, e, "h", "ultrawide") == "foreign"
    assert poses_provenance({}, [], None, "ultrawide") is None


def _rewrite_encoders(session: Path, fn) -> None:
    p = session / "encoders.json"
    p.write_text(json.dumps(fn(json.loads(p.read_text())), indent=2))


def test_encoder_clock_that_misses_the_video_fails_that_session_only(raw_copy: Path, tmp_path: Path):
    victim = sorted(raw_copy.iterdir())[0]
    _rewrite_encoders(victim, lambda rs: [{**r, "timestamp": r["timestamp"] + 3600.0} for r in rs])
    r = pack(raw_copy, tmp_path / "p", PackOptions(workers=1), progress=False)
    assert set(r.failed) == {victim.name} and len(r.packed) == 2
    assert r.failed[victim.name].startswith("encoders.json: 100% of the readings (+3599.9")
    assert "from frame 0, placed by " in r.failed[victim.name]
    assert "fall outside the video: the clocks disagree" in r.failed[victim.name]


def test_partial_encoder_coverage_is_a_warning(raw_copy: Path, tmp_path: Path):
    victim = sorted(raw_copy.iterdir())[0]
    _rewrite_encoders(victim, lambda rs: rs[: int(len(rs) * 0.7)])
    r = pack(raw_copy, tmp_path / "p", PackOptions(workers=1), progress=False)
    assert not r.failed
    assert any(w.startswith("glove silent 1 time(s)") for w in r.warnings[victim.name])
    labels = json.loads((tmp_path / "p" / "index.json").read_text())["sessions"][victim.name]["labels"]
    assert 0.6 < labels["joints_coverage"] < 0.75 and len(labels["glove_gaps"]) == 1


def test_malformed_encoders_name_the_file_and_field(raw_copy: Path, tmp_path: Path):
    victim = sorted(raw_copy.iterdir())[1]
    _rewrite_encoders(victim, lambda rs: [{k: v for k, v in r.items() if k != "index_pip"} for r in rs])
    r = pack(raw_copy, tmp_path / "p", PackOptions(workers=1), progress=False)
    assert r.failed[victim.name].startswith("encoders.json: readings lack index_pip")


def test_pack_of_an_empty_raw_dir_is_an_error_not_success(tmp_path: Path):
    (tmp_path / "raw").mkdir()
    r = subprocess.run([sys.executable, "-m", "packer", "pack", "--raw", str(tmp_path / "raw"), "--out",
                        str(tmp_path / "p"), "--no-slam", "--quiet"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and "no sessions under" in r.stderr and "Traceback" not in r.stderr


def test_check_unzips_and_says_what_pack_will_do(tmp_path: Path):
    from packer.synth import synth_session

    raw = tmp_path / "raw"
    synth_session(raw, "session_2026-03-01_101010", 30, 2, export="zip", encoders=False)
    r = subprocess.run([sys.executable, "-m", "packer", "check", "--raw", str(raw)], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "unzip session_2026-03-01_101010.zip -> session_2026-03-01_101010/" in out
    assert "ok    session_2026-03-01_101010: 30 frames, 0.5 s at 60 fps [imu.json span" in out
    assert "encoders.json: absent (glove not connected) -> joints masked" in out
    assert "poses.json empty -> `packer slam` computes metric poses" in out
    assert "1 of 1 session ok" in out
