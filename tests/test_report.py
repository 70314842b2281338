"""`packer report` and `train eval`'s page, looked at in a real headless Chromium
(tests/browser.py): no console errors, no network request, every image decoded,
and the things a person must see are on the page (a refused session's reason, a
session flagged as unusual). Skipped, with the reason, where chromium is not
installed or cannot start."""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from packer.report.outliers import flag_sessions, robust_z
from packer.report.overview import group_warnings, warning_kind
from packer.report.page import anchor
from tests.browser import BrowserUnavailable, PageResult, open_page
from tests.datasets import make_raw

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
SEED = 3
SCALED = "session_2026-01-04_120004"  # its trajectory is made 6x longer: the outlier
REFUSED = "session_2026-01-04_120005"  # its glove clock is 1000 s off: pack refuses it
SKIPPED = "session_2099-01-01_000000"  # put in raw after the pack
GLITCHY = "session_2026-01-04_120001"  # index_pip reads -1 six times in a row: 6 read errors, one gap


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _scale_poses(session: Path, k: float) -> None:
    poses = json.loads((session / "poses.json").read_text())
    for p in poses:
        for r in range(3):
            p["transform"][r][3] *= k
    (session / "poses.json").write_text(json.dumps(poses))


def _shift_glove(session: Path, seconds: float) -> None:
    rows = json.loads((session / "encoders.json").read_text())
    for r in rows:
        r["timestamp"] += seconds
    (session / "encoders.json").write_text(json.dumps(rows))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> tuple[Path, Path]:
    """(raw, packed): 5 packed sessions with metric poses (one moving 6x as far as
    the others), one refused by pack, one in raw that was never packed."""
    from packer.pack import pack
    from shardship.config import PackOptions

    root = tmp_path_factory.mktemp("report")
    raw = make_raw(root / "raw", sessions=6, frames=48, seed=SEED, metric_poses=True)
    assert {SCALED, REFUSED} <= {p.name for p in raw.iterdir()}
    _scale_poses(raw / SCALED, 6.0)
    _shift_glove(raw / REFUSED, 1000.0)
    rows = json.loads((raw / GLITCHY / "encoders.json").read_text())
    for r in rows[10:16]:
        r["index_pip"] = -1.0
    (raw / GLITCHY / "encoders.json").write_text(json.dumps(rows))
    out = root / "packed"
    r = pack(raw, out, PackOptions(workers=2), progress=False)
    assert set(r.failed) == {REFUSED}, r.failed
    shutil.copytree(raw / SCALED, raw / SKIPPED)
    return raw, out


def ov_names(out: Path) -> list[str]:
    from shardship.format import index as fmt

    return sorted(fmt.read(out).doc["sessions"])


def _look(page: Path) -> PageResult:
    try:
        return open_page(page, timeout=120)
    except BrowserUnavailable as e:
        pytest.skip(f"no headless browser: {e}")


def _check_renders(res: PageResult, min_images: int) -> None:
    assert not res.errors, res.errors
    assert len(res.images) >= min_images, res.images
    broken = [i for i in res.images if not i[1] or i[2] <= 0]
    assert not broken, broken
    shot = Image.open(io.BytesIO(res.png))
    assert shot.width == 1280 and shot.height > 1500, shot.size


@pytest.mark.timeout(300)
def test_report_page_in_chromium_shows_refused_skipped_and_flagged(dataset: tuple[Path, Path], tmp_path: Path):
    raw, out = dataset
    page = tmp_path / "report.html"
    p = subprocess.run([PY, "-m", "packer", "report", "--raw", str(raw), "--out", str(out), "--report", str(page),
                        "--quota", "10G", "--workers", "2"], cwd=ROOT, env=_env(), capture_output=True, text=True,
                       timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"refused {REFUSED}: encoders.json" in p.stdout
    assert "5 packed, 1 refused, 1 skipped" in p.stdout
    html = page.read_text()
    assert "http://" not in html.replace("http://www.w3.org", "") and "https://" not in html  # nothing to fetch
    res = _look(page)
    # 5 thumbnails + 5 x (trajectory + signals) + 5 x 6 filmstrip frames
    _check_renders(res, 5 + 10 + 30)
    text = " ".join(res.text.split())
    assert REFUSED in text and "fall outside the video: the clocks disagree" in text
    assert SKIPPED in text and "not packed yet" in text
    # the quota table, the split, and the outlier on the 6x trajectory
    assert "packed data" in text and "checkpoints" in text and "10.0 GB" in text
    assert "train / validation sessions" in text
    flagged = [n for n in ov_names(out) if f'<section class="session flagged" id="{anchor(n)}">' in html]
    assert flagged == [SCALED], flagged
    assert "median speed" in text and "far above the dataset's median" in text
    assert "1 flagged as unusual" in text
    assert "index_pip: 6 read error(s), 1 gap(s) > 0.1 s" in text  # GLITCHY's glove, on its section


def test_report_without_the_raw_folder(dataset: tuple[Path, Path], tmp_path: Path):
    """After `transfer pull` only the packed directory is there: the page is made
    from the shards alone and says what it could not show."""
    from packer.report import write_dataset_report

    _raw, out = dataset
    page = tmp_path / "pulled.html"
    ov = write_dataset_report(out, None, page, workers=1)
    assert ov["n_packed"] == 5 and ov["n_refused"] == 1 and ov["n_skipped"] == 0
    html = page.read_text()
    assert "no encoders.json here (raw folder absent)" in html
    assert html.count('src="data:image/jpeg;base64,') == 30


def test_eval_page_in_chromium(dataset: tuple[Path, Path], tmp_path: Path):
    """train eval's page from chunks read back from the shards (the recorded
    actions, perturbed, stand in for a policy's): every session's figure and the
    three errors per session and overall."""
    from shardship.format import index as fmt
    from train.report import write_eval_page

    _raw, out = dataset
    ix = fmt.read(out)
    val = sorted(ix.doc["sessions"])[:2]
    keys, true, mask = [], [], []
    for sh in ix.shards:
        if sh.session not in val:
            continue
        with open(out / sh.name, "rb") as f:
            for i in range(0, len(sh.samples), 5):
                f.seek(int(sh.samples.json_offset[i]))
                d = json.loads(f.read(int(sh.samples.json_size[i])))
                if d["action"] is not None:
                    keys.append(sh.samples.keys[i])
                    true.append(d["action"])
                    mask.append(d["action_mask"])
    true_a = np.asarray(true)
    pred = true_a + np.random.default_rng(0).normal(0, 0.01, true_a.shape)
    per = {n: {"position_cm": 1.0 + i, "rotation_deg": 2.0, "joint_deg": 3.0} for i, n in enumerate(val)}
    res = {"checkpoint": "x/best.pt", "step": 7, "samples": len(keys), "sampler": "ddim", "ddim_steps": 3,
           "device": "cpu", "val_sessions": val, "per_session": per, "position_cm": 1.5, "rotation_deg": 2.0,
           "joint_deg": 3.0, "pose_metric": True, "units": "cm / deg"}
    page = write_eval_page(out, keys, pred, true_a, np.asarray(mask), res, tmp_path / "eval.html")
    res_page = _look(page)
    assert not res_page.errors, res_page.errors
    assert len(res_page.images) == 2 and all(i[2] > 0 for i in res_page.images), res_page.images
    text = " ".join(res_page.text.split())
    for n in val:
        assert n in text
    assert "overall" in text and "1.5 2 3" in text


def test_gyro_against_camera_rates_agree_at_the_right_offset_only(dataset: tuple[Path, Path]):
    """The recomputed rates: the synthetic gyro at the true clock offset follows
    the camera's rotation rate read back from the shards; 0.25 s off, it does not."""
    from packer.report.raw import rotation_rates
    from packer.report.series import read_series
    from shardship.format import index as fmt

    raw, out = dataset
    name = "session_2026-01-04_120000"
    s = read_series(out, fmt.read(out), name)
    truth = json.loads((raw / name / "synth_truth.json").read_text())
    cal = {"imu_offset": truth["imu_offset"], "gyro_bias": truth["gyro_bias"], "imu_lag": 0.0}
    good, why = rotation_rates(s, raw / name, cal)
    assert good is not None, why
    assert good.correlation > 0.95 and good.rms_diff < 0.1 * float(np.mean(good.visual)), (good.correlation,
                                                                                           good.rms_diff)
    off, _ = rotation_rates(s, raw / name, {**cal, "imu_offset": truth["imu_offset"] + 0.25})
    assert off is not None and off.rms_diff > 3 * good.rms_diff
    none, why = rotation_rates(s, raw / name, {"method": "none"})
    assert none is None and "no gyro alignment" in why


def test_glove_read_errors_and_gaps_on_the_frame_clock(dataset: tuple[Path, Path]):
    from packer.report.raw import glove_events
    from shardship.format import index as fmt

    raw, out = dataset
    entry = fmt.read(out).doc["sessions"][GLITCHY]
    ev, why = glove_events(raw / GLITCHY, entry["clock"]["frame0_epoch"])
    assert ev is not None, why
    assert [len(e) for e in ev.errors] == [0, 6, 0, 0]
    assert [len(g) for g in ev.gaps] == [0, 1, 0, 0]
    (a, b), = ev.gaps[1]
    assert all(a < t < b for t in ev.errors[1]) and 0.1 < b - a < 0.2


def test_robust_z_flags_the_one_unlike_the_rest():
    metrics = {f"s{i}": {"scale": 0.03 + 0.001 * i, "speed": 0.2, "joint_range": None, "gyro_residual": 0.001}
               for i in range(6)}
    metrics["s5"]["scale"] = 0.3
    flags, note = flag_sessions(metrics)
    assert note == ""
    assert [f.quantity for f in flags["s5"]] == ["scale"] and not any(flags[f"s{i}"] for i in range(5))
    assert "far above the dataset's median" in str(flags["s5"][0])
    # identical sessions: no spread, no flags (and no division by zero)
    assert np.all(robust_z(np.ones(5)) == 0)
    few, note = flag_sessions({k: metrics[k] for k in ("s0", "s5")})
    assert not any(few.values()) and "from 4 on" in note


def test_warnings_group_by_kind_across_joints_and_numbers():
    assert warning_kind("index_mcp: 12 of 900 readings are read errors (-1); check the encoder wiring") == \
        warning_kind("three_finger_pip: 3 of 800 readings are read errors (-1); check the encoder wiring") == \
        "<joint> N of N readings are read errors"
    assert warning_kind("index_pip never moves (stays at 3.0 deg): encoder loose or unplugged?") == \
        "<joint> never moves"
    groups = group_warnings({"a": {"warnings": ["index_pip never moves (stays at 3.0 deg): x",
                                                "encoders.json covers 80% of the video: held"]},
                             "b": {"warnings": ["index_mcp never moves (stays at 1.0 deg): x"]}})
    assert [(g["kind"], g["count"], g["sessions"]) for g in groups] == [
        ("<joint> never moves", 2, 2), ("encoders.json covers N of the video", 1, 1)]


def test_templates_ship_with_the_package():
    """An installed (non-editable) shardship has every page template: each .j2 file
    is matched by setup.cfg's package_data of the package that holds it."""
    import configparser
    import fnmatch

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    data = {k: v.split() for k, v in cfg["options.package_data"].items()}
    templates = sorted(ROOT.glob("*/**/templates/*.j2"))
    assert len(templates) >= 3, templates
    for t in templates:
        pkg_dir = t.parent.parent
        pkg = ".".join(pkg_dir.relative_to(ROOT).parts)
        rel = str(t.relative_to(pkg_dir))
        assert any(fnmatch.fnmatch(rel, pat) for pat in data.get(pkg, [])), f"{t} is not in [options.package_data]"


def test_no_index_is_one_line_and_exit_2(tmp_path: Path):
    p = subprocess.run([PY, "-m", "packer", "report", "--out", str(tmp_path / "nothing"), "--no-budget"], cwd=ROOT,
                       env=_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert p.stderr.strip().count("\n") == 0 and "index.json not found: run `packer pack` first" in p.stderr
    assert "Traceback" not in p.stderr


def test_sessions_without_poses_or_glove_still_get_a_section(tmp_path: Path):
    """`packer pack --no-slam` on fresh sessions (no poses), one recorded without
    the glove: the page says so instead of failing or drawing empty axes."""
    from packer.pack import pack
    from packer.report import write_dataset_report
    from shardship.config import PackOptions

    raw = make_raw(tmp_path / "raw", sessions=2, frames=24, seed=5)
    first = sorted(p for p in raw.iterdir() if p.is_dir())[0]
    (first / "encoders.json").unlink()
    out = tmp_path / "packed"
    r = pack(raw, out, PackOptions(workers=1), progress=False)
    assert not r.failed, r.failed
    page = tmp_path / "r.html"
    ov = write_dataset_report(out, raw, page, workers=1)
    assert ov["n_packed"] == 2
    html = page.read_text()
    assert html.count("no poses</div>") == 2 and html.count("no action chunks (no poses)") == 2
    assert "recorded without the glove (joints masked)" in html and "no glove</span>" in html
    res = _look(page)
    assert not res.errors and all(i[2] > 0 for i in res.images), (res.errors, res.images)


def test_a_chromium_that_cannot_start_becomes_the_skip_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """What the page tests skip with on a machine whose chromium dies at start."""
    fake = tmp_path / "bin" / "chromium"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'Missing X server or $DISPLAY' >&2\nexit 13\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")
    page = tmp_path / "p.html"
    page.write_text("<!DOCTYPE html><title>x</title>")
    with pytest.raises(BrowserUnavailable, match=r"chromium exited \(13\): Missing X server"):
        open_page(page, timeout=30)
