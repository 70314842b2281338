"""index.json: the one file that says what a packed directory holds (docs/FORMAT.md).

This module is its only parser and validator: packer, transfer and train all read
index.json through `load`/`read`/`parse`, so a damaged or hand-edited index is
refused once, up front, with one line naming the file, instead of surfacing as a
bad seek in a DataLoader worker or an odd remote path halfway through an upload.

The JSON document stays a plain dict (packer edits it in place and transfer sends
its exact bytes); `Index` is a typed, validated view over it. Written last and
atomically; anything it names exists, complete, with that sha256.
"""
from __future__ import annotations

import datetime as _dt
import itertools
import json
import operator
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from shardship import __version__
from shardship.atomic import TMP_SUFFIX, write_json
from shardship.errors import ShardshipError

INDEX = "index.json"
FORMAT = "shardship-index"
VERSION = 1
#: the columns of a sample row, in the order packer writes them; readers look each
#: one up in the index's own `sample_fields`, so extra or reordered columns still read
SAMPLE_FIELDS = ("key", "jpg_offset", "jpg_size", "json_offset", "json_size", "has_action")
#: suffixes of files that live next to shards but are not shards: partial copies
#: (transfer's `.part`) and crash-safe temp files (shardship.atomic)
RESERVED_SUFFIXES = (".part", TMP_SUFFIX)
#: what every validation error tells the user to do
REPACK = "re-run `packer pack`"
#: ... and for the copy on the cluster, which the local pack rewrites
REUPLOAD = "run `transfer upload` again (it rewrites the cluster's copy from your packed directory)"

_HEX64 = re.compile(r"[0-9a-f]{64}")
_NUMERIC = SAMPLE_FIELDS[1:]  # the integer columns, in table order
_MAX_BYTES = 2**62  # keeps offset + size inside int64


# ---------------------------------------------------------------------------
# typed records
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FileRef:
    """A file the index promises: its name next to index.json, size and sha256."""

    name: str
    bytes: int
    sha256: str


@dataclass(frozen=True)
class Columns:
    """Where each SAMPLE_FIELDS column sits in a sample row (from `sample_fields`),
    and how many values a row has."""

    key: int
    jpg_offset: int
    jpg_size: int
    json_offset: int
    json_size: int
    has_action: int
    width: int

    @classmethod
    def of(cls, fields: object, where: str) -> Columns:
        if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
            raise ShardshipError(f"{where}: 'sample_fields' must be a list of column names; {REPACK}")
        missing = [f for f in SAMPLE_FIELDS if f not in fields]
        if missing:
            raise ShardshipError(f"{where}: sample_fields lacks {', '.join(missing)}; {REPACK}")
        return cls(**{f: fields.index(f) for f in SAMPLE_FIELDS}, width=len(fields))


@dataclass(frozen=True, eq=False)
class Samples:
    """One shard's validated sample rows as columns: one numpy buffer per column
    (int64; `has_action` bool), so a reader builds its arrays without touching rows
    again. `keys` are the rows' own str objects (no copies)."""

    keys: list[str]
    jpg_offset: np.ndarray
    jpg_size: np.ndarray
    json_offset: np.ndarray
    json_size: np.ndarray
    has_action: np.ndarray

    def __len__(self) -> int:
        return len(self.keys)

    @classmethod
    def empty(cls) -> Samples:
        z = np.zeros(0, dtype=np.int64)
        return cls([], z, z, z, z, np.zeros(0, dtype=bool))


@dataclass(frozen=True)
class Shard:
    """One shard: the `.tar` a reader seeks into, its optional `.tar.zst`, the
    session it belongs to and its samples. Equality and hashing ignore `samples`."""

    name: str
    bytes: int
    sha256: str
    compressed: FileRef | None = None
    session: str = ""
    samples: Samples = field(default_factory=Samples.empty, compare=False, repr=False)

    @property
    def ref(self) -> FileRef:
        return FileRef(self.name, self.bytes, self.sha256)


@dataclass(frozen=True)
class Index:
    """A validated index.json: the JSON document as written (`doc`, a dict that
    packer edits in place) plus typed views of what readers rely on."""

    where: str
    columns: Columns
    shards: tuple[Shard, ...]
    doc: dict[str, Any] = field(compare=False, repr=False)


# ---------------------------------------------------------------------------
# reading and writing
# ---------------------------------------------------------------------------


def empty(options: dict[str, Any], pil: str) -> dict[str, Any]:
    """A new document for packer to fill in."""
    return {"format": FORMAT, "version": VERSION, "created": None, "tool": f"shardship {__version__}",
            "pil": pil, "options": options, "sample_fields": list(SAMPLE_FIELDS), "shards": [], "sessions": {},
            "failed": {}, "joints": [], "action_dim": None, "horizon": options.get("horizon"),
            "stats": {}, "totals": {}}


def _read_bytes(directory: str | os.PathLike, required: bool) -> tuple[bytes | None, str]:
    if Path(directory).is_file():  # `--data data/packed/index.json`: a NotADirectoryError traceback
        raise ShardshipError(f"{directory} is a file: give the folder that holds {INDEX} "
                             f"({Path(directory).parent}), not the file")
    p = Path(directory) / INDEX
    try:
        return p.read_bytes(), str(p)
    except FileNotFoundError:
        if required:
            raise ShardshipError(f"{p} not found: run `packer pack` first, or point at a packed directory") from None
        return None, str(p)


def read(directory: str | os.PathLike) -> Index:
    """`directory/index.json`, parsed and validated."""
    data, where = _read_bytes(directory, required=True)
    assert data is not None
    return parse(data, where)


def load(directory: str | os.PathLike, *, required: bool = True) -> dict[str, Any] | None:
    """`directory/index.json` as the validated JSON dict (what packer edits); None
    when it is absent and not `required`."""
    data, where = _read_bytes(directory, required)
    return None if data is None else parse(data, where).doc


def parse(data: bytes | str, where: str = INDEX, fix: str = REPACK) -> Index:
    """index.json bytes -> a validated Index. Pure: `where` only names the file in errors;
    `fix` is what they tell the user to do (REUPLOAD for the cluster's copy)."""
    try:
        try:
            doc = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ShardshipError(f"{where}: not valid JSON ({e}); {REPACK}") from None
        return validate(doc, where)
    except ShardshipError as e:
        if fix == REPACK or not str(e).endswith(REPACK):
            raise
        raise ShardshipError(str(e)[:-len(REPACK)] + fix, e.code) from None


def version_of(data: bytes | str) -> int | None:
    """The format version a document claims, without validating the rest (None when it
    does not parse or says none): transfer compares it before replacing a remote index."""
    try:
        doc = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    v = doc.get("version") if isinstance(doc, dict) else None
    return v if type(v) is int else None


def save(directory: str | os.PathLike, index: dict[str, Any]) -> None:
    """Write the document atomically, with fresh `created` and `totals`. Not
    re-validated: packer saves after every session and builds rows with ShardWriter."""
    index["created"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    index["totals"] = {
        "samples": sum(len(s["samples"]) for s in index["shards"]),
        "shards": len(index["shards"]),
        "raw_bytes": sum(s.get("raw_bytes", 0) for s in index["sessions"].values()),
        "packed_bytes": sum(s["bytes"] for s in index["shards"]),
    }
    write_json(Path(directory) / INDEX, index, indent=None)


def shard_paths(directory: str | os.PathLike, index: dict[str, Any]) -> list[Path]:
    return [Path(directory) / s["name"] for s in index["shards"]]


# ---------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------


def validate(doc: object, where: str = INDEX) -> Index:
    """The one check of an index.json document: format and version, shard names,
    sizes, digests, sample columns and every sample row. Returns the typed view;
    raises ShardshipError with one line naming `where` and what to do."""
    if not isinstance(doc, dict):
        raise ShardshipError(f"{where}: not a shardship index (a JSON {type(doc).__name__}, not an object); {REPACK}")
    _check_version(doc, where)
    columns = Columns.of(doc.get("sample_fields"), where)
    entries = doc.get("shards")
    if not isinstance(entries, list):
        raise ShardshipError(f"{where}: no 'shards' list; {REPACK}")
    shards: list[Shard] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        shard = _shard(entry, columns, f"{where}: shards[{i}]")
        for ref in (shard.ref, shard.compressed):
            if ref is None:
                continue
            if ref.name in seen:
                raise ShardshipError(f"{where}: shard name {ref.name!r} appears twice; {REPACK}")
            seen.add(ref.name)
        shards.append(shard)
    _check_stats(doc.get("stats"), where)
    return Index(where, columns, tuple(shards), doc)


def _check_stats(stats: object, where: str) -> None:
    """stats.{action,proprio}.{mean,std}: lists of finite numbers, std >= 0 (the
    trainer normalises by them: a NaN would silently become a std of 1)."""
    if stats is None:
        return
    if not isinstance(stats, dict):
        raise ShardshipError(f"{where}: 'stats' must be an object; {REPACK}")
    for name in ("action", "proprio"):
        part = stats.get(name)
        if part is None:
            continue
        if not isinstance(part, dict):
            raise ShardshipError(f"{where}: stats.{name} must be an object with mean/std; {REPACK}")
        for stat in ("mean", "std"):
            values = part.get(stat)
            if values is None:
                continue
            if not isinstance(values, list):
                raise ShardshipError(f"{where}: stats.{name}.{stat} must be a list of numbers; {REPACK}")
            for i, v in enumerate(values):
                problem = None
                if type(v) not in (int, float):
                    problem = f"{v!r}, not a number"
                elif v != v:
                    problem = "NaN"
                elif v in (float("inf"), float("-inf")):
                    problem = "infinite"
                elif stat == "std" and v < 0:
                    problem = f"{v}, negative"
                if problem:
                    raise ShardshipError(f"{where}: stats.{name}.{stat}[{i}] is {problem}; {REPACK}")


def _check_version(doc: dict[str, Any], where: str) -> None:
    fmt, version = doc.get("format"), doc.get("version")
    if fmt != FORMAT:
        raise ShardshipError(f"{where}: not a shardship index (format {fmt!r}, expected {FORMAT!r}); "
                             f"point at a packed directory or {REPACK}")
    if type(version) is int and version > VERSION:
        raise ShardshipError(f"{where}: format version {version} is newer than this shardship reads "
                             f"({VERSION}): upgrade shardship")
    if type(version) is not int or version != VERSION:
        raise ShardshipError(f"{where}: format version {version!r}, this shardship reads {VERSION}; {REPACK}")


def check_name(name: object, where: str) -> str:
    """A shard name that is safe as a file name here and on the remote (it ends up in
    paths and remote commands), or ShardshipError: a plain file name, no `/`, no
    `..`, no leading `.`/`-` that could pose as a temp file or an option, and none
    of the names that live next to shards."""
    if not isinstance(name, str) or not name:
        raise ShardshipError(f"{where}: shard name {name!r} is not a file name; {REPACK}")
    bad = None
    if "/" in name or "\\" in name or "\0" in name or "\n" in name:
        bad = "contains a path separator or control character"
    elif name.startswith("."):
        bad = "starts with '.' (reserved for temp files)"
    elif name.startswith("-"):
        bad = "starts with '-'"
    elif name.endswith(RESERVED_SUFFIXES) or name == INDEX:
        bad = "collides with a name transfer uses"
    if bad:
        raise ShardshipError(f"{where}: shard name {name!r} {bad}; {REPACK}")
    return name


def _ref(d: object, where: str) -> FileRef:
    if not isinstance(d, dict):
        raise ShardshipError(f"{where}: expected an object with name/bytes/sha256; {REPACK}")
    name = check_name(d.get("name"), where)
    size, digest = d.get("bytes"), d.get("sha256")
    if type(size) is not int or not 0 <= size < _MAX_BYTES:
        raise ShardshipError(f"{where} ({name}): 'bytes' must be a non-negative integer, not {size!r}; {REPACK}")
    if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
        raise ShardshipError(f"{where} ({name}): 'sha256' must be 64 lowercase hex digits, not {digest!r}; {REPACK}")
    return FileRef(name, size, digest)


def _shard(entry: object, columns: Columns, where: str) -> Shard:
    ref = _ref(entry, where)
    assert isinstance(entry, dict)
    comp = entry.get("compressed")
    cref = _ref(comp, f"{where}.compressed") if comp is not None else None
    session = entry.get("session")
    if not isinstance(session, str):
        raise ShardshipError(f"{where} ({ref.name}): 'session' must be the session's name, not {session!r}; {REPACK}")
    rows = entry.get("samples")
    if not isinstance(rows, list):
        raise ShardshipError(f"{where} ({ref.name}): 'samples' must be a list of rows; {REPACK}")
    samples = _samples(rows, columns, ref, f"{where} ({ref.name})")
    return Shard(ref.name, ref.bytes, ref.sha256, cref, session, samples)


def _samples(rows: list[Any], c: Columns, ref: FileRef, where: str) -> Samples:
    """Check every row and return its columns. Types are checked row by row (exact
    ints: JSON true/1.0 are refused); the arithmetic (range, order, inside the shard)
    runs on numpy columns, so a million rows cost about a second, not ten."""
    _check_row_types(rows, c, where)
    n = len(rows)
    pick = operator.itemgetter(c.jpg_offset, c.jpg_size, c.json_offset, c.json_size, c.has_action)
    try:
        table = np.fromiter(itertools.chain.from_iterable(map(pick, rows)), dtype=np.int64, count=5 * n).reshape(n, 5)
    except OverflowError:
        i = next(i for i, r in enumerate(rows) if any(abs(v) >= _MAX_BYTES for v in pick(r)))
        raise ShardshipError(f"{where}: samples[{i}]: a value is too large for a byte offset; {REPACK}") from None
    table.flags.writeable = False  # the records are frozen; readers copy what they keep
    jo, js, mo, ms, act = (table[:, k] for k in range(5))
    _check_ranges(table, ref, where)
    jpg_end, json_end = jo + js, mo + ms
    # members in file order: jpg, then its json, then the next sample's jpg
    starts = np.column_stack([jo, mo]).ravel()
    ends = np.column_stack([jpg_end, json_end]).ravel()
    back = np.flatnonzero(starts[1:] < ends[:-1])
    if back.size:
        k = int(back[0]) + 1  # member k starts before member k-1 ends
        row, what = divmod(k, 2)
        prev = "its jpg member" if what else "the previous sample's json member"
        raise ShardshipError(f"{where}: samples[{row}]: {('jpg', 'json')[what]} member starts at byte {starts[k]}, "
                             f"before {prev} ends (byte {ends[k - 1]}): offsets must increase; {REPACK}")
    past = np.flatnonzero(ends > ref.bytes)
    if past.size:
        k = int(past[0])
        raise ShardshipError(f"{where}: samples[{k // 2}]: {('jpg', 'json')[k % 2]} member ends at byte {ends[k]}, "
                             f"past the shard's {ref.bytes} bytes; {REPACK}")
    return Samples([r[c.key] for r in rows], jo, js, mo, ms, act.astype(bool))


def _check_row_types(rows: list[Any], c: Columns, where: str) -> None:
    """Every row a list of `c.width` values, a str key and exact ints elsewhere
    (JSON true or 1.0 is not an offset). One flat loop: the fastest way to check
    a million rows in Python; the first bad row is named."""
    k, a, b, d, e, h, w = c.key, c.jpg_offset, c.jpg_size, c.json_offset, c.json_size, c.has_action, c.width
    for i, r in enumerate(rows):
        if (type(r) is list and len(r) == w and type(r[k]) is str and type(r[a]) is int and type(r[b]) is int
                and type(r[d]) is int and type(r[e]) is int and type(r[h]) is int):
            continue
        if type(r) is not list or len(r) != w:
            problem = f"not a list of {w} values (sample_fields)"
        elif type(r[k]) is not str:
            problem = f"key {r[k]!r} is not a string"
        else:
            name = next(f for f in _NUMERIC if type(r[getattr(c, f)]) is not int)
            problem = f"{name} {r[getattr(c, name)]!r} is not an integer"
        raise ShardshipError(f"{where}: samples[{i}]: {problem}; {REPACK}")


def _check_ranges(table: np.ndarray, ref: FileRef, where: str) -> None:
    """Offsets and sizes in [0, shard bytes], has_action 0 or 1 (first bad row named)."""
    bad = (table[:, :4] < 0) | (table[:, :4] > ref.bytes)
    if bad.any():
        row, col = (int(x[0]) for x in np.nonzero(bad))
        value = int(table[row, col])
        why = "negative" if value < 0 else f"beyond the shard's {ref.bytes} bytes"
        raise ShardshipError(f"{where}: samples[{row}]: {_NUMERIC[col]} {value} is {why}; {REPACK}")
    flag = np.flatnonzero((table[:, 4] != 0) & (table[:, 4] != 1))
    if flag.size:
        row = int(flag[0])
        raise ShardshipError(f"{where}: samples[{row}]: has_action {int(table[row, 4])} is not 0 or 1; {REPACK}")
