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
