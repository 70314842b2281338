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

import multiprocessing as mp
import os
import time
from collections.abc import Iterator
from multiprocessing.pool import AsyncResult, Pool
from pathlib import Path
from types import TracebackType

from PIL import Image

from packer.imageops import ResizeSpec, process_frames
from shardship.config import PackOptions
from shardship.pil import cache_image_buffers

CHUNK = 16  # frames per task: small enough that the last tasks leave no core idle for long
EARLY_FRAMES = 8_000  # fed before their session is checked: ~0.2 GB at most wait for a SLAM run elsewhere


def default_workers() -> int:
    """The cores this process may run on (a cgroup/taskset limit counts), not the
    machine's: more workers than cores only adds switching."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def _worker_init(lock_fd: int) -> None:
    """A forked worker drops its copy of the out dir lock: only the pack holds it."""
    try:
        os.close(lock_fd)
    except OSError:
        pass
    cache_image_buffers()


class FramePool:
    """Use as a context manager: on an error, or with results nobody asked for
    (a session fed early that then failed), the workers are stopped at once.
    `lock_fd`: the out dir lock the forked workers must not keep (-1: not taken
    yet when the pool starts, so there is none to inherit)."""

    def __init__(self, workers: int, spec: ResizeSpec, lock_fd: int = -1):
        self.workers, self.spec, self.lock_fd = workers or default_workers(), spec, lock_fd
        self._pool: Pool | None = None
        self._fed: dict[str, tuple[list[str], list[AsyncResult]]] = {}
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
            self._pool = ctx.Pool(self.workers, initializer=_worker_init, initargs=(self.lock_fd,))
            self.started = time.perf_counter()
        return self._pool

    def fed(self, name: str, paths: list[str]) -> bool:
        """Were exactly these frames fed for the session? Fed others (the listing
        `prefeed` made differs from the checked session's): those are dropped."""
        if name in self._fed and self._fed[name][0] != paths:
            self.drop(name)
        return name in self._fed

    def feed(self, name: str, paths: list[str]) -> None:
        """Queue a session's frames (the kept ones, in order)."""
        pool = self._start()
        self._fed[name] = (paths, [pool.apply_async(process_frames, (paths[i:i + CHUNK], self.spec))
                                   for i in range(0, len(paths), CHUNK)])

    def drop(self, name: str) -> None:
        """Nobody will ask for this session's results (it failed)."""
        if self._fed.pop(name, None) is not None:
            self._dropped = True

    def results(self, name: str) -> Iterator[tuple[bytes | None, bytes | None, str | None]]:
        """(jpeg, frame_digest of the source, error) per frame of a fed session, in order."""
        for chunk in self._fed.pop(name)[1]:
            yield from chunk.get()

    def __enter__(self) -> FramePool:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._pool is None:
            return
        if exc_type is not None or self._fed or self._dropped:
            self._pool.terminate()
        else:
            self._pool.close()
        self._pool.join()


def prefeed(raw: Path, out: Path, opts: PackOptions) -> FramePool:
    """A pool for `packer pack`, already encoding when the out dir has no index.json
    yet (a first pack: every session that checks out will be encoded): the frames
    of each session folder as a directory listing gives them (rgb/<number>.jpg in
    number order, every stride-th), up to EARLY_FRAMES. pack compares each listing
    with the checked session's frames and drops any that differ."""
    from packer.lockfile import held_by_another

    frames = FramePool.for_options(opts)
    if (out / "index.json").exists() or not raw.is_dir() or held_by_another(out):
        return frames
    stride = max(1, opts.stride)
    try:
        for d in sorted(p for p in raw.iterdir() if p.is_dir() and not p.name.startswith(".")):
            rgb = d / "rgb"
            if not rgb.is_dir():
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
    return frames
