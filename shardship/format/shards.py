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

from shardship.atomic import TMP_SUFFIX

BLOCK = 512
CONTENT_HEX = 8  # hex digits of the shard's own sha256 in its name


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


RECORD = 20 * BLOCK  # tar's default blocking factor: archives end on a 10 KiB boundary


def _template() -> bytearray:
    """A ustar header with every field but name, prefix, size and checksum filled."""
    h = bytearray(BLOCK)
    h[100:108] = b"0000644\0"
    h[108:116] = b"0000000\0"
    h[116:124] = b"0000000\0"
    h[136:148] = b"00000000000\0"
    h[148:156] = b"        "  # the checksum is summed with its own field as spaces
    h[156:157] = b"0"
    h[257:265] = b"ustar\x0000"
    return h


_TEMPLATE = bytes(_template())
_TEMPLATE_SUM = sum(_TEMPLATE)


def member_header(name: str, size: int) -> bytes:
    """The 512-byte header of a regular file: fixed mode/owner/mtime so bytes are
    deterministic. Plain ustar (name, or prefix + name) written directly: ~10x
    cheaper than tarfile's header code, which matters at thousands of members per
    second; the checksum is the template's plus the bytes that vary. Names that
    do not fit ustar get a PAX header from tarfile."""
    raw = name.encode("utf-8")
    prefix, base = b"", raw
    if len(raw) > 100:
        cut = raw.rfind(b"/", 0, 156)
        if cut <= 0 or len(raw) - cut - 1 > 100:
            ti = tarfile.TarInfo(name)
            ti.size, ti.mtime, ti.mode, ti.uid, ti.gid, ti.uname, ti.gname = size, 0, 0o644, 0, 0, "", ""
            return ti.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
        prefix, base = raw[:cut], raw[cut + 1:]
    field = b"%011o\0" % size
    h = bytearray(_TEMPLATE)
    h[0:len(base)] = base
    h[124:136] = field
    h[345:345 + len(prefix)] = prefix
    h[148:156] = b"%06o\0 " % (_TEMPLATE_SUM + sum(base) + sum(prefix) + sum(field))
    return bytes(h)


def _padding(n: int) -> bytes:
    return b"\0" * (-n % BLOCK)


class ShardWriter:
    """Rolls a session's samples into `<prefix>-NNNN-<sha256[:8]>.tar` files of about
    `target_bytes`. Each shard is written to a temp name and only renamed by
    `commit()`, so a crash never leaves a half shard under a real name. The
    sha256 is computed while writing: no second read of the shard."""

    def __init__(self, out_dir: Path, session: str, target_bytes: int):
        self.out_dir, self.session, self.target = Path(out_dir), session, target_bytes
        self.prefix = shard_prefix(session)
        self.done: list[ShardInfo] = []  # closed, still under temp names
        self._tmp_paths: list[Path] = []
        self._file: io.BufferedWriter | None = None
        self._hash = hashlib.sha256()
        self._offset = 0
        self._cur: ShardInfo | None = None

    def _open(self) -> None:
        name = f"{self.prefix}-{len(self.done):04d}.tar"
        tmp = self.out_dir / f".{name}{TMP_SUFFIX}"
        self._tmp_paths.append(tmp)
        self._file = open(tmp, "wb")
        self._hash, self._offset = hashlib.sha256(), 0
        self._cur = ShardInfo(name, 0, "", self.session)

    def _write(self, b: bytes) -> None:
        assert self._file is not None
        self._file.write(b)
        self._hash.update(b)
        self._offset += len(b)

    def add(self, key: str, jpg: bytes, meta_json: bytes, has_action: bool) -> None:
        if self._file is not None and self._offset + len(jpg) + len(meta_json) + 4 * BLOCK > self.target \
                and self._cur and self._cur.samples:
            self._close()
        if self._file is None:
            self._open()
        # both members in one write and one hash update: this runs once per frame in the main process
        jo = self._offset + BLOCK
        mo = jo + len(jpg) + (-len(jpg) % BLOCK) + BLOCK
        self._write(b"".join((member_header(f"{key}.jpg", len(jpg)), jpg, _padding(len(jpg)),
                              member_header(f"{key}.json", len(meta_json)), meta_json, _padding(len(meta_json)))))
        assert self._cur is not None
        self._cur.samples.append([key, jo, len(jpg), mo, len(meta_json), int(has_action)])

    def _close(self) -> None:
        assert self._file and self._cur
        end = self._offset + 2 * BLOCK  # two zero blocks end the archive
        self._write(b"\0" * (2 * BLOCK + (-end % RECORD)))
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._cur.bytes, self._cur.sha256 = self._offset, self._hash.hexdigest()
        # content-named: a shard name never stands for two different byte strings, so a
        # re-packed session uploads under new names and a job reading the old index.json
        # on the cluster keeps reading the old, intact shards until the index switches
        self._cur.name = f"{self.prefix}-{len(self.done):04d}-{self._cur.sha256[:CONTENT_HEX]}.tar"
        self.done.append(self._cur)
        self._file = self._cur = None

    def commit(self) -> list[ShardInfo]:
        """Close the open shard and rename all to their real names."""
        if self._file is not None:
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
        self._file = self._cur = None


def read_member(fd: int, offset: int, size: int, where: str) -> bytes:
    """The `size` bytes of one member's data at `offset` (index.json's columns) of
    an open shard: one pread, no tar parsing. A short read means the shard is not
    what index.json says; the error names it (`where`) and the fix."""
    data = os.pread(fd, size, offset)
    if len(data) != size:
        from shardship.errors import ShardshipError

        raise ShardshipError(f"{where}: member at byte {offset} is truncated ({len(data)} of {size} bytes): "
                             "run `packer verify`, then `packer pack`")
    return data
