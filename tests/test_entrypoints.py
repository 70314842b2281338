"""The commands the README tells people to run keep working in a folder that holds
a train.py / packer.py of the user's own (which `python -m train` would import
first, since `-m` puts the current folder ahead of site-packages)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


@pytest.mark.parametrize("tool, words", [("train", "submit"), ("packer", "pack"), ("transfer", "upload")])
def test_console_scripts_ignore_a_users_own_module_in_the_folder(tmp_path: Path, tool: str, words: str):
    (tmp_path / f"{tool}.py").write_text("print('THE USER SCRIPT RAN')\nraise SystemExit(7)\n")
    r = subprocess.run([str(BIN / tool), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "THE USER SCRIPT RAN" not in r.stdout and words in r.stdout
    # what `python -m` would have done there: the reason the README and Makefile use the scripts
    r = subprocess.run([sys.executable, "-m", tool, "--help"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 7 and "THE USER SCRIPT RAN" in r.stdout
    if sys.version_info < (3, 11):
        return
    # python >= 3.11 -P keeps the folder off sys.path
    r = subprocess.run([sys.executable, "-P", "-m", tool, "--help"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and words in r.stdout
