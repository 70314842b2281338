"""A StackCapture v3 session on disk: discovery, validation, timestamps, intrinsics.

Everything here reads; nothing writes. A problem is a `SessionError` naming the
session, the file and the reason, so one bad session never stops the others."""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from packer.errors import SessionError

RAW_WIDTH, RAW_HEIGHT = 480, 360
DEFAULT_FPS = 60.0
MIN_FRAMES = 2
SHIPPED_NEVER = ("video.mov", "imu.json")  # raw-only: never packed


@dataclass
class Session:
    path: Path
    name: str
    frames: np.ndarray  # int64 frame indices (file stems), sorted
    frame_paths: list[Path]
    timestamps: np.ndarray  # float64 seconds, one per frame, strictly increasing
    timestamp_source: str  # "poses.json" | "fps"
    fps: float
    intrinsics: tuple[float, float, float, float] | None  # fx fy cx cy at RAW size
    metadata: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    pose_entries: list[dict[str, Any]] = field(default_factory=list)  # poses.json as read at load time

    @property
    def n_frames(self) -> int:
        return len(self.frames)

    def file(self, name: str) -> Path:
        return self.path / name

    def error(self, file: str | Path, reason: str) -> SessionError:
        p = Path(file)
        rel = p.relative_to(self.path) if p.is_absolute() and _is_within(p, self.path) else p
        return SessionError(self.name, str(rel), reason)

    @property
    def capture_source(self) -> str:
        return str(self.metadata.get("captureSource", ""))

    def raw_bytes(self) -> int:
        """Every byte of the session directory (what a naive upload would send)."""
        total = 0
        for root, _dirs, files in os.walk(self.path):
            for f in files:
                try:
                    total += os.lstat(os.path.join(root, f)).st_size
                except OSError:
                    pass
        return total


def _is_within(p: Path, root: Path) -> bool:
    try:
        p.relative_to(root)
        return True
    except ValueError:
        return False


def discover(raw: str | os.PathLike) -> list[Path]:
    """Session directories under `raw`: every non-hidden subdirectory, sorted.
    A directory without rgb/ is still returned so `check` can say what is wrong."""
    root = Path(raw)
    if not root.is_dir():
        from packer.errors import ShardshipError

        raise ShardshipError(f"raw directory {root} not found: pass --raw DIR or run `packer synth --out {root}`")
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def read_json(session_name: str, path: Path) -> Any:
    try:
        with open(path, "rb") as f:
            return json.loads(f.read(), parse_constant=_reject_constant)
    except FileNotFoundError:
        raise SessionError(session_name, path.name, "missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as e:
        raise SessionError(session_name, path.name, f"not valid JSON ({e})") from None


def _reject_constant(name: str) -> float:
    return float("nan")  # NaN/Infinity literals load as NaN; callers check finiteness


def list_frames(path: Path, name: str) -> tuple[np.ndarray, list[Path]]:
    rgb = path / "rgb"
    if not rgb.is_dir():
        raise SessionError(name, "rgb/", "missing: a session needs rgb/000000.jpg ...")
    root = path.resolve()
    items: list[tuple[int, Path]] = []
    for p in rgb.iterdir():
        if p.suffix.lower() not in (".jpg", ".jpeg"):
            continue
        if not p.stem.isdigit():
            raise SessionError(name, f"rgb/{p.name}", "frame file name is not a number")
        if p.is_symlink():
            target = p.resolve()
            if not _is_within(target, root):
                raise SessionError(
                    name, f"rgb/{p.name}", f"symlink points outside the session ({target}); copy the file in instead"
                )
        items.append((int(p.stem), p))
    if not items:
        raise SessionError(name, "rgb/", "empty: no .jpg frames")
    items.sort()
    if len(items) < MIN_FRAMES:
        raise SessionError(name, "rgb/", f"only {len(items)} frame(s); need at least {MIN_FRAMES}")
    return np.array([i for i, _ in items], dtype=np.int64), [p for _, p in items]


def check_jpeg(session: Session, p: Path) -> None:
    """Cheap structural check (SOI/EOI markers, non-trivial size): catches the
    truncated files a dropped phone transfer leaves without decoding them."""
    try:
        size = p.stat().st_size
        with open(p, "rb") as f:
            head = f.read(3)
            f.seek(max(0, size - 2))
            tail = f.read(2)
    except OSError as e:
        raise session.error(p, f"unreadable ({e.strerror})") from None
    if size < 128 or head[:2] != b"\xff\xd8":
        raise session.error(p, "not a JPEG (bad header); re-export the session or delete the frame")
    if tail != b"\xff\xd9":
        raise session.error(p, "truncated JPEG (no end marker); re-copy it from the phone or delete the frame")


def _monotonic(name: str, file: str, t: np.ndarray, what: str) -> None:
    if not np.all(np.isfinite(t)):
        raise SessionError(name, file, f"{what} contain NaN/inf")
    d = np.diff(t)
    if np.any(d <= 0):
        i = int(np.argmax(d <= 0))
        raise SessionError(name, file, f"{what} not strictly increasing at entry {i + 1} ({t[i]:.6f} -> {t[i + 1]:.6f})")


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
        warnings.append(f"metadata.json missing: assuming {DEFAULT_FPS:g} fps, {RAW_WIDTH}x{RAW_HEIGHT}")
    fps = float(metadata.get("fps", DEFAULT_FPS) or DEFAULT_FPS)
    if not math.isfinite(fps) or fps <= 0:
        raise SessionError(name, "metadata.json", f"fps must be positive, got {metadata.get('fps')!r}")

    pose_entries = _read_pose_entries(path, name)
    timestamps, source = _frame_timestamps(name, frames, fps, pose_entries)

    intrinsics = None
    calib = path / "calib.txt"
    if calib.exists():
        try:
            vals = [float(x) for x in calib.read_text().split()]
        except ValueError:
            raise SessionError(name, "calib.txt", "expected four numbers 'fx fy cx cy'") from None
        if len(vals) != 4 or not all(math.isfinite(v) and v > 0 for v in vals):
            raise SessionError(name, "calib.txt", f"expected four positive numbers 'fx fy cx cy', got {vals}")
        intrinsics = (vals[0], vals[1], vals[2], vals[3])

    s = Session(path, name, frames, frame_paths, timestamps, source, fps, intrinsics, metadata, warnings,
                pose_entries)
    if check_images:
        for p in frame_paths:
            check_jpeg(s, p)
    return s


def _read_pose_entries(path: Path, name: str) -> list[dict[str, Any]]:
    """poses.json, read once per load: timestamps, poses and SLAM flags all come from it."""
    poses_file = path / "poses.json"
    if not poses_file.exists() or poses_file.stat().st_size <= 2:
        return []
    entries = read_json(name, poses_file)
    if not isinstance(entries, list):
        raise SessionError(name, "poses.json", "expected a JSON list of poses")
    return entries


def _frame_timestamps(name: str, frames: np.ndarray, fps: float,
                      poses: list[dict[str, Any]]) -> tuple[np.ndarray, str]:
    """poses.json timestamps when present (keyed by rgbIndex), else index / fps."""
    if poses:
        by_index: dict[int, float] = {}
        for i, p in enumerate(poses):
            try:
                by_index[int(p["rgbIndex"])] = float(p["timestamp"])
            except (KeyError, TypeError, ValueError):
                raise SessionError(name, "poses.json", f"entry {i} lacks rgbIndex/timestamp") from None
        if all(int(f) in by_index for f in frames):
            t = np.array([by_index[int(f)] for f in frames], dtype=np.float64)
            _monotonic(name, "poses.json", t, "frame timestamps")
            return t, "poses.json"
    t = frames.astype(np.float64) / fps
    return t, "fps"


def load_poses(session: Session) -> dict[int, np.ndarray] | None:
    """camera-to-world 4x4 per frame index from poses.json, or None when empty."""
    if not session.pose_entries:
        return None
    p = session.file("poses.json")
    out: dict[int, np.ndarray] = {}
    for i, e in enumerate(session.pose_entries):
        m = np.asarray(e.get("transform"), dtype=np.float64)
        if m.shape == (16,):
            m = m.reshape(4, 4)
        if m.shape != (4, 4) or not np.all(np.isfinite(m)):
            raise session.error(p, f"entry {i}: transform is not a finite 4x4 matrix")
        out[int(e["rgbIndex"])] = m
    return out


def load_pose_flags(session: Session) -> dict[int, str]:
    """Per-frame SLAM flag ("registered" | "interpolated" | "outside") that
    `packer slam` writes into poses.json; empty for poses from elsewhere."""
    return {int(e["rgbIndex"]): str(e["flag"]) for e in session.pose_entries if "flag" in e}


def poses_are_metric(session: Session) -> bool:
    """ARKit poses are metric already; so are poses shardship wrote itself."""
    md = session.metadata
    return md.get("captureSource") == "ARKit" or bool(md.get("shardship", {}).get("metric"))


@dataclass
class Imu:
    t: np.ndarray  # (N,) seconds, IMU clock
    accel: np.ndarray  # (N,3) g, device frame
    gyro: np.ndarray  # (N,3) rad/s


def load_imu(session: Session) -> Imu:
    p = session.file("imu.json")
    data = read_json(session.name, p)
    if not isinstance(data, list) or len(data) < 2:
        raise session.error(p, "expected a list of at least 2 samples")
    try:
        t = np.array([d["timestamp"] for d in data], dtype=np.float64)
        acc = np.array([d["accel"] for d in data], dtype=np.float64)
        gyr = np.array([d["gyro"] for d in data], dtype=np.float64)
    except (KeyError, TypeError, ValueError) as e:
        raise session.error(p, f"each sample needs timestamp, accel[3], gyro[3] ({e})") from None
    if acc.shape != (len(t), 3) or gyr.shape != (len(t), 3):
        raise session.error(p, "accel and gyro must be 3-vectors")
    bad = ~(np.isfinite(acc).all(1) & np.isfinite(gyr).all(1) & np.isfinite(t))
    if bad.any():
        i = int(np.argmax(bad))
        raise session.error(p, f"NaN/inf in {int(bad.sum())} sample(s), first at entry {i} (t={t[i]})")
    _monotonic(session.name, "imu.json", t, "IMU timestamps")
    return Imu(t, acc, gyr)


@dataclass
class Encoders:
    t: np.ndarray  # (N,)
    names: list[str]
    values: np.ndarray  # (N, J)

    def at(self, t: np.ndarray) -> np.ndarray:
        """Joint values linearly interpolated to times `t` (clamped at the ends)."""
        return np.stack([np.interp(t, self.t, self.values[:, j]) for j in range(len(self.names))], axis=1)


def load_encoders(session: Session) -> Encoders | None:
    p = session.file("encoders.json")
    if not p.exists():
        return None
    data = read_json(session.name, p)
    if not isinstance(data, list) or not data:
        raise session.error(p, "expected a non-empty list of samples")
    names = sorted(k for k in data[0] if k != "timestamp")
    try:
        t = np.array([d["timestamp"] for d in data], dtype=np.float64)
        v = np.array([[d[k] for k in names] for d in data], dtype=np.float64)
    except (KeyError, TypeError, ValueError) as e:
        raise session.error(p, f"every sample needs timestamp and {names} ({e})") from None
    if not np.all(np.isfinite(v)):
        raise session.error(p, "NaN/inf joint values")
    _monotonic(session.name, "encoders.json", t, "encoder timestamps")
    return Encoders(t, names, v)
