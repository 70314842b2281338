import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.datasets import make_raw  # noqa: E402

pytest_plugins = ["tests.sshd"]  # the real OpenSSH sshd fixture (tests/sshd.py)


@pytest.fixture(scope="session")
def raw_cache(tmp_path_factory) -> Path:
    """Three rendered sessions shared (read-only) by the tests; copy before mutating."""
    return make_raw(tmp_path_factory.mktemp("raw"), sessions=3, frames=48, seed=7)


@pytest.fixture
def raw_copy(raw_cache: Path, tmp_path: Path) -> Path:
    import shutil

    dst = tmp_path / "raw"
    shutil.copytree(raw_cache, dst, symlinks=True)
    return dst


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


@pytest.fixture
def tmpfs_1m(tmp_path: Path):
    """A real 1 MiB tmpfs (a full disk from the kernel), unmounted afterwards; skipped where
    mounting is not allowed."""
    import subprocess

    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
