"""SLAM in worker processes: as many at once as memory holds, and a worker killed as
the out-of-memory killer kills it (SIGKILL, from outside) loses only its own session."""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from packer.slam import SlamOptions, slam_sessions
from packer.slam.workers import estimate_mb, killed_message, memory_jobs
from packer.synth import synth_session


def test_memory_jobs_fit_the_largest_sessions_in_what_is_available() -> None:
    assert memory_jobs(4, [500, 500, 500, 500], 16_000) == 4
    assert memory_jobs(4, [2_000, 2_000, 300, 300], 4_000) == 1  # two 5-minute sessions do not fit at once
    assert memory_jobs(4, [2_000, 300, 300, 300], 3_500) == 3
    assert memory_jobs(3, [900, 900, 900], 3_000) == 2
    assert memory_jobs(4, [9_000], 1_000) == 1  # never fewer than one: the kill then says why
    assert memory_jobs(4, [500] * 4, None) == 4  # not Linux: no limit known


def test_estimate_grows_with_the_session_as_measured() -> None:
    whole = {"chunk_keyframes": 0}
    assert estimate_mb(1_800, **whole) == pytest.approx(334, rel=0.05)  # 30 s: 301 keyframes, 334 MB peak measured
    assert estimate_mb(5_400, **whole) == pytest.approx(1_067, rel=0.05)  # 90 s: 901 keyframes, 1,067 MB
    assert estimate_mb(18_000, **whole) > 4_000  # a 5-minute session mapped whole (extrapolated)
    assert estimate_mb(18_000, **whole) > estimate_mb(1_800, **whole) > estimate_mb(0, **whole)


def test_estimate_of_a_session_mapped_in_parts_is_that_of_one_part() -> None:
    assert estimate_mb(1_800) == estimate_mb(1_800, chunk_keyframes=0)  # 301 keyframes: one part, as before
    assert estimate_mb(5_400) == pytest.approx(373, rel=0.05)  # 90 s in 3 parts: 373 MB measured (slam_memory)
    assert estimate_mb(18_000) < 600  # 5 minutes in 9 parts
    assert estimate_mb(18_000, chunk_keyframes=200) < estimate_mb(18_000)


def test_killed_message_names_the_signal_the_need_and_what_to_do() -> None:
    m = killed_message("session_X", -signal.SIGKILL, 1_990)
    assert m.startswith("session session_X: its SLAM process was killed by SIGKILL (the out-of-memory killer")
    assert "~1,990 MB" in m and "close other programs" in m
    assert "exit code 1" in killed_message("s", 1, 200)


def _spawned_workers() -> list[int]:
    """This process's spawned multiprocessing children (not the resource tracker)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == os.getpid() and b"spawn_main" in cmd:
            out.append(int(pid))
    return out


def _kill_first(n: int, after_s: float, stop: threading.Event, killed: list[int]) -> None:
    """SIGKILL the first `n` SLAM workers, each once it has run `after_s` (mid-SfM)."""
    seen: dict[int, float] = {}
    while not stop.is_set() and len(killed) < n:
        now = time.monotonic()
        for pid in _spawned_workers():
            if pid in killed:
                continue
            seen.setdefault(pid, now)
            if now - seen[pid] >= after_s:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                break
        time.sleep(0.05)


@pytest.mark.slow
def test_a_killed_worker_fails_only_its_own_session(tmp_path: Path) -> None:
    """One worker for two sessions: the first is killed mid-reconstruction, which breaks
    the executor for both; both run again alone, the first is killed again and fails with
    the reason, the second finishes as it would have."""
    # 10 s sessions: SfM takes seconds, so a worker seen for 1.5 s is still on its session
    a = synth_session(tmp_path, "session_2026-01-01_120000", 600, 11, imu_offset=0.0237)
    b = synth_session(tmp_path, "session_2026-01-01_130000", 600, 12)
    stop, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_first, args=(2, 1.5, stop, killed), daemon=True)
    killer.start()
    try:
        ra, rb = slam_sessions([a, b], SlamOptions(progress=False, force=True), jobs=1, isolate=True)
    finally:
        stop.set()
        killer.join()
    assert len(killed) == 2
    assert ra.failed and "killed by SIGKILL" in ra.message and "MB" in ra.message, ra.message
    assert rb.status == "ok" and rb.metric and rb.scale is not None, rb.message
