"""End-to-end SLAM stage on rendered `packer.synth` sessions: real pycolmap SfM, IMU
alignment and scale against the synthetic ground truth, caching, raw-data safety,
refusals and bad input through the `slam` CLI.

Sessions are short (60-120 frames, keyframe step 2) to keep the file around a minute
on 2 cores."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from packer.session import load_session
from packer.slam import FLAG_NAMES, REGISTERED, SlamOptions, slam_session, slam_sessions, store
from packer.slam.rotations import umeyama
from packer.slam_cli import slam
from packer.synth import synth_session, truth

pytestmark = pytest.mark.slow

HAND_SEED = 11


def fast(**kw) -> SlamOptions:
    return SlamOptions(progress=False, **kw)  # the defaults a user runs


def accuracy(session_dir: Path) -> dict[str, float]:
    """Scale error and ATE (after sim(3) alignment, as a fraction of the path length)
    of the written poses.json against synth_truth.json."""
    tr = truth(session_dir)
    entries = json.loads((session_dir / "poses.json").read_text())
    idx = [e["rgbIndex"] for e in entries]
    est = np.array([e["transform"] for e in entries])[:, :3, 3]
    gt = tr["poses"][idx, :3, 3]
    s, R, t = umeyama(est, gt)
    err = np.linalg.norm(s * est @ R.T + t - gt, axis=1)
    length = float(np.sum(np.linalg.norm(np.diff(gt, axis=0), axis=1)))
    return {"scale_err": abs(s - 1.0), "ate_ratio": float(np.sqrt(np.mean(err**2))) / length, "length": length}


@pytest.fixture(scope="module")
def hand(tmp_path_factory) -> Path:
    """A 2 s hand-held session (120 frames, IMU 23.7 ms ahead of the frames), processed once."""
    root = tmp_path_factory.mktemp("slam_hand")
    return synth_session(root, "session_2026-01-01_120000", 120, HAND_SEED, imu_offset=0.0237)


@pytest.fixture(scope="module")
def hand_result(hand):
    return slam_session(hand, fast(plot=True))


def test_metric_poses_meet_the_accuracy_targets(hand, hand_result):
    r = hand_result
    assert r.status == "ok", r.message
    assert r.metric and r.method == "imu"
    acc = accuracy(hand)
    assert acc["scale_err"] <= 0.02, acc
    assert acc["ate_ratio"] <= 0.02, acc
    info = r.info
    assert info["registered_fraction"] >= 0.95
    tr = truth(hand)
    assert abs(info["imu_offset"] - tr["imu_offset"]) <= 0.005
    # camera-to-IMU rotation recovered without any assumed axis convention
    R_err = np.asarray(info["R_imu_cam"]).T @ tr["R_imu_cam"]
    assert np.degrees(np.arccos(np.clip((np.trace(R_err) - 1) / 2, -1, 1))) < 1.0
    assert 0 < info["confidence"] <= 1 and info["scale_rel_std"] < 0.02
    assert r.plot is not None and r.plot.stat().st_size > 10_000


def test_poses_json_schema_and_metadata(hand, hand_result):
    s = load_session(hand)
    entries = json.loads((hand / "poses.json").read_text())
    assert [e["rgbIndex"] for e in entries] == [int(f) for f in s.frames]
    assert np.allclose([e["timestamp"] for e in entries], s.timestamps)
    T = np.array([e["transform"] for e in entries])
    assert T.shape == (120, 4, 4) and np.all(np.isfinite(T))
    assert np.allclose(T[:, 3], [0, 0, 0, 1])
    assert np.allclose(np.swapaxes(T[:, :3, :3], 1, 2) @ T[:, :3, :3], np.eye(3), atol=1e-9)
    assert {e["flag"] for e in entries} <= set(FLAG_NAMES.values())
    assert sum(e["flag"] == "registered" for e in entries) == int(np.sum(hand_result.flags == REGISTERED))
    md = json.loads((hand / "metadata.json").read_text())
    assert md["captureSource"] == "iphone_ultrawide" and md["rgbFrameCount"] == 120  # the app's keys kept
    sh = md["shardship"]
    # the fields the user's own run_slam.py / calibrate_scale.py read, so they skip this session
    assert md["slamProcessed"] is True and md["poseCount"] == 120 and md["scale_factor"] == sh["scale"]
    for key in ("metric", "scale", "imu_offset", "residual", "registered_fraction", "reprojection_error",
                "method", "version", "fingerprint", "confidence"):
        assert key in sh, key
    assert sh["metric"] is True and sh["method"] == "imu"
    s2 = load_session(hand)
    assert s2.pose_source == "shardship" and s2.timestamp_source == "index/fps"


def test_rerun_is_cached_and_writes_nothing(hand, hand_result):
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in (hand / "poses.json", hand / "metadata.json")}
    r = slam_session(hand, fast())
    assert r.status == "cached", r.message
    assert r.scale == pytest.approx(hand_result.scale)
    for p, (mtime, data) in before.items():
        assert p.stat().st_mtime_ns == mtime and p.read_bytes() == data
    # a different option is a different fingerprint: not cached
    fp_a = store.input_fingerprint(load_session(hand), fast().fingerprint_options(), True)
    fp_b = store.input_fingerprint(load_session(hand), fast(mapper="incremental").fingerprint_options(), True)
    assert fp_a != fp_b


def test_cached_by_stat_reads_no_frame_and_a_touched_frame_falls_back_to_content(hand, hand_result, monkeypatch):
    from packer.slam.pipeline import cached_by_stat

    real = store.input_fingerprint

    def no_hashing(*a, **k):
        raise AssertionError("the content fingerprint was computed for an unchanged session")

    monkeypatch.setattr(store, "input_fingerprint", no_hashing)
    assert slam_session(hand, fast()).status == "cached"
    hit = cached_by_stat(load_session(hand), fast())
    assert hit is not None and hit.status == "cached" and hit.scale == pytest.approx(hand_result.scale)
    assert cached_by_stat(load_session(hand), fast(mapper="incremental")) is None  # other options: not this result
    # same bytes, new mtime (a copy, a restore): the stat differs, the content decides
    frame = sorted((hand / "rgb").glob("*.jpg"))[3]
    st = frame.stat()
    os.utime(frame, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert cached_by_stat(load_session(hand), fast()) is None
    monkeypatch.setattr(store, "input_fingerprint", real)
    assert slam_session(hand, fast()).status == "cached"


def test_foreign_poses_are_kept_and_arkit_is_skipped(tmp_path):
    d = synth_session(tmp_path, "session_2026-01-01_120001", 12, 3)
    foreign = [{"timestamp": i / 30.0, "rgbIndex": i, "transform": np.eye(4).tolist()} for i in range(12)]
    (d / "poses.json").write_text(json.dumps(foreign))
    s = load_session(d)
    assert s.pose_source == "foreign" and s.timestamp_source == "index/fps"  # i/30 stamps of others: not trusted
    poses = np.tile(np.eye(4), (12, 1, 1))
    store.write_results(s, poses, np.zeros(12, np.int8), FLAG_NAMES, {"metric": False, "fingerprint": "x"})
    assert json.loads((d / "poses.orig.json").read_text()) == foreign
    ours = json.loads((d / "poses.json").read_text())
    assert [e["timestamp"] for e in ours] == pytest.approx([i / 60.0 for i in range(12)])  # the frame clock
    # writing again never overwrites the kept original with our own output
    store.write_results(load_session(d), poses, np.zeros(12, np.int8), FLAG_NAMES, {"metric": False})
    assert json.loads((d / "poses.orig.json").read_text()) == foreign
    assert not (d / "poses.orig.1.json").exists()
    assert json.loads((d / "metadata.json").read_text())["shardship"]["original_poses"] == "poses.orig.json"

    a = synth_session(tmp_path, "session_2026-01-01_120002", 12, 4)
    md = json.loads((a / "metadata.json").read_text())
    md["captureSource"] = "iphone_arkit"
    (a / "metadata.json").write_text(json.dumps(md))
    before = (a / "poses.json").read_bytes()
    r = slam_session(a, fast())
    assert r.status == "skipped" and "ARKit" in r.message
    assert (a / "poses.json").read_bytes() == before


def test_rotation_only_session_is_refused_with_reason(tmp_path):
    # 2 s: enough IMU intervals that the refusal is about motion, not length
    d = synth_session(tmp_path, "session_2026-01-01_120003", 120, 5, motion="rotation-only")
    r = slam_session(d, fast())
    assert r.failed
    assert "translat" in r.message and ("pure rotation" in r.message or "barely" in r.message), r.message
    assert json.loads((d / "poses.json").read_text()) == []  # nothing written


@pytest.mark.parametrize("motion", ["rotation-only", "default"])
def test_a_still_camera_is_the_reason_given_when_its_model_disagrees_with_the_gyro(tmp_path, motion):
    # SfM sometimes builds a (wrong) model of a camera turning in place, sometimes not: it
    # varies between runs and machines. When such a model disagrees with the gyro, the reason
    # to give is the missing translation, not "record with more texture". Forced here on the
    # true keyframe poses with a gyro limit of 0; a moving camera still gets the gyro refusal.
    from packer.session import load_imu
    from packer.slam.scale.scale_methods import metric_scale

    d = synth_session(tmp_path, "session_2026-01-01_120003", 120, 5,
                      **({"motion": motion} if motion != "default" else {}))
    s = load_session(d)
    key_pos = np.arange(0, len(s.frames), 6)
    key_T = truth(d)["poses"][key_pos]
    with pytest.raises(Exception) as e:
        metric_scale(s, fast(max_gyro_disagreement=0.0), load_imu(s), key_pos, s.timestamps[key_pos], key_T)
    if motion == "rotation-only":
        assert "barely translates" in str(e.value) and "texture" not in str(e.value), e.value
    else:
        assert "disagree with the gyro" in str(e.value) and "barely" not in str(e.value), e.value
        assert "s into the video (" in str(e.value), e.value  # where: the second of video to look at


def test_a_repair_that_does_not_pass_keeps_the_gyro_refusal_and_says_what_it_found(tmp_path):
    """With a gyro limit of 0 every model is refused, the repaired one too: the session fails
    with the first refusal (where the model disagrees) and what the repair ran into, in one line,
    and nothing is written."""
    d = synth_session(tmp_path, "session_2026-01-01_120004", 180, 6)
    r = slam_session(d, fast(max_gyro_disagreement=0.0))
    assert r.failed, r.message
    first, _sep, repair = r.message.partition("; mapped again on the gyro's rotations, calibrated from the images: ")
    assert "disagree with the gyro" in first and "s into the video (" in first, r.message
    assert "disagree with the gyro" in repair or "did not converge" in repair or "fit only" in repair, r.message
    assert "\n" not in r.message
    assert json.loads((d / "poses.json").read_text()) == []  # the app's empty file, as synth wrote it


def test_where_the_bundle_adjustment_cannot_run_the_windowed_answer_stands_and_says_why(tmp_path, monkeypatch):
    """`--solver auto` (the default): a model the windowed solve accepted whose bundle
    adjustment could not run at all (`AdjustmentFailed`: it says nothing about the model)
    keeps the windowed scale, and metadata.json names why. (Made to fail here.)"""
    from packer.slam.scale import viba_scale as vs

    def fails(session, *_a, **_k):
        raise session.error("rgb/", "visual-inertial bundle adjustment failed: made to fail", vs.AdjustmentFailed)

    monkeypatch.setattr(vs, "viba_scale", fails)
    d = synth_session(tmp_path, "session_2026-01-01_120005", 120, HAND_SEED, imu_offset=0.0237)
    r = slam_session(d, fast())
    assert r.status == "ok", r.message
    assert r.info["solver"] == "window" and "made to fail" in r.info["viba_refused"], r.info
    assert "window_scale" not in r.info and r.info["scale"] > 0
    assert accuracy(d)["scale_err"] < 0.02


def test_a_refusal_of_the_bundle_adjustment_is_never_overruled_by_the_windowed_answer(tmp_path, monkeypatch):
    """Where the adjustment refuses (the images and the IMU disagree), the session is
    refused, saying the windowed answer it did not accept; nothing is written, and the
    same inputs get the same refusal at once (remembered, not mapped again)."""
    from packer.slam.scale import viba_scale as vs

    calls = []

    def refuses(session, *_a, **_k):
        calls.append(1)
        raise session.error("rgb/", "poses refused: the images and the IMU disagree (made so by the test)")

    monkeypatch.setattr(vs, "viba_scale", refuses)
    d = synth_session(tmp_path, "session_2026-01-01_120005", 120, HAND_SEED, imu_offset=0.0237)
    r = slam_session(d, fast())
    assert r.failed and "made so by the test" in r.message, r.message
    assert "the windowed accelerometer solve alone gave" in r.message and "not accepted" in r.message
    assert json.loads((d / "poses.json").read_text()) == []
    assert len(calls) == 1
    again = slam_session(d, fast())
    assert again.failed and store.REFUSAL_KEY in json.loads((d / "metadata.json").read_text())
    assert again.message.startswith(r.message) and "refused before on these same inputs" in again.message
    assert len(calls) == 1  # not mapped again
    forced = slam_session(d, fast(force=True))
    assert forced.failed and "refused before" not in forced.message and len(calls) == 2
    md = json.loads((d / "metadata.json").read_text())  # another release of the tool tries it again
    md[store.REFUSAL_KEY]["tool"] = "0.0.1"
    (d / "metadata.json").write_text(json.dumps(md))
    assert "refused before" not in slam_session(d, fast()).message and len(calls) == 3


def test_a_remembered_refusal_goes_when_the_inputs_change_or_a_result_is_written(tmp_path):
    """A rotation-only session is refused (scale unobservable); with the same inputs the
    refusal comes back from metadata.json; `--scale none` (other options) maps it and
    writes poses, which clears the remembered refusal."""
    d = synth_session(tmp_path, "session_2026-01-01_120003", 120, 5, motion="rotation-only")
    r = slam_session(d, fast())
    assert r.failed and "translat" in r.message, r.message
    assert "refused before" in slam_session(d, fast()).message
    ok = slam_session(d, fast(scale="none"))
    assert ok.status == "ok", ok.message
    assert store.REFUSAL_KEY not in json.loads((d / "metadata.json").read_text())
    again = slam_session(d, fast())  # the IMU scale again: these inputs were never refused on the record now
    assert again.failed and "refused before" not in again.message, again.message


def test_viba_names_a_still_camera_in_the_same_words(tmp_path):
    d = synth_session(tmp_path, "session_2026-01-01_120003", 120, 5, motion="rotation-only")
    r = slam_session(d, fast(solver="viba"))
    assert r.failed and "translat" in r.message, r.message
    assert "barely translates" in r.message or "pure rotation" in r.message, r.message


def test_scale_none_and_known_distance_without_imu(tmp_path):
    d = synth_session(tmp_path, "session_2026-01-01_120004", 60, 6)
    (d / "imu.json").unlink()
    r = slam_session(d, fast(scale="imu"))
    assert r.failed and "imu.json" in r.message and "--scale none" in r.message

    r = slam_session(d, fast(scale="none"))
    assert r.status == "ok", r.message
    assert not r.metric and r.scale is None
    md = json.loads((d / "metadata.json").read_text())["shardship"]
    assert md["metric"] is False and md["scale"] is None
    assert load_session(d).metadata["shardship"]["metric"] is False
    assert accuracy(d)["ate_ratio"] <= 0.02  # right shape, unknown size

    gt = truth(d)["poses"][:, :3, 3]
    dist = float(np.linalg.norm(gt[59] - gt[0]))
    r = slam_session(d, fast(scale="known-distance", known_distance=f"0:59:{dist:.6f}"))
    assert r.status == "ok" and r.metric, r.message
    assert accuracy(d)["scale_err"] <= 0.02


def _bad_sessions(root: Path) -> dict[str, str]:
    """name -> expected fragment of the one-line error."""
    import cv2

    expected = {}
    few = synth_session(root, "few", 6, 20)
    expected[few.name] = "only 6 frames"
    synth_session(root, "nan", 30, 21, nan_imu=True)
    expected["nan"] = "NaN"
    synth_session(root, "short", 30, 22, imu_duration_factor=0.5)
    expected["short"] = "IMU covers only"
    noimu = synth_session(root, "noimu", 30, 23)
    (noimu / "imu.json").unlink()
    expected["noimu"] = "imu.json: missing"
    blank = synth_session(root, "blank", 20, 24)
    gray = cv2.imencode(".jpg", np.full((360, 480, 3), 128, np.uint8))[1].tobytes()
    for p in (blank / "rgb").iterdir():
        p.write_bytes(gray)
    expected["blank"] = "almost no features"
    synth_session(root, "static", 20, 25, motion="static")
    expected["static"] = "identical"
    return expected


def test_cli_reports_each_bad_session_in_one_line(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    expected = _bad_sessions(raw)
    res = CliRunner().invoke(slam, ["--raw", str(raw), "--jobs", "2", "--quiet"])
    assert isinstance(res.exception, SystemExit), res.exception  # no uncaught error
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output
    lines = [ln for ln in res.output.splitlines() if ln.startswith("FAIL  ")]
    assert len(lines) == len(expected), res.output
    for name, fragment in expected.items():
        line = next(ln for ln in lines if f"session {name}:" in ln)
        assert fragment in line, line
    assert f"0 of {len(expected)} sessions ok" in res.output


def test_cli_usage_errors_exit_2(tmp_path):
    runner = CliRunner()
    res = runner.invoke(slam, ["--raw", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "not found" in res.output
    res = runner.invoke(slam, ["--raw", str(tmp_path), "--scale", "marker"])
    assert res.exit_code == 2 and "--marker-size" in res.output
    res = runner.invoke(slam, ["--raw", str(tmp_path), "--scale", "known-distance", "--known-distance", "1:2"])
    assert res.exit_code == 2 and "FRAME_A:FRAME_B:METRES" in res.output


def test_sessions_run_in_parallel_and_keep_order(tmp_path, hand, hand_result):
    a = tmp_path / "a"
    shutil.copytree(hand, a)  # copied results: cached by content, not by path or mtime
    b = synth_session(tmp_path, "b", 5, 30)
    results = slam_sessions([a, b], fast(), jobs=2)
    assert [r.session for r in results] == ["a", "b"]
    assert results[0].status == "cached" and results[1].failed


def _paste_marker(session_dir: Path, side: float, marker_id: int = 3) -> None:
    """Render a flat ArUco card of `side` metres into every frame with the true camera
    poses (a real 3-D object for SfM, seen in perspective), 0.6 m in front of frame 0."""
    import cv2

    tr = truth(session_dir)
    fx, fy, cx, cy = tr["intrinsics"]
    K = np.array([[fx, 0, cx - 0.5], [0, fy, cy - 0.5], [0, 0, 1.0]])
    px = 120  # marker pixels; a white quiet zone of px/4 around it
    card = np.full((px * 3 // 2, px * 3 // 2), 255, np.uint8)
    card[px // 4: px // 4 + px, px // 4: px // 4 + px] = cv2.aruco.generateImageMarker(
        cv2.aruco.getPredefinedDictionary(cv2.aruco.DICT_4X4_50), marker_id, px)
    T0 = tr["poses"][0]
    centre = T0[:3, 3] + 0.6 * T0[:3, 2]
    # card axes: x along the camera-0 x axis, y along camera-0 -y (up), facing camera 0
    R_wm = np.column_stack([T0[:3, 0], -T0[:3, 1], -T0[:3, 2]])
    m = side / px  # metres per card pixel; card pixel (u, v) -> marker plane (x, y, 0)
    A = np.array([[m, 0, -0.75 * px * m], [0, -m, 0.75 * px * m], [0, 0, 1]])
    for i, T in enumerate(tr["poses"]):
        R_cw, t_cw = T[:3, :3].T, -T[:3, :3].T @ T[:3, 3]
        R_cm, t_cm = R_cw @ R_wm, R_cw @ centre + t_cw
        H = K @ np.column_stack([R_cm[:, 0], R_cm[:, 1], t_cm]) @ A
        p = session_dir / "rgb" / f"{i:06d}.jpg"
        img = cv2.imread(str(p))
        warped = cv2.warpPerspective(card, H, (img.shape[1], img.shape[0]), borderValue=0)
        mask = cv2.warpPerspective(np.ones_like(card), H, (img.shape[1], img.shape[0])) > 0
        img[mask] = warped[mask][:, None]
        cv2.imwrite(str(p), img, [cv2.IMWRITE_JPEG_QUALITY, 92])


def test_marker_scale_end_to_end(tmp_path):
    d = synth_session(tmp_path, "session_2026-01-01_120005", 90, 12)
    _paste_marker(d, side=0.15)
    (d / "imu.json").unlink()  # the marker alone gives the scale
    r = slam_session(d, fast(scale="marker", marker_size=0.15))
    assert r.status == "ok" and r.metric, r.message
    assert r.info["marker_id"] == 3 and r.info["marker_frames"] >= 0.9 * r.info["registered_keyframes"]
    acc = accuracy(d)
    assert acc["scale_err"] <= 0.02 and acc["ate_ratio"] <= 0.02, acc
