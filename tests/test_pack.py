"""packer pack on rendered sessions: shards, manifest, resume, and every kind of
bad input the issue lists. Each bad-input test checks three things: a message that
names the session/file, the other sessions still packed, a consistent manifest."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from packer.pack import pack
from shardship.config import PackOptions
from shardship.format import index as manifest
from shardship.hashing import sha256_file
from tests.conftest import ROOT, is_root


def opts(**kw) -> PackOptions:
    o = PackOptions(workers=2, shard_bytes=256 * 1024)
    for k, v in kw.items():
        setattr(o, k, v)
    return o


def assert_consistent(out: Path) -> dict:
    """Every shard the manifest names exists with its size and sha256, and every
    member offset points at the right bytes."""
    index = manifest.load(out)
    names = set()
    for sh in index["shards"]:
        p = out / sh["name"]
        assert p.stat().st_size == sh["bytes"], sh["name"]
        assert sha256_file(p) == sh["sha256"], sh["name"]
        names.add(sh["name"])
        with open(p, "rb") as f:
            for key, jo, _, mo, ms, _ in sh["samples"]:
                f.seek(jo)
                assert f.read(2) == b"\xff\xd8"
                f.seek(mo)
                meta = json.loads(f.read(ms))
                assert key == f"{meta['session']}/{meta['frame']:06d}"
    for name, entry in index["sessions"].items():
        assert set(entry["shards"]) <= names, name
    tars = {p.name for p in out.glob("*.tar")}
    assert tars == names, "shard files on disk that the manifest does not name (or the reverse)"
    assert not list(out.glob(".*.tmp")), "temp files left behind"
    return index


def test_pack_writes_shards_readable_by_tar_and_webdataset(raw_copy: Path, tmp_path: Path):
    out = tmp_path / "packed"
    r = pack(raw_copy, out, opts(), progress=False)
    assert not r.failed and len(r.packed) == 3
    index = assert_consistent(out)
    n = index["totals"]["samples"]
    assert n == sum(e["frames"] for e in index["sessions"].values())
    assert r.packed_bytes < r.raw_bytes
    first = out / index["shards"][0]["name"]
    listing = subprocess.run(["tar", "tf", str(first)], check=True, capture_output=True, text=True).stdout.split()
    assert listing[0].endswith(".jpg") and listing[1].endswith(".json")
    import webdataset as wds

    urls = [str(out / s["name"]) for s in index["shards"]]
    seen = 0
    for sample in wds.WebDataset(urls, shardshuffle=False).decode("pil"):
        assert sample["jpg"].size == (224, 224)
        assert sample["json"]["image_size"] == [224, 224]
        seen += 1
    assert seen == n


def test_intrinsics_rescaled_and_options_recorded(raw_copy: Path, tmp_path: Path):
    out = tmp_path / "p"
    pack(raw_copy, out, opts(crop="center", quality=80), progress=False)
    index = manifest.load(out)
    assert index["options"]["crop"] == "center" and index["options"]["quality"] == 80
    name = next(iter(index["sessions"]))
    fx, fy, cx, cy = [float(x) for x in (raw_copy / name / "calib.txt").read_text().split()]
    k = index["sessions"][name]["intrinsics"]
    s = 224 / 360
    assert k == pytest.approx([fx * s, fy * s, (cx - 60) * s, cy * s])


def test_rerun_reencodes_nothing_and_keeps_bytes(raw_copy: Path, tmp_path: Path):
    out = tmp_path / "p"
    pack(raw_copy, out, opts(), progress=False)
    before = {s["name"]: s["sha256"] for s in manifest.load(out)["shards"]}
    r = pack(raw_copy, out, opts(), progress=False)
    assert r.images == 0 and sorted(r.reused) == sorted(p.name for p in raw_copy.iterdir())
    assert {s["name"]: s["sha256"] for s in manifest.load(out)["shards"]} == before
    # touching one frame re-packs only that session
    victim = sorted(raw_copy.iterdir())[1]
    frame = sorted((victim / "rgb").iterdir())[0]
    frame.write_bytes((sorted((victim / "rgb").iterdir())[1]).read_bytes())
    r = pack(raw_copy, out, opts(), progress=False)
    assert r.packed == [victim.name] and len(r.reused) == 2
    assert_consistent(out)


def test_truncated_jpeg_fails_only_its_session(raw_copy: Path, tmp_path: Path):
    victim = sorted(raw_copy.iterdir())[0]
    f = victim / "rgb" / "000005.jpg"
    f.write_bytes(f.read_bytes()[:2000])
    out = tmp_path / "p"
    r = pack(raw_copy, out, opts(), progress=False)
    assert set(r.failed) == {victim.name}
    assert "rgb/000005.jpg" in r.failed[victim.name] and "truncated" in r.failed[victim.name]
    index = assert_consistent(out)
    assert len(index["sessions"]) == 2 and victim.name in index["failed"]


def test_corrupt_jpeg_body_is_reported_by_the_decoder(raw_copy: Path, tmp_path: Path):
    victim = sorted(raw_copy.iterdir())[2]
    f = victim / "rgb" / "000003.jpg"
    data = bytearray(f.read_bytes())
    data[2:600] = b"\x00" * 598  # header garbage, markers intact
    f.write_bytes(bytes(data))
    r = pack(raw_copy, tmp_path / "p", opts(), progress=False)
    assert set(r.failed) == {victim.name} and "000003.jpg" in r.failed[victim.name]
    assert_consistent(tmp_path / "p")


def test_empty_rgb_and_missing_metadata(raw_copy: Path, tmp_path: Path):
    a, b, _ = sorted(raw_copy.iterdir())
    for p in (a / "rgb").iterdir():
        p.unlink()
    (b / "metadata.json").unlink()
    out = tmp_path / "p"
    r = pack(raw_copy, out, opts(), progress=False)
    assert set(r.failed) == {a.name} and "rgb/" in r.failed[a.name] and "empty" in r.failed[a.name]
    index = assert_consistent(out)
    assert any("metadata.json missing" in w for w in index["sessions"][b.name]["warnings"])


def test_non_monotonic_timestamps(raw_copy: Path, tmp_path: Path):
    """ARKit poses carry the frames' real timestamps: out of order is refused."""
    victim = sorted(raw_copy.iterdir())[0]
    md = json.loads((victim / "metadata.json").read_text())
    (victim / "metadata.json").write_text(json.dumps({**md, "captureSource": "iphone_arkit"}))
    n = len(list((victim / "rgb").iterdir()))
    ts = [i / 60 for i in range(n)]
    ts[10], ts[11] = ts[11], ts[10]
    eye = [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
    (victim / "poses.json").write_text(
        json.dumps([{"timestamp": t, "rgbIndex": i, "transform": eye} for i, t in enumerate(ts)]))
    r = pack(raw_copy, tmp_path / "p", opts(), progress=False)
    assert "poses.json" in r.failed[victim.name] and "not strictly increasing" in r.failed[victim.name]
    assert len(r.packed) == 2


def test_symlink_outside_session_refused(raw_copy: Path, tmp_path: Path):
    victim = sorted(raw_copy.iterdir())[1]
    outside = tmp_path / "secret.jpg"
    shutil.copy(victim / "rgb" / "000001.jpg", outside)
    (victim / "rgb" / "000001.jpg").unlink()
    (victim / "rgb" / "000001.jpg").symlink_to(outside)
    r = pack(raw_copy, tmp_path / "p", opts(), progress=False)
    assert "symlink points outside the session" in r.failed[victim.name]
    assert len(r.packed) == 2


def test_session_name_with_spaces_and_unicode(raw_copy: Path, tmp_path: Path):
    victim = sorted(raw_copy.iterdir())[0]
    fancy = victim.with_name("séance 1 ü — grasp")
    victim.rename(fancy)
    out = tmp_path / "p"
    r = pack(raw_copy, out, opts(), progress=False)
    assert not r.failed and fancy.name in r.packed
    index = assert_consistent(out)
    shard = next(s for s in index["shards"] if s["session"] == fancy.name)
    assert shard["name"].isascii() and " " not in shard["name"]
    with tarfile.open(out / shard["name"]) as tf:
        assert tf.getnames()[0] == f"{fancy.name}/000000.jpg"


def test_action_chunks_from_metric_poses(tmp_path: Path):
    from tests.datasets import make_packed

    out = make_packed(tmp_path, sessions=1, frames=40, seed=3, horizon=8)
    index = manifest.load(out)
    assert index["action_dim"] == 9 + len(index["joints"]) and index["horizon"] == 8
    assert len(index["stats"]["action"]["mean"]) == index["action_dim"]
    sh = index["shards"][0]
    with open(out / sh["name"], "rb") as f:
        _, _, _, mo, ms, has_action = sh["samples"][0]
        f.seek(mo)
        meta = json.loads(f.read(ms))
    assert has_action == 1 and meta["pose_metric"] is True
    assert len(meta["action"]) == 8 and len(meta["action"][0]) == index["action_dim"]
    last = index["shards"][-1]
    with open(out / last["name"], "rb") as f:
        _, _, _, mo, ms, _ = last["samples"][-1]
        f.seek(mo)
        meta = json.loads(f.read(ms))
    assert meta["action_mask"] == [0] * 8, "the last frame's chunk runs past the session end"
    assert meta["action"][0][:3] == [0.0, 0.0, 0.0]  # padded with the frame itself: zero motion


@pytest.mark.skipif(not is_root(), reason="mounting a size-limited tmpfs needs root")
def test_disk_full_keeps_finished_sessions(raw_copy: Path, tmp_path: Path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    probe = tmp_path / "probe"  # one session packed on a roomy disk: what its shards weigh
    (probe / "raw").mkdir(parents=True)
    shutil.copytree(sorted(raw_copy.iterdir())[0], probe / "raw" / "one")
    pack(probe / "raw", probe / "out", opts(), progress=False)
    one_session = sum(f.stat().st_size for f in (probe / "out").glob("*.tar"))
    size_kb = max(64, int(one_session * 1.5 / 1024))  # room for ~1.5 sessions of shards
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(mnt)], check=True)
    try:
        r = pack(raw_copy, mnt, opts(), progress=False)
        assert r.failed, "the small disk should have filled up"
        assert any("disk full" in why for why in r.failed.values())
        assert r.packed, "sessions packed before the disk filled must be kept"
        index = assert_consistent(mnt)
        assert set(index["sessions"]) == set(r.packed)
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_ctrl_c_mid_pack_then_rerun(raw_copy: Path, tmp_path: Path):
    """SIGINT a real `packer pack` process mid-run; the rerun finishes the job and
    the manifest never names an incomplete shard."""
    out = tmp_path / "p"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "packer", "pack", "--raw", str(raw_copy), "--out", str(out),
           "--no-slam", "--workers", "1", "--shard-mb", "0.25"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and not (out / "index.json").exists():
        time.sleep(0.02)  # wait until the first session is published
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    if proc.returncode == 130:
        assert "interrupted" in err
    index = assert_consistent(out)
    assert len(index["sessions"]) >= 1
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    index = assert_consistent(out)
    assert len(index["sessions"]) == 3


def test_compression_default_none_auto_probes_and_zstd_forces(raw_copy: Path, tmp_path: Path):
    import zstandard

    out = tmp_path / "p"
    r = pack(raw_copy, out, opts(), progress=False)  # default none: one copy on disk
    index = manifest.load(out)
    assert index["compression"] == {"mode": "none", "probe_ratio": None, "used": False}
    assert not list(out.glob("*.zst")) and all(sh["compressed"] is None for sh in index["shards"])
    assert r.packed_bytes == sum(p.stat().st_size for p in out.glob("*.tar"))
    r = pack(raw_copy, out, opts(compress="auto"), progress=False)
    assert not r.packed and len(r.reused) == 3  # switching the mode re-encodes nothing
    index = manifest.load(out)
    assert index["compression"]["mode"] == "auto" and 0 < index["compression"]["probe_ratio"] <= 1.0
    assert index["compression"]["used"] == (index["compression"]["probe_ratio"] <= 0.9)
    out2 = tmp_path / "z"
    r = pack(raw_copy, out2, opts(compress="zstd"), progress=False)
    assert r.packed and r.images
    index = manifest.load(out2)
    sh = index["shards"][0]
    z = out2 / sh["compressed"]["name"]
    assert sha256_file(z) == sh["compressed"]["sha256"]
    assert zstandard.ZstdDecompressor().decompressobj().decompress(z.read_bytes()) == (out2 / sh["name"]).read_bytes()
    # the summary counts what is on disk: both copies
    assert r.packed_bytes == sum(p.stat().st_size for p in out2.iterdir() if p.name.endswith((".tar", ".tar.zst")))
    r = pack(raw_copy, out2, opts(), progress=False)  # back to none: the .tar.zst copies go, nothing re-encoded
    assert not r.packed and not list(out2.glob("*.zst"))


def test_frames_fed_before_the_slam_stage_pack_the_same_and_a_refusal_still_fails(raw_copy: Path, tmp_path: Path):
    """`ready` lets the workers start on a session before `prepare` (the SLAM stage)
    has run: same shards as without it; a session prepare then refuses is failed
    and its early results are dropped, the others are packed."""
    plain = pack(raw_copy, tmp_path / "a", opts(), progress=False)
    names = sorted(plain.packed)
    asked: list[str] = []

    def ready(s) -> bool:
        asked.append(s.name)
        return True

    early = pack(raw_copy, tmp_path / "b", opts(), progress=False, ready=ready,
                 prepare=lambda sessions: {names[1]: "slam: refused"})
    assert sorted(asked) == names
    assert early.failed == {names[1]: "slam: refused"} and sorted(early.packed) == [names[0], names[2]]
    assert_consistent(tmp_path / "b")
    shards = {p.name for p in (tmp_path / "b").glob("*.tar")}
    assert shards and shards <= {p.name for p in (tmp_path / "a").glob("*.tar")}  # byte-identical shards
    again = pack(raw_copy, tmp_path / "b", opts(), progress=False, ready=ready, prepare=lambda sessions: {})
    assert again.packed == [names[1]] and sorted(again.reused) == [names[0], names[2]]


def test_prefed_frames_that_differ_from_the_checked_session_are_dropped(raw_copy: Path, tmp_path: Path):
    """`prefeed` lists frames before a session is checked; pack uses them only when
    they are exactly the kept frames (here the listing took every frame, the pack
    keeps every 2nd), else drops them and feeds again: same shards as a plain pack."""
    from packer.framepool import FramePool, prefeed

    plain = pack(raw_copy, tmp_path / "a", opts(stride=2), progress=False)
    with FramePool.for_options(opts()) as frames:
        prefeed(frames, raw_copy, tmp_path / "b", opts())
        assert frames.started is not None  # a fresh out dir: already encoding
        early = pack(raw_copy, tmp_path / "b", opts(stride=2), progress=False, frames=frames)
    assert sorted(early.packed) == sorted(plain.packed) and not early.failed
    assert {p.name for p in (tmp_path / "b").glob("*.tar")} == {p.name for p in (tmp_path / "a").glob("*.tar")}
    with FramePool.for_options(opts()) as frames:
        prefeed(frames, raw_copy, tmp_path / "b", opts())
        assert frames.started is None  # index.json there: a re-run feeds nothing before the checks


def test_atomic_write_keeps_permissions(tmp_path: Path):
    from shardship.atomic import write_json

    p = tmp_path / "a.json"
    write_json(p, {"x": 1})
    umask = os.umask(0)
    os.umask(umask)
    assert p.stat().st_mode & 0o777 == 0o666 & ~umask
    os.chmod(p, 0o640)
    write_json(p, {"x": 2})
    assert p.stat().st_mode & 0o777 == 0o640 and json.loads(p.read_text()) == {"x": 2}


@pytest.mark.parametrize("name", ["s/000001.jpg", "séance ü/000001.json", "x" * 140 + "/000001.jpg",
                                  "y" * 170 + "/000001.jpg"])
def test_member_header_matches_tarfile(tmp_path: Path, name: str):
    """Our direct ustar headers (and the PAX fallback) read back with tarfile."""
    import io as _io

    from shardship.format.shards import member_header

    data = b"abc" * 200
    blob = member_header(name, len(data)) + data + b"\0" * (-len(data) % 512) + b"\0" * 1024
    with tarfile.open(fileobj=_io.BytesIO(blob)) as tf:
        (m,) = tf.getmembers()
        assert m.name == name and m.size == len(data) and m.mode == 0o644 and m.mtime == 0
        assert tf.extractfile(m).read() == data


def test_touched_but_unchanged_session_is_not_reencoded(raw_copy: Path, tmp_path: Path):
    """New mtimes (a copy with cp -r, a sync tool) fall back to the content
    fingerprint: same bytes, no re-encode."""
    out = tmp_path / "p"
    pack(raw_copy, out, opts(), progress=False)
    sig_before = {n: e["stat_signature"] for n, e in manifest.load(out)["sessions"].items()}
    later = time.time() + 100
    for f in raw_copy.rglob("*"):
        os.utime(f, (later, later))
    r = pack(raw_copy, out, opts(), progress=False)
    assert r.images == 0 and len(r.reused) == 3
    after = manifest.load(out)["sessions"]
    assert all(after[n]["stat_signature"] != sig_before[n] for n in after)  # refreshed: next run is stat-only


def test_copied_session_with_one_changed_frame_of_the_same_size_is_repacked(raw_copy: Path, tmp_path: Path):
    """The content fingerprint (CRC-32 + length per frame, no longer sha256) still
    catches an edit: new mtimes everywhere (a copy) send every session to the
    fingerprint; the one whose frame changed a byte, same size, re-packs and the
    others are kept."""
    out = tmp_path / "p"
    pack(raw_copy, out, opts(), progress=False)
    victim = sorted(raw_copy.iterdir())[2]
    frame = sorted((victim / "rgb").iterdir())[3]
    data = bytearray(frame.read_bytes())
    data[len(data) // 2] ^= 0x10  # inside the entropy-coded data: still a decodable JPEG
    frame.write_bytes(bytes(data))
    later = time.time() + 100
    for f in raw_copy.rglob("*"):
        os.utime(f, (later, later))
    r = pack(raw_copy, out, opts(), progress=False)
    assert r.packed == [victim.name] and len(r.reused) == 2 and not r.failed
    assert_consistent(out)
