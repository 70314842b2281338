"""Pre-flight plan: delta by sha256, peak usage (incl. unpack), quota verdict. Pure."""
from __future__ import annotations

import pytest

from shardship.errors import ShardshipError
from transfer.manifest import FileRef, ShardFile
from transfer.plan import BLOCK, BOOKKEEPING, Item, RemoteEntry, build_plan, parse_margin, peak_profile
from transfer.quota import Quota

MiB = 1024**2
SHA = {c: c * 64 for c in "abcdef0123"}


def item(name: str, size: int, sha: str, zst: int | None = None) -> Item:
    shard = ShardFile(name, size, sha, FileRef(name + ".zst", zst, SHA["f"]) if zst else None)
    return Item.of(shard, use_compressed=zst is not None)


def quota(limit: int, used: int = 0) -> Quota:
    return Quota(limit, used, None, None, "test")


def test_delta_by_sha256_and_size() -> None:
    items = [item("a.tar", 10 * MiB, SHA["a"]), item("b.tar", 10 * MiB, SHA["b"]), item("c.tar", 10 * MiB, SHA["c"]),
             item("d.tar", 10 * MiB, SHA["d"])]
    remote = {"a.tar": RemoteEntry(10 * MiB, SHA["a"]),  # same: skip
              "b.tar": RemoteEntry(10 * MiB, SHA["e"]),  # same size, other content: replace
              "c.tar": RemoteEntry(3 * MiB, None)}  # other size: replace
    plan = build_plan(items, remote, {"d.tar": 4 * MiB}, quota(1 << 40))
    assert [s.action for s in plan.steps] == ["skip", "replace", "replace", "resume"]
    assert plan.steps[3].to_send == 6 * MiB
    assert plan.bytes_to_send == 10 * MiB + 10 * MiB + 6 * MiB
    assert [s.item.name for s in plan.sends] == ["b.tar", "c.tar", "d.tar"]


def test_part_larger_than_file_is_discarded() -> None:
    plan = build_plan([item("a.tar", MiB, SHA["a"])], {}, {"a.tar": 2 * MiB}, quota(1 << 40))
    assert plan.steps[0].action == "send" and plan.steps[0].to_send == MiB


def test_rerun_with_everything_there_sends_nothing() -> None:
    items = [item("a.tar", MiB, SHA["a"])]
    plan = build_plan(items, {"a.tar": RemoteEntry(MiB, SHA["a"])}, {}, quota(2 * MiB, 2 * MiB))
    assert plan.sends == [] and plan.bytes_to_send == 0


def test_peak_counts_unpacked_tar_next_to_zst() -> None:
    plain = build_plan([item("a.tar", 40 * MiB, SHA["a"])], {}, {}, quota(1 << 40), margin=0)
    packed = build_plan([item("a.tar", 40 * MiB, SHA["a"], zst=10 * MiB)], {}, {}, quota(1 << 40), margin=0)
    assert plain.peak_bytes >= 40 * MiB
    # while unpacking: the 10 MiB .tar.zst and the 40 MiB .tar both exist
    assert packed.peak_bytes >= 50 * MiB
    assert packed.bytes_to_send == 10 * MiB
    # afterwards only the .tar stays
    assert packed.final_bytes == plain.final_bytes


def test_peak_replacing_keeps_old_file_until_rename() -> None:
    steps = build_plan([item("a.tar", 30 * MiB, SHA["a"])], {"a.tar": RemoteEntry(30 * MiB, SHA["b"])}, {},
                       quota(1 << 40)).steps
    peak, final, _ = peak_profile(steps, 0)
    assert peak >= 30 * MiB  # new .part next to the old file
    assert final == BOOKKEEPING  # same size: nothing extra once replaced


def test_peak_is_max_not_sum_for_zst() -> None:
    items = [item(f"s{i}.tar", 20 * MiB, SHA["a"], zst=5 * MiB) for i in range(3)]
    plan = build_plan(items, {}, {}, quota(1 << 40), margin=0)
    # two shards done (40 MiB) + the third's .tar.zst (5) + its .tar being written (20)
    assert 65 * MiB <= plan.peak_bytes < 66 * MiB
    assert 60 * MiB <= plan.final_bytes < 61 * MiB


def test_over_quota_refused_with_numbers() -> None:
    items = [item("a.tar", 30 * MiB, SHA["a"]), item("b.tar", 30 * MiB, SHA["b"])]
    plan = build_plan(items, {}, {}, quota(64 * MiB, 10 * MiB), margin="5%")
    assert plan.margin_bytes == pytest.approx(0.05 * 64 * MiB, abs=1)
    assert not plan.fits
    msg = plan.refusal("u@h:/d")
    assert "exceed the quota" in msg and "60.0 MB to send" in msg and "Nothing was sent" in msg


def test_fits_exactly_under_margin() -> None:
    items = [item("a.tar", 8 * MiB, SHA["a"])]
    need = build_plan(items, {}, {}, quota(1 << 40), margin=0).peak_bytes
    assert build_plan(items, {}, {}, quota(need + MiB, 0), margin=MiB).fits
    assert not build_plan(items, {}, {}, quota(need + MiB - BLOCK, 0), margin=MiB).fits


def test_inode_limit() -> None:
    items = [item(f"s{i}.tar", 1024, SHA["a"]) for i in range(10)]
    q = Quota(1 << 40, 0, 100, 95, "test")
    plan = build_plan(items, {}, {}, q)
    assert plan.fits_space and not plan.fits_inodes and not plan.fits
    assert "more files" in plan.refusal("x")


def test_filesystem_free_space_is_a_ceiling_too() -> None:
    q = Quota(10 * 1024 * MiB, 0, None, None, "quota", avail_bytes=5 * MiB)
    assert not build_plan([item("a.tar", 8 * MiB, SHA["a"])], {}, {}, q, margin=0).fits


def test_unknown_quota_does_not_block() -> None:
    assert build_plan([item("a.tar", 8 * MiB, SHA["a"])], {}, {}, None).fits


def test_parse_margin() -> None:
    assert parse_margin("5%", 1000) == 50
    assert parse_margin("200M", None) == 200 * MiB
    assert parse_margin("0", 10) == 0
    with pytest.raises(ShardshipError):
        parse_margin("lots%", 10)
