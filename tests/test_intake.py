"""packer.intake: session zips from the phone -> session folders, safely and atomically.

Every test builds real zips with zipfile in tmp_path, the way the app (or a Mac's
"Compress") lays them out, and checks what lands on disk."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import zipfile
from pathlib import Path

import cv2
import numpy as np
import pytest

from packer import intake
from packer.intake import Extracted, extract_all, extract_export, find_exports
from shardship.errors import SessionError

NAME = "session_2024-05-01_120000"


def jpeg(seed: int) -> bytes:
    img = np.random.default_rng(seed).integers(0, 255, (8, 8, 3), dtype=np.uint8)
    ok, buf = cv2.imencode(".jpg", img)
    assert ok
    return buf.tobytes()


def session_files(frames: int = 3, metadata: bool = True) -> dict[str, bytes]:
    """Relative path -> bytes of a small StackCapture session."""
    files = {f"rgb/{i:06d}.jpg": jpeg(i) for i in range(frames)}
    files["imu.json"] = json.dumps([{"timestamp": 0.0, "accel": [0, 0, 9.8]}]).encode()
    files["poses.json"] = json.dumps([{"timestamp": 0.0, "rgbIndex": 0}]).encode()
    files["encoders.json"] = b"[]"
    files["calib.txt"] = b"400 400 240 180\n"
    files["video.mov"] = os.urandom(2048)
    if metadata:
        files["metadata.json"] = json.dumps({"captureSource": "ARKit", "fps": 60}).encode()
    return files


def write_zip(path: Path, files: dict[str, bytes], top: str | None = NAME, extra: list[tuple] = (),
              dirs: bool = True) -> Path:
    """Write `files` under `top/` (None: at the root); `extra` = (ZipInfo|name, bytes)
    members added verbatim, e.g. unsafe ones."""
    prefix = f"{top}/" if top else ""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        if dirs and top:
            zf.writestr(zipfile.ZipInfo(prefix), b"")
        for rel, data in files.items():
            zf.writestr(prefix + rel, data)
        for info, data in extra:
            zf.writestr(info, data)
    return path


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def raw(tmp_path: Path) -> Path:
    d = tmp_path / "raw"
    d.mkdir()
    return d


def assert_only(raw: Path, *names: str) -> None:
    assert sorted(os.listdir(raw)) == sorted(names)


def test_one_top_folder_extracts_identical_bytes_and_zip_untouched(raw: Path):
    files = session_files()
    z = write_zip(raw / f"{NAME}.zip", files)
    before = (sha(z), z.stat().st_mtime_ns, z.stat().st_size)

    res = extract_export(z, raw)

    assert res == Extracted(z, raw / NAME, "extracted", False)
    assert tree(raw / NAME) == files
    assert (sha(z), z.stat().st_mtime_ns, z.stat().st_size) == before
    assert_only(raw, f"{NAME}.zip", NAME)
    assert stat.S_IMODE((raw / NAME / "metadata.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((raw / NAME / "rgb").stat().st_mode) == 0o755
    assert stat.S_IMODE((raw / NAME).stat().st_mode) == 0o755


def test_top_folder_with_other_name_goes_into_stem(raw: Path):
    files = session_files(frames=1)
    z = write_zip(raw / f"{NAME}.zip", files, top="renamed_by_user", dirs=False)
    res = extract_export(z, raw)
    assert res.session_dir == raw / NAME and res.status == "extracted"
    assert tree(raw / NAME) == files
    assert_only(raw, f"{NAME}.zip", NAME)


def test_no_top_folder_extracts_as_is(raw: Path):
    files = session_files(frames=2)
    z = write_zip(raw / f"{NAME}.zip", files, top=None)
    res = extract_export(z, raw)
    assert res.status == "extracted"
    assert tree(raw / NAME) == files


def test_modes_are_fixed_not_from_zip_or_umask(raw: Path):
    info = zipfile.ZipInfo(f"{NAME}/run.sh")
    info.external_attr = (stat.S_IFREG | 0o4777) << 16
    z = write_zip(raw / f"{NAME}.zip", session_files(frames=1), extra=[(info, b"#!/bin/sh\n")])
    old = os.umask(0o077)  # a strict umask must not make the session unreadable to others
    try:
        extract_export(z, raw)
    finally:
        os.umask(old)
    modes = {p.relative_to(raw).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in (raw / NAME).rglob("*")}
    assert modes["session_2024-05-01_120000/run.sh"] == 0o644
    assert modes["session_2024-05-01_120000/rgb"] == 0o755
    assert set(modes.values()) == {0o644, 0o755}
    assert stat.S_IMODE((raw / NAME).stat().st_mode) == 0o755


def test_sidecar_used_when_zip_lacks_metadata(raw: Path):
    z = write_zip(raw / f"{NAME}.zip", session_files(metadata=False))
    sidecar = raw / f"{NAME}.metadata.json"
    sidecar.write_bytes(b'{"captureSource": "sidecar"}')
    res = extract_export(z, raw)
    assert res.sidecar_used is True
    assert (raw / NAME / "metadata.json").read_bytes() == b'{"captureSource": "sidecar"}'
    assert sidecar.read_bytes() == b'{"captureSource": "sidecar"}'  # copied, not moved


def test_sidecar_ignored_when_zip_has_metadata(raw: Path):
    files = session_files()
    z = write_zip(raw / f"{NAME}.zip", files)
    (raw / f"{NAME}.metadata.json").write_bytes(b'{"captureSource": "sidecar"}')
    res = extract_export(z, raw)
    assert res.sidecar_used is False
    assert (raw / NAME / "metadata.json").read_bytes() == files["metadata.json"]


def test_no_metadata_and_no_sidecar_still_extracts(raw: Path):
    z = write_zip(raw / f"{NAME}.zip", session_files(frames=1, metadata=False))
    res = extract_export(z, raw)
    assert res.status == "extracted" and res.sidecar_used is False
    assert not (raw / NAME / "metadata.json").exists()


def test_existing_folder_wins(raw: Path):
    z = write_zip(raw / f"{NAME}.zip", session_files())
    (raw / f"{NAME}.metadata.json").write_text("{}")
    (raw / NAME).mkdir()
    (raw / NAME / "poses.json").write_text("my own SLAM")
    mtime = (raw / NAME / "poses.json").stat().st_mtime_ns

    res = extract_export(z, raw)

    assert res == Extracted(z, raw / NAME, "already", False)
    assert tree(raw / NAME) == {"poses.json": b"my own SLAM"}
    assert (raw / NAME / "poses.json").stat().st_mtime_ns == mtime


def test_target_that_is_a_file_is_refused(raw: Path):
    z = write_zip(raw / f"{NAME}.zip", session_files(frames=1))
    (raw / NAME).write_text("not a folder")
    with pytest.raises(SessionError, match="not a folder"):
        extract_export(z, raw)
    assert (raw / NAME).read_text() == "not a folder"


def _symlink(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    return info


def _fifo(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.external_attr = (stat.S_IFIFO | 0o644) << 16
    return info


@pytest.mark.parametrize("member, why", [
    ("../evil.txt", "'..'"),
    (f"{NAME}/rgb/../../../evil.txt", "'..'"),
    ("/tmp/evil.txt", "absolute"),
    ("C:/evil.txt", "drive letter"),
    (f"{NAME}\\..\\evil.txt", "backslash"),
    (_symlink(f"{NAME}/rgb/000009.jpg"), "symlink"),
    (_fifo(f"{NAME}/fifo"), "not a regular file"),
])
def test_unsafe_member_refuses_whole_zip(raw: Path, tmp_path: Path, member, why: str):
    payload = b"/etc/passwd" if isinstance(member, zipfile.ZipInfo) else b"pwned"
    z = write_zip(raw / f"{NAME}.zip", session_files(frames=1), extra=[(member, payload)])
    before = sha(z)
    with pytest.raises(SessionError, match=why) as ei:
        extract_export(z, raw)
    name = member.filename if isinstance(member, zipfile.ZipInfo) else member
    assert ei.value.path == f"{NAME}.zip" and ei.value.session == NAME
    assert repr(name) in ei.value.reason
    assert_only(raw, f"{NAME}.zip")
    assert sorted(os.listdir(tmp_path)) == ["raw"]  # nothing escaped either
    assert sha(z) == before


def test_two_top_folders_refused(raw: Path):
    z = raw / f"{NAME}.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("session_a/metadata.json", b"{}")
        zf.writestr("session_b/metadata.json", b"{}")
        zf.writestr("__MACOSX/session_a/._metadata.json", b"x")
    with pytest.raises(SessionError, match=r"more than one top-level folder \(session_a, session_b\)") as ei:
        extract_export(z, raw)
    assert ei.value.path == f"{NAME}.zip"
    assert_only(raw, f"{NAME}.zip")


def test_duplicate_member_refused(raw: Path):
    with pytest.warns(UserWarning):  # zipfile itself warns on the duplicate name
        z = write_zip(raw / f"{NAME}.zip", session_files(frames=1), extra=[(f"{NAME}/imu.json", b"2nd")])
    with pytest.raises(SessionError, match="appears twice"):
        extract_export(z, raw)
    assert_only(raw, f"{NAME}.zip")


def test_macosx_and_ds_store_skipped(raw: Path):
    files = session_files(frames=2)
    extra = [("__MACOSX/", b""), (f"__MACOSX/{NAME}/._metadata.json", b"\x00\x05\x16\x07"),
             (f"{NAME}/.DS_Store", b"Bud1"), (f"{NAME}/rgb/.DS_Store", b"Bud1")]
    z = write_zip(raw / f"{NAME}.zip", files, extra=extra)
    res = extract_export(z, raw)
    assert res.status == "extracted"
    assert tree(raw / NAME) == files


def test_truncated_zip_refused_nothing_left(raw: Path):
    good = write_zip(raw / "good.zip", session_files())
    z = raw / f"{NAME}.zip"
    z.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    good.unlink()
    with pytest.raises(SessionError, match="re-export it from the phone") as ei:
        extract_export(z, raw)
    assert ei.value.path == f"{NAME}.zip"
    assert_only(raw, f"{NAME}.zip")


def test_corrupt_member_data_refused_and_temp_removed(raw: Path):
    """Central directory intact, a member's bytes flipped: fails mid-extraction
    (after other files were written) on the CRC check; the temp must go."""
    z = raw / f"{NAME}.zip"
    marker = b"MARKER" * 200
    with zipfile.ZipFile(z, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr(f"{NAME}/metadata.json", b"{}")
        zf.writestr(f"{NAME}/video.mov", marker)
    data = bytearray(z.read_bytes())
    i = data.index(marker) + 100
    data[i] ^= 0xFF
    z.write_bytes(bytes(data))
    with pytest.raises(SessionError, match=r"corrupt member '.*video\.mov'.*re-export it from the phone"):
        extract_export(z, raw)
    assert_only(raw, f"{NAME}.zip")


def test_disk_full_while_writing_cleans_up(raw: Path, monkeypatch):
    z = write_zip(raw / f"{NAME}.zip", session_files())
    calls = []

    def full(src, dst, length=0):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(src, dst, length)

    original = intake.shutil.copyfileobj
    monkeypatch.setattr(intake.shutil, "copyfileobj", full)
    with pytest.raises(SessionError, match=r"disk full .* free \d+ MiB"):
        extract_export(z, raw)
    assert_only(raw, f"{NAME}.zip")


def test_not_enough_free_space_refused_before_writing(raw: Path, monkeypatch):
    z = write_zip(raw / f"{NAME}.zip", session_files())
    monkeypatch.setattr(intake, "_free_bytes", lambda path: 100)
    with pytest.raises(SessionError, match=r"needs 1 MiB but .* has 0 MiB free: free 1 MiB"):
        extract_export(z, raw)
    assert_only(raw, f"{NAME}.zip")


def test_zip_bomb_refused(raw: Path, monkeypatch):
    monkeypatch.setattr(intake, "BOMB_MIN_BYTES", 1 << 20)
    z = raw / f"{NAME}.zip"
    with zipfile.ZipFile(z, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"{NAME}/metadata.json", b"{}")
        zf.writestr(f"{NAME}/video.mov", bytes(4 << 20))  # 4 MiB of zeros -> ~4 KiB
    with pytest.raises(SessionError, match="zip bomb"):
        extract_export(z, raw)
    assert_only(raw, f"{NAME}.zip")


def test_highly_compressible_but_small_is_not_a_bomb(raw: Path):
    z = raw / f"{NAME}.zip"
    with zipfile.ZipFile(z, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"{NAME}/video.mov", bytes(4 << 20))  # ratio > 200 but far below 1 GiB
    assert extract_export(z, raw).status == "extracted"
    assert (raw / NAME / "video.mov").stat().st_size == 4 << 20


def test_stale_temp_from_killed_run_is_redone(raw: Path):
    files = session_files()
    z = write_zip(raw / f"{NAME}.zip", files)
    stale = raw / f".{NAME}.unzip-tmp"
    (stale / "rgb").mkdir(parents=True)
    (stale / "rgb" / "000000.jpg").write_bytes(b"half")
    (stale / "junk").write_bytes(b"from the killed run")
    res = extract_export(z, raw)
    assert res.status == "extracted"
    assert tree(raw / NAME) == files
    assert_only(raw, f"{NAME}.zip", NAME)


def test_find_exports_only_visible_zips_sorted(raw: Path):
    for n in ("session_b.zip", "session_a.zip", "._session_a.zip", "session_a.metadata.json", "notes.txt"):
        (raw / n).write_bytes(b"x")
    (raw / "session_c").mkdir()
    (raw / "dir.zip").mkdir()
    assert find_exports(raw) == [raw / "session_a.zip", raw / "session_b.zip"]
    assert find_exports(raw / "missing") == []


def test_extract_all_continues_past_bad_zip(raw: Path):
    files = session_files(frames=2)
    write_zip(raw / "session_a.zip", files)
    (raw / "session_b.zip").write_bytes(b"PK\x03\x04 this is not a zip")
    write_zip(raw / "session_c.zip", files, top=None)
    (raw / "session_d").mkdir()
    (raw / "session_d" / "notes.txt").write_text("the user's own folder")  # (an empty one is an unzip's leftover)
    write_zip(raw / "session_d.zip", files)

    done, failed = extract_all(raw)

    assert [(e.zip_path.name, e.status) for e in done] == [
        ("session_a.zip", "extracted"), ("session_c.zip", "extracted"), ("session_d.zip", "already")]
    assert list(failed) == ["session_b.zip"]
    assert "re-export it from the phone" in failed["session_b.zip"]
    assert tree(raw / "session_a") == files and tree(raw / "session_c") == files
    assert not (raw / "session_b").exists()
    assert os.listdir(raw / "session_d") == ["notes.txt"]
    assert not [p for p in os.listdir(raw) if p.endswith(".unzip-tmp")]

    again, failed_again = extract_all(raw)  # idempotent: everything is "already" now
    assert [e.status for e in again] == ["already"] * 3 and list(failed_again) == ["session_b.zip"]


# --- issue 39, item 6: rendered sessions (packer.synth) in the app's export format, through `packer check` ---

SYNTH = "session_2026-03-02_090000"
N_FRAMES = 40


@pytest.fixture(scope="module")
def app_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One rendered session as the app exports it: SYNTH.zip (the folder as its one top
    folder) + SYNTH.metadata.json; read-only, tests copy it."""
    from packer.synth import synth_session

    return synth_session(tmp_path_factory.mktemp("synth"), SYNTH, n_frames=N_FRAMES, seed=3, export="zip")


@pytest.fixture
def exported(app_zip: Path, raw: Path) -> Path:
    """raw/ holding a copy of the export (zip + sidecar); returns the zip's path there."""
    for p in (app_zip, app_zip.with_suffix(".metadata.json")):
        (raw / p.name).write_bytes(p.read_bytes())
    return raw / app_zip.name


def check(raw: Path):
    from click.testing import CliRunner

    from packer.cli import main

    return CliRunner().invoke(main, ["check", "--raw", str(raw)])


def rezip(z: Path, rename=lambda name: name, extra: list[tuple[str, bytes]] = ()) -> None:
    """Rewrite zip `z` in place: every member under `rename(its name)` (None drops it),
    then the `extra` (name, bytes) members, as a user's re-zip on a Mac would."""
    with zipfile.ZipFile(z) as zf:
        members = [(i, zf.read(i)) for i in zf.infolist()]
    with zipfile.ZipFile(z, "w") as zf:
        for info, data in members:
            name = rename(info.filename)
            if name is not None:
                info.filename = name
                zf.writestr(info, data)
        for name, data in extra:
            zf.writestr(name, data)


def interrupted_unzip(z: Path, raw: Path, whole: int) -> Path:
    """What an unzip that stopped midway (Finder or `unzip` hitting a full disk, a killed
    run) leaves in raw/: the zip's first `whole` files in its order, the next one cut in
    half, and nothing after it. Returns the session folder it made."""
    with zipfile.ZipFile(z) as zf:
        n = 0
        for info in zf.infolist():
            dest = raw / info.filename
            if info.is_dir():
                dest.mkdir(parents=True, exist_ok=True)
                continue
            data = zf.read(info)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data if n < whole else data[: len(data) // 2])
            n += 1
            if n > whole:
                break
    return raw / z.stem


def ok_line(out: str, name: str = SYNTH) -> str:
    lines = [ln for ln in out.splitlines() if ln.startswith(f"ok    {name}:")]
    assert len(lines) == 1, out
    return lines[0]


APPLEDOUBLE = b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        " + bytes(64)


def test_appledouble_files_in_a_copied_folder_are_ignored(exported: Path, raw: Path):
    """A folder copied from a Mac onto exFAT/SMB gets ._<name> beside every file, and .DS_Store."""
    with zipfile.ZipFile(exported) as zf:
        zf.extractall(raw)
    exported.unlink()
    folder = raw / SYNTH
    for rel in ("rgb/._000007.jpg", "rgb/._000000.jpg", "._metadata.json", "._rgb"):
        (folder / rel).write_bytes(APPLEDOUBLE)
    (folder / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    (folder / "rgb" / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    (raw / "__MACOSX").mkdir()  # an unzip of a Mac's zip leaves it beside the session
    r = check(raw)
    assert r.exit_code == 0, r.output
    assert f"{N_FRAMES} frames" in ok_line(r.output) and "1 of 1 session ok" in r.output


def test_appledouble_and_macosx_members_of_a_zip_are_not_extracted(exported: Path, raw: Path):
    rezip(exported, extra=[(f"{SYNTH}/rgb/._000003.jpg", APPLEDOUBLE), (f"{SYNTH}/._imu.json", APPLEDOUBLE),
                           (f"{SYNTH}/.DS_Store", b"Bud1"), (f"__MACOSX/{SYNTH}/rgb/._000003.jpg", APPLEDOUBLE)])
    r = check(raw)
    assert r.exit_code == 0, r.output
    assert f"{N_FRAMES} frames" in ok_line(r.output)
    left = [p.name for p in (raw / SYNTH).rglob("*") if p.name.startswith(".") or p.name == "__MACOSX"]
    assert left == [] and not (raw / "__MACOSX").exists()


def test_session_folder_one_level_deeper_is_found(exported: Path, raw: Path):
    """A zip of a folder of exports: export/session_X/rgb/... (and a note beside it)."""
    rezip(exported, rename=lambda n: f"export/{n}", extra=[("export/README.txt", b"from the lab laptop")])
    r = check(raw)
    assert r.exit_code == 0, r.output
    assert f"unzip {SYNTH}.zip -> {SYNTH}/" in r.output and f"{N_FRAMES} frames" in ok_line(r.output)
    with zipfile.ZipFile(exported) as zf:
        want = {n.split("/", 2)[2] for n in zf.namelist() if n.startswith(f"export/{SYNTH}/") and not n.endswith("/")}
    assert set(tree(raw / SYNTH)) == want


def test_deeper_session_folder_with_an_unsafe_member_is_refused(exported: Path, raw: Path, tmp_path: Path):
    rezip(exported, rename=lambda n: f"export/{n}", extra=[(f"export/{SYNTH}/../../../evil.txt", b"pwned")])
    r = check(raw)
    assert r.exit_code == 1
    assert f"FAIL  {SYNTH}.zip: unsafe member 'export/{SYNTH}/../../../evil.txt'" in r.output
    assert not (raw / SYNTH).exists() and not list(tmp_path.rglob("evil.txt"))


def test_two_session_folders_in_one_zip_are_refused(exported: Path, raw: Path):
    with zipfile.ZipFile(exported) as zf:
        second = [(f"b/{n}", zf.read(n)) for n in zf.namelist() if not n.endswith("/")]
    rezip(exported, rename=lambda n: f"a/{n}", extra=second)
    r = check(raw)
    assert r.exit_code == 1
    assert f"more than one session folder (a/{SYNTH}, b/{SYNTH}): a session zip holds one" in r.output
    assert not (raw / SYNTH).exists()


def test_half_unzipped_folder_is_replaced_by_its_zip(exported: Path, raw: Path):
    """Before: the folder won, so `check` said ok for 15 frames without the rest, and every
    later export of the session was ignored."""
    folder = interrupted_unzip(exported, raw, whole=20)
    assert len(list((folder / "rgb").glob("*.jpg"))) == 16  # 15 whole, one cut short
    r = check(raw)
    assert r.exit_code == 0, r.output
    assert f"unzip {SYNTH}.zip -> {SYNTH}/" in r.output and f"{N_FRAMES} frames" in ok_line(r.output)
    with zipfile.ZipFile(exported) as zf:
        assert tree(folder) == {n.split("/", 1)[1]: zf.read(n) for n in zf.namelist() if not n.endswith("/")}
    assert_only(raw, exported.name, f"{SYNTH}.metadata.json", SYNTH)


def test_empty_folder_left_by_an_unzip_is_replaced(exported: Path, raw: Path):
    (raw / SYNTH / "rgb").mkdir(parents=True)  # the unzip made the folders, then failed
    res = extract_export(exported, raw)
    assert res.status == "extracted" and res.why == f"in place of a half-unzipped {SYNTH}/"
    assert len(list((raw / SYNTH / "rgb").glob("*.jpg"))) == N_FRAMES


@pytest.mark.parametrize("edit", ["frame deleted", "file added", "half file differs", "file rewritten"])
def test_a_folder_the_user_worked_on_still_wins(exported: Path, raw: Path, edit: str):
    """Only a folder that is exactly the start of the zip is an unzip's leftover."""
    if edit == "frame deleted":  # the check's advice for a bad frame: the zip must not bring it back
        extract_export(exported, raw)
        (raw / SYNTH / "rgb" / "000011.jpg").unlink()
    elif edit == "file added":
        interrupted_unzip(exported, raw, whole=20)
        (raw / SYNTH / "notes.txt").write_text("mine")
    elif edit == "half file differs":
        folder = interrupted_unzip(exported, raw, whole=20)
        cut = max((folder / "rgb").glob("*.jpg"))
        cut.write_bytes(b"\xff\xd8" + cut.read_bytes()[2:-1] + b"\x00")
    else:  # the user's SLAM rewrote poses.json (shorter than the app's `[]`? no: any other bytes)
        extract_export(exported, raw)
        (raw / SYNTH / "poses.json").write_bytes(b"[1]")
    before = tree(raw / SYNTH)
    res = extract_export(exported, raw)
    assert res.status == "already" and tree(raw / SYNTH) == before
    assert_only(raw, exported.name, f"{SYNTH}.metadata.json", SYNTH)


def corrupt_member(z: Path, member: str) -> None:
    """Flip bytes inside `member`'s data: the central directory stays readable, the CRC fails."""
    with zipfile.ZipFile(z) as zf:
        info = zf.getinfo(member)
    data = bytearray(z.read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    data[start + info.compress_size // 2] ^= 0xFF
    z.write_bytes(bytes(data))


def test_extraction_failing_midway_leaves_nothing_and_the_remade_zip_extracts(exported: Path, raw: Path):
    good = exported.read_bytes()
    corrupt_member(exported, f"{SYNTH}/rgb/000030.jpg")
    r = check(raw)
    assert r.exit_code == 1
    assert f"FAIL  {SYNTH}.zip: corrupt member '{SYNTH}/rgb/000030.jpg'" in r.output
    assert f"ok    {SYNTH}" not in r.output
    assert_only(raw, exported.name, f"{SYNTH}.metadata.json")  # no folder, no hidden temp
    exported.write_bytes(good)  # re-exported from the phone
    r = check(raw)
    assert r.exit_code == 0 and f"{N_FRAMES} frames" in ok_line(r.output)


def test_leftover_beside_a_still_broken_zip_is_moved_aside_until_a_good_one(exported: Path, raw: Path):
    good = exported.read_bytes()
    interrupted_unzip(exported, raw, whole=20)
    corrupt_member(exported, f"{SYNTH}/rgb/000030.jpg")  # past what the leftover holds
    r = check(raw)
    assert r.exit_code == 1
    line = [ln for ln in r.output.splitlines() if ln.startswith("FAIL")]
    assert len(line) == 1 and line[0].startswith(f"FAIL  {SYNTH}.zip: corrupt member '{SYNTH}/rgb/000030.jpg'")
    assert line[0].endswith(f"(the half-unzipped {SYNTH}/ beside it is now .{SYNTH}.unzip-leftover)")
    assert f"ok    {SYNTH}" not in r.output and not (raw / SYNTH).exists()
    exported.write_bytes(good)
    r = check(raw)
    assert r.exit_code == 0 and f"{N_FRAMES} frames" in ok_line(r.output)
    assert_only(raw, exported.name, f"{SYNTH}.metadata.json", SYNTH)
