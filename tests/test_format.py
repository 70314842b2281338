"""index.json has one parser/validator (shardship.format.index): every way an index
can be wrong is refused with one line naming the file and saying what to do, and
packer, transfer and train all get the same refusal."""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardship.errors import ShardshipError
from shardship.format import index as fmt

WHERE = "/data/packed/index.json"
SHA = "0123456789abcdef" * 4
NAME = "sess-a1b2c3-0000.tar"


def good_doc() -> dict[str, Any]:
    """Two samples, laid out as a tar would: header, jpg, header, json, ... in 10 KiB."""
    rows = [["sess/000000", 512, 100, 1536, 50, 1],
            ["sess/000001", 2560, 100, 3584, 50, 0]]
    shard = {"name": NAME, "bytes": 10240, "sha256": SHA, "session": "sess", "samples": rows,
             "compressed": {"name": NAME + ".zst", "bytes": 900, "sha256": "f" * 64}}
    return {"format": fmt.FORMAT, "version": fmt.VERSION, "sample_fields": list(fmt.SAMPLE_FIELDS),
            "shards": [shard], "sessions": {"sess": {}}, "joints": [], "action_dim": 9, "horizon": 16}


def refused(doc: Any) -> str:
    """The message parse() refuses `doc` with; it must be one line that names the file."""
    data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    with pytest.raises(ShardshipError) as err:
        fmt.parse(data, WHERE)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{WHERE}: "), msg
    return msg


def with_row(i: int, col: str, value: Any) -> dict[str, Any]:
    doc = good_doc()
    doc["shards"][0]["samples"][i][fmt.SAMPLE_FIELDS.index(col)] = value
    return doc


REPACK = "; re-run `packer pack`"


# ------------------------------------------------------------------ the good case
def test_a_valid_index_gives_typed_shards_and_columns() -> None:
    ix = fmt.parse(json.dumps(good_doc()).encode(), WHERE)
    assert ix.where == WHERE and ix.columns.json_size == 4 and ix.columns.width == 6
    (sh,) = ix.shards
    assert (sh.name, sh.bytes, sh.sha256, sh.session) == (NAME, 10240, SHA, "sess")
    assert sh.compressed == fmt.FileRef(NAME + ".zst", 900, "f" * 64) and sh.ref == fmt.FileRef(NAME, 10240, SHA)
    assert sh.samples.keys == ["sess/000000", "sess/000001"] and len(sh.samples) == 2
    assert sh.samples.jpg_offset.tolist() == [512, 2560] and sh.samples.json_size.tolist() == [50, 50]
    assert sh.samples.has_action.tolist() == [True, False] and sh.samples.jpg_offset.dtype == np.int64
    assert ix.doc["shards"][0]["name"] == NAME  # the JSON dict itself, for packer to edit


def test_columns_are_looked_up_not_assumed() -> None:
    doc = good_doc()
    order = ["has_action", "json_size", "extra", "key", "jpg_offset", "json_offset", "jpg_size"]
    doc["sample_fields"] = order
    sh = doc["shards"][0]
    rows = [dict(zip(fmt.SAMPLE_FIELDS, r, strict=True), extra=None) for r in sh["samples"]]
    sh["samples"] = [[r[f] for f in order] for r in rows]
    (s,) = fmt.parse(json.dumps(doc), WHERE).shards
    assert s.samples.keys == ["sess/000000", "sess/000001"] and s.samples.jpg_size.tolist() == [100, 100]


def test_save_then_load_round_trips_and_an_empty_index_is_valid(tmp_path: Path) -> None:
    doc = fmt.empty({"horizon": 16}, "pil")
    fmt.save(tmp_path, doc)
    assert fmt.load(tmp_path) == doc and fmt.read(tmp_path).shards == ()
    doc = good_doc()
    doc["sessions"] = {"sess": {"raw_bytes": 5}}
    fmt.save(tmp_path, doc)
    assert fmt.load(tmp_path)["totals"] == {"samples": 2, "shards": 1, "raw_bytes": 5, "packed_bytes": 10240}
    assert fmt.read(tmp_path).shards[0].name == NAME


def test_missing_index() -> None:
    assert fmt.load("/nonexistent", required=False) is None
    with pytest.raises(ShardshipError, match="index.json not found: run `packer pack` first"):
        fmt.load("/nonexistent")


# ------------------------------------------------------------------ sample rows
def test_member_past_the_end_of_the_shard() -> None:
    msg = refused(with_row(1, "json_offset", 10200))
    assert msg == (f"{WHERE}: shards[0] ({NAME}): samples[1]: json member ends at byte 10250, "
                   f"past the shard's 10240 bytes{REPACK}")
    msg = refused(with_row(0, "jpg_offset", 20000))
    assert msg == f"{WHERE}: shards[0] ({NAME}): samples[0]: jpg_offset 20000 is beyond the shard's 10240 bytes{REPACK}"


def test_overlapping_members() -> None:
    msg = refused(with_row(1, "jpg_offset", 1546))  # inside sample 0's json (1536..1586)
    assert msg == (f"{WHERE}: shards[0] ({NAME}): samples[1]: jpg member starts at byte 1546, before the "
                   f"previous sample's json member ends (byte 1586): offsets must increase{REPACK}")
    msg = refused(with_row(0, "json_offset", 600))  # inside its own jpg (512..612)
    assert msg == (f"{WHERE}: shards[0] ({NAME}): samples[0]: json member starts at byte 600, before its jpg "
                   f"member ends (byte 612): offsets must increase{REPACK}")


def test_decreasing_offsets() -> None:
    doc = good_doc()
    doc["shards"][0]["samples"].reverse()
    msg = refused(doc)
    assert msg == (f"{WHERE}: shards[0] ({NAME}): samples[1]: jpg member starts at byte 512, before the "
                   f"previous sample's json member ends (byte 3634): offsets must increase{REPACK}")


def test_negative_size_or_offset() -> None:
    assert refused(with_row(0, "jpg_size", -1)) == (f"{WHERE}: shards[0] ({NAME}): samples[0]: jpg_size -1 "
                                                    f"is negative{REPACK}")
    assert refused(with_row(1, "json_offset", -5)) == (f"{WHERE}: shards[0] ({NAME}): samples[1]: json_offset -5 "
                                                       f"is negative{REPACK}")


@pytest.mark.parametrize("value", [1.5, True, "512", None])
def test_offsets_must_be_integers(value: Any) -> None:
    assert refused(with_row(1, "jpg_offset", value)) == (f"{WHERE}: shards[0] ({NAME}): samples[1]: jpg_offset "
                                                         f"{value!r} is not an integer{REPACK}")


def test_has_action_is_zero_or_one() -> None:
    assert refused(with_row(0, "has_action", 2)) == (f"{WHERE}: shards[0] ({NAME}): samples[0]: has_action 2 "
                                                     f"is not 0 or 1{REPACK}")


def test_row_shape_key_and_huge_values() -> None:
    doc = good_doc()
    doc["shards"][0]["samples"][1] = doc["shards"][0]["samples"][1][:5]
    assert refused(doc) == f"{WHERE}: shards[0] ({NAME}): samples[1]: not a list of 6 values (sample_fields){REPACK}"
    assert refused(with_row(0, "key", 7)) == f"{WHERE}: shards[0] ({NAME}): samples[0]: key 7 is not a string{REPACK}"
    assert refused(with_row(1, "json_size", 2**70)) == (f"{WHERE}: shards[0] ({NAME}): samples[1]: a value is too "
                                                        f"large for a byte offset{REPACK}")


# ------------------------------------------------------------------ shard entries
@pytest.mark.parametrize("name,why", [
    ("../x.tar", "contains a path separator or control character"),
    ("a/b.tar", "contains a path separator or control character"),
    ("a\nb.tar", "contains a path separator or control character"),
    (".hidden.tar", "starts with '.' (reserved for temp files)"),
    (".shardship-state.json", "starts with '.' (reserved for temp files)"),
    ("-rf.tar", "starts with '-'"),
    ("x.tar.part", "collides with a name transfer uses"),
    ("x.tar.tmp", "collides with a name transfer uses"),
    ("index.json", "collides with a name transfer uses"),
])
def test_unsafe_shard_names(name: str, why: str) -> None:
    doc = good_doc()
    doc["shards"][0]["name"] = name
    assert refused(doc) == f"{WHERE}: shards[0]: shard name {name!r} {why}{REPACK}"


@pytest.mark.parametrize("name", ["", 3, None])
def test_shard_name_must_be_a_string(name: Any) -> None:
    doc = good_doc()
    doc["shards"][0]["name"] = name
    assert refused(doc) == f"{WHERE}: shards[0]: shard name {name!r} is not a file name{REPACK}"


def test_names_with_shell_characters_are_fine() -> None:
    assert fmt.check_name("sess; rm -rf ~ $(touch x) `id`.tar", "i").endswith(".tar")


def test_transfer_names_are_reserved_by_the_format() -> None:
    from transfer.manifest import PART, REMOTE_STATE

    assert PART in fmt.RESERVED_SUFFIXES
    with pytest.raises(ShardshipError):
        fmt.check_name(REMOTE_STATE, "i")


def test_duplicate_names() -> None:
    doc = good_doc()
    doc["shards"].append(copy.deepcopy(doc["shards"][0]))
    doc["shards"][1]["compressed"] = None
    assert refused(doc) == f"{WHERE}: shard name {NAME!r} appears twice{REPACK}"
    doc["shards"][1]["name"] = NAME + ".zst"  # the first shard's compressed copy is called that
    assert refused(doc) == f"{WHERE}: shard name {NAME + '.zst'!r} appears twice{REPACK}"


@pytest.mark.parametrize("sha", ["xyz", "A" * 64, "a" * 63, 5])
def test_bad_sha256(sha: Any) -> None:
    doc = good_doc()
    doc["shards"][0]["sha256"] = sha
    assert refused(doc) == (f"{WHERE}: shards[0] ({NAME}): 'sha256' must be 64 lowercase hex digits, "
                            f"not {sha!r}{REPACK}")
    doc = good_doc()
    doc["shards"][0]["compressed"]["sha256"] = sha
    assert refused(doc) == (f"{WHERE}: shards[0].compressed ({NAME}.zst): 'sha256' must be 64 lowercase hex "
                            f"digits, not {sha!r}{REPACK}")


@pytest.mark.parametrize("size", [-1, 1.0, True, "10", 2**63])
def test_bad_bytes(size: Any) -> None:
    doc = good_doc()
    doc["shards"][0]["bytes"] = size
    assert refused(doc) == f"{WHERE}: shards[0] ({NAME}): 'bytes' must be a non-negative integer, not {size!r}{REPACK}"


def test_shard_needs_session_and_samples() -> None:
    doc = good_doc()
    del doc["shards"][0]["session"]
    assert refused(doc) == f"{WHERE}: shards[0] ({NAME}): 'session' must be the session's name, not None{REPACK}"
    doc = good_doc()
    doc["shards"][0]["samples"] = {}
    assert refused(doc) == f"{WHERE}: shards[0] ({NAME}): 'samples' must be a list of rows{REPACK}"


# ------------------------------------------------------------------ the document
@pytest.mark.parametrize("field", fmt.SAMPLE_FIELDS)
def test_missing_sample_field(field: str) -> None:
    doc = good_doc()
    doc["sample_fields"].remove(field)
    assert refused(doc) == f"{WHERE}: sample_fields lacks {field}{REPACK}"


def test_wrong_version() -> None:
    doc = good_doc()
    doc["version"] = 2
    assert refused(doc) == f"{WHERE}: format version 2 is newer than this shardship reads (1): upgrade shardship"
    for version in (0, "1", None):
        doc["version"] = version
        assert refused(doc) == f"{WHERE}: format version {version!r}, this shardship reads 1{REPACK}"


def test_wrong_format_or_not_json() -> None:
    doc = good_doc()
    doc["format"] = "webdataset"
    assert refused(doc) == (f"{WHERE}: not a shardship index (format 'webdataset', expected 'shardship-index'); "
                            f"point at a packed directory or re-run `packer pack`")
    assert refused(b"{").startswith(f"{WHERE}: not valid JSON (") and refused(b"{").endswith(REPACK)
    assert refused(b"[]") == f"{WHERE}: not a shardship index (a JSON list, not an object){REPACK}"
    doc = good_doc()
    doc["shards"] = 3
    assert refused(doc) == f"{WHERE}: no 'shards' list{REPACK}"


# ------------------------------------------------------------------ every reader refuses alike
def test_transfer_and_train_share_the_refusal(tmp_path: Path) -> None:
    from train.data.index import index_from_doc, load_index
    from transfer.manifest import load_local

    (tmp_path / "index.json").write_text(json.dumps(good_doc()))
    data, shards = load_local(tmp_path)
    assert data == (tmp_path / "index.json").read_bytes() and [s.name for s in shards] == [NAME]
    assert load_index(tmp_path).keys.tolist() == [b"sess/000000"]  # has_action 1 only
    doc = with_row(1, "json_offset", 10200)
    (tmp_path / "index.json").write_text(json.dumps(doc))
    want = f"{tmp_path / 'index.json'}: shards[0] ({NAME}): samples[1]: json member ends at byte 10250"
    for reader in (load_local, load_index, fmt.load, fmt.read):
        with pytest.raises(ShardshipError, match=f"^{re.escape(want)}"):
            reader(tmp_path)
    with pytest.raises(ShardshipError, match=f"^{re.escape(WHERE)}: shards"):
        index_from_doc(doc, tmp_path, WHERE)


def test_interrupts_deferred_holds_ctrl_c_until_the_section_ends():
    """A SIGINT inside the section does not cut it short; it arrives right after."""
    import os
    import signal

    from shardship.atomic import interrupts_deferred

    done = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            done.append("rename")
            done.append("save index")
    assert done == ["rename", "save index"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handler restored
