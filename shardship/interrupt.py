"""Ctrl-C while a command line tool is still importing: one line, exit 130.

A CLI module imports click, numpy and the rest before its command runs; a Ctrl-C
then (an impatient user, or a terminal sending SIGINT to a whole process group)
would print a KeyboardInterrupt traceback from deep inside an import. Nothing has
started, so nothing needs saving: `quiet_imports` exits at once with the line
friendly_errors would print. Standard library only: it runs before the imports."""
from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


def _exit_quietly(signum: int, frame: FrameType | None) -> None:
    try:
        sys.stderr.write("\ninterrupted before anything started: nothing to save\n")
        sys.stderr.flush()
    finally:
        os._exit(130)


@contextmanager
def quiet_imports() -> Iterator[None]:
    """Around a CLI module's imports: Ctrl-C exits quietly (see the module
    docstring); Python's own handler is back afterwards, so commands and any
    importer (tests, other tools) see the usual KeyboardInterrupt. Only in the
    main thread, and only when nobody installed a handler of their own."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    signal.signal(signal.SIGINT, _exit_quietly)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
