"""Turn the app's session exports (`raw/session_X.zip`) into session folders.

The StackCapture app zips each finished session and deletes the folder, so what
reaches `data/raw/` is zips (plus a `session_X.metadata.json` sidecar). The rest
of the pipeline reads folders, so each zip is unpacked once into `raw/session_X/`.

Rules, and why:
* The folder wins: if `raw/session_X/` exists nothing is done, since the user may
  have edited it (e.g. their own SLAM wrote poses.json). Nothing is overwritten.
  Except a folder that an unzip stopped midway left (a Finder or `unzip` run that
  hit a truncated zip or a full disk): it holds the zip's first files, byte for
  byte, the last one maybe cut short, and nothing else. Kept, it would pass for a
  session (fewer frames, no IMU) and hide every later export of it, so it is moved
  aside (`.session_X.unzip-leftover`) and the zip extracted in its place; the
  leftover is deleted once that extraction succeeded (the zip holds all of it).
* The session folder is found where it sits: at the zip's root, as its one top
  folder, or a few folders down (`export/session_X/rgb/...`, a zip of a folder of
  exports); what lies outside it is not extracted.
* A Mac's litter is skipped: `__MACOSX/`, `.DS_Store` and `._*` AppleDouble files
  (copying through exFAT or SMB adds one per file), which would otherwise refuse
  the session as a frame that is not a number.
* The zip is the original: it is only ever read, never modified, moved or deleted.
* Zips come from users' machines, so they are untrusted: a member that could land
  outside the folder (absolute, `..`, drive letter, backslash, symlink, device)
  refuses the whole zip, and so does a zip bomb or a zip larger than the free disk.
* Atomic: members are streamed into a hidden temp folder that is renamed into place
  only when everything is there, so a crash or a corrupt zip never leaves a
  half-session that a later run would take as "already" extracted.
"""
from __future__ import annotations

import errno
import math
import os
import re
import shutil
import stat
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from packer.duplicates import skipped_exports
from shardship.errors import SessionError

TMP_SUFFIX = ".unzip-tmp"
LEFTOVER_SUFFIX = ".unzip-leftover"
SIDECAR_SUFFIX = ".metadata.json"
METADATA = "metadata.json"
SKIP_TOP = "__MACOSX"  # resource forks added by macOS "Compress"
SKIP_NAMES = frozenset({".DS_Store"})
APPLEDOUBLE = "._"  # a Mac's resource fork beside each file on exFAT/SMB: ._000139.jpg
SESSION_FILES = frozenset({"metadata.json", "imu.json", "encoders.json", "calib.txt", "poses.json"})
MAX_NEST = 3  # how deep a session folder may sit in a zip: session_X/, export/session_X/, a/b/session_X/
BOMB_RATIO = 200  # uncompressed / compressed above this ...
BOMB_MIN_BYTES = 1 << 30  # ... and more than this in total: refuse as a zip bomb
FILE_MODE, DIR_MODE = 0o644, 0o755
MIB = 1 << 20
REEXPORT = "re-export it from the phone"
_DRIVE = re.compile(r"^[A-Za-z]:")


@dataclass
class Extracted:
    """One zip export made usable as a session folder."""

    zip_path: Path
    session_dir: Path
    status: str  # "extracted" | "already" (folder exists, nothing done) | "duplicate" (not unpacked)
    sidecar_used: bool  # metadata.json came from the sidecar because the zip lacked it
    why: str = ""  # for a duplicate: of what, and whether the bytes are the same; for "extracted": what it replaced


@dataclass
class _Member:
    info: zipfile.ZipInfo
    parts: tuple[str, ...]  # path inside the session folder, after stripping the top folder
    is_dir: bool


def find_exports(raw: Path) -> list[Path]:
    """Session zips directly under `raw`, sorted. Hidden files are skipped because
    copying to exFAT/SMB from a Mac leaves `._session_X.zip` AppleDouble files."""
    raw = Path(raw)
    if not raw.is_dir():
        return []
    return sorted(p for p in raw.iterdir()
                  if p.suffix.lower() == ".zip" and not p.name.startswith(".") and p.is_file())


def extract_all(raw: Path) -> tuple[list[Extracted], dict[str, str]]:
    """Extract every export under `raw`. Returns (done, {zip file name: reason});
    a bad zip is reported and skipped so it never stops the others. A second
    export `session_X (1).zip` of a session already there is not unpacked
    (status "duplicate", packer.duplicates says why)."""
    done: list[Extracted] = []
    failed: dict[str, str] = {}
    zips = find_exports(raw)
    copies = skipped_exports(zips, raw)
    for zip_path in zips:
        if zip_path.name in copies:
            done.append(Extracted(zip_path, raw / zip_path.stem, "duplicate", False, copies[zip_path.name]))
            continue
        try:
            done.append(extract_export(zip_path, raw))
        except SessionError as e:
            failed[zip_path.name] = e.reason
    return done, failed


def extract_export(zip_path: Path, raw: Path) -> Extracted:
    """Unpack `zip_path` into `raw/<zip stem>/` atomically (see module docstring).
    Raises SessionError naming the zip (and the member) on any problem."""
    zip_path, raw = Path(zip_path), Path(raw)
    name = zip_path.stem
    target = raw / name
    tmp, aside = raw / f".{name}{TMP_SUFFIX}", raw / f".{name}{LEFTOVER_SUFFIX}"

    def fail(reason: str) -> SessionError:
        return SessionError(name, zip_path.name, reason)

    replaced = False
    if target.exists() or target.is_symlink():
        if not target.is_dir():
            raise fail(f"{target} exists and is not a folder: move it away and run again")
        _remove_tree(tmp, fail)  # our own leftover from a killed run; the folder is untouched
        if target.is_symlink() or not _is_unzip_leftover(zip_path, target):
            return Extracted(zip_path, target, "already", False)
        _remove_tree(aside, fail)  # an older leftover of the same session, already verified
        try:
            os.rename(target, aside)  # hidden: no longer taken for a session, whatever happens next
        except OSError as e:
            raise fail(f"{name}/ is a half-unzipped copy of this zip but cannot be moved aside: "
                       f"{e.strerror or e}; delete it and run again") from None
        replaced = True
    _remove_tree(tmp, fail)  # stale temp from a killed earlier run: redo from scratch
    try:
        done = _unzip(zip_path, raw, tmp, fail)
    except SessionError as e:
        if replaced:
            raise fail(f"{e.reason} (the half-unzipped {name}/ beside it is now {aside.name})") from None
        raise
    if done.status == "extracted":
        _remove_tree(aside, fail)  # the zip is whole on disk now: the leftover holds nothing more
        if replaced:
            done.why = f"in place of a half-unzipped {name}/"
    return done


def _unzip(zip_path: Path, raw: Path, tmp: Path, fail) -> Extracted:
    """Read, check and stream the zip into `tmp`, then rename it into place."""
    target = raw / zip_path.stem
    try:
        zf = zipfile.ZipFile(zip_path)
    except (zipfile.BadZipFile, EOFError, ValueError) as e:
        raise fail(f"not a readable zip ({e}): it is corrupt or truncated; {REEXPORT}") from None
    except OSError as e:
        raise fail(f"cannot open: {e.strerror or e}") from None
    with zf:
        members = _plan(zf, fail)
        total = sum(m.info.file_size for m in members if not m.is_dir)
        _check_sizes(members, total, raw, fail)
        sidecar_used = _extract_to_tmp(zf, members, tmp, raw / f"{zip_path.stem}{SIDECAR_SUFFIX}", total, fail)
    if target.exists() or target.is_symlink():  # appeared while we worked: it wins
        _remove_tree(tmp, fail)
        return Extracted(zip_path, target, "already", False)
    os.sync()  # the files reach the disk before the rename publishes them: a power cut
    try:      # must not leave a folder of empty files that "the folder wins" then keeps
        os.rename(tmp, target)
    except OSError as e:
        _remove_tree(tmp, fail)
        raise fail(f"cannot rename {tmp.name} to {target.name}: {e.strerror or e}") from None
    return Extracted(zip_path, target, "extracted", sidecar_used)


def _junk(name: str) -> bool:
    """A Mac's litter, never the app's: .DS_Store and ._* AppleDouble files."""
    return name in SKIP_NAMES or name.startswith(APPLEDOUBLE)


def _plan(zf: zipfile.ZipFile, fail) -> list[_Member]:
    """Validate every member and map it to a path inside the session folder.
    Any unsafe member refuses the whole zip, before a single byte is written."""
    kept: list[_Member] = []
    for info in zf.infolist():
        parts, is_dir = _safe_parts(info, fail)
        if not parts or SKIP_TOP in parts or _junk(parts[-1]):
            continue
        kept.append(_Member(info, parts, is_dir))
    if not any(not m.is_dir for m in kept):
        raise fail(f"the zip holds no files: {REEXPORT}")
    root = _session_root(kept, fail)
    if root is not None:
        kept = [_Member(m.info, m.parts[len(root):], m.is_dir) for m in kept
                if m.parts[:len(root)] == root and len(m.parts) > len(root)]
    elif not any(not m.is_dir and len(m.parts) == 1 for m in kept):  # none of the app's files: one top folder
        tops = sorted({m.parts[0] for m in kept})
        if len(tops) > 1:
            raise fail(f"more than one top-level folder ({', '.join(tops)}): a session zip holds one; "
                       f"{REEXPORT} or unzip it by hand")
        kept = [_Member(m.info, m.parts[1:], m.is_dir) for m in kept if m.parts[1:]]
    _check_conflicts(kept, fail)
    return kept


def _session_root(members: list[_Member], fail) -> tuple[str, ...] | None:
    """The folder in the zip that holds the session: where the app's files are
    (metadata.json, imu.json, rgb/*.jpg, ...), at most MAX_NEST folders down; the
    outermost such folder, since a session may hold a copy of another's files.
    None where the zip has none of them (the session check then says what is
    missing). Two separate session folders refuse the zip: which one is meant?"""
    found: set[tuple[str, ...]] = set()
    for m in members:
        p = m.parts
        if m.is_dir:
            continue
        if p[-1] in SESSION_FILES:
            found.add(p[:-1])
        elif len(p) >= 2 and p[-2] == "rgb" and p[-1].lower().endswith((".jpg", ".jpeg")):
            found.add(p[:-2])
    found = {r for r in found if len(r) <= MAX_NEST}
    outer = sorted(r for r in found if not any(r[:len(o)] == o and o != r for o in found))
    if len(outer) > 1:
        what = "top-level folder" if all(len(r) == 1 for r in outer) else "session folder"
        raise fail(f"more than one {what} ({', '.join('/'.join(r) for r in outer)}): a session zip holds one; "
                   f"{REEXPORT} or unzip it by hand")
    return outer[0] if outer else None


def _is_unzip_leftover(zip_path: Path, folder: Path) -> bool:
    """Whether `folder` is what an unzip of this zip that stopped midway leaves:
    exactly the zip's first k files (in its order, the order every unzip writes
    them), each byte-identical to its member but the last, which may be a prefix
    of it, and the zip not whole there. A folder the user worked on is not one (an
    added or rewritten file, a frame deleted from the middle), nor is a complete
    extraction; an unreadable zip proves nothing, so the folder wins then too."""
    try:
        with zipfile.ZipFile(zip_path) as zf:
            if _last_file_there(zf, folder):
                return False  # complete (or edited since): the common case, a few stats
            files = [m for m in _plan(zf, lambda reason: SessionError(zip_path.stem, zip_path.name, reason))
                     if not m.is_dir]
            end = files[-1]
            present = _files_in(folder, len(files))
            if present is None or (len(present) == len(files) and present.get(end.parts) == end.info.file_size):
                return False
            k = len(present)
            if any(m.parts not in present for m in files[:k]):
                return False
            return all(_holds_start(zf, m.info, folder.joinpath(*m.parts), present[m.parts], i == k - 1)
                       for i, m in enumerate(files[:k]))
    except (SessionError, OSError, zipfile.BadZipFile, zlib.error, EOFError, RuntimeError, ValueError,
            NotImplementedError):
        return False


def _last_file_there(zf: zipfile.ZipFile, folder: Path) -> bool:
    """Whether the zip's last file is in `folder` whole, under its name less 0 to
    MAX_NEST leading folders (wherever the session folder sat in the zip): then no
    unzip stopped before it. Spares planning every member of a big zip each run."""
    for info in reversed(zf.infolist()):
        parts = info.filename.split("/")
        if info.is_dir() or SKIP_TOP in parts or _junk(parts[-1]):
            continue
        if "\\" in info.filename or ".." in parts or info.filename.startswith("/"):
            return False  # the full plan refuses it
        return any(_size(folder.joinpath(*parts[n:])) == info.file_size for n in range(min(len(parts), MAX_NEST + 1)))
    return False


def _size(path: Path) -> int | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def _files_in(folder: Path, limit: int) -> dict[tuple[str, ...], int] | None:
    """{path parts: size} of the regular files under `folder`, a Mac's litter
    skipped; None when there are more than `limit` or anything else (a symlink)."""
    out: dict[tuple[str, ...], int] = {}
    for d, dirs, files in os.walk(folder):
        rel = Path(d).relative_to(folder).parts
        for n in dirs + files:
            st = os.lstat(os.path.join(d, n))
            if stat.S_ISDIR(st.st_mode) or (_junk(n) and n in files):
                continue
            if not stat.S_ISREG(st.st_mode) or len(out) == limit:
                return None
            out[rel + (n,)] = st.st_size
    return out


def _holds_start(zf: zipfile.ZipFile, info: zipfile.ZipInfo, path: Path, size: int, may_be_short: bool) -> bool:
    """Whether the file at `path` (`size` bytes) is the member's content, or with
    `may_be_short` its first `size` bytes (where an unzip stopped writing)."""
    if size > info.file_size or (size < info.file_size and not may_be_short):
        return False
    with zf.open(info) as src, open(path, "rb") as f:
        left = size
        while left:
            a = src.read(min(left, 1 << 20))
            if not a or a != f.read(len(a)):
                return False
            left -= len(a)
    return True


def _safe_parts(info: zipfile.ZipInfo, fail) -> tuple[tuple[str, ...], bool]:
    """(path components, is a folder) of a member, or SessionError if it is not a
    plain relative file/folder path that stays inside the target."""
    raw_name = info.filename
    why = None
    if "\\" in raw_name:
        why = "has a backslash (Windows path)"
    elif raw_name.startswith("/"):
        why = "is an absolute path"
    elif _DRIVE.match(raw_name):
        why = "has a drive letter"
    elif ".." in raw_name.split("/"):
        why = "has a '..' component (would land outside the folder)"
    mode = info.external_attr >> 16
    ftype = stat.S_IFMT(mode)
    if why is None and stat.S_ISLNK(mode):
        why = "is a symlink"
    elif why is None and ftype and ftype not in (stat.S_IFREG, stat.S_IFDIR):
        why = f"is not a regular file or folder (mode {oct(mode)})"
    if why is not None:
        raise fail(f"unsafe member {raw_name!r} {why}: refusing the whole zip; {REEXPORT}")
    parts = tuple(p for p in raw_name.split("/") if p not in ("", "."))
    return parts, info.is_dir() or stat.S_ISDIR(mode)


def _check_conflicts(members: list[_Member], fail) -> None:
    """Refuse duplicate members and a name used as both file and folder: either
    would make one member silently replace another."""
    files: set[tuple[str, ...]] = set()
    dirs: set[tuple[str, ...]] = set()
    for m in members:
        if m.is_dir:
            dirs.add(m.parts)
        elif m.parts in files:
            raise fail(f"member {m.info.filename!r} appears twice: {REEXPORT}")
        else:
            files.add(m.parts)
        dirs.update(m.parts[:i] for i in range(1, len(m.parts)))
    clash = files & dirs
    if clash:
        raise fail(f"{'/'.join(min(clash))!r} is both a file and a folder in the zip: {REEXPORT}")


def _check_sizes(members: list[_Member], total: int, raw: Path, fail) -> None:
    """Refuse a zip bomb or a zip that cannot fit, before writing anything. The
    declared sizes are binding: zipfile stops at file_size and then fails the CRC."""
    packed = sum(m.info.compress_size for m in members if not m.is_dir)
    if total > BOMB_MIN_BYTES and total > BOMB_RATIO * max(packed, 1):
        raise fail(f"looks like a zip bomb ({_mib(total)} MiB from {_mib(packed)} MiB compressed, "
                   f"over {BOMB_RATIO}x): refusing; unzip it by hand if you trust it")
    free = _free_bytes(raw)
    if total > free:
        raise fail(f"needs {_mib(total)} MiB but {raw} has {free // MIB} MiB free: "
                   f"free {_mib(total - free)} MiB and run again")


def _extract_to_tmp(zf: zipfile.ZipFile, members: list[_Member], tmp: Path, sidecar: Path, total: int,
                    fail) -> bool:
    """Stream every member into `tmp`, add the sidecar if needed; returns whether
    the sidecar was used. On any failure `tmp` is removed and SessionError raised."""
    member = "?"
    try:
        tmp.mkdir(mode=DIR_MODE)
        for m in members:
            member = m.info.filename
            dest = tmp.joinpath(*m.parts)
            if m.is_dir:
                dest.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
                continue
            dest.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
            with zf.open(m.info) as src, os.fdopen(fd, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        member = sidecar.name
        used = not (tmp / METADATA).exists() and sidecar.is_file()
        if used:
            shutil.copyfile(sidecar, tmp / METADATA)
        _normalize_modes(tmp)
        return used
    except BaseException as e:
        _remove_tree(tmp, fail)
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            short = _mib(max(total - _free_bytes(tmp.parent), 1))
            raise fail(f"disk full while extracting {member!r}: needs {_mib(total)} MiB; "
                       f"free {short} MiB and run again") from None
        if isinstance(e, OSError) and e.errno is not None:
            raise fail(f"cannot extract {member!r}: {e.strerror}") from None
        if isinstance(e, RuntimeError) and "encrypted" in str(e):
            raise fail(f"member {member!r} is encrypted: export it without a password") from None
        if isinstance(e, (zipfile.BadZipFile, zlib.error, EOFError, RuntimeError, ValueError,
                          NotImplementedError, OSError)):  # OSError without errno: bz2/lzma data
            raise fail(f"corrupt member {member!r} ({e}): {REEXPORT}") from None
        raise


def _normalize_modes(root: Path) -> None:
    """Files 0644, folders 0755 whatever the umask: nothing is taken from the zip."""
    os.chmod(root, DIR_MODE)
    for d, dirs, files in os.walk(root):
        for n in dirs:
            os.chmod(os.path.join(d, n), DIR_MODE)
        for n in files:
            os.chmod(os.path.join(d, n), FILE_MODE)


def _remove_tree(path: Path, fail) -> None:
    """Remove our temp folder (or whatever sits at its name) if present."""
    try:
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.exists():
            shutil.rmtree(path)
    except OSError as e:
        raise fail(f"cannot remove leftover {path}: {e.strerror or e}; remove it by hand") from None


def _free_bytes(path: Path) -> int:
    """Free bytes on the file system holding `path` (a function so tests can fake it)."""
    return shutil.disk_usage(path).free


def _mib(n: int) -> int:
    return max(math.ceil(n / MIB), 0)
