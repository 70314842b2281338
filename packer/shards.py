"""Writing WebDataset-named POSIX tar shards with the byte offset of every member,
so a reader can seek straight to one sample. Deterministic bytes (fixed mtime,
owner, mode): an unchanged session re-packs to identical shards and identical
sha256, which is what makes uploads a delta."""
from __future__ import annotations

import hashlib
import io
import os
import re
import tarfile
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

from packer.atomic import TMP_SUFFIX

BLOCK = 512


def shard_prefix(session: str) -> str:
    """File-system- and shell-friendly shard name prefix for a session: an ASCII slug
    plus a short hash of the exact name, so names with spaces/unicode stay unique."""
    ascii_name = unicodedata.normalize("NFKD", session).encode("ascii", "ignore").decode()
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", ascii_name).strip("-.")[:48] or "session"
    h = hashlib.sha256(session.encode()).hexdigest()[:6]
    return f"{slug}-{h}"


@dataclass
class ShardInfo:
    name: str
    bytes: int
    sha256: str
    session: str
    samples: list[list] = field(default_factory=list)  # [key, jpg_off, jpg_size, json_off, json_size, has_action]

    def to_json(self) -> dict:
        return {"name": self.name, "bytes": self.bytes, "sha256": self.sha256, "session": self.session,
                "samples": self.samples, "compressed": None}


class _HashingWriter(io.RawIOBase):
    """File wrapper that hashes what passes through (no second read of the shard)."""

    def __init__(self, f):
        self.f, self.h, self.n = f, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.n

    def write(self, b) -> int:
        self.f.write(b)
        self.h.update(b)
        self.n += len(b)
        return len(b)


class ShardWriter:
    """Rolls a session's samples into `<prefix>-NNNN.tar` files of about
    `target_bytes`. Each shard is written to a temp name and only renamed by
    `commit()`, so a crash never leaves a half shard under a real name."""

    def __init__(self, out_dir: Path, session: str, target_bytes: int):
        self.out_dir, self.session, self.target = Path(out_dir), session, target_bytes
        self.prefix = shard_prefix(session)
        self.done: list[ShardInfo] = []  # closed, still under temp names
        self._tmp_paths: list[Path] = []
        self._tar: tarfile.TarFile | None = None
        self._file = None
        self._hw: _HashingWriter | None = None
        self._cur: ShardInfo | None = None

    def _open(self) -> None:
        name = f"{self.prefix}-{len(self.done):04d}.tar"
        tmp = self.out_dir / f".{name}{TMP_SUFFIX}"
        self._tmp_paths.append(tmp)
        self._file = open(tmp, "wb")
        self._hw = _HashingWriter(self._file)
        self._tar = tarfile.open(fileobj=self._hw, mode="w", format=tarfile.PAX_FORMAT, encoding="utf-8")
        self._cur = ShardInfo(name, 0, "", self.session)

    def _member(self, name: str, data: bytes) -> tuple[int, int]:
        ti = tarfile.TarInfo(name)
        ti.size, ti.mtime, ti.mode, ti.uid, ti.gid = len(data), 0, 0o644, 0, 0
        ti.uname = ti.gname = ""
        assert self._tar is not None
        self._tar.addfile(ti, io.BytesIO(data))
        padded = -(-len(data) // BLOCK) * BLOCK
        return self._tar.offset - padded, len(data)

    def add(self, key: str, jpg: bytes, meta_json: bytes, has_action: bool) -> None:
        if self._tar is not None and self._tar.offset + len(jpg) + len(meta_json) + 4 * BLOCK > self.target \
                and self._cur and self._cur.samples:
            self._close()
        if self._tar is None:
            self._open()
        jo, js = self._member(f"{key}.jpg", jpg)
        mo, ms = self._member(f"{key}.json", meta_json)
        assert self._cur is not None
        self._cur.samples.append([key, jo, js, mo, ms, int(has_action)])

    def _close(self) -> None:
        assert self._tar and self._file and self._hw and self._cur
        self._tar.close()  # writes the two zero end blocks + record padding
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._cur.bytes, self._cur.sha256 = self._hw.n, self._hw.h.hexdigest()
        self.done.append(self._cur)
        self._tar = self._file = self._hw = self._cur = None

    def commit(self) -> list[ShardInfo]:
        """Close the open shard and rename all to their real names."""
        if self._tar is not None:
            self._close()
        for info, tmp in zip(self.done, self._tmp_paths):
            os.replace(tmp, self.out_dir / info.name)
        self._tmp_paths.clear()
        return self.done

    def abort(self) -> None:
        """Drop everything this writer produced (crash, full disk, bad frame)."""
        try:
            if self._file is not None:
                self._file.close()
        except OSError:
            pass
        for tmp in self._tmp_paths:
            tmp.unlink(missing_ok=True)
        self._tmp_paths.clear()
        self._tar = self._file = self._hw = self._cur = None


def sha256_file(path: str | os.PathLike, bufsize: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(bufsize):
            h.update(chunk)
    return h.hexdigest()
