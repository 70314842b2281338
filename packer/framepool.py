"""The worker processes of `packer pack`: frames go in per session, as soon as the
session is likely to need encoding; each session's results come back in frame
order whenever the main process asks for them. On 2 cores a serial start-up is a
core left idle, so the pool starts early: `prefeed` (a fresh out dir) starts it
from a plain directory listing before the CLI imports numpy and loads a session;
otherwise it starts at the first session fed. An encoded frame depends only on
the file and the resize options, never on poses or SLAM, so early work is lost
only for a session that then fails (its results are dropped).

No numpy of its own here: `prefeed` runs before the pack's own imports. (numpy
does come in with packer.imageops' simplejpeg, once, before the workers fork,
where importing it in each worker would cost it twice.)"""
from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.pool import AsyncResult, Pool
from pathlib import Path
from types import TracebackType

from PIL import Image

from packer.imageops import ResizeSpec, process_frames
from shardship.atomic import interrupts_deferred
from shardship.config import PackOptions
from shardship.pil import cache_image_buffers

CHUNK = 16  # frames per task: small enough that the last tasks leave no core idle for long
EARLY_FRAMES = 8_000  # fed (queued) before their session is checked
# Frames encoded ahead of the writer at most: their JPEGs wait in memory (~25 kB
# each at 224x224), so this bounds the pack's memory whatever the session length
# (~0.1 GB), and it is ~15 s of work for 2 cores while a SLAM run or a session's
# planning keeps the writer busy.
AHEAD_FRAMES = 4_096


def default_workers() -> int:
    """The cores this process may run on (a cgroup/taskset limit counts), not the
    machine's: more workers than cores only adds switching."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def _worker_init(lock_fd: int, parent: int) -> None:
    """A forked worker drops its copy of the out dir lock: only the pack holds it.
    It ignores Ctrl-C: a terminal sends SIGINT to the whole process group, and the
    main process alone decides what an interrupt means (it stops the workers);
    a worker of its own would print a KeyboardInterrupt traceback, or die half-way
    through sending a result and leave the pool's result pipe corrupt. And it dies
    with `parent`, the pack (_die_with_parent)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # FramePool._start forks with both deferred
    _die_with_parent(parent)
    try:
        os.close(lock_fd)
    except OSError:
        pass
    cache_image_buffers()


_PR_SET_PDEATHSIG = 1  # linux/prctl.h
ORPHAN_POLL_S = 0.2  # where the kernel cannot kill a worker with its parent: how often it looks


def _die_with_parent(parent: int) -> None:
    """A pack killed with SIGKILL (the OOM killer, a scheduler, `kill -9`) cannot stop its
    workers. An orphan then finished its chunk and wrote the result into the pipe nobody
    reads any more: Python's BrokenPipeError, a two-part traceback on the terminal after the
    pack was long gone. So the kernel kills each worker with its parent (Linux:
    PR_SET_PDEATHSIG); elsewhere a thread of the worker looks for its parent every
    ORPHAN_POLL_S and ends it, and a write into the result pipe without a reader ends it
    quietly in the meantime (SIGPIPE's default action, which Python turns off). Without
    the thread an orphan could wait for ever: one that died by SIGPIPE holding the result
    pipe's lock leaves the next one blocked on that lock. A parent gone before this ran is
    noticed by its pid."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    if not _kernel_kills_orphans():
        threading.Thread(target=_exit_when_orphaned, args=(parent,), name="orphan-watch", daemon=True).start()
    if os.getppid() != parent:
        os._exit(0)


def _kernel_kills_orphans() -> bool:
    """Ask Linux to SIGKILL this process when its parent dies; False where it cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) == 0
    except (OSError, AttributeError):  # no libc to ask
        return False


def _exit_when_orphaned(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(ORPHAN_POLL_S)
    os._exit(0)


@dataclass
class _Fed:
    """One session's frames: its chunks' tasks in order, None before they are
    submitted and again once their results were handed out (so they are freed)."""
    paths: list[str]
    jobs: list[AsyncResult | None] = field(default_factory=list)
    submitted: int = 0  # chunks submitted so far (always the first ones)

    def __post_init__(self) -> None:
        self.jobs = [None] * ((len(self.paths) + CHUNK - 1) // CHUNK)


class FramePool:
    """Frames are encoded at most AHEAD_FRAMES ahead of what was handed out:
    `feed` queues, the pool tops up as `results` hands out, the session being
    read first. Use as a context manager: on an error, or with results nobody asked for
    (a session fed early that then failed), the workers are stopped at once.
    `lock_fd`: the out dir lock the forked workers must not keep (-1: not taken
    yet when the pool starts, so there is none to inherit)."""

    def __init__(self, workers: int, spec: ResizeSpec, lock_fd: int = -1):
        self.workers, self.spec, self.lock_fd = workers or default_workers(), spec, lock_fd
        self._pool: Pool | None = None
        self._fed: dict[str, _Fed] = {}  # in feed order
        self._ahead = 0  # chunks submitted and not handed out
        self._dropped = False
        self.early = EARLY_FRAMES  # frames that may still be fed before their session is checked
        self.started: float | None = None  # perf_counter of the first frame fed

    @classmethod
    def for_options(cls, opts: PackOptions, lock_fd: int = -1) -> FramePool:
        return cls(opts.workers, ResizeSpec(opts.size, opts.crop, opts.quality), lock_fd)

    def _start(self) -> Pool:
        if self._pool is None:
            # fork starts a pool in ~20 ms where spawn takes ~0.5 s (measured here); the
            # workers only run PIL on their own inputs, so no lock state is inherited
            # that they could trip on. Platforms without fork use spawn.
            ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
            # Pillow imports its five core plugins at the first open/save: once here,
            # before the fork, instead of once in every worker
            Image.preinit()
            # Ctrl-C held while the pool starts: a pool half-built when it lands is one
            # nobody stops (its exit finalizer then waited for ever on a worker's queue
            # lock), and a worker forked before _worker_init would die of it (a worker
            # inherits the recording handler until then). Raised right after, with the
            # pool in place for __exit__ to stop.
            with interrupts_deferred():
                self._pool = ctx.Pool(self.workers, initializer=_worker_init,
                                     initargs=(self.lock_fd, os.getpid()))
                self.started = time.perf_counter()
        return self._pool

    def fed(self, name: str, paths: list[str]) -> bool:
        """Were exactly these frames fed for the session? Fed others (the listing
        `prefeed` made differs from the checked session's): those are dropped."""
        if name in self._fed and self._fed[name].paths != paths:
            self.drop(name)
        return name in self._fed

    def feed(self, name: str, paths: list[str]) -> None:
        """Queue a session's frames (the kept ones, in order)."""
        self._start()
        self._fed[name] = _Fed(paths)
        self._top_up()

    def _submit(self, s: _Fed) -> None:
        assert self._pool is not None
        i = s.submitted
        s.jobs[i] = self._pool.apply_async(process_frames, (s.paths[i * CHUNK:(i + 1) * CHUNK], self.spec))
        s.submitted += 1
        self._ahead += 1

    def _top_up(self, first: _Fed | None = None) -> None:
        """Submit queued chunks, `first`'s before the others', up to AHEAD_FRAMES."""
        for s in ([first] if first is not None else []) + list(self._fed.values()):
            while s.submitted < len(s.jobs) and self._ahead * CHUNK < AHEAD_FRAMES:
                self._submit(s)

    def drop(self, name: str) -> None:
        """Nobody will ask for this session's results (it failed)."""
        s = self._fed.pop(name, None)
        if s is not None:
            self._dropped = True
            self._ahead -= sum(j is not None for j in s.jobs)
            self._top_up()

    def results(self, name: str) -> Iterator[tuple[bytes | None, bytes | None, str | None]]:
        """(jpeg, frame_digest of the source, error) per frame of a fed session, in
        order. Each chunk is let go once handed out: a session's JPEGs are never all
        in memory at once."""
        s = self._fed[name]
        for i in range(len(s.jobs)):
            if i >= s.submitted:
                self._submit(s)
            job, s.jobs[i] = s.jobs[i], None
            assert job is not None
            out = job.get()
            self._ahead -= 1
            self._top_up(s)
            yield from out
        del self._fed[name]

    def __enter__(self) -> FramePool:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._pool is None:
            return
        if exc_type is not None or self._fed or self._dropped:
            stop_now(self._pool)
            return
        try:
            self._pool.close()
            self._pool.join()
        except BaseException:  # a Ctrl-C while the finished workers exit: left to the pool's
            stop_now(self._pool)  # exit finalizer, it hangs on the task queue's lock a waiting worker holds
            raise


def stop_now(pool: Pool) -> None:
    """Kill the workers and reap them, without `Pool.terminate`: that one drains
    the result pipe, which blocks for ever when a worker was killed half-way
    through writing a result (the remaining bytes never come), and it also runs
    from the pool's exit finalizer. Seen as a Ctrl-C that hung `packer pack` until
    a second one. The pool's threads are daemons left blocked on its pipes, with
    nothing that joins them; the workers hold nothing the main process needs (they
    only encode their own inputs) and never the out dir lock. A Ctrl-C meanwhile
    (the first one landing here, or a second one) is held until the pool is
    stopped: cut short, it left the pool's own finalizer to hang at exit."""
    with interrupts_deferred():
        _stop(pool)


def _stop(pool: Pool) -> None:
    from multiprocessing.pool import TERMINATE

    pool._state = TERMINATE  # type: ignore[attr-defined]
    for handler in (pool._worker_handler, pool._task_handler, pool._result_handler):  # type: ignore[attr-defined]
        handler._state = TERMINATE  # the worker handler must not start replacements for the killed ones
    pool._change_notifier.put(None)  # type: ignore[attr-defined]  # wakes the worker handler to see it
    # The worker handler may be half-way through replacing a killed worker when it sees
    # TERMINATE (a loaded machine: seen as two replacements, forked after the kill, left
    # orphaned and holding the pack's stderr open): kill what is in the pool until the
    # handler has ended, then once more.
    deadline = time.monotonic() + 10
    while True:
        handler_done = not pool._worker_handler.is_alive()  # type: ignore[attr-defined]
        workers = list(pool._pool)  # type: ignore[attr-defined]
        for w in workers:
            if w.exitcode is None:
                w.kill()
        for w in workers:
            w.join(5)
        if handler_done or time.monotonic() > deadline:
            break
        pool._worker_handler.join(0.2)  # type: ignore[attr-defined]
    pool._terminate.cancel()  # type: ignore[attr-defined]  # no Pool.terminate at interpreter exit either


def prefeed(frames: FramePool, raw: Path, out: Path, opts: PackOptions) -> None:
    """Start `frames` (a pool for `packer pack`, already entered as a context manager,
    so a Ctrl-C while this feeds stops its workers) encoding when the out dir has no
    index.json yet (a first pack: every session that checks out will be encoded): the frames
    of each session folder as a directory listing gives them (rgb/<number>.jpg in
    number order, every stride-th), up to EARLY_FRAMES; not `session_X (1)/`
    beside `session_X/` (a second copy, packer.duplicates). pack compares each listing
    with the checked session's frames and drops any that differ."""
    from packer.duplicates import original_name
    from packer.lockfile import held_by_another

    if (out / "index.json").exists() or not raw.is_dir() or held_by_another(out):
        return
    stride = max(1, opts.stride)
    try:
        for d in sorted(p for p in raw.iterdir() if p.is_dir() and not p.name.startswith(".")):
            rgb = d / "rgb"
            if not rgb.is_dir() or (original_name(d.name) != d.name and (raw / original_name(d.name)).is_dir()):
                continue
            stems = ((Path(f.name).stem, f.name) for f in os.scandir(rgb) if f.name.lower().endswith((".jpg", ".jpeg")))
            files = sorted((int(stem), name) for stem, name in stems if stem.isdigit())
            paths = [str(rgb / name) for _, name in files][::stride]
            if len(paths) > frames.early:
                break
            if not paths:
                continue
            frames.feed(d.name, paths)
            frames.early -= len(paths)
    except OSError:
        pass  # pack reports what is unreadable
