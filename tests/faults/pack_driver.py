"""Runs `packer pack` (the real CLI) with a fault hook, for tests/faults.

    python -m tests.faults.pack_driver OUT ACTION K -- <packer pack args>

Counts the mutations of the out dir's real names (os.replace onto a name in OUT,
os.unlink of a name in OUT; temp files, whose names start with '.', do not count)
and after the K-th one sends itself ACTION: KILL (SIGKILL, as a power cut or the
OOM killer would) or STOP (SIGSTOP: a pack that holds the out dir and never ends).
K = 0 only counts: the total is written to OUT/../mutations.txt at exit."""
from __future__ import annotations

import atexit
import os
import signal
import sys
from pathlib import Path


def main() -> None:
    out, action, k = Path(sys.argv[1]).resolve(), sys.argv[2], int(sys.argv[3])
    args = sys.argv[sys.argv.index("--") + 1:]
    sig = {"KILL": signal.SIGKILL, "STOP": signal.SIGSTOP}[action]
    count = [0]
    real_replace, real_unlink = os.replace, os.unlink

    def counted(path) -> None:
        p = Path(os.fsdecode(path)).resolve()
        if p.parent == out and not p.name.startswith("."):
            count[0] += 1
            if count[0] == k:
                os.kill(os.getpid(), sig)

    def replace(src, dst, **kw):
        real_replace(src, dst, **kw)
        counted(dst)

    def unlink(path, **kw):
        real_unlink(path, **kw)
        counted(path)

    os.replace, os.unlink = replace, unlink  # type: ignore[assignment]
    atexit.register(lambda: (out.parent / "mutations.txt").write_text(str(count[0])))
    from packer.cli import main as packer_main

    packer_main(["pack", *args], standalone_mode=True)


if __name__ == "__main__":
    main()
