"""The shards' bytes: which files are checked against index.json (size, then
sha256, once per shard per process), and positional reads of one sample's
members, or of a run of neighbouring samples in one `pread`.

A short read says which file is wrong: the shard shorter than index.json says
(re-upload it) or index.json pointing past a whole shard (re-pack)."""
from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

from shardship.errors import ShardshipError
from shardship.hashing import sha256_file
from train.data.index import ShardIndex

MAX_OPEN_SHARDS = 32
_HASH_CHUNK = 4 << 20

# path -> (size, mtime_ns, inode, sha256) of shards this process has hashed.
_VERIFIED: dict[str, tuple[int, int, int, str]] = {}


def _stat_key(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns, st.st_ino


def verify_shard(index: ShardIndex, s: int) -> None:
    """Size then sha256 of shard `s` against the manifest; cached per process."""
    path = index.shard_path(s)
    name = index.shard_names[s]
    expected_sha = index.shard_sha256[s]
    try:
        key = _stat_key(path)
    except FileNotFoundError:
        zst = path.with_name(path.name + ".zst")
        hint = (f"only {zst.name} is here: unpack it (`zstd -d {zst.name}`, or re-run `transfer upload`)"
                if zst.exists() else "re-run `transfer upload` or `packer pack`")
        raise ShardshipError(f"shard {name} listed in {index.root / 'index.json'} is missing: {hint}") from None
    cached = _VERIFIED.get(str(path))
    if cached is not None and cached[:3] == key and cached[3] == expected_sha:
        return
    size = key[0]
    expected_size = int(index.shard_bytes[s])
    if size != expected_size:
        what = "truncated" if size < expected_size else "larger than expected"
        raise ShardshipError(f"shard {name}: {size} bytes on disk, index.json says {expected_size} ({what}): "
                             "re-upload it (`transfer upload`) or re-pack")
    got = sha256_file(path, bufsize=_HASH_CHUNK)
    if got != expected_sha:
        raise ShardshipError(f"shard {name}: sha256 {got[:16]}... does not match index.json ({expected_sha[:16]}...): "
                             "the file is corrupt or from another pack; re-upload it (`transfer upload`) or re-pack")
    _VERIFIED[str(path)] = (*key, got)


def verify_shards(index: ShardIndex, progress: bool = False) -> None:
    """Check every shard once in this process (before DataLoader workers fork)."""
    from shardship.progress import bar

    b = bar(index.n_shards, "verify shards", "shard", None if progress else False, leave=False)
    for s in range(index.n_shards):
        verify_shard(index, s)
        b.update(1)
    b.close()


class ShardFiles:
    """Open shard files of one process (an LRU of at most MAX_OPEN_SHARDS) and
    the reads the reader makes. File descriptors never cross a fork or a pickle:
    a DataLoader worker opens its own."""

    def __init__(self, index: ShardIndex, verify: bool = True) -> None:
        self.index = index
        self.verify = verify
        self._fds: OrderedDict[int, int] = OrderedDict()

    def __getstate__(self) -> dict:
        d = self.__dict__.copy()
        d["_fds"] = OrderedDict()
        return d

    def _fd(self, s: int) -> int:
        fd = self._fds.get(s)
        if fd is not None:
            self._fds.move_to_end(s)
            return fd
        if self.verify:
            verify_shard(self.index, s)
        try:
            fd = os.open(self.index.shard_path(s), os.O_RDONLY)
        except FileNotFoundError:
            raise ShardshipError(f"shard {self.index.shard_names[s]} disappeared from {self.index.root}: "
                                 "re-upload it (`transfer upload`)") from None
        self._fds[s] = fd
        if len(self._fds) > MAX_OPEN_SHARDS:
            _, old = self._fds.popitem(last=False)
            os.close(old)
        return fd

    def read(self, i: int) -> tuple[memoryview, memoryview]:
        """(jpg bytes, json bytes) of sample `i`: one pread when the members are adjacent."""
        ix = self.index
        s = int(ix.shard[i])
        fd = self._fd(s)
        jo, jn, so, sn = int(ix.jpg_offset[i]), int(ix.jpg_size[i]), int(ix.json_offset[i]), int(ix.json_size[i])
        lo, hi = min(jo, so), max(jo + jn, so + sn)
        if hi - lo <= jn + sn + 4096:  # adjacent members: one read
            buf = os.pread(fd, hi - lo, lo)
            if len(buf) < hi - lo:
                raise self._truncated(fd, s, i, hi)
            mv = memoryview(buf)
            return mv[jo - lo:jo - lo + jn], mv[so - lo:so - lo + sn]
        out = []
        for off, n in ((jo, jn), (so, sn)):
            buf = os.pread(fd, n, off)
            if len(buf) < n:
                raise self._truncated(fd, s, i, off + n)
            out.append(memoryview(buf))
        return out[0], out[1]

    def read_json(self, i: int) -> bytes:
        """The sample JSON member of sample `i`."""
        ix = self.index
        s = int(ix.shard[i])
        fd = self._fd(s)
        off, n = int(ix.json_offset[i]), int(ix.json_size[i])
        buf = os.pread(fd, n, off)
        if len(buf) < n:
            raise self._truncated(fd, s, i, off + n)
        return buf

    def read_many(self, idx: list[int]) -> list[tuple[memoryview, memoryview]]:
        """(jpg, json) of samples `idx` (ascending): one pread when they sit in one
        shard close together (an observation window), else one per sample."""
        ix = self.index
        s = int(ix.shard[idx[0]])
        if len(idx) == 1 or any(int(ix.shard[i]) != s for i in idx):
            return [self.read(i) for i in idx]
        lo = min(int(ix.jpg_offset[idx[0]]), int(ix.json_offset[idx[0]]))
        hi = max(int(ix.jpg_offset[i] + ix.jpg_size[i]) for i in idx)
        hi = max(hi, max(int(ix.json_offset[i] + ix.json_size[i]) for i in idx))
        if hi - lo > int(sum(ix.jpg_size[i] + ix.json_size[i] for i in idx)) + 4096 * len(idx):
            return [self.read(i) for i in idx]
        fd = self._fd(s)
        buf = os.pread(fd, hi - lo, lo)
        if len(buf) < hi - lo:
            raise self._truncated(fd, s, idx[-1], hi)
        mv = memoryview(buf)
        out = []
        for i in idx:
            jo, so = int(ix.jpg_offset[i]) - lo, int(ix.json_offset[i]) - lo
            out.append((mv[jo:jo + int(ix.jpg_size[i])], mv[so:so + int(ix.json_size[i])]))
        return out

    def read_frames(self, idx: list[int]) -> list[memoryview]:
        """The JPEG bytes of samples `idx` (ascending, distinct): neighbours in one
        shard (an observation window, a run of consecutive samples) in one pread."""
        ix = self.index
        out: list[memoryview] = []
        run: list[int] = []
        for i in idx:
            if run and (int(ix.shard[i]) != int(ix.shard[run[-1]])
                        or int(ix.jpg_offset[i]) - int(ix.jpg_offset[run[-1]] + ix.jpg_size[run[-1]])
                        > int(ix.json_size[run[-1]]) + 4096):
                out.extend(m[0] for m in self.read_many(run))
                run = []
            run.append(i)
        if run:
            out.extend(m[0] for m in self.read_many(run))
        return out

    def _truncated(self, fd: int, s: int, i: int, need: int) -> ShardshipError:
        """A read came up short: say which file is wrong. The shard shorter than
        index.json says -> re-upload the shard; the shard as long as index.json says
        but a sample reaching past it -> index.json is inconsistent -> re-pack."""
        name, expected = self.index.shard_names[s], int(self.index.shard_bytes[s])
        size = os.fstat(fd).st_size
        if size < expected:
            return ShardshipError(f"shard {name} is truncated: {size} bytes on disk, index.json says {expected}: "
                                  "re-upload the shard (`transfer upload`)")
        return ShardshipError(f"{self.index.root / 'index.json'}: sample {self.index.key(i)} needs bytes up to {need} "
                              f"of shard {name}, which has the {size} bytes index.json gives it: index.json is "
                              "inconsistent; re-run `packer pack`")

    def bad(self, i: int, reason: str) -> ShardshipError:
        s = int(self.index.shard[i])
        return ShardshipError(f"shard {self.index.shard_names[s]}: sample {self.index.key(i)}: {reason}; re-pack")

    def close(self) -> None:
        while self._fds:
            _, fd = self._fds.popitem()
            os.close(fd)

    def __del__(self) -> None:  # a reader dropped without close() (a test, a notebook) leaks no descriptors
        try:
            self.close()
        except OSError:
            pass
