"""The packer CLI's small promises (issue 21.8), as a user meets them in a log: plain
progress lines (no \\r), "FAIL" and the session named once, no lock file left after a
failed pack, and `packer slam --scale none` respected by a later `packer pack`."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

ENV = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}


def packer(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "packer", *args], capture_output=True, text=True, env=ENV,
                          timeout=600)


def test_scale_none_survives_pack_and_a_slam_failure_is_one_clean_line(tmp_path: Path) -> None:
    raw, out = tmp_path / "raw", tmp_path / "packed"
    r = packer("synth", "--out", str(raw), "--sessions", "1", "--frames", "90", "--export", "folder")
    assert r.returncode == 0 and "wrote 1 session to" in r.stdout, r.stderr
    assert "\r" not in r.stderr and "synth: 100% 1 of 1 session," in r.stderr, r.stderr  # off a terminal: lines
    (good,) = [p for p in raw.iterdir() if p.is_dir()]
    r = packer("slam", "--raw", str(raw), "--scale", "none", "--quiet")
    assert r.returncode == 0 and "1 of 1 session ok" in r.stdout, r.stdout + r.stderr
    before = (good / "metadata.json").read_bytes()
    assert json.loads(before)["shardship"]["method"] == "none"

    # a second session whose scale SLAM must refuse (rotation only)
    r = packer("synth", "--out", str(raw), "--sessions", "1", "--frames", "90", "--export", "folder", "--seed", "5",
               "--motion", "rotation-only")
    assert r.returncode == 0, r.stderr
    (bad,) = [p for p in raw.iterdir() if p.is_dir() and p != good]
    r = packer("pack", "--raw", str(raw), "--out", str(out), "--quiet")
    assert r.returncode == 1, r.stdout + r.stderr
    # the user's --scale none stands: SLAM was not redone with the IMU scale
    assert (good / "metadata.json").read_bytes() == before
    index = json.loads((out / "index.json").read_text())
    assert index["sessions"][good.name]["pose_metric"] is False
    (line,) = [ln for ln in r.stderr.splitlines() if bad.name in ln]
    assert line.startswith(f"FAIL  session {bad.name}: slam: ") and line.count(bad.name) == 1, line
    assert "FAILED" not in r.stdout + r.stderr
    assert not (out / ".packer.lock").exists()  # a pack that ended (here: partly failed) leaves no lock file
