"""`packer pack` SIGKILLed while its workers encode (issue 39.7.5): the workers go with
it, quietly. Before, an orphan finished its chunk, wrote the result into the pipe
nobody read any more and printed a BrokenPipeError traceback (two of them, chained)
on the terminal after the pack was gone; with the kernel's parent-death signal
switched off, one of them also waited for ever on the result pipe's lock."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.procs import children_by_parent

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _children(pid: int) -> list[int]:
    """The live processes whose parent is `pid` (from /proc)."""
    return children_by_parent(live_only=True).get(pid, [])


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for a parent (here: init) to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def sessions(tmp_path_factory: pytest.TempPathFactory) -> Path:
    raw = tmp_path_factory.mktemp("orphans") / "raw"
    r = subprocess.run([sys.executable, "-m", "packer", "synth", "--out", str(raw), "--sessions", "2", "--frames",
                        "120", "--export", "folder", "--workers", "2", "--quiet"], cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return raw


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process tree from /proc")
@pytest.mark.parametrize("after_s", [0.0, 0.05])
def test_sigkilled_pack_leaves_no_worker_and_no_traceback(sessions: Path, tmp_path: Path, after_s: float) -> None:
    """SIGKILL the pack's main process once its two workers are busy encoding (the
    240 frames take them ~0.3 s; unfixed, both delays printed the traceback every
    time here); then its stderr, which the workers share, must close without a
    traceback and no worker may live on."""
    proc = subprocess.Popen([sys.executable, "-m", "packer", "pack", "--raw", str(sessions), "--out",
                             str(tmp_path / "packed"), "--workers", "2"], cwd=ROOT, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(_children(proc.pid)) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        workers = _children(proc.pid)
        assert len(workers) >= 2, f"the pool never started: {proc.poll()}"
        time.sleep(after_s)
        proc.kill()
        _, err = proc.communicate(timeout=30)  # returns once every holder of its stderr, the workers too, is gone
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    deadline = time.monotonic() + 5
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = [w for w in workers if _alive(w)]
    for w in survivors:
        os.kill(w, signal.SIGKILL)
    assert not survivors, f"workers {survivors} outlived the pack"
    assert proc.returncode == -signal.SIGKILL
    assert "Traceback" not in err and "BrokenPipeError" not in err, err[-3000:]
