"""What the SLAM stage reads to decide it has nothing to do, and what it writes.

Output, in the session (what the StackCapture tools read):
- poses.json: [{"timestamp", "rgbIndex", "transform": 4x4 camera-to-world}] for
  every frame (metres when metric), plus "flag": registered|interpolated|outside;
- metadata.json: the original keys untouched except the ones the user's own tools
  read (slamProcessed, poseCount, scale_factor when metric); results under "shardship".

Raw data is never lost: a non-empty poses.json that shardship did not write is
renamed to poses.orig.json (poses.orig.1.json, ... if that exists) first.
A re-run with the same inputs and options finds the same fingerprint in
metadata.json and a poses.json whose hash matches, and does nothing. Two levels, as
`packer pack` does for its shards: the stat of the inputs (`input_stat`: sizes and
mtimes, no reads) decides a re-run without reading a frame; only when it differs
(e.g. the session was copied) does the content fingerprint, which hashes every
frame, decide."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from packer.session import Session, read_json
from shardship import __version__
from shardship.atomic import write_bytes, write_json

SLAM_VERSION = 3  # 2: tracks corrected for the rolling shutter; 3: frames between keyframes from the IMU. Bump when
# the output of the same inputs changes
KEY = "shardship"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def input_fingerprint(session: Session, options: dict[str, Any], use_imu: bool) -> str:
    """Content hash of everything the result depends on: frames, frame timestamps,
    calib.txt, imu.json (when used), the capture source, the options and the version.
    Not metadata.json or poses.json as files: this stage writes them."""
    h = hashlib.sha256()
    h.update(json.dumps({"v": SLAM_VERSION, "options": options, "source": session.capture_source},
                        sort_keys=True).encode())
    h.update(np.ascontiguousarray(session.timestamps, dtype="<f8").tobytes())
    for name in ("calib.txt", "imu.json") if use_imu else ("calib.txt",):
        p = session.file(name)
        h.update(name.encode() + b"\0" + (hashlib.sha256(p.read_bytes()).digest() if p.exists() else b"-"))
    for idx, p in zip(session.frames, session.frame_paths):
        h.update(f"{int(idx)}\0".encode())
        with open(p, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def input_stat(session: Session, options: dict[str, Any], use_imu: bool) -> str:
    """The stat-level twin of `input_fingerprint`: the same inputs by name, size and
    mtime (a rewrite changes one of them), so a cached session costs one stat per
    frame instead of reading and hashing every frame."""
    h = hashlib.sha256()
    h.update(json.dumps({"v": SLAM_VERSION, "options": options, "source": session.capture_source, "stat": 1},
                        sort_keys=True).encode())
    h.update(np.ascontiguousarray(session.timestamps, dtype="<f8").tobytes())
    for name in ("calib.txt", "imu.json") if use_imu else ("calib.txt",):
        p = session.file(name)
        st = p.stat() if p.exists() else None
        h.update(f"{name}\0{st.st_size if st else -1}\0{st.st_mtime_ns if st else -1}\0".encode())
    for idx, (size, mtime) in zip(session.frames, session.frame_stats()):
        h.update(f"{int(idx)}\0{size}\0{mtime}\0".encode())
    return h.hexdigest()


def load_metadata(session: Session) -> dict[str, Any]:
    p = session.file("metadata.json")
    if not p.exists():
        return {}
    data = read_json(session.name, p)
    return data if isinstance(data, dict) else {}


def cached(session: Session, fingerprint: str | None = None, stat: str | None = None) -> dict[str, Any] | None:
    """The stored results when this exact input was already processed, else None:
    by content `fingerprint`, or by `stat` (input_stat) when the stored one matches."""
    info = load_metadata(session).get(KEY)
    if not isinstance(info, dict):
        return None
    if not ((fingerprint is not None and info.get("fingerprint") == fingerprint)
            or (stat is not None and info.get("input_stat") == stat)):
        return None
    p = session.file("poses.json")
    if not p.exists() or _sha(p.read_bytes()) != info.get("poses_sha256"):
        return None
    return info


REFUSAL_KEY = "shardship_refusal"  # metadata.json: the last run's refusal, with the inputs it was made on


def write_refusal(session: Session, fingerprint: str, stat: str, message: str) -> None:
    """Remember a refusal beside the inputs it was made on: the same inputs give the
    same answer, so `packer pack` after a refused `packer slam` says it at once instead
    of mapping the session again (minutes). Only this key of metadata.json changes."""
    md = load_metadata(session)
    md[REFUSAL_KEY] = {"version": SLAM_VERSION, "tool": __version__, "fingerprint": fingerprint, "input_stat": stat,
                       "message": message}
    write_json(session.file("metadata.json"), _jsonable(md))


def cached_refusal(session: Session, fingerprint: str | None = None, stat: str | None = None) -> str | None:
    """The stored refusal's message when these exact inputs were refused before
    (by content `fingerprint` or by `stat`, as `cached`), else None. A refusal made by
    another release of the tool is tried again: a newer one may map what an older refused."""
    rec = load_metadata(session).get(REFUSAL_KEY)
    if not isinstance(rec, dict) or rec.get("version") != SLAM_VERSION or rec.get("tool") != __version__:
        return None
    if (fingerprint is not None and rec.get("fingerprint") == fingerprint) or (
            stat is not None and rec.get("input_stat") == stat):
        return str(rec.get("message", ""))
    return None


SCALE_CHOICE = ("scale", "marker_size", "marker_dict", "known_distance")  # SlamOptions fields: the user's choice


def scale_choice(session: Session) -> dict[str, Any] | None:
    """The scale method (and its arguments) the stored result was made with: `packer slam
    --scale none` then `packer pack` must keep the user's choice, not redo SLAM with the
    IMU. Older results stored only the method."""
    info = load_metadata(session).get(KEY)
    if not isinstance(info, dict):
        return None
    choice = info.get("scale_choice")
    if isinstance(choice, dict):
        return {k: v for k, v in choice.items() if k in SCALE_CHOICE}
    method = info.get("method")
    return {"scale": method} if method in ("imu", "none") else None


def _ours(session: Session, data: bytes) -> bool:
    info = load_metadata(session).get(KEY)
    return isinstance(info, dict) and info.get("poses_sha256") == _sha(data)


def keep_foreign_poses(session: Session) -> Path | None:
    """Rename a non-empty poses.json that shardship did not write; returns the new path."""
    p = session.file("poses.json")
    if not p.exists():
        return None
    data = p.read_bytes()
    try:
        empty = not json.loads(data)
    except (ValueError, UnicodeDecodeError):
        empty = False  # unreadable: keep it, it is someone's data
    if empty or _ours(session, data):
        return None
    dest = session.file("poses.orig.json")
    n = 1
    while dest.exists():
        if dest.read_bytes() == data:
            return dest  # already kept
        dest = session.file(f"poses.orig.{n}.json")
        n += 1
    os.replace(p, dest)
    return dest


def poses_document(session: Session, poses: np.ndarray, flags: np.ndarray, flag_names: dict[int, str]) -> bytes:
    """poses.json for every frame SLAM placed. Frames before the first or after the
    last registered keyframe ("outside") get no entry: holding the nearest pose
    would pack a label known to be wrong (seconds of motion at a standstill), and
    `pack` already packs a frame without an entry as an image without pose or action."""
    entries = [
        {
            "timestamp": float(t),
            "rgbIndex": int(i),
            "transform": [[float(v) for v in row] for row in T],
            "flag": flag_names[int(f)],
        }
        for t, i, T, f in zip(session.timestamps, session.frames, poses, flags)
        if flag_names[int(f)] != "outside"
    ]
    return (json.dumps(entries, allow_nan=False) + "\n").encode()


def write_results(session: Session, poses: np.ndarray, flags: np.ndarray, flag_names: dict[int, str],
                  info: dict[str, Any]) -> dict[str, Any]:
    """Write poses.json then metadata.json (both atomic). metadata goes last: a crash
    in between leaves a poses.json whose hash is not recorded, so the next run redoes
    the session instead of trusting it."""
    if not np.all(np.isfinite(poses)):
        raise ValueError("non-finite pose")
    kept = keep_foreign_poses(session)
    doc = poses_document(session, poses, flags, flag_names)
    write_bytes(session.file("poses.json"), doc)
    md = load_metadata(session)
    info = dict(info)
    info["poses_sha256"] = _sha(doc)
    if kept is not None:
        info["original_poses"] = kept.name
    elif isinstance(md.get(KEY), dict) and md[KEY].get("original_poses"):
        info["original_poses"] = md[KEY]["original_poses"]
    md[KEY] = info
    md.pop(REFUSAL_KEY, None)  # an older run's refusal no longer says anything about these poses
    # the fields the user's own tools read: run_slam.py skips a slamProcessed session,
    # calibrate_scale.py one with a scale_factor (our poses are in metres already)
    md["slamProcessed"] = True
    md["poseCount"] = int(sum(flag_names[int(f)] != "outside" for f in flags))
    if info.get("metric") and info.get("scale") is not None:
        md["scale_factor"] = float(info["scale"])
    else:
        md.pop("scale_factor", None)
    write_json(session.file("metadata.json"), _jsonable(md))
    return info


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, (np.floating, float)):
        v = float(obj)
        return v if np.isfinite(v) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj
