"""The synthetic session generator: layout, determinism, and that the IMU, poses
and images agree with each other (checked from the files, not the generator's code)."""
from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest

from packer.errors import SessionError
from packer.session import load_encoders, load_imu, load_poses, load_session
from packer.synth import TRUTH_FILE, session_name, synth_dataset, synth_session, truth
from packer.synth.trajectory import so3_exp, so3_log

N = 48  # frames: 0.78 s at 60 fps, enough motion for every check below


@pytest.fixture(scope="module")
def sess(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synth_session(tmp_path_factory.mktemp("synth"), "session_2026-01-01_120000", N, seed=7)


def test_layout_and_schemas(sess: Path) -> None:
    names = sorted(p.name for p in sess.iterdir())
    assert names == sorted(
        ["rgb", "imu.json", "encoders.json", "calib.txt", "metadata.json", "poses.json", TRUTH_FILE]
    )
    frames = sorted((sess / "rgb").iterdir())
    assert [p.name for p in frames] == [f"{i:06d}.jpg" for i in range(N)]
    img = cv2.imread(str(frames[0]))
    assert img.shape == (360, 480, 3)
    assert json.loads((sess / "poses.json").read_text()) == []

    imu = json.loads((sess / "imu.json").read_text())
    assert all(set(d) == {"timestamp", "accel", "gyro"} and len(d["accel"]) == 3 and len(d["gyro"]) == 3 for d in imu)
    rate = 1.0 / np.median(np.diff([d["timestamp"] for d in imu]))
    assert rate == pytest.approx(200.0, rel=1e-6)

    enc = json.loads((sess / "encoders.json").read_text())
    assert set(enc[0]) == {"timestamp", "index_mcp", "index_pip", "three_finger_mcp", "three_finger_pip"}
    md = json.loads((sess / "metadata.json").read_text())
    assert md["rgbResolution"] == [480, 360] and md["fps"] == 60 and md["captureSource"] == "StackCapture"
    fx, fy, cx, cy = (float(x) for x in (sess / "calib.txt").read_text().split())
    assert (cx, cy) == (240.0, 180.0) and fx == fy > 0

    # the project's own loader accepts it as a raw, not-yet-SLAMed session
    s = load_session(sess, check_images=True)
    assert s.n_frames == N and s.timestamp_source == "fps" and s.intrinsics == (fx, fy, cx, cy)
    assert load_poses(s) is None
    assert load_imu(s).accel.shape[1] == 3
    e = load_encoders(s)
    assert e is not None and np.ptp(e.values, axis=0).min() > 0.05  # the gripper actually moves

    t = truth(sess)
    assert t["poses"].shape == (N, 4, 4) and t["frame_timestamps"].shape == (N,)
    R = t["R_imu_cam"]
    assert np.allclose(R @ R.T, np.eye(3), atol=1e-9) and np.linalg.det(R) == pytest.approx(1.0)
    assert np.abs(R - np.eye(3)).max() > 0.5  # not identity
    assert np.sort(np.abs(R), axis=1)[:, :2].max() > 0.02  # and not a bare axis permutation


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


def _imu_arrays(sess: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    imu = json.loads((sess / "imu.json").read_text())
    return (
        np.array([d["timestamp"] for d in imu]),
        np.array([d["accel"] for d in imu]),
        np.array([d["gyro"] for d in imu]),
    )


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
    """imu_time = frame_time + offset: cross-correlating gyro speed with the visual
    rotation speed finds +offset."""
    t = truth(sess)
    tau, _, gyro = _imu_arrays(sess)
    T, ts = t["poses"], t["frame_timestamps"]
    mid = (ts[1:] + ts[:-1]) / 2
    vis = np.array([np.linalg.norm(so3_log(a[:3, :3].T @ b[:3, :3])) for a, b in zip(T[:-1], T[1:])]) / np.diff(ts)
    speed = np.linalg.norm(gyro - t["gyro_bias"], axis=1)
    cands = np.arange(-0.08, 0.08, 0.0005)
    err = [np.mean((np.interp(mid[5:-5] + d, tau, speed) - vis[5:-5]) ** 2) for d in cands]
    assert cands[int(np.argmin(err))] == pytest.approx(t["imu_offset"], abs=0.002)


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
    tau, _, _ = _imu_arrays(short)
    video = 11 / 60
    assert tau[-1] - tau[0] == pytest.approx(0.05 + 0.5 * video, abs=0.006)

    bad = synth_session(tmp_path, "nan", 3, seed=1, nan_imu=True)
    with pytest.raises(SessionError, match="NaN"):
        load_imu(load_session(bad))
    # only the IMU differs from the clean session: frames are the same bytes
    clean = synth_session(tmp_path, "clean", 3, seed=1, video=True)
    assert (bad / "rgb/000002.jpg").read_bytes() == (clean / "rgb/000002.jpg").read_bytes()
    jpg = sum(p.stat().st_size for p in (clean / "rgb").iterdir())
    assert 0.2 * jpg < (clean / "video.mov").stat().st_size < jpg  # a raw-only file of realistic size
    assert load_session(clean).n_frames == 3


def test_dataset_names_and_seeds(tmp_path: Path) -> None:
    paths = synth_dataset(tmp_path / "a", 3, 2, seed=5, progress=False)
    assert [p.name for p in paths] == [session_name(5, i) for i in range(3)]
    assert len({p.name for p in paths}) == 3 and all(p.name.startswith("session_20") for p in paths)
    assert len({(p / "rgb/000000.jpg").read_bytes() for p in paths}) == 3  # own trajectories
    assert len({json.dumps(truth(p)["scene"]) for p in paths}) == 1  # one room
    assert not any(p.name.startswith(".") for p in (tmp_path / "a").iterdir())  # no temp dirs left
    # parallel workers write the same bytes
    par = synth_dataset(tmp_path / "b", 2, 2, seed=5, progress=False, workers=2)
    for p, q in zip(paths, par):
        assert (p / "imu.json").read_bytes() == (q / "imu.json").read_bytes()
        assert (p / "rgb/000001.jpg").read_bytes() == (q / "rgb/000001.jpg").read_bytes()
