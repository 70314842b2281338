"""The same session twice in raw/: pack it once, and say which copy was skipped.

How it happens: AirDrop or Finder saves a second export of `session_X.zip` as
`session_X (1).zip` (and `session_X (1).metadata.json`); both would be unpacked
and packed as two sessions, and training would then hold out one as validation
while training on its twin. So a copy is recognised by

* its name: `<name> (N)` beside `<name>` (the suffix macOS gives a second copy),
  which is the same session by the app's naming (the folder is named after the
  second the capture started);
* its content (`content_key`): the recorded streams and the frames are the same
  bytes, whatever the folder is called (a renamed copy).

The copy without a suffix (else the first by name) is kept. `content_key` hashes
what the phone recorded and nothing that packer or the user's SLAM rewrites
(metadata.json, poses.json): imu.json and encoders.json (epoch stamps at 200 and
50 Hz: no two recordings share them), the frame file names and sizes, and the
bytes of the first, middle and last frame. Reading those costs a few MB per
session, not the frames."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from shardship.split import COPY, original_name  # noqa: F401  (one definition: the split needs it too)

STREAMS = ("imu.json", "encoders.json", "calib.txt")


def content_key(session_dir: Path) -> str | None:
    """A digest of what the phone recorded in this session folder (see the module
    docstring), or None when it cannot be read (the session check says why)."""
    h = hashlib.sha256()
    try:
        for name in STREAMS:
            p = session_dir / name
            if p.is_file():
                h.update(f"{name}\0".encode())
                h.update(hashlib.sha256(p.read_bytes()).digest())
        rgb = session_dir / "rgb"
        with os.scandir(rgb) as entries:  # is_file from the directory entry, one stat for the size
            frames = sorted((e.name, e.stat().st_size) for e in entries if e.is_file())
        if not frames:
            return None
        h.update(repr(frames).encode())
        for i in sorted({0, len(frames) // 2, len(frames) - 1}):
            h.update(hashlib.sha256((rgb / frames[i][0]).read_bytes()).digest())
    except OSError:
        return None
    return h.hexdigest()


def unique_sessions(paths: list[Path]) -> tuple[list[Path], dict[str, str], dict[str, str]]:
    """(sessions to use, {skipped copy: why}, {used session: content key}).
    `paths` are session folders; order is kept."""
    names = {p.name for p in paths}
    skipped: dict[str, str] = {}
    keys: dict[str, str] = {}
    first_with: dict[str, str] = {}
    # the original first, then its copies: the one without a suffix is the one kept
    for p in sorted(paths, key=lambda p: (original_name(p.name), p.name != original_name(p.name), p.name)):
        key = content_key(p)
        if key is not None and key in first_with:
            skipped[p.name] = (f"the same recording as {first_with[key]} (identical imu.json, encoders.json and "
                               f"frames): packed once, as {first_with[key]}")
            continue
        base = original_name(p.name)
        if base != p.name and base in names and base not in skipped:
            skipped[p.name] = (f"a second copy of {base} (the '{p.name[len(base):].strip()}' suffix AirDrop or "
                               f"Finder gives a second export), but not the same bytes: packed {base} only; if "
                               "this copy is the one you want, replace the original with it")
            continue
        if key is not None:
            first_with[key] = p.name
            keys[p.name] = key
    return [p for p in paths if p.name not in skipped], skipped, keys


def skipped_exports(zips: list[Path], raw: Path) -> dict[str, str]:
    """{zip file name: why} for `session_X (N).zip` exports of a session already
    there as `session_X.zip` or `session_X/`: not unpacked at all."""
    out: dict[str, str] = {}
    for z in zips:
        base = original_name(z.stem)
        if base == z.stem:
            continue
        original = raw / f"{base}.zip"
        if original.is_file() and _same_file(z, original):
            out[z.name] = f"the same bytes as {original.name}: a second export of {base}, skipped"
        elif original.is_file() or (raw / base).is_dir():
            out[z.name] = (f"a second export of {base} ('{z.stem[len(base):].strip()}' suffix), not the same bytes "
                           f"as {original.name if original.is_file() else base + '/'}: skipped; if this copy is "
                           "the one you want, replace the original with it")
    return out


def _same_file(a: Path, b: Path) -> bool:
    try:
        if a.stat().st_size != b.stat().st_size:
            return False
        with open(a, "rb") as fa, open(b, "rb") as fb:
            while True:
                x, y = fa.read(1 << 20), fb.read(1 << 20)
                if x != y:
                    return False
                if not x:
                    return True
    except OSError:
        return False
