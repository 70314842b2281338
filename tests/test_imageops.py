"""packer.imageops' decode through simplejpeg against the plain Pillow path it
replaces: the same packed bytes for every crop and size, Pillow still decoding
what simplejpeg refuses (or everything, when simplejpeg is not installed), the
same one-line error for a broken frame; and the optional orjson paths
(sample JSON, session JSON) against the standard json they fall back to."""
from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from PIL import Image

from packer import imageops, samples, session
from packer.imageops import ResizeSpec, frame_digest, process_frame, resize_jpeg
from packer.pack import pack
from shardship.config import PackOptions
from shardship.format import index as manifest

pytest.importorskip("simplejpeg")  # the fast path under test: a dependency in setup.cfg


@pytest.fixture
def pillow_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """imageops as it runs where simplejpeg is not installed."""
    monkeypatch.setattr(imageops, "simplejpeg", None)


def _frames(raw: Path, n: int = 12) -> list[bytes]:
    return [p.read_bytes() for p in sorted(raw.glob("*/rgb/*.jpg"))[::7][:n]]


@pytest.mark.parametrize("spec", [ResizeSpec(), ResizeSpec(crop="center"), ResizeSpec(size=160, quality=80),
                                  ResizeSpec(size=400, crop="center"), ResizeSpec(size=96)])
def test_simplejpeg_path_packs_the_same_bytes_as_pillow(raw_cache: Path, spec: ResizeSpec,
                                                        monkeypatch: pytest.MonkeyPatch):
    blobs = _frames(raw_cache)
    fast = [resize_jpeg(b, spec) for b in blobs]
    monkeypatch.setattr(imageops, "simplejpeg", None)
    slow = [resize_jpeg(b, spec) for b in blobs]
    assert fast == slow
    assert all(size == (480, 360) for _, size in fast)
    assert Image.open(io.BytesIO(fast[0][0])).size == (spec.size, spec.size)


def _jpeg(mode: str) -> bytes:
    buf = io.BytesIO()
    Image.new(mode, (64, 48), {"CMYK": (10, 200, 30, 5), "L": 90}[mode]).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


@pytest.mark.parametrize("mode", ["CMYK", "L"])
def test_frames_simplejpeg_refuses_or_converts_decode_as_pillow_does(mode: str, monkeypatch: pytest.MonkeyPatch):
    """A CMYK JPEG (simplejpeg refuses RGB output for it) goes to Pillow; a grey
    one decodes in either and packs to the same bytes."""
    data = _jpeg(mode)
    fast = resize_jpeg(data, ResizeSpec(size=32))
    monkeypatch.setattr(imageops, "simplejpeg", None)
    assert fast == resize_jpeg(data, ResizeSpec(size=32))
    assert Image.open(io.BytesIO(fast[0])).mode == "RGB"


def test_broken_frame_reports_the_same_error_either_way(tmp_path: Path, raw_cache: Path,
                                                        monkeypatch: pytest.MonkeyPatch):
    bad = bytearray(_frames(raw_cache, 1)[0])
    bad[2:600] = b"\0" * 598  # header garbage, markers intact
    p = tmp_path / "000001.jpg"
    p.write_bytes(bytes(bad))
    fast = process_frame((str(p), ResizeSpec()))
    monkeypatch.setattr(imageops, "simplejpeg", None)
    slow = process_frame((str(p), ResizeSpec()))
    def said(r: tuple) -> str:  # Pillow names the BytesIO object by its address
        return re.sub(r" at 0x[0-9a-f]+", "", r[2])

    assert fast[:2] == slow[:2] == (None, None) and said(fast) == said(slow)
    assert said(fast).startswith("cannot decode JPEG")


def test_pack_without_simplejpeg_writes_the_same_shards(raw_copy: Path, tmp_path: Path, pillow_only: None):
    """The forked workers inherit the patched module: the whole pack on Pillow."""
    o = PackOptions(workers=2, shard_bytes=256 * 1024)
    pack(raw_copy, tmp_path / "slow", o, progress=False)
    slow = {s["name"] for s in manifest.load(tmp_path / "slow")["shards"]}
    imageops.simplejpeg = pytest.importorskip("simplejpeg")  # monkeypatch restores None->module at teardown
    pack(raw_copy, tmp_path / "fast", o, progress=False)
    assert {s["name"] for s in manifest.load(tmp_path / "fast")["shards"]} == slow  # content-named: same bytes


def test_frame_digest_changes_with_any_byte():
    data = bytes(range(256)) * 40
    d = frame_digest(data)
    assert len(d) == 12 and frame_digest(bytes(data)) == d
    for i in (0, 5000, len(data) - 1):
        changed = bytearray(data)
        changed[i] ^= 0x01
        assert frame_digest(bytes(changed)) != d
    assert frame_digest(data + b"\0") != d


def test_sample_json_without_orjson_has_the_same_values(raw_cache: Path, monkeypatch: pytest.MonkeyPatch):
    s = session.load_session(sorted(p for p in raw_cache.iterdir() if p.is_dir())[0])
    fast = [samples.sample_json(m) for m in samples.plan_session(s, PackOptions(), "sig").metas]
    monkeypatch.setattr(samples, "orjson", None)
    slow = [samples.sample_json(m) for m in samples.plan_session(s, PackOptions(), "sig").metas]
    assert [json.loads(b) for b in fast] == [json.loads(b) for b in slow]
    assert all(len(json.loads(b)["proprio"]) == 4 for b in fast)  # the numpy rows were written as lists


def test_session_json_nan_and_errors_as_with_json(tmp_path: Path):
    """orjson refuses NaN literals: read_json falls back to json, which loads them
    (callers check finiteness) and words the error of broken JSON."""
    p = tmp_path / "poses.json"
    p.write_text('{"a": [1.5, NaN]}')
    v = session.read_json("s", p)
    assert v["a"][0] == 1.5 and v["a"][1] != v["a"][1]
    p.write_text('{"a": [1.5,, 2]}')
    with pytest.raises(Exception, match="poses.json.*not valid JSON"):
        session.read_json("s", p)
    p.write_text('{"a": [1.5,')  # cut short: the app stopped while writing it (issue 21.9)
    with pytest.raises(Exception, match="poses.json: truncated after 11 bytes .*re-export"):
        session.read_json("s", p)
