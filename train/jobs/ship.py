"""Ship shardship's own code with the job: a source archive named by its content
hash, uploaded once next to the data and unpacked into `<root>/code/<name>/`; the
job script puts that directory first on PYTHONPATH, on top of the cluster's own
python and torch (its `setup` lines: module load, conda activate).

Why a source archive and not `pip install`: on a shared cluster `pip install -e`
fails on a read-only conda module, and a per-user venv with a second torch costs
quota and inodes; the code is pure Python, so PYTHONPATH is all it needs (the
users' own workaround). Why a content hash: every job runs exactly the code it
was submitted with, a resubmission of unchanged code uploads nothing, and a
newer submit never changes the code under a job that is still queued."""
from __future__ import annotations

import gzip
import hashlib
import io
import posixpath
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardship.errors import RemoteError

PACKAGES = ("shardship", "packer", "transfer", "train")  # everything `python -m train run` may import


@dataclass(frozen=True)
class CodeArchive:
    name: str  # shardship-src-<sha256 of the tar, 16 hex>
    data: bytes  # .tar.gz, byte-identical for identical sources (no times, owners or gzip mtime)
    files: int

    def remote_dir(self, root: str) -> str:
        """Where the job's PYTHONPATH points: `<root>/code/<name>`."""
        return posixpath.join(root, "code", self.name)


def source_root() -> Path:
    """The directory holding the packages (a checkout or site-packages)."""
    import train

    return Path(train.__file__).resolve().parent.parent


def build_archive(root: Path | None = None) -> CodeArchive:
    """Every .py file of PACKAGES under `root`, in sorted order with fixed metadata, so the
    same sources always give the same bytes and the same name."""
    root = root or source_root()
    files = sorted(p for pkg in PACKAGES for p in (root / pkg).rglob("*.py") if "__pycache__" not in p.parts)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for p in files:
            data = p.read_bytes()
            info = tarfile.TarInfo(p.relative_to(root).as_posix())
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    digest = hashlib.sha256(raw.getvalue()).hexdigest()[:16]
    gz = io.BytesIO()
    with gzip.GzipFile(fileobj=gz, mode="wb", mtime=0, compresslevel=9) as f:
        f.write(raw.getvalue())
    return CodeArchive(f"shardship-src-{digest}", gz.getvalue(), len(files))


def ship(remote: Any, archive: CodeArchive, root: str) -> bool:
    """Upload and unpack `archive` under `<root>/code/` unless it is already there.
    The unpacked directory appears by one rename, so a half-unpacked copy is never
    used. Returns True when it uploaded."""
    final = archive.remote_dir(root)
    if remote.exists(posixpath.join(final, "train", "__init__.py")):
        return False
    code = posixpath.dirname(final)
    tmp = f"{final}.part"
    tgz = f"{final}.tar.gz"
    remote.mkdir(code)
    remote.write_file(tgz, archive.data)
    for argv in (["rm", "-rf", tmp], ["mkdir", "-p", tmp], ["tar", "-xzf", tgz, "-C", tmp],
                 ["rm", "-rf", final], ["mv", tmp, final], ["rm", "-f", tgz]):
        res = remote.run(argv, timeout=300)
        if not res.ok:
            raise RemoteError(f"{remote.label}: shipping shardship's code to {final} failed at `{argv[0]}`: "
                              f"{(res.stderr or res.stdout).strip()[:200]}; check space and permissions in {code}")
    return True
