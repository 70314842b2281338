"""What a phone and a Bluetooth glove do to a recording, rendered by `packer synth` in
the app's export format, packed, and every packed label checked against the truth:
a sample marked valid is within 2 degrees of the recorded joints, an action step
marked real spans exactly its own time (no "teleport" across a dropped frame), and
a fault that cannot be labelled right is masked or refused with its real reason.

Poses come from the truth in the user's calibrated-SLAM format (`write_truth_as_metric`),
so these tests check the labels, not SLAM; tests/test_slam_hard.py runs SLAM on drops."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from packer.cli import main as packer_main
from packer.pack import pack
from packer.session import load_session
from packer.synth import truth
from packer.synth.session import synth_session
from packer.synth.spec import Faults
from shardship.config import PackOptions
from shardship.errors import SessionError
from tests.datasets import write_truth_as_metric
from tests.test_slam_hard import assert_never_wrong

JOINT_TOL = 2.0  # degrees
NAME = "session_2026-01-01_120000"
FPS = 60.0


def wrapped(d: np.ndarray) -> np.ndarray:
    return (d + 180.0) % 360.0 - 180.0


def render(tmp: Path, frames: int = 300, seed: int = 5, poses: bool = True, video: bool = False,
           drop_frames: tuple[int, ...] = (), **faults) -> Path:
    s = synth_session(tmp / "raw", NAME, frames, seed, motion="fast", export="folder", video=video,
                      drop_frames=drop_frames, faults=Faults(**faults))
    if poses:
        write_truth_as_metric(s)
    return s


def packed_samples(session: Path, out: Path) -> tuple[dict, list[dict]]:
    """(the session's index.json entry, its samples in frame order)."""
    r = pack(session.parent, out, PackOptions(workers=1), progress=False)
    assert not r.failed, r.failed
    index = json.loads((out / "index.json").read_text())
    entry = index["sessions"][session.name]
    metas = []
    for shard in entry["shards"]:
        with tarfile.open(out / shard) as tf:
            metas += [json.load(tf.extractfile(m)) for m in tf.getmembers() if m.name.endswith(".json")]
    return entry, sorted(metas, key=lambda m: m["frame"])


def assert_labels_true(session: Path, metas: list[dict]) -> dict[str, float]:
    """Every label marked valid matches the truth: proprio and each real chunk step's
    joints within JOINT_TOL, each real step's pose the truth's relative pose, and its
    time k periods after the sample's (nothing spans a gap). Returns counts."""
    tr = truth(session)
    joints, poses, times = tr["joints_deg"], tr["poses"], tr["frame_timestamps"]
    worst, valid_steps = 0.0, 0
    for p, m in enumerate(metas):
        jm = np.array(m.get("joint_mask", [1, 1, 1, 1]), bool)
        if m["joints_valid"]:
            worst = max(worst, float(np.abs(wrapped(np.array(m["proprio"]) - joints[m["frame"]]))[jm].max()))
        if m["action"] is None:
            continue
        act = np.array(m["action"])
        for k, real in enumerate(m["action_mask"], start=1):
            if not real:
                continue
            nxt = metas[p + k]["frame"]
            dt = times[nxt] - times[m["frame"]]
            assert abs(dt - k / FPS) < 0.25 / FPS, f"frame {m['frame']} step {k} spans {dt * FPS:.2f} periods"
            rel = poses[m["frame"]][:3, :3].T @ (poses[nxt][:3, 3] - poses[m["frame"]][:3, 3])
            assert np.abs(act[k - 1, :3] - rel).max() < 1e-4
            if m["joints_valid"] and m.get("joints_mask", [1] * len(m["action_mask"]))[k - 1]:
                err = np.abs(wrapped(act[k - 1, 9:] - joints[nxt]))[jm]
                worst = max(worst, float(err.max()))
                valid_steps += 1
    assert worst <= JOINT_TOL, worst
    return {"worst": worst, "valid": sum(m["joints_valid"] for m in metas), "steps": valid_steps}


def check_lines(raw: Path) -> str:
    r = CliRunner().invoke(packer_main, ["check", "--raw", str(raw)])
    return r.output


# ----------------------------------------------------------------- the glove


def test_glove_dropout_masks_the_silent_frames_only(tmp_path: Path):
    s = render(tmp_path, 360, glove_gaps=((2.0, 2.0),))
    entry, metas = packed_samples(s, tmp_path / "p")
    t = truth(s)["frame_timestamps"]
    silent = [m for m in metas if 2.05 < t[m["frame"]] < 3.95]
    assert silent and not any(m["joints_valid"] for m in silent)
    assert all(m["proprio"] == [0, 0, 0, 0] for m in silent)  # not straight-lined, not held
    got = assert_labels_true(s, metas)
    assert got["valid"] > 0.6 * len(metas) and got["steps"] > 0
    gaps = entry["labels"]["glove_gaps"]
    assert len(gaps) == 1 and abs(gaps[0][0] - 2.0) < 0.05 and abs(gaps[0][1] - 2.0) < 0.05
    assert 0.6 < entry["labels"]["joints_coverage"] < 0.72
    out = check_lines(s.parent)
    assert "glove: joints on 6" in out and "silent 2.0" in out, out
    r = CliRunner().invoke(packer_main, ["report", "--raw", str(s.parent), "--out", str(tmp_path / "p"),
                                         "--no-budget", "--workers", "1"])
    assert r.exit_code == 0, r.output
    page = (tmp_path / "p" / "report.html").read_text()
    assert "joints known on 6" in page and "glove silent 2.0-4.0 s" in page


def test_late_connect_and_early_disconnect_are_masked_not_held_nor_refused(tmp_path: Path):
    s = render(tmp_path, 360, glove_gaps=((-1.0, 2.5), (4.5, 5.0)))  # 40% of the video has no glove
    entry, metas = packed_samples(s, tmp_path / "p")
    t = truth(s)["frame_timestamps"]
    assert not any(m["joints_valid"] for m in metas if t[m["frame"]] < 1.45 or t[m["frame"]] > 4.55)
    got = assert_labels_true(s, metas)
    assert 0.45 * len(metas) < got["valid"] < 0.6 * len(metas)
    assert len(entry["labels"]["glove_gaps"]) == 2
    assert not any("clocks disagree" in w for w in entry["warnings"])


def test_a_joint_that_only_reads_minus_one_is_masked_alone(tmp_path: Path):
    s = render(tmp_path, 240, dead_joint="index_pip")
    entry, metas = packed_samples(s, tmp_path / "p")
    assert entry["labels"]["joints_usable"] == [True, False, True, True]
    assert all(m["joint_mask"] == [1, 0, 1, 1] and m["joints_valid"] for m in metas)
    assert_labels_true(s, metas)
    prop = json.loads((tmp_path / "p" / "index.json").read_text())["stats"]["proprio"]
    assert prop["count"][1] == 0 and prop["count"][0] == len(metas)  # the dead joint's zeros are no statistic


# ----------------------------------------------------------------- the camera


def test_dropped_frames_are_placed_by_video_mov(tmp_path: Path):
    s = render(tmp_path, 360, video=True, drop_rate=0.05)
    sess = load_session(s)
    tr = truth(s)
    assert sess.timestamp_source == "video.mov" and sess.fps == FPS
    assert np.abs(sess.timestamps - tr["frame_timestamps"][sess.frames]).max() < 1e-9
    entry, metas = packed_samples(s, tmp_path / "p")
    drops = len(tr["faults"]["camera_drops"])
    assert entry["labels"]["frame_times"] == "video.mov" and 0 < len(entry["labels"]["breaks"]) <= drops
    got = assert_labels_true(s, metas)
    assert got["valid"] == len(metas)
    assert any(f"the camera dropped {drops} frame(s)" in w for w in entry["warnings"])


@pytest.mark.parametrize("rate", [0.05, 0.10])
def test_dropped_frames_without_video_mov_are_refused_with_the_count(tmp_path: Path, rate: float):
    s = render(tmp_path, 600, drop_rate=rate)
    with pytest.raises(SessionError) as e:
        load_session(s)
    msg = str(e.value)
    assert "were dropped by the camera" in msg and "copy video.mov from the phone's export" in msg
    short = int(msg.split("about ")[1].split(" frames")[0])
    assert abs(short - rate * 600) <= 0.25 * rate * 600 + 2, msg  # the count, give or take the IMU's lead
    out = check_lines(s.parent)
    assert f"FAIL  session {NAME}: rgb: 600 frames in the" in out and "0 of 1 session ok" in out, out


def test_unreadable_video_mov_is_named_and_the_numbers_are_used(tmp_path: Path):
    s = render(tmp_path, 120, video=True)
    (s / "video.mov").write_bytes((s / "video.mov").read_bytes()[:300])  # a truncated copy
    sess = load_session(s)
    assert sess.timestamp_source == "index/fps"
    assert any(w.startswith("video.mov unreadable") or w.startswith("video.mov holds") for w in sess.warnings)


def test_failed_jpeg_encodes_break_the_chunks(tmp_path: Path):
    s = render(tmp_path, 240, video=True, drop_frames=(60, 61, 150))
    entry, metas = packed_samples(s, tmp_path / "p")
    assert entry["labels"]["breaks"] == [62, 151]
    assert_labels_true(s, metas)
    before = next(m for m in metas if m["frame"] == 59)
    assert before["action_mask"] == [0] * 16  # its next frame is across the gap


def test_a_frame_the_writer_skipped_is_placed_in_its_gap(tmp_path: Path):
    s = render(tmp_path, 240, video=True, writer_skips=(100,))
    sess = load_session(s)
    assert np.abs(sess.timestamps - truth(s)["frame_timestamps"][sess.frames]).max() < 1e-9
    assert any("lacks 1 frame(s)" in w for w in sess.warnings)


def test_drops_and_a_writer_skip_leave_unplaceable_frames_out_never_wrong(tmp_path: Path):
    s = render(tmp_path, 240, video=True, camera_drops=(50, 180), writer_skips=(120,))
    sess = load_session(s)
    tr = truth(s)
    assert sess.n_frames < 240 and any("cannot be placed in time: left out" in w for w in sess.warnings)
    assert np.abs(sess.timestamps - tr["frame_timestamps"][sess.frames]).max() < 1e-9
    _, metas = packed_samples(s, tmp_path / "p")
    assert_labels_true(s, metas)


# ----------------------------------------------------------------- SLAM on a camera that dropped frames


@pytest.fixture(scope="module")
def dropped_3pct(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """10 s of fast hand motion, the camera dropping 3% of its frames, video.mov written."""
    raw = tmp_path_factory.mktemp("drops") / "raw"
    return synth_session(raw, NAME, 600, 2003, motion="fast", export="folder", video=True,
                         faults=Faults(drop_rate=0.03))


def _slam(src: Path, work: Path, video: bool) -> tuple[Path, subprocess.CompletedProcess]:
    shutil.copytree(src, work / "raw" / src.name, ignore=shutil.ignore_patterns(*([] if video else ["video.mov"])))
    r = subprocess.run([sys.executable, "-m", "packer", "pack", "--raw", str(work / "raw"), "--out",
                        str(work / "p"), "--quiet", "--workers", "1"], capture_output=True, text=True, timeout=900)
    return work / "raw" / src.name, r


def test_slam_on_dropped_frames_placed_by_video_mov(dropped_3pct: Path, tmp_path: Path):
    d, r = _slam(dropped_3pct, tmp_path, video=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert_never_wrong(d, r, ())
    entry, metas = json.loads((tmp_path / "p" / "index.json").read_text())["sessions"][NAME], []
    for shard in entry["shards"]:
        with tarfile.open(tmp_path / "p" / shard) as tf:
            metas += [json.load(tf.extractfile(m)) for m in tf.getmembers() if m.name.endswith(".json")]
    metas.sort(key=lambda m: m["frame"])
    assert entry["labels"]["frame_times"] == "video.mov" and entry["labels"]["breaks"]
    tr = truth(dropped_3pct)
    joints, times = tr["joints_deg"], tr["frame_timestamps"]
    for p, m in enumerate(metas):  # SLAM's poses are not the truth's: joints and time spans checked here
        assert not m["joints_valid"] or np.abs(wrapped(np.array(m["proprio"]) - joints[m["frame"]])).max() <= JOINT_TOL
        for k, real in enumerate(m["action_mask"], start=1):
            if real:
                assert abs(times[metas[p + k]["frame"]] - times[m["frame"]] - k / FPS) < 0.25 / FPS


def test_slam_refuses_dropped_frames_without_video_mov(dropped_3pct: Path, tmp_path: Path):
    d, r = _slam(dropped_3pct, tmp_path, video=False)
    failed = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("FAIL")]
    assert r.returncode != 0 and len(failed) == 1, r.stdout + r.stderr
    assert "dropped by the camera" in failed[0] and "copy video.mov" in failed[0], failed
    assert not (tmp_path / "p" / "index.json").exists() or NAME not in json.loads(
        (tmp_path / "p" / "index.json").read_text())["sessions"]


def test_without_video_mov_or_poses_the_unchecked_clock_is_said(tmp_path: Path):
    """1% of 4 s is too few drops to show against the IMU's span, and with neither
    video.mov nor poses nothing else can see them: packed, with the warning that says so."""
    from packer.samples import NO_CLOCK_CHECK

    s = render(tmp_path, 240, poses=False, drop_rate=0.01)
    entry, _ = packed_samples(s, tmp_path / "p")
    assert NO_CLOCK_CHECK in entry["warnings"]


def test_without_poses_frame_0_comes_from_the_images_rotation(tmp_path: Path):
    """`packer pack --no-slam` on a camera that dropped frames, with video.mov: frame 0 is
    placed by the gyro against the images' own rotation (not the IMU's first sample,
    10-40 ms off: 4 degrees of joint error at hand speeds), every joint within 2 deg."""
    s = render(tmp_path, 360, poses=False, video=True, drop_rate=0.03)
    entry, metas = packed_samples(s, tmp_path / "p")
    assert entry["clock"]["source"] == "gyro alignment on the images' own rotation"
    assert abs(entry["clock"]["frame0_epoch"] - truth(s)["imu_offset"]) < 0.004
    got = assert_labels_true(s, metas)
    assert got["valid"] > 0.95 * len(metas)
