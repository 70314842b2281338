"""Quota parsers on real-format tool output (tests/data/quota/) and the source choice."""
from __future__ import annotations

from pathlib import Path

import pytest

from transfer.quota import (
    Quota,
    choose,
    parse_count,
    parse_df,
    parse_lfs_quota,
    parse_mmlsquota_y,
    parse_quota_s,
    parse_size,
    split_sections,
)

DATA = Path(__file__).parent / "data" / "quota"
KiB, MiB, GiB, TiB = 1024, 1024**2, 1024**3, 1024**4


def sample(name: str) -> str:
    return (DATA / name).read_text()


@pytest.mark.parametrize("token,expected", [
    ("10240M", 10240 * MiB), ("9.537T", round(9.537 * TiB)), ("0k", 0), ("0K", 0), ("479G", 479 * GiB),
    ("792.3M", round(792.3 * MiB)), ("4128M*", 4128 * MiB), ("[1041408]", 1041408 * KiB), ("1840", 1840 * KiB),
])
def test_parse_size_units(token: str, expected: int) -> None:
    assert parse_size(token) == expected


@pytest.mark.parametrize("token,expected", [
    ("352k", 352_000), ("10000k", 10_000_000), ("2126k", 2_126_000), ("115,486", 115_486), ("40468*", 40_468),
    ("1m", 1_000_000), ("[0]", 0),
])
def test_parse_count_powers_of_1000(token: str, expected: int) -> None:
    assert parse_count(token) == expected


def test_not_numbers_are_not_sizes() -> None:
    for t in ("6days", "none", "-", "13:30", "Filesystem"):
        assert parse_size(t) is None and parse_count(t) is None


def test_linux_quota_nfs_k_inodes() -> None:
    q = parse_quota_s(sample("quota_sw_nfs.txt"))
    assert q == Quota(5120 * GiB, 479 * GiB, 5_000_000, 352_000, "quota -s -w", filesystem="/nfs_global")
    assert q.headroom_bytes == (5120 - 479) * GiB


def test_linux_quota_soft_zero_inode_limit_means_none() -> None:
    q = parse_quota_s(sample("quota_sw_workspace.txt"))
    assert q.limit_bytes == 400 * GiB and q.used_bytes == 0
    assert q.inode_limit is None and q.inode_used == 1


def test_linux_quota_over_soft_limit_with_grace() -> None:
    q = parse_quota_s(sample("quota_sw_over.txt"))
    assert q.filesystem == "/dev/sda1"
    assert q.used_bytes == 10300 * MiB and q.limit_bytes == 10240 * MiB
    assert q.headroom_bytes < 0  # over the soft quota: nothing may be added
    assert (q.inode_used, q.inode_limit) == (40468, 50000)


def test_linux_quota_picks_the_row_of_our_filesystem() -> None:
    text = sample("quota_sw_over.txt")
    assert parse_quota_s(text, ("/dev/sdb1", "/scratch")) is None  # that row has no limits
    assert parse_quota_s(text, ("/dev/sda1", "/home")).limit_bytes == 10240 * MiB
    assert parse_quota_s(text, ("/dev/nvme0n1", "/data")) is None


def test_linux_quota_wrapped_long_filesystem_name() -> None:
    q = parse_quota_s(sample("quota_s_wrapped.txt"))
    assert q.filesystem == "fileserver.example.edu:/export/home/long/path"
    assert q.used_bytes == 4128 * MiB and q.limit_bytes == 10240 * MiB
    assert (q.inode_used, q.inode_limit) == (2_126_000, 3_000_000)


def test_scc_quota_wrapper() -> None:
    q = parse_quota_s(sample("quota_s_scc.txt"))
    assert q.source == "quota -s (SCC)"
    assert q.limit_bytes == 10 * GiB and q.used_bytes == int(3.72791 * GiB)
    assert (q.inode_used, q.inode_limit) == (115_486, 200_000)


def test_no_quota_output() -> None:
    assert parse_quota_s(sample("quota_none.txt")) is None
    assert parse_quota_s("quota: Cannot stat() mounted device tmpfs: No such file or directory\n") is None


def test_lfs_quota_kbytes() -> None:
    q = parse_lfs_quota(sample("lfs_quota.txt"))
    assert q.source == "lfs quota" and q.filesystem == "/lustre7"
    assert q.used_bytes == 982177580 * KiB and q.limit_bytes == 1000000000 * KiB
    assert q.inode_used == 443208230 and q.inode_limit is None


def test_lfs_quota_human_units() -> None:
    q = parse_lfs_quota(sample("lfs_quota_h.txt"))
    assert q.limit_bytes == round(9.537 * TiB) and q.used_bytes == round(792.3 * MiB)
    assert (q.inode_used, q.inode_limit) == (9, 2_000_000)


def test_lfs_quota_brackets_and_wrapped() -> None:
    q = parse_lfs_quota(sample("lfs_quota_brackets.txt"))
    assert q.used_bytes == 1041408 * KiB and q.limit_bytes == 5242880 * KiB
    w = parse_lfs_quota(sample("lfs_quota_wrapped.txt"))
    assert w.filesystem == "/lustre/a/very/long/filesystem/name"
    assert w.used_bytes == 5242880 * KiB and w.limit_bytes == 4194304 * KiB and w.inode_limit == 1_000_000


def test_lfs_quota_without_limits_defers_to_df() -> None:
    assert parse_lfs_quota(sample("lfs_quota_nolimit.txt")) is None


def test_mmlsquota_y_user_row() -> None:
    q = parse_mmlsquota_y(sample("mmlsquota_y.txt"))
    assert q.source == "mmlsquota -Y" and q.filesystem == "gpfs01"
    assert q.used_bytes == 2097152 * KiB and q.limit_bytes == 10485760 * KiB
    assert (q.inode_used, q.inode_limit) == (4000, 500000)


def test_df_posix_tmpfs_and_inodes() -> None:
    q = parse_df(sample("df_p_tmpfs.txt"), sample("df_pi_tmpfs.txt"))
    assert q.source == "df -P" and q.filesystem == "tmpfs on /dev/shm"
    assert q.limit_bytes == 24684096 * KiB and q.used_bytes == 0 and q.avail_bytes == 24684096 * KiB
    assert (q.inode_limit, q.inode_used) == (3085512, 1)


def test_df_root_reserve_makes_avail_the_ceiling() -> None:
    q = parse_df(sample("df_p_root.txt"))
    assert q.limit_bytes - q.used_bytes > q.avail_bytes  # ext4 reserve for root
    assert q.headroom_bytes == q.avail_bytes


def test_df_512_byte_blocks() -> None:
    q = parse_df(sample("df_p_512.txt"))
    assert q.limit_bytes == 965595304 * 512 and q.filesystem.endswith("/System/Volumes/Data")


def test_df_rejects_inode_table_as_space() -> None:
    assert parse_df(sample("df_pi_root.txt")) is None


def _probe_output(**sections: str) -> str:
    return "".join(f"@@{k}\n{v}\n" for k, v in sections.items()) + "@@end\n"


def test_choose_prefers_user_quota_and_keeps_df_free_space() -> None:
    df = "Filesystem 1024-blocks Used Available Capacity Mounted on\n/dev/sda1 104857600 52428800 1048576 98% /home\n"
    s = split_sections(_probe_output(df=df, quota=sample("quota_sw_over.txt").replace("10300M*", "1024M")))
    q = choose(s)
    assert q.source == "quota -s -w" and q.limit_bytes == 10240 * MiB
    assert q.avail_bytes == 1048576 * KiB
    assert q.headroom_bytes == 1048576 * KiB  # the filesystem is nearly full: its free space is the ceiling


def test_choose_falls_back_to_df_then_lfs_then_gpfs() -> None:
    df = sample("df_p_tmpfs.txt")
    assert choose(split_sections(_probe_output(df=df, quota=""))).source == "df -P"
    assert choose(split_sections(_probe_output(df=df, lfs=sample("lfs_quota.txt")))).source == "lfs quota"
    assert choose(split_sections(_probe_output(df=df, mmlsquota=sample("mmlsquota_y.txt")))).source == "mmlsquota -Y"


def test_choose_ignores_scc_home_quota_outside_home() -> None:
    s = split_sections(_probe_output(df=sample("df_p_root.txt"), quota_s=sample("quota_s_scc.txt")))
    assert choose(s, under_home=True).source == "quota -s (SCC)"
    assert choose(s, under_home=False).source == "df -P"
