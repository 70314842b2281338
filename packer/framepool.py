"""The worker processes of `packer pack`: frames go in per session, as soon as the
session is known to need encoding; each session's results come back in frame order
whenever the main process asks for them. Started at the first session fed, so
the workers encode while the main process still loads and checks the other
sessions (on 2 cores, a serial start-up is a core left idle)."""
from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Iterator, Sequence
from multiprocessing.pool import AsyncResult, Pool
from types import TracebackType
from typing import Any

from PIL import Image

from packer.imageops import ResizeSpec, process_frames
from packer.session import Session
from shardship.pil import cache_image_buffers

CHUNK = 16  # frames per task: small enough that the last tasks leave no core idle for long


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
    (a session fed early that then failed), the workers are stopped at once."""

    def __init__(self, workers: int, spec: ResizeSpec, lock_fd: int):
        self.workers, self.spec, self.lock_fd = workers or default_workers(), spec, lock_fd
        self._pool: Pool | None = None
        self._fed: dict[str, list[AsyncResult]] = {}
        self.started: float | None = None  # perf_counter of the first frame fed

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

    def fed(self, name: str) -> bool:
        return name in self._fed

    def feed(self, session: Session, keep: Sequence[int] | Any) -> None:
        """Queue the kept frames of a session (positions into session.frame_paths)."""
        pool = self._start()
        paths = [str(session.frame_paths[i]) for i in keep]
        self._fed[session.name] = [pool.apply_async(process_frames, (paths[i:i + CHUNK], self.spec))
                                   for i in range(0, len(paths), CHUNK)]

    def results(self, name: str) -> Iterator[tuple[bytes | None, bytes | None, str | None]]:
        """(jpeg, sha256 of the source, error) per frame of a fed session, in order."""
        for chunk in self._fed.pop(name):
            yield from chunk.get()

    def __enter__(self) -> FramePool:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._pool is None:
            return
        if exc_type is not None or self._fed:
            self._pool.terminate()
        else:
            self._pool.close()
        self._pool.join()
