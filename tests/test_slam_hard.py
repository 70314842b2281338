"""`packer slam` at the defaults a user runs, on the hard world (`packer synth
--profile`): real hand speeds and what a phone camera does. The sweep over many
seeds is `python -m bench.slam_hard` (bench/results/slam_hard.csv); these are the
gates that keep the defaults honest in CI, one short session each."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.slam_hard import synth_seed
from packer.effects import LOW_TEXTURE_GRAIN, PROFILES, CameraEffects
from packer.session import load_session
from packer.slam.frontend.tracks import track_keyframes
from packer.slam.poses.interpolate import interpolate_poses
from packer.slam.rotations import rotation_mean, so3_log, umeyama
from packer.synth import synth_session, truth
from packer.synth.camera import make_glove
from packer.synth.spec import Rngs
from packer.synth.trajectory import make_trajectory

pytestmark = pytest.mark.slow


def _slam_cli(raw: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "packer", "slam", "--raw", str(raw), "--quiet", *extra],
                          capture_output=True, text=True, timeout=600)


def _errors(d: Path) -> dict[str, float]:
    """Packed poses against the truth: scale error (sim(3) over every posed frame),
    ATE % of the path, rotation RMS (deg) after that alignment."""
    tr = truth(d)
    entries = json.loads((d / "poses.json").read_text())
    idx = np.array([e["rgbIndex"] for e in entries])
    T = np.array([e["transform"] for e in entries])
    gt = tr["poses"][idx]
    s, R, t = umeyama(T[:, :3, 3], gt[:, :3, 3])
    err = np.linalg.norm(s * T[:, :3, 3] @ R.T + t - gt[:, :3, 3], axis=1)
    length = float(np.sum(np.linalg.norm(np.diff(gt[:, :3, 3], axis=0), axis=1)))
    A = rotation_mean(gt[:, :3, :3] @ np.swapaxes(T[:, :3, :3], -1, -2))  # rotations aligned on their own
    ang = np.linalg.norm(so3_log(np.swapaxes(gt[:, :3, :3], -1, -2) @ (A @ T[:, :3, :3])), axis=1)
    return {"scale_err": abs(s - 1.0), "ate": float(np.sqrt(np.mean(err**2))) / length,
            "rot_deg": float(np.degrees(np.sqrt(np.mean(ang**2)))), "posed": len(idx) / len(tr["poses"])}


def test_fast_hand_motion_is_accepted_within_two_percent_at_the_defaults(tmp_path: Path):
    """Real hand speeds (to ~3 rad/s, pauses, flicks) with a 0.25 s IMU clock offset:
    the 0.1 s front-end lost its tracks here and accepted an 11-18% wrong scale."""
    motion, fx = PROFILES["fast"]
    d = synth_session(tmp_path / "raw", "session_2026-02-01_100000", 420, 3, motion=motion, effects=fx,
                      imu_offset=0.25)
    r = _slam_cli(tmp_path / "raw")
    assert r.returncode == 0, r.stdout + r.stderr
    e = _errors(d)
    assert e["scale_err"] < 0.02, e
    assert e["ate"] < 0.01, e
    assert e["rot_deg"] < 1.0, e
    assert e["posed"] > 0.9, e
    info = json.loads((d / "metadata.json").read_text())["shardship"]
    assert abs(info["imu_offset"] - truth(d)["imu_offset"]) < 0.005
    assert e["scale_err"] < 3 * info["scale_rel_std"], (e, info["scale_rel_std"])
    # the same input gives the same poses, to the byte (the mapper on one thread: with two, Ceres' sums came out
    # in either order, ~1e-14 m apart here, and a weak session got a different model each run)
    before = (d / "poses.json").read_bytes()
    r2 = _slam_cli(tmp_path / "raw", "--force")
    assert r2.returncode == 0, r2.stdout + r2.stderr
    assert (d / "poses.json").read_bytes() == before


REASONS = ("registered only", "almost no features", "disagree with the gyro", "scale uncertain",
           "poorly constrained", "not observable")


@pytest.mark.parametrize("profile, seed", [("all", 5), ("low-texture", 1)])
def test_a_hard_camera_is_never_accepted_wrong(tmp_path: Path, profile: str, seed: int):
    """Every effect at once on fast motion, and a plain room: today these are often
    refused (bench/results/slam_hard.csv has the rates). What must hold is the bar:
    an accepted session is within 2% and within 3 of its own reported std; a refused
    one says why in one line, with one of the reasons the README explains."""
    motion, fx = PROFILES[profile]
    d = synth_session(tmp_path / "raw", "session_2026-02-01_100000", 420, seed, motion=motion, effects=fx,
                      imu_offset=0.25)
    r = _slam_cli(tmp_path / "raw")
    assert_never_wrong(d, r, REASONS)
    if profile == "all":  # a weak session: with the mapper on two threads its model changed from run to run
        again = _slam_cli(tmp_path / "raw", "--force")
        fail = [[ln for ln in x.stderr.splitlines() if ln.startswith("FAIL  ")] for x in (r, again)]
        assert again.returncode == r.returncode and fail[0] == fail[1], (r.stderr, again.stderr)


@pytest.mark.parametrize("profile, seed", [("all", 7), ("low-texture", 2)])
def test_a_model_refused_for_its_rotations_is_repaired_and_accepted(tmp_path: Path, profile: str, seed: int):
    """Every camera effect on fast motion (bench seed 7 of the all profile): GLOMAP puts
    the first second's keyframes off and the gyro check refuses that model (23% of the
    rotation rate). A plain room (seed 2 of low texture): the rotations disagree less
    (under the check's 10%) but enough that the scale is refused as distorted. Mapped
    again on the gyro's rotations with the gyro calibrated from the images
    (`gyro_repair`) and scaled by the visual-inertial bundle adjustment, each is accepted
    within 2% and 3 reported std, and says so."""
    motion, fx = PROFILES[profile]
    d = synth_seed(tmp_path / "raw", seed, 600, motion, fx)
    r = _slam_cli(tmp_path / "raw")
    assert r.returncode == 0, r.stdout + r.stderr
    info = json.loads((d / "metadata.json").read_text())["shardship"]
    rep = info["gyro_repair"]
    assert info["gyro_disagreement"] < min(0.05, rep["refused_gyro_disagreement"]), (rep, info)
    assert info["frontend_used"] == "klt, mapped again on the gyro's rotations"
    assert "scaled by the visual-inertial bundle adjustment" in r.stdout, r.stdout
    assert info["solver"] == "viba" and info["viba_imu_chi2"] < 2 and info["scale_model_rel_std"] >= 0.006, info
    assert rep["revisited_tracks"] > 0, rep  # its loops closed where the view came back (`revisits`)
    e = _errors(d)
    assert e["scale_err"] < 0.02 and e["scale_err"] < 3 * info["scale_rel_std"], (e, info["scale_rel_std"])
    assert e["ate"] < 0.01 and e["rot_deg"] < 1.0, e
    tr = truth(d)
    assert abs(rep["camera"][0] / tr["true_intrinsics"][0] - 1) < 0.01  # the focal, 3% off calib.txt, found


def test_a_plain_room_the_windowed_solve_accepts_is_scaled_by_the_bundle_adjustment(tmp_path: Path):
    """A plain room (bench seed 8 of low texture): the windowed solve accepts the SfM
    model and scales it 1.4% small at a 0.85% std (SfM position errors that follow the
    motion). The default `--solver auto` keeps the windowed solve's checks and takes the
    scale and the keyframes from the visual-inertial bundle adjustment on the same model:
    within 0.5% (bench.viba: 0.17%), and 3 of its std."""
    motion, fx = PROFILES["low-texture"]
    d = synth_seed(tmp_path / "raw", 8, 600, motion, fx)
    r = _slam_cli(tmp_path / "raw")
    assert r.returncode == 0, r.stdout + r.stderr
    info = json.loads((d / "metadata.json").read_text())["shardship"]
    assert "gyro_repair" not in info and info["solver"] == "viba" and "viba_refused" not in info, info
    assert abs(info["window_scale"] / info["scale"] - 1) > 0.01, info  # the windowed solve's answer, kept
    e = _errors(d)
    assert e["scale_err"] < 0.005 and e["scale_err"] < 3 * info["scale_rel_std"], (e, info["scale_rel_std"])
    assert e["ate"] < 0.01 and e["rot_deg"] < 1.0, e


def _every_effect_accepted(tmp_path: Path, seed: int) -> tuple[Path, dict]:
    """(the session, metadata.json's shardship fields) of every camera effect on fast
    motion, bench seed `seed`, through the CLI at the defaults: accepted (`assert_never_wrong`),
    within 2% and 3 of its std, ATE under 1% of the path, rotation under 1 deg RMS."""
    motion, fx = PROFILES["all"]
    d = synth_seed(tmp_path / "raw", seed, 600, motion, fx)
    r = _slam_cli(tmp_path / "raw")
    assert_never_wrong(d, r, REASONS)
    assert r.returncode == 0, r.stdout + r.stderr
    info = json.loads((d / "metadata.json").read_text())["shardship"]
    e = _errors(d)
    assert e["scale_err"] < 0.02 and e["scale_err"] < 3 * info["scale_rel_std"], (e, info["scale_rel_std"])
    assert e["ate"] < 0.01 and e["rot_deg"] < 1.0, e
    return d, info


def test_a_model_that_splits_is_mapped_in_parts_tied_where_the_view_comes_back(tmp_path: Path):
    """Every camera effect, bench seed 12: the model mapped again on the gyro's rotations
    splits where the view turns plain (GLOMAP's pruning returns clusters of 70, 53 and 28
    keyframes) and no track crosses one of the two gaps, so the IMU alone placed the
    later parts and the session was refused at +-2.3%. The same corners seen again from
    another part (`revisits`: SIFT at the tracked corners of keyframes looking the same
    way, verified on the gyro's rotation) tie all three in the images (`part_links`):
    accepted within 2% and 3 of its std with no join term left, rotations within 1 deg
    RMS (0.5; 1.0 when the IMU joined them), the parts named."""
    from packer.slam.repair.repaired import MIN_LINKS

    _d, info = _every_effect_accepted(tmp_path, 12)
    rep = info["gyro_repair"]
    assert len(rep["parts"]) == 3 and all("cluster_of" in p for p in rep["parts"][1:]), rep["parts"]
    shared = np.array(rep["shared_points"])
    assert rep["revisited_tracks"] > 0 and (shared[np.triu_indices(3, 1)] >= MIN_LINKS).all(), rep
    assert "scale_join_rel_std" not in info, info.get("scale_join_rel_std")


def test_a_session_that_split_on_a_plain_stretch_is_accepted_at_the_defaults(tmp_path: Path):
    """Every camera effect, bench seed 11: with keyframes 0.1 s apart its plain stretches
    left consecutive keyframes 9-13 shared corners, GLOMAP's view graph split there, the
    second try too (25/98 keyframes even from the true calibration), and it was refused.
    With keyframes halfway where tracks are scarce it maps, and is accepted within 2% and
    3 of its std, its rotations within 1 deg RMS."""
    _every_effect_accepted(tmp_path, 11)


def test_when_every_gyro_alignment_is_wrong_the_tracks_rotation_chain_starts_the_second_try(tmp_path: Path):
    """Every camera effect, bench seed 16: the refused model's gyro alignment, the only
    start there was, sat 100 deg and 0.26 s off, and the second try bent the camera
    (focal length 170 px for a true 412): refused. The rotations chained from the tracks
    alone (`rotation_chain`) put the clock within 2 ms and the camera-IMU rotation within
    15 deg; from there the session is accepted within 2% and 3 of its std."""
    _d, info = _every_effect_accepted(tmp_path, 16)
    assert info["gyro_repair"]["start"]["chosen"].startswith("the rotation chain (from the refused model"), info
    assert "focal length went to" in info["gyro_repair"]["start"]["chosen"]  # why the first start was left


def test_a_model_that_registers_too_few_gets_the_second_try(tmp_path: Path):
    """Every camera effect, bench seed 24: the first model broke into parts of 48, 20 and
    18 of 101 keyframes and was refused before any gyro check, so the repair never ran.
    Now it maps again on the gyro's rotations (session 16: that model split too, 41/97,
    the rest mapped alone 16/57; with the keyframes halfway on plain stretches, 62/136 at
    first, and the second try placed the path too loosely, +-2.0-2.2%, its two parts
    joined by the IMU alone). Its parts now share 200 points where the view comes back
    (`revisits`): accepted within 2% and 3 of its std (+0.25% at +-0.61%)."""
    _d, info = _every_effect_accepted(tmp_path, 24)
    assert info["frontend_used"] == "klt, mapped again on the gyro's rotations", info["frontend_used"]
    assert len(info["gyro_repair"]["parts"]) >= 2 and "scale_join_rel_std" not in info, info["gyro_repair"]


def test_a_repaired_model_gets_its_clock_offset_from_the_bundle_adjustment(tmp_path: Path):
    """Every camera effect, bench seed 44: the repair keeps the clock offset of the
    alignment it started from, 8.8 ms off here, and at fast turns the IMU factors could
    not fit (chi^2/dof 2.62, refused over 2). The adjustment's own search
    (`viba_timing`) moves it to within 2 ms of the truth, the factors fit (under 1) and the
    session is accepted within 2% and 3 of its std."""
    d, info = _every_effect_accepted(tmp_path, 44)
    assert abs(info["imu_offset_shift"]) > 0.004, info["imu_offset_shift"]
    assert abs(info["imu_offset"] - truth(d)["imu_offset"]) < 0.002, (info["imu_offset"], truth(d)["imu_offset"])
    assert info["viba_imu_chi2"] < 1.0, info["viba_imu_chi2"]


def test_a_stretch_that_fails_alone_does_not_stop_the_others(tmp_path: Path):
    """Every camera effect, bench seed 62: mapped again on the gyro's rotations it placed
    keyframes 60-94 of 117, GLOMAP's clusters one more stretch (32-48); its first 3.7 s,
    mapped alone, saw too few points, and that refusal stopped the repair before the
    last 15 keyframes were tried. Now each stretch is tried: the parts around the plain
    start hold over half the keyframes, the failed one is named in the metadata, and the
    session is accepted within 2% and 3 of its std (its clock offset, 18 ms off from the
    repair's start, searched by the adjustment: 3.5 ms off)."""
    d, info = _every_effect_accepted(tmp_path, 62)
    rep = info["gyro_repair"]
    assert len(rep["parts"]) >= 3 and any("mapped alone, failed" in f for f in rep["left_out_failed"]), rep
    assert abs(info["imu_offset"] - truth(d)["imu_offset"]) < 0.005, (info["imu_offset"], truth(d)["imu_offset"])


def test_a_repair_that_keeps_no_well_seen_keyframe_is_a_refusal_not_a_crash(tmp_path: Path):
    """A fast hand over a plain room with the glove in view (every-effect seed 4 without
    the lens, blur and exposure): mapped again on the gyro's rotations, none of the 9
    keyframes GLOMAP kept saw 30 points, and the repair died of an IndexError. Now the
    session is refused in one line, the first refusal followed by what the repair found."""
    fx = CameraEffects(low_texture=LOW_TEXTURE_GRAIN, glove=True)
    d = synth_seed(tmp_path / "raw", 4, 600, "fast", fx)
    r = _slam_cli(tmp_path / "raw")
    assert_never_wrong(d, r, REASONS)


def assert_never_wrong(d: Path, r: subprocess.CompletedProcess, reasons: tuple[str, ...]) -> None:
    """The bar for a hard session: accepted within 2% and 3 of its own reported std,
    or refused in one line that names one of `reasons`, without a traceback; and no
    flood from GTSAM (a point behind a camera printed 100 KB on every-effect seed 5
    while the clock offset was searched, and stalled a caller reading the pipe late)."""
    out = r.stdout + r.stderr
    assert "CheiralityException" not in out and len(out) < 4000, out[-2000:]
    if r.returncode == 0:
        e = _errors(d)
        std = json.loads((d / "metadata.json").read_text())["shardship"]["scale_rel_std"]
        assert e["scale_err"] < 0.02 and e["scale_err"] < 3 * std, (e, std)
    else:
        failed = [ln for ln in r.stderr.splitlines() if ln.startswith("FAIL  ")]
        assert len(failed) == 1 and any(k in failed[0] for k in reasons), r.stderr
        assert "Traceback" not in r.stderr


def test_the_gloves_tracks_never_reach_the_model(tmp_path: Path):
    """The palm and its logo are rigid to the camera: corners there pass the
    forward-backward check and fit any essential matrix when the camera mostly turns.
    None of their observations may reach SfM. What may: a scene corner where the
    palm's outline crosses the texture (its 7x7 window straddles the edge), a few px
    inside the outline before the epipolar check stops it."""
    import cv2

    seed = 7
    d = synth_session(tmp_path, "session_2026-02-01_110000", 240, seed, effects=CameraEffects(glove=True))
    s = load_session(d)
    glove = make_glove(Rngs.from_seed(seed).camera, 480, 360)  # the camera stream's first draw
    tracks = track_keyframes(s.frame_paths, 6)
    obs = np.vstack(tracks.points) - 0.5  # COLMAP pixel centres back to OpenCV's
    xi = np.clip(obs[:, 0].round().astype(int), 0, 479)
    yi = np.clip(obs[:, 1].round().astype(int), 0, 359)
    depth = cv2.distanceTransform(glove.mask.astype(np.uint8) * 255, cv2.DIST_L2, 3)[yi, xi]  # px into the palm
    assert len(obs) > 1000
    assert float(depth.max()) <= 6.0, f"an observation {depth.max():.0f} px inside the glove"
    assert int((depth > 0).sum()) < 0.005 * len(obs)


def test_a_plain_stretch_gets_keyframes_halfway_so_each_pair_keeps_enough_corners(tmp_path: Path):
    """Every effect at once (bench seed 11, 4 s): looking at a plain wall, blurred, one
    keyframe pair 0.1 s apart shared only 9 corners, under the 15 COLMAP's view graph
    needs, and the model split there. A frame halfway that shares fewer than
    `scarce_shared` tracks with the last keyframe becomes a keyframe too."""
    from packer.slam.frontend.tracks import TrackOptions

    motion, fx = PROFILES["all"]
    d = synth_seed(tmp_path, 11, 240, motion, fx)
    paths = load_session(d).frame_paths

    def shared(opt: TrackOptions) -> tuple[int, list[int]]:
        t = track_keyframes(paths, 6, opt)
        return len(t.keyframes), [len(np.intersect1d(a, b)) for a, b in zip(t.ids, t.ids[1:])]

    k0, before = shared(TrackOptions(scarce_shared=0))
    k1, after = shared(TrackOptions())
    assert min(before) < 15, before  # the weak pair is still in the render
    assert min(after) >= 15, after
    assert k0 < k1 <= 1.25 * k0  # keyframes only where the tracks are scarce


def test_a_user_mask_keeps_corners_out(tmp_path: Path):
    import cv2

    d = synth_session(tmp_path, "session_2026-02-01_120000", 60, 2)
    mask = np.full((360, 480), 255, np.uint8)
    mask[:, :240] = 0
    cv2.imwrite(str(d / "mask.png"), mask)
    from packer.slam.frontend.tracks import TrackOptions
    from packer.slam.options import SlamOptions
    from packer.slam.pipeline import _load_mask

    m = _load_mask(load_session(d), SlamOptions(mask="mask.png").mask)
    tracks = track_keyframes(load_session(d).frame_paths, 6, TrackOptions(mask=m))
    first = tracks.points[0] - 0.5
    assert len(first) > 50 and float(first[:, 0].min()) >= 240 - 1


@pytest.mark.parametrize("motion", ["hand", "fast"])
def test_interpolation_between_keyframes_keeps_the_scale(motion: str):
    """Perfect keyframes 0.1 s apart (the default spacing): the cubic between them
    must not shrink the path by more than 0.1% (0.2 s shrank fast motion by up to 0.2%)."""
    worst = 0.0
    for seed in range(4):
        tr = make_trajectory(np.random.default_rng(seed), motion, np.zeros(3), np.array([0.0, 1.0, -0.5]))
        kt = np.arange(0, 12, 0.1)
        t = np.arange(0, kt[-1] + 1e-9, 1 / 60)  # frames past the last keyframe get no pose
        P, _fl = interpolate_poses(t, kt, tr.poses(kt))
        s, _R, _t = umeyama(P[:, :3, 3], tr.position(t))
        worst = max(worst, abs(s - 1.0))
    assert worst < 0.001


@pytest.fixture(scope="module")
def fast_phone(tmp_path_factory) -> Path:
    """`packer synth --profile fast-phone`, bench seed 4, 10 s: rendered once, copied per test."""
    from packer.effects import PHONE_RIGS

    motion, fx = PROFILES["fast-phone"]
    return synth_seed(tmp_path_factory.mktemp("fast_phone"), 4, 600, motion, fx, PHONE_RIGS["fast-phone"])


def _copy(session: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(session, tmp_path / "raw" / session.name))


def test_a_phone_whose_imu_sits_off_the_camera_is_scaled_right_at_the_defaults(tmp_path: Path, fast_phone: Path):
    """Vigorous hand motion (~1 g, to ~3 rad/s) on a phone whose IMU sits 4-8 cm from the
    camera and starts 0.05-0.3 s before frame 0, with an off-centre principal point
    (`packer synth --profile fast-phone`, bench seed 4, 10 s). The lever arm's
    acceleration, read as motion, had made the adjustment refuse and the windowed
    answer be kept 1.6% off at 2.4 std; found now (`imu_lever_arm`), the session is
    accepted within 2% and 3 std."""
    d = _copy(fast_phone, tmp_path)
    r = _slam_cli(tmp_path / "raw")
    assert_never_wrong(d, r, ())
    assert r.returncode == 0, r.stderr
    info = json.loads((d / "metadata.json").read_text())["shardship"]
    tr = truth(d)
    assert info["solver"] == "viba" and info["viba_imu_chi2"] < 1.0, info
    assert np.linalg.norm(np.subtract(info["imu_lever_arm"], tr["phone_rig"]["lever_arm"])) < 0.015, info
    assert abs(info["imu_offset"] - tr["imu_offset"]) < 0.005


def test_where_the_adjustment_refuses_a_fast_phone_session_the_windowed_answer_is_not_kept(tmp_path: Path,
                                                                                            fast_phone: Path):
    """The same session with the lever arm left out (`[scale] lever_arm = false`, the
    stage before): the adjustment refuses it (IMU chi^2/dof 3.2 where the images fit to
    0.9 px), and so the session is refused, naming the IMU model, not the scene, and
    quoting the windowed answer it did not keep (the stage before kept it)."""
    d = _copy(fast_phone, tmp_path)
    (tmp_path / "shardship.toml").write_text("[scale]\nlever_arm = false\n")
    r = subprocess.run([sys.executable, "-m", "packer", "slam", "--raw", str(tmp_path / "raw"), "--quiet",
                        "--config", str(tmp_path / "shardship.toml")], capture_output=True, text=True, timeout=600)
    assert_never_wrong(d, r, ("the IMU's motion does not fit them",))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "the scene is not the cause" in r.stderr and "texture" not in r.stderr, r.stderr
    assert "the windowed accelerometer solve alone gave" in r.stderr and "not accepted" in r.stderr, r.stderr


def test_a_room_papered_with_photographs_is_never_accepted_wrong(tmp_path: Path):
    """Real photographs on every surface (brick, grass, gravel, printed pages, posters),
    the glove, lens, blur, rolling shutter and exposure, fast hand, a phone's build
    (`--profile photos`, bench seed 3, 10 s): where a room like it was made elsewhere all
    seven errors leaned one way. Accepted within 2% and 3 std, or refused in one line."""
    pytest.importorskip("skimage")
    from packer.effects import PHONE_RIGS

    motion, fx = PROFILES["photos"]
    d = synth_seed(tmp_path / "raw", 3, 600, motion, fx, PHONE_RIGS["photos"])
    r = _slam_cli(tmp_path / "raw")
    assert_never_wrong(d, r, REASONS + ("still disagree",))
