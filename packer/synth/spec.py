"""`synth_session`'s arguments, checked once, and the session's seeded generators.

Every step of `packer.synth.session` reads the same validated `SessionSpec`, so the
checks (and their error messages, in their order) live in one place and a step can
never see an argument the others rejected. The generators are one per component
(`Rngs`): a step draws only from its own, which is what keeps toggling one option
(e.g. `nan_imu` or `read_errors`) from changing any other stream's bytes."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from packer.effects import CameraEffects, PhoneRig
from packer.synth.encoders import JOINT_NAMES
from packer.synth.trajectory import MOTIONS

CAPTURES = ("ultrawide", "arkit")
EXPORTS = ("folder", "zip")


@dataclass(kw_only=True)
class SessionSpec:
    """The arguments of `synth_session` (see its docstring), validated in
    `__post_init__`. Values are kept as the caller passed them (every step converts
    with int()/float() where it always did), except `fps`, which becomes a float."""

    name: str
    n_frames: int
    seed: int
    motion: str
    imu_offset: float
    scale_hint: float | None
    imu_duration_factor: float
    nan_imu: bool
    video: bool
    scene_seed: int | None
    jpeg_quality: int
    progress: bool
    fps: float
    drop_frames: tuple[int, ...]
    encoders: bool
    read_errors: float
    wrap_joint: bool | str
    capture: str
    legacy_metadata: bool
    calib: bool
    lidar: bool
    export: str
    device_model: str
    ios_version: str
    clock_step: float = 0.0
    clock_step_at: float = 0.5
    effects: CameraEffects = CameraEffects()  # what the phone camera does to the frames (none: ideal)
    rig: PhoneRig = PhoneRig()  # how the phone is built (none: the IMU at the optical centre)
    camera_drops: tuple[int, ...] = ()  # slots of the 1/fps grid whose frame the camera discarded (late)
    writer_skips: tuple[int, ...] = ()  # frame indices video.mov lacks (the writer was not ready)
    glove_gaps: tuple[tuple[float, float], ...] = ()  # (s from frame 0, length s) without a BLE notification
    dead_joint: str | None = None  # this joint reads -1.0 (an I2C error) in every notification
    phone: DrawnPhone = field(init=False)  # this session's draw within `rig`
    dropped: list[int] = field(init=False)  # sorted unique `drop_frames`
    present: list[int] = field(init=False)  # frame indices that get a JPEG
    slots: np.ndarray = field(init=False)  # (n_frames,) grid slot of each delivered frame: its time is slot / fps

    def __post_init__(self) -> None:
        if self.motion not in MOTIONS:
            raise ValueError(f"motion must be one of {MOTIONS}, got {self.motion!r}")
        if self.capture not in CAPTURES:
            raise ValueError(f"capture must be one of {CAPTURES}, got {self.capture!r}")
        if self.export not in EXPORTS:
            raise ValueError(f"export must be one of {EXPORTS}, got {self.export!r}")
        if self.n_frames < 1:
            raise ValueError("n_frames must be >= 1")
        if not self.fps > 0:
            raise ValueError("fps must be > 0")
        if not 0.0 < self.imu_duration_factor <= 1.0:
            raise ValueError("imu_duration_factor must be in (0, 1]")
        if not 0.0 <= self.read_errors <= 1.0:
            raise ValueError("read_errors must be in [0, 1]")
        if self.legacy_metadata and self.capture != "arkit":
            raise ValueError("legacy_metadata is the first (ARKit) app's metadata: use capture='arkit'")
        self.dropped = sorted({int(i) for i in self.drop_frames})
        if any(not 0 <= i < self.n_frames for i in self.dropped):
            raise ValueError(f"drop_frames must be frame indices in [0, {self.n_frames})")
        self.present = [i for i in range(self.n_frames) if i not in set(self.dropped)]
        if not self.present:
            raise ValueError("drop_frames drops every frame")
        if isinstance(self.wrap_joint, str) and self.wrap_joint not in JOINT_NAMES:
            raise ValueError(f"wrap_joint must be a bool or one of {JOINT_NAMES}, got {self.wrap_joint!r}")
        if not 0.0 < self.clock_step_at < 1.0:
            raise ValueError("clock_step_at must be in (0, 1): a fraction of the capture")
        self.fps = float(self.fps)
        self.slots = delivered_slots(self.n_frames, self.camera_drops)
        if any(not 0 <= int(i) < self.n_frames for i in self.writer_skips):
            raise ValueError(f"writer_skips must be frame indices in [0, {self.n_frames})")
        if self.dead_joint is not None and self.dead_joint not in JOINT_NAMES:
            raise ValueError(f"dead_joint must be one of {JOINT_NAMES}, got {self.dead_joint!r}")
        self.phone = DrawnPhone.draw(self.rig, int(self.seed))

    @property
    def scale(self) -> float:
        """The world's length multiplier (`scale_hint`, None meaning 1)."""
        return 1.0 if self.scale_hint is None else float(self.scale_hint)


@dataclass(frozen=True)
class Faults:
    """What a phone and a Bluetooth glove do to a recording; none by default.

    drop_rate: the camera discards this share of late frames (`alwaysDiscardsLateVideoFrames`):
    the next frame takes the number, so the numbering runs on over a gap in time (slots
    drawn per seed, `draw_drops`); camera_drops: those slots of the 1/fps grid, given instead.
    writer_skips: frame numbers video.mov lacks (the writer was not ready for them).
    glove_gaps: (s from frame 0, length s) with no BLE notification: a dropout, a late
    connect (a start before 0), an early disconnect (to past the end).
    dead_joint: a joint that reads -1.0 (an I2C error) in every notification."""

    drop_rate: float = 0.0
    camera_drops: tuple[int, ...] = ()
    writer_skips: tuple[int, ...] = ()
    glove_gaps: tuple[tuple[float, float], ...] = ()
    dead_joint: str | None = None


def delivered_slots(n_frames: int, drops: tuple[int, ...]) -> np.ndarray:
    """The grid slot of each of `n_frames` delivered frames when the camera discarded
    the slots `drops` (never the first: frame 0 is the first frame delivered)."""
    dropped = sorted({int(d) for d in drops})
    n_slots = n_frames + len(dropped)
    if any(not 0 < d < n_slots - 1 for d in dropped):
        raise ValueError(f"camera_drops must be slots in [1, {n_slots - 1}): frame 0 and the last are delivered")
    return np.setdiff1d(np.arange(n_slots), dropped)


def draw_drops(n_frames: int, rate: float, seed: int) -> tuple[int, ...]:
    """Slots a camera that discards late frames loses at `rate` (a fraction of the
    frames delivered): mostly one frame, a burst of 2-4 one time in five (a stall),
    from their own generator on `seed` so nothing else moves."""
    if not 0.0 <= rate < 0.5:
        raise ValueError("drop rate must be in [0, 0.5)")
    g = np.random.default_rng(np.random.SeedSequence([int(seed), 0xD509]))
    want = int(round(rate * n_frames))
    n_slots = n_frames + want
    dropped: set[int] = set()
    while len(dropped) < want:
        start = int(g.integers(1, n_slots - 1))
        burst = int(g.integers(2, 5)) if g.random() < 0.2 else 1
        dropped.update(s for s in range(start, min(start + burst, n_slots - 1)) if len(dropped) < want)
    return tuple(sorted(dropped))


@dataclass(frozen=True)
class DrawnPhone:
    """One session's phone within a `PhoneRig`: from its own generator on the seed, so
    no other stream moves, and all zero for the default rig (the same bytes as before)."""

    lever_arm: tuple[float, float, float] = (0.0, 0.0, 0.0)  # m, the IMU's position in the camera frame
    imu_lead: float = 0.0  # s added to frame 0's delay after the IMU's start
    principal_offset: tuple[float, float] = (0.0, 0.0)  # px, true principal point - the image centre

    @classmethod
    def draw(cls, rig: PhoneRig, seed: int) -> DrawnPhone:
        if not rig.any:
            return cls()
        g = np.random.default_rng(np.random.SeedSequence([seed, 0x9407]))
        d = g.normal(0.0, 1.0, 3) * np.array([1.0, 1.0, 0.3])  # mostly in the phone's plane
        lever = d / np.linalg.norm(d) * rig.lever_arm * g.uniform(0.5, 1.0)
        lead = float(g.uniform(*rig.imu_lead))
        a = g.uniform(0, 2 * np.pi)
        pp = rig.principal_offset * g.uniform(0.5, 1.0) * np.array([np.cos(a), np.sin(a)])
        return cls(tuple(float(v) for v in lever), lead, (float(pp[0]), float(pp[1])))  # type: ignore[arg-type]


@dataclass(frozen=True)
class Rngs:
    """One generator per component. The field order is the order of the seed
    sequence's spawned children, so it must never change: reordering would give
    every existing seed different bytes (spawn keys 0..5 are the historical ones)."""

    scene: np.random.Generator
    traj: np.random.Generator
    imu: np.random.Generator
    grip: np.random.Generator
    nan: np.random.Generator
    vid: np.random.Generator
    clock: np.random.Generator
    esp: np.random.Generator
    enc_noise: np.random.Generator
    ble: np.random.Generator
    err: np.random.Generator
    arkit: np.random.Generator
    wrap: np.random.Generator
    camera: np.random.Generator  # glove and exposure (`effects`)

    @classmethod
    def from_seed(cls, seed: int) -> Rngs:
        ss = np.random.SeedSequence([int(seed), 0x5EED])
        return cls(*(np.random.default_rng(s) for s in ss.spawn(14)))
