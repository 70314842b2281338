"""The packer CLI as a user runs it: per-session report, exit codes, no tracebacks."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "packer", *args], capture_output=True, text=True, cwd=cwd,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_check_reports_each_session_and_exits_1(raw_copy: Path):
    victim = sorted(raw_copy.iterdir())[0]
    (victim / "rgb" / "000002.jpg").write_bytes(b"\xff\xd8" + b"\x00" * 300)
    r = run("check", "--raw", str(raw_copy))
    assert r.returncode == 1
    assert f"FAIL  session {victim.name}: rgb/000002.jpg: truncated JPEG" in r.stdout
    assert r.stdout.count("\nok    ") + r.stdout.startswith("ok") >= 2 and "2 of 3 sessions ok" in r.stdout
    assert "PIL: pillow-simd" in r.stdout or "PIL: Pillow" in r.stdout


def test_check_nan_imu_named(raw_copy: Path):
    victim = sorted(raw_copy.iterdir())[1]
    text = (victim / "imu.json").read_text()
    key = '"accel" : ['  # Swift's pretty printing, as the app writes it
    i = text.index(key) + len(key)
    (victim / "imu.json").write_text(text[:i] + "NaN, " + text[i:].split(",", 1)[1])
    r = run("check", "--raw", str(raw_copy))
    assert r.returncode == 1 and f"session {victim.name}: imu.json: NaN/inf" in r.stdout


def test_pack_cli_summary_and_missing_raw(raw_copy: Path, tmp_path: Path):
    r = run("pack", "--raw", str(raw_copy), "--out", str(tmp_path / "p"), "--no-slam", "--quiet", "--timings")
    assert r.returncode == 0, r.stderr
    assert "packed 3 sessions" in r.stdout and "saved" in r.stdout
    assert not list((tmp_path / "p").glob("*.zst"))  # one copy on disk by default
    cpu = {line.split(" s  ", 1)[1]: float(line[4:].split(" s  ")[0]) for line in r.stdout.splitlines()
           if line.startswith("cpu ")}
    assert cpu["workers (decode, resize, encode, frame digest)"] > 0
    assert cpu["encode: plan, sample JSON, tar, publish"] > 0
    assert cpu["total"] == pytest.approx(sum(v for k, v in cpu.items() if k != "total"), abs=0.01)
    r = run("pack", "--raw", str(tmp_path / "absent"), "--out", str(tmp_path / "p"), "--no-slam")
    assert r.returncode == 2 and "raw directory" in r.stderr and "Traceback" not in r.stderr


def test_bad_config_is_a_usage_error(tmp_path: Path):
    (tmp_path / "shardship.toml").write_text("[pack]\nqualty = 80\n")
    r = run("pack", "--no-slam", cwd=tmp_path)
    assert r.returncode == 2 and "unknown key 'qualty'" in r.stderr


def test_synth_offers_every_motion_the_synthesiser_has():
    """The CLI lists the motions by hand (importing the synthesiser would cost every
    packer command numpy's start-up); this keeps the two lists equal."""
    from packer.cli import synth
    from packer.synth import MOTIONS

    opt = next(p for p in synth.params if p.name == "motion")
    assert sorted(opt.type.choices) == sorted(MOTIONS)
