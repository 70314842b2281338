"""`packer slam` sessions in spawned worker processes, sized to the memory there is,
and surviving one that the system kills.

SfM's memory grows faster than the number of keyframes it maps: peaks measured in
GLOMAP's mapping stage were 334 MB for 30 s (301 keyframes) and 1,067 MB for 90 s
(901 keyframes) mapped whole, which a base, a linear and a quadratic term fit. A
long session is mapped in parts of at most `[slam] chunk_keyframes`
(packer/slam/mapping/chunks.py), so the quadratic term is that of one part and only a small
linear one grows with the whole session (`estimate_mb`). The number of processes
is cut to what MemAvailable holds (`memory_jobs`). Should the out-of-memory
killer (SIGKILL) still end a worker, the executor breaks for every session it
held; each of those is run again alone, and only one that is killed alone is
failed, with a line saying why and what to do: the other sessions are never lost
with it."""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

BASE_MB = 150.0  # interpreter, pycolmap, OpenCV, the session's own arrays
MB_PER_KEYFRAME = 0.41  # fitted with MB_PER_KEYFRAME_SQ through the two measured peaks (module docstring)
MB_PER_KEYFRAME_SQ = 6.8e-4
MB_PER_SESSION_KEYFRAME = 0.03  # what grows with the whole session when mapped in parts: tracks, the joined
# model, poses (90 s in 3 parts: 373 MB measured against 357 for its largest part alone)
KEYFRAMES_PER_S = 10.0  # keyframe candidates every 0.1 s (SlamOptions.max_keyframe_gap)
FPS = 60.0  # the app's frame rate, to turn a frame count into seconds


def estimate_mb(n_frames: int, fps: float = FPS, chunk_keyframes: int = 400, overlap: int = 40) -> float:
    """Peak memory of one session's SLAM, from its frame count and the part size
    (`chunk_keyframes`, 0: mapped whole)."""
    from packer.slam.mapping.chunks import chunk_ranges

    k = int(KEYFRAMES_PER_S * n_frames / max(fps, 1.0))
    part = max((b - a for a, b in chunk_ranges(k, chunk_keyframes, overlap)), default=0)
    return BASE_MB + MB_PER_KEYFRAME * part + MB_PER_KEYFRAME_SQ * part * part + MB_PER_SESSION_KEYFRAME * (k - part)


def frame_count(session_dir: Path) -> int:
    """Frames in a session folder's rgb/ (0 when it cannot be listed: the session's own
    check will say why)."""
    try:
        return sum(1 for e in os.scandir(session_dir / "rgb") if e.name.lower().endswith((".jpg", ".jpeg")))
    except OSError:
        return 0


def mem_available_mb() -> float | None:
    """MemAvailable from /proc/meminfo (None off Linux)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def memory_jobs(jobs: int, estimates_mb: list[float], available_mb: float | None, headroom: float = 0.8) -> int:
    """The most processes (<= jobs, >= 1) whose largest sessions, run at once, fit in
    `headroom` of the available memory."""
    if available_mb is None or not estimates_mb:
        return max(1, jobs)
    biggest = sorted(estimates_mb, reverse=True)
    k = max(1, jobs)
    while k > 1 and sum(biggest[:k]) > headroom * available_mb:
        k -= 1
    return k


def killed_message(name: str, exitcode: int | None, need_mb: float) -> str:
    """The line for a session whose worker died without a result."""
    if exitcode is not None and exitcode < 0:
        how = signal.Signals(-exitcode).name if -exitcode in signal.valid_signals() else f"signal {-exitcode}"
    else:
        how = f"exit code {exitcode}"
    free = mem_available_mb()
    have = f", {free:,.0f} MB available now" if free is not None else ""
    likely = " (the out-of-memory killer sends SIGKILL)" if exitcode == -signal.SIGKILL else ""
    return (f"session {name}: its SLAM process was killed by {how}{likely}; it needs ~{need_mb:,.0f} MB{have}: "
            "close other programs and run again, lower [slam] chunk_keyframes (parts of fewer keyframes need less), "
            "or run packer slam on a machine with more memory")


def run_in_processes(dirs: list[Path], fn: Callable[[Path], Any], jobs: int,
                     done: Callable[[int, Any], None], failed: Callable[[int, str], None],
                     chunk_keyframes: int = 400) -> None:
    """fn(dir) per directory in spawned processes (at most `jobs`, fewer where memory is
    short); done(i, result) per result, failed(i, message) per session whose process
    died alone or raised. A Ctrl-C or any error kills the workers (see _round)."""
    need = [estimate_mb(frame_count(d), chunk_keyframes=chunk_keyframes) for d in dirs]
    jobs = memory_jobs(jobs, need, mem_available_mb())
    broken = _round(dirs, list(range(len(dirs))), fn, jobs, done, failed)
    for i in sorted(broken):  # each alone, in order, in a fresh process: the one killed again is the one
        for j, code in _round(dirs, [i], fn, 1, done, failed).items():
            failed(j, killed_message(dirs[j].name, code, need[j]))


def _dead_worker_code(ex: ProcessPoolExecutor, started: list[Any]) -> int | None:
    """The exit code of the worker whose death broke `ex` (not the SIGTERM the
    executor then sends the others). `started`: its processes as seen after the
    submits (the executor may have let go of them by now)."""
    manager = getattr(ex, "_executor_manager_thread", None)
    if manager is not None:  # it reaps the workers of a broken executor: their exit codes land then
        manager.join(5)
    procs = list({id(p): p for p in [*started, *(getattr(ex, "_processes", None) or {}).values()]}.values())
    for p in procs:  # the executor's own thread may be reaping them: its exit code lands then
        p.join(2)
    codes = [c for c in (p.exitcode for p in procs) if c not in (None, 0)]
    return next((c for c in codes if c != -signal.SIGTERM), codes[0] if codes else None)


def _round(dirs: list[Path], idx: list[int], fn: Callable[[Path], Any], jobs: int,
           done: Callable[[int, Any], None], failed: Callable[[int, str], None]) -> dict[int, int | None]:
    """One executor over `idx`: {index: a dead worker's exit code} for the sessions lost
    when a worker died. Workers start with Ctrl-C ignored (a terminal sends it to the whole
    group: they would print KeyboardInterrupt tracebacks); on an interrupt or any error
    this process kills them, instead of the executor's shutdown waiting for running ones."""
    ex = ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"))
    lost: dict[int, int | None] = {}
    try:
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited through exec by the spawned workers
        try:
            futs = {ex.submit(fn, dirs[i]): i for i in idx}
        finally:
            signal.signal(signal.SIGINT, old)
        started = list((getattr(ex, "_processes", None) or {}).values())  # spawned by submit
        for f in as_completed(futs):
            i = futs[f]
            try:
                done(i, f.result())
            except BrokenProcessPool:  # the executor then terminates (SIGTERM) the others
                lost[i] = _dead_worker_code(ex, started)
            except Exception as e:  # a crash in a worker (a bug or pycolmap abort): report, go on
                failed(i, f"session {dirs[i].name}: internal error: {type(e).__name__}: {e}")
    except BaseException:
        workers = list((getattr(ex, "_processes", None) or {}).values())
        ex.shutdown(wait=False, cancel_futures=True)
        for w in workers:
            w.kill()
        for w in workers:
            w.join(5)
        raise
    ex.shutdown()
    return lost
