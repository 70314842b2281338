"""A StackCapture session on disk, as the app writes it: discovery, validation,
the frame clock, intrinsics, poses and who wrote them.

Everything here reads; nothing writes. A problem is a `SessionError` naming the
session, the file and the reason, so one bad session never stops the others."""
from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from packer.encoders import EncoderFormatError, Encoders
from packer.encoders import from_rows as encoders_from_rows
from packer.imageops import frame_size_problem
from packer.imu import Imu, monotonic, read_imu
from packer.jsonfile import read_json
from packer.timebase import DEFAULT_FPS, estimate_fps, iso_epoch
from packer.videoclock import from_video, numbers_short
from shardship.errors import SessionError, ShardshipError

RAW_WIDTH, RAW_HEIGHT = 480, 360
MIN_FRAMES = 2
SHIPPED_NEVER = ("video.mov", "imu.json")  # raw-only: never packed


CAPTURE_ULTRAWIDE, CAPTURE_ARKIT = "ultrawide", "arkit"
# ARKit camera axes (x right, y up, z back) -> OpenCV (x right, y down, z forward)
ARKIT_TO_OPENCV = np.diag([1.0, -1.0, -1.0, 1.0])


@dataclass
class Session:
    path: Path
    name: str
    frames: np.ndarray  # int64 frame indices (file stems), sorted; a failed encode leaves a gap
    frame_paths: list[Path]
    timestamps: np.ndarray  # frame clock: float64 seconds since frame index 0, strictly increasing
    timestamp_source: str  # "index/fps" | "poses.json" (ARKit: the phone's boot clock)
    fps: float
    intrinsics: tuple[float, float, float, float] | None  # fx fy cx cy at RAW size
    metadata: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    pose_entries: list[dict[str, Any]] = field(default_factory=list)  # poses.json as read at load time
    capture: str = CAPTURE_ULTRAWIDE  # "ultrawide" | "arkit"
    fps_source: str = "default"
    pose_source: str | None = None  # see poses_provenance()
    imu: Imu | None = None  # imu.json, read once at load (None when absent)
    frame0_epoch: float | None = None  # first guess; packer.clock refines it
    frame0_source: str = ""
    encoder_rows: Any = None  # encoders.json as decoded at load (None when absent): read once
    _frame_stats: list[tuple[int, int]] | None = field(default=None, init=False, repr=False, compare=False)

    def frame_stats(self) -> list[tuple[int, int]]:
        """(size, mtime_ns) of every frame file, read once: the SLAM cache, the pack's
        reuse decision and the raw size all ask, and a stat per frame per question
        was ~5% of a 2,400-frame pack's CPU."""
        if self._frame_stats is None:
            self._frame_stats = [(st.st_size, st.st_mtime_ns) for st in map(os.stat, self.frame_paths)]
        return self._frame_stats

    @property
    def n_frames(self) -> int:
        return len(self.frames)

    def file(self, name: str) -> Path:
        return self.path / name

    def error(self, file: str | Path, reason: str, kind: type[SessionError] = SessionError) -> SessionError:
        """The session's one-line error naming `file` (relative to the session), as `kind`
        (a SessionError subclass with the same arguments, for callers that tell refusals apart)."""
        p = Path(file)
        rel = p.relative_to(self.path) if p.is_absolute() and _is_within(p, self.path) else p
        return kind(self.name, str(rel), reason)

    @property
    def capture_source(self) -> str:
        """The normalised capture mode (goes into the SLAM fingerprint)."""
        return self.capture

    def raw_bytes(self) -> int:
        """Every byte of the session directory (what a naive upload would send)."""
        frames = {str(p) for p in self.frame_paths}
        total = sum(size for size, _mtime in self.frame_stats())
        for root, _dirs, files in os.walk(self.path):
            for f in files:
                path = os.path.join(root, f)
                if path in frames:
                    continue
                try:
                    total += os.lstat(path).st_size
                except OSError:
                    pass
        return total


def _is_within(p: Path, root: Path) -> bool:
    try:
        p.relative_to(root)
        return True
    except ValueError:
        return False


SESSION_MARKERS = ("metadata.json", "rgb", "imu.json", "encoders.json", "calib.txt")  # what the app writes


def discover(raw: str | os.PathLike) -> list[Path]:
    """Session directories under `raw`: every non-hidden subdirectory but a Mac's
    `__MACOSX` (an unzip leaves it), sorted. A directory without rgb/ is still
    returned so `check` can say what is wrong."""
    root = Path(raw)
    if not root.is_dir():
        raise ShardshipError(f"raw directory {root} not found: pass --raw DIR or run `packer synth --out {root}`")
    if any((root / m).exists() for m in SESSION_MARKERS):  # its rgb/ would be taken for a session
        raise ShardshipError(f"{root} is a session folder, not the raw directory: give its parent "
                             f"(--raw {root.parent})")
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name != "__MACOSX")


def no_sessions(root: str | os.PathLike) -> ShardshipError:
    """What `packer check` and `packer pack` say when `root` holds no session."""
    return ShardshipError(f"no sessions under {root}: copy the app's session_*.zip exports (or session_* folders) "
                          "there, or run `packer synth`")


def list_frames(path: Path, name: str) -> tuple[np.ndarray, list[Path]]:
    rgb = path / "rgb"
    if not rgb.is_dir():
        raise SessionError(name, "rgb/", "missing: a session needs rgb/000000.jpg ...")
    items: list[tuple[int, Path]] = []
    with os.scandir(rgb) as entries:  # is_symlink from the directory entry: no stat per frame
        listed = [(Path(e.path), e.is_symlink()) for e in entries]
    for p, link in listed:
        if p.suffix.lower() not in (".jpg", ".jpeg") or p.name.startswith("."):  # ._000139.jpg: a Mac's AppleDouble
            continue
        if not p.stem.isdigit():
            raise SessionError(name, f"rgb/{p.name}", "frame file name is not a number")
        if link and not _is_within(target := p.resolve(), path.resolve()):
            raise SessionError(name, f"rgb/{p.name}",
                               f"symlink points outside the session ({target}); copy the file in instead")
        items.append((int(p.stem), p))
    if not items:
        raise SessionError(name, "rgb/", "empty: no .jpg frames")
    items.sort()
    if len(items) < MIN_FRAMES:
        raise SessionError(name, "rgb/", f"only {len(items)} frame(s); need at least {MIN_FRAMES}")
    return np.array([i for i, _ in items], dtype=np.int64), [p for _, p in items]


def check_jpeg(session: Session, p: Path) -> tuple[int, int]:
    """Cheap structural check (SOI/EOI markers, non-trivial size): catches the
    truncated files a dropped phone transfer leaves without decoding them.
    Returns the file's (size, mtime_ns), as `Session.frame_stats` keeps them."""
    try:
        with open(p, "rb", buffering=0) as f:  # unbuffered: 5 bytes read, no 8 KiB buffer per frame
            st = os.fstat(f.fileno())
            size = st.st_size
            head = f.read(3)
            f.seek(max(0, size - 2))
            tail = f.read(2)
    except OSError as e:
        raise session.error(p, f"unreadable ({e.strerror})") from None
    if size < 128 or head[:2] != b"\xff\xd8":
        raise session.error(p, "not a JPEG (bad header); re-export the session or delete the frame")
    if tail != b"\xff\xd9":
        raise session.error(p, "truncated JPEG (no end marker); re-copy it from the phone or delete the frame")
    return size, st.st_mtime_ns


def load_session(path: str | os.PathLike, *, check_images: bool = False) -> Session:
    """Read and validate one session; raises SessionError with file and reason."""
    path = Path(path)
    name = path.name
    frames, frame_paths = list_frames(path, name)
    warnings: list[str] = []

    metadata: dict[str, Any] = {}
    if (path / "metadata.json").exists():
        metadata = read_json(name, path / "metadata.json")
        if not isinstance(metadata, dict):
            raise SessionError(name, "metadata.json", "expected a JSON object")
    else:
        warnings.append("metadata.json missing: capture mode and start time unknown")
    if bad := frame_size_problem(frame_paths[0], metadata.get("rgbResolution"), (RAW_WIDTH, RAW_HEIGHT)):
        raise SessionError(name, *bad)  # not the landscape frames packing and SLAM assume: refused now, in a line

    raw_poses = _read_pose_entries(path, name)
    pose_entries = raw_poses[1]
    capture = capture_mode(metadata, bool(pose_entries), (path / "imu.json").exists())
    s = Session(path, name, frames, frame_paths, np.zeros(0), "", DEFAULT_FPS, _read_calib(path, name),
                metadata, warnings, pose_entries, capture)
    s.pose_source = poses_provenance(metadata, pose_entries, raw_poses[0], capture)
    if (path / "encoders.json").exists():  # before the IMU: a clock step is undone in both (packer.clockstep)
        s.encoder_rows = read_json(name, path / "encoders.json")
    if (path / "imu.json").exists():
        s.imu = load_imu(s)
    _frame_clock(s)
    if check_images:  # the checks' fstat is the frame's stat too: kept, not asked again
        s._frame_stats = [check_jpeg(s, p) for p in frame_paths]
    return s


def capture_mode(metadata: dict[str, Any], has_poses: bool, has_imu: bool) -> str:
    """"arkit" for the app's ARKit mode (poses recorded by ARKit, metric, ARKit axes,
    boot clock), else "ultrawide" (frames + IMU, poses from SLAM later). The first
    app version wrote no captureSource: poses without an IMU mean ARKit there."""
    src = str(metadata.get("captureSource") or "")
    if src in ("iphone_arkit", "ARKit"):
        return CAPTURE_ARKIT
    if not src and has_poses and not has_imu:
        return CAPTURE_ARKIT
    return CAPTURE_ULTRAWIDE


def poses_provenance(metadata: dict[str, Any], entries: list[dict[str, Any]], sha256: str | None,
                     capture: str) -> str | None:
    """Who wrote poses.json, which decides whether they are metric:
    "arkit" (metric), "shardship" (our SLAM: metric unless --scale none),
    "user-calibrated" (the user's run_slam.py + calibrate_scale.py: slamProcessed and
    scale_factor, metric), "user-slam" (slamProcessed, no scale: SfM units),
    "foreign" (unknown writer, not trusted as metric); None when there are none."""
    if not entries:
        return None
    ours = metadata.get("shardship")
    if isinstance(ours, dict) and sha256 is not None and ours.get("poses_sha256") == sha256:
        return "shardship"
    if capture == CAPTURE_ARKIT:
        return "arkit"
    if metadata.get("slamProcessed") is True:
        sf = metadata.get("scale_factor")
        return "user-calibrated" if isinstance(sf, (int, float)) and math.isfinite(sf) and sf > 0 else "user-slam"
    return "foreign"


def _read_calib(path: Path, name: str) -> tuple[float, float, float, float] | None:
    calib = path / "calib.txt"
    if not calib.exists():
        return None
    try:
        vals = [float(x) for x in calib.read_text().split()]
    except (ValueError, UnicodeDecodeError):
        raise SessionError(name, "calib.txt", "expected four numbers 'fx fy cx cy'") from None
    if len(vals) != 4 or not all(math.isfinite(v) and v > 0 for v in vals):
        raise SessionError(name, "calib.txt", f"expected four positive numbers 'fx fy cx cy', got {vals}")
    return vals[0], vals[1], vals[2], vals[3]


def _read_pose_entries(path: Path, name: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(sha256 of the bytes, entries sorted by rgbIndex) of poses.json, read once per
    load: timestamps, poses, provenance and SLAM flags all come from it."""
    poses_file = path / "poses.json"
    if not poses_file.exists():
        return None, []
    data = poses_file.read_bytes()
    entries = read_json(name, poses_file) if data.strip() else []
    if not isinstance(entries, list):
        raise SessionError(name, "poses.json", "expected a JSON list of poses")
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or "rgbIndex" not in e or "transform" not in e:
            raise SessionError(name, "poses.json", f"entry {i} lacks rgbIndex/transform")
        try:
            e["rgbIndex"] = int(e["rgbIndex"])
        except (TypeError, ValueError):
            raise SessionError(name, "poses.json", f"entry {i}: rgbIndex is not an integer") from None
    entries.sort(key=lambda e: e["rgbIndex"])  # the app's async writer may store them out of order
    return hashlib.sha256(data).hexdigest(), entries


def _frame_clock(s: Session) -> None:
    """Frame timestamps (seconds since frame 0), the frame rate and a first guess of
    frame 0 on the epoch clock. ARKit frames carry real timestamps (boot clock); the
    others are index / fps (the user's run_slam.py writes i/60 into poses.json
    whatever the rate, so those stamps are not used)."""
    md, frames = s.metadata, s.frames
    pose_t = None
    if s.capture == CAPTURE_ARKIT and s.pose_entries:
        # raw JSON values: float() below refuses a missing (None) or non-numeric timestamp
        by_index: dict[Any, Any] = {e["rgbIndex"]: e.get("timestamp") for e in s.pose_entries}
        try:
            if all(int(f) in by_index for f in frames):
                pose_t = np.array([float(by_index[int(f)]) for f in frames], dtype=np.float64)
        except (TypeError, ValueError):
            raise s.error("poses.json", "timestamps must be numbers") from None
    enc_span = _encoder_span(s)
    start, end = iso_epoch(md.get("startTime")), iso_epoch(md.get("endTime"))
    spans: list[tuple[str, float]] = []
    if s.imu is not None:
        spans.append(("imu.json span", float(s.imu.t[-1] - s.imu.t[0])))
    if enc_span is not None:
        spans.append(("encoders.json span", enc_span[1] - enc_span[0]))
    if start is not None and end is not None and end > start:
        spans.append(("metadata startTime/endTime", end - start))
    md_count = int(md.get("rgbFrameCount") or 0) if isinstance(md.get("rgbFrameCount"), int) else 0
    count = max(int(frames[-1]) + 1, md_count)
    pose_dt = float(np.median(np.diff(pose_t))) if pose_t is not None else None
    s.fps, s.fps_source, warn = estimate_fps(count, spans, pose_dt)
    s.warnings.extend(warn)
    if pose_t is not None:
        monotonic(s.name, "poses.json", pose_t, "frame timestamps")
        s.timestamps, s.timestamp_source = pose_t - pose_t[0], "poses.json"
    else:
        _numbers_or_video(s, count)
    # frame 0 on the epoch clock: the IMU and the glove start with the capture, the
    # first frame follows within a frame period; startTime is rounded to the second
    if s.imu is not None:
        s.frame0_epoch, s.frame0_source = float(s.imu.t[0]), "imu.json start"
    elif enc_span is not None:
        s.frame0_epoch, s.frame0_source = enc_span[0], "encoders.json start"
    elif start is not None:
        s.frame0_epoch, s.frame0_source = start, "metadata startTime (1 s resolution)"


def _numbers_or_video(s: Session, count: int) -> None:
    """The app's frames: placed by video.mov where it is readable (`packer.videoclock`),
    else index / fps, refused where the IMU's span shows the camera dropped frames.
    index / fps, not (index - first) / fps: frame 0 is the capture's first frame even
    when its file is missing (a failed encode), and that is what the clocks refer to."""
    vc = from_video(s.path / "video.mov", s.frames, count, s.warnings)
    if vc is None:
        s.timestamps, s.timestamp_source = s.frames.astype(np.float64) / s.fps, "index/fps"
        if s.imu is not None and s.capture == CAPTURE_ULTRAWIDE:
            short = numbers_short(count, s.fps, s.imu.t)
            if short:
                raise s.error("rgb/", short)
        return
    s.fps, s.fps_source, s.timestamp_source = vc.fps, vc.fps_source, "video.mov"
    s.warnings.extend(vc.notes)
    keep = vc.placed
    if not keep.all():
        s.frames, s.frame_paths = s.frames[keep], [p for p, k in zip(s.frame_paths, keep) if k]
        if len(s.frames) < MIN_FRAMES:
            raise s.error("video.mov", "too few frames can be placed in time; re-copy video.mov from the phone")
    s.timestamps = vc.times[keep]


def _encoder_span(s: Session) -> tuple[float, float] | None:
    """(first, last) receive time in encoders.json (the rows load_session decoded,
    once per load, and packer.clockstep repaired)."""
    rows = s.encoder_rows
    if rows is None:
        return None
    try:
        t = [float(r["timestamp"]) for r in rows] if isinstance(rows, list) else []
    except (KeyError, TypeError, ValueError):
        return None  # load_encoders says what is wrong
    return (min(t), max(t)) if len(t) >= 2 else None


def load_poses(session: Session) -> dict[int, np.ndarray] | None:
    """camera-to-world 4x4 per frame index from poses.json in OpenCV camera axes
    (ARKit poses converted), or None when empty."""
    if not session.pose_entries:
        return None
    p = session.file("poses.json")
    remap = _user_slam_positions(session)
    out: dict[int, np.ndarray] = {}
    for i, e in enumerate(session.pose_entries):
        try:
            m = np.asarray(e.get("transform"), dtype=np.float64)
        except (TypeError, ValueError):
            raise session.error(p, f"entry {i}: transform is not a 4x4 matrix of numbers") from None
        if m.shape == (16,):
            m = m.reshape(4, 4)
        if m.shape != (4, 4) or not np.all(np.isfinite(m)):
            raise session.error(p, f"entry {i}: transform is not a finite 4x4 matrix")
        key = int(session.frames[int(e["rgbIndex"])]) if remap else int(e["rgbIndex"])
        out[key] = m @ ARKIT_TO_OPENCV if session.pose_source == "arkit" else m
    return out


def _user_slam_positions(session: Session) -> bool:
    """True when the user's run_slam.py numbered poses by position in the sorted list
    of JPEG files (what it does) and a gap makes that differ from the file index:
    such an rgbIndex i means the i-th file. Warned once per load."""
    if session.pose_source not in ("user-calibrated", "user-slam"):
        return False
    n = session.n_frames
    if int(session.frames[-1]) == n - 1:  # no gap: position == index
        return False
    if max(int(e["rgbIndex"]) for e in session.pose_entries) >= n:
        return False  # indices beyond the file count: real frame indices
    w = (f"poses.json from run_slam.py numbers frames by file position; with {int(session.frames[-1]) + 1 - n} "
         "missing frame(s) those are mapped to the files they were computed from")
    if w not in session.warnings:
        session.warnings.append(w)
    return True


def load_pose_flags(session: Session) -> dict[int, str]:
    """Per-frame SLAM flag ("registered" | "interpolated" | "outside") that
    `packer slam` writes into poses.json; empty for poses from elsewhere."""
    return {int(e["rgbIndex"]): str(e["flag"]) for e in session.pose_entries if "flag" in e}


def poses_are_metric(session: Session) -> bool:
    """ARKit poses are metric; so are the user's calibrated ones and shardship's own
    (unless written with --scale none)."""
    if session.pose_source in ("arkit", "user-calibrated"):
        return True
    if session.pose_source == "shardship":
        return bool(session.metadata.get("shardship", {}).get("metric"))
    return False


def load_imu(session: Session) -> Imu:
    if session.imu is not None:
        return session.imu
    return read_imu(session.path, session.name, session.encoder_rows, session.warnings)


def load_encoders(session: Session) -> Encoders | None:
    """The glove's joint readings on the epoch clock, or None without encoders.json."""
    p = session.file("encoders.json")
    if session.encoder_rows is None and not p.exists():
        return None
    rows = session.encoder_rows if session.encoder_rows is not None else read_json(session.name, p)
    try:
        return encoders_from_rows(rows)
    except EncoderFormatError as e:
        raise session.error(p, str(e)) from None
