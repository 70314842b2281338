"""The same session twice in raw/ (an AirDrop/Finder second export `session_X (1).zip`,
or a renamed copy of a folder): `packer check` and `packer pack` use it once and
say which copy was skipped; the train/validation split never puts two copies of
one recording on different sides. Real exports from `packer synth`, real commands."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from packer.synth import synth_session
from shardship.split import split_sessions
from tests.datasets import write_truth_as_metric
from train.data.index import load_index

ROOT = Path(__file__).resolve().parent.parent
A, B = "session_2026-03-02_090000", "session_2026-03-02_091500"


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "packer", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dups")
    synth_session(root, A, 48, seed=1, export="zip")
    synth_session(root, B, 48, seed=2, export="zip")
    return root


def test_airdrop_second_export_is_packed_once_and_named(exports: Path, tmp_path: Path) -> None:
    raw = shutil.copytree(exports, tmp_path / "raw")
    shutil.copyfile(raw / f"{A}.zip", raw / f"{A} (1).zip")
    shutil.copyfile(raw / f"{A}.metadata.json", raw / f"{A} (1).metadata.json")
    chk = run("check", "--raw", str(raw))
    assert chk.returncode == 0, chk.stdout + chk.stderr
    assert f"skip  {A} (1).zip: the same bytes as {A}.zip" in chk.stdout and "2 of 2 sessions ok" in chk.stdout
    res = run("pack", "--no-slam", "--quiet", "--raw", str(raw), "--out", str(tmp_path / "out"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"skip  {A} (1).zip" in res.stderr and "packed 2 sessions" in res.stdout
    assert not (raw / f"{A} (1)").exists()  # never unpacked
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert sorted(index["sessions"]) == [A, B] and f"{A} (1).zip" in index["skipped"]


def test_copies_unpacked_by_an_earlier_run_are_dropped_from_the_pack(exports: Path, tmp_path: Path) -> None:
    """What an older packer left: both copies unpacked and packed. Now the folder
    copy is skipped (by its suffix) and its shards leave index.json."""
    raw = shutil.copytree(exports, tmp_path / "raw")
    out = tmp_path / "out"
    assert run("pack", "--no-slam", "--quiet", "--raw", str(raw), "--out", str(out)).returncode == 0
    for name in (A, B):
        write_truth_as_metric(raw / name)  # poses, so that the trainer's index has samples
    shutil.copytree(raw / A, raw / f"{A} (1)")
    shutil.copytree(raw / B, raw / "session_renamed_by_hand")  # the same bytes under another name
    res = run("pack", "--no-slam", "--quiet", "--raw", str(raw), "--out", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"skip  {A} (1): the same recording as {A}" in res.stderr
    assert f"skip  session_renamed_by_hand: the same recording as {B}" in res.stderr
    index = json.loads((out / "index.json").read_text())
    assert sorted(index["sessions"]) == [A, B]
    keys = {n: e["content_key"] for n, e in index["sessions"].items()}
    assert keys[A] and keys[B] and keys[A] != keys[B]
    assert load_index(out).session_content == keys


def test_a_second_export_with_other_bytes_is_still_the_same_session(exports: Path, tmp_path: Path) -> None:
    raw = shutil.copytree(exports, tmp_path / "raw")
    data = bytearray((raw / f"{A}.zip").read_bytes())
    data[len(data) // 2] ^= 0xFF  # differs (a damaged copy)
    (raw / f"{A} (2).zip").write_bytes(bytes(data))
    res = run("pack", "--no-slam", "--quiet", "--raw", str(raw), "--out", str(tmp_path / "out"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"skip  {A} (2).zip: a second export of {A}" in res.stderr and "not the same bytes" in res.stderr


@pytest.mark.parametrize("seed", range(40))
def test_the_split_never_separates_copies_of_one_recording(seed: int) -> None:
    names = [f"s{i}" for i in range(8)] + ["s3 (1)", "s5 (1)", "renamed"]
    same = {"s6": "k6", "renamed": "k6"}
    for frac in (0.1, 0.3, 0.5):
        train, val = split_sessions(names, frac, seed, same=same)
        for a, b in (("s3", "s3 (1)"), ("s5", "s5 (1)"), ("s6", "renamed")):
            assert (a in val) == (b in val), (frac, train, val)
        assert sorted(train + val) == sorted(names)
    _, val = split_sessions(names, 0.1, seed, val_sessions=["s3 (1)"], same=same)
    assert val == ["s3", "s3 (1)"]  # the held-out session brings its copy along
