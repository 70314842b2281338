"""`SlamOptions`: every knob of `packer slam`, from shardship.toml's [slam] and
[scale] sections and the CLI. Kept apart from the pipeline so the options (and
their validation, fingerprint and derived SfM options) read in one place."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from packer.slam.mapping.colmap import FRONTENDS, MAPPERS, SfmOptions
from packer.slam.scale.marker import MarkerError, parse_known_distance
from packer.slam.scale.scale import ScaleOptions
from shardship.errors import ShardshipError

SCALE_METHODS = ("imu", "marker", "known-distance", "none")
SOLVERS = ("auto", "window", "viba")  # --scale imu: the windowed solve's checks then the visual-inertial bundle
# adjustment's scale, the windowed accelerometer solve alone, or the bundle adjustment alone


@dataclass
class SlamOptions:
    mapper: str = "global"  # "global" (GLOMAP) | "incremental"
    frontend: str = "klt"  # "klt" (tracked corners, keyframes by parallax) | "sift" (every Nth frame, matched)
    keyframe_step: int | None = None  # klt: a keyframe candidate every N frames (None: 0.1 s); sift: SfM on every Nth
    min_parallax_px: float = 16.0  # klt: a candidate becomes a keyframe once its tracks moved this far (median)
    max_tracks: int = 400  # klt: corners tracked per frame
    max_keyframe_gap: float = 0.1  # klt: seconds; cubic interpolation over 0.2 s of fast hand motion shrinks the
    # path by 0.1-0.2% (every session, the same way), over 0.1 s by < 0.04% (tests/test_slam_hard.py)
    scale: str = "imu"  # "imu" | "marker" | "known-distance" | "none"
    marker_size: float | None = None  # metres, --scale marker
    marker_dict: str = "DICT_4X4_50"
    marker_id: int | None = None
    known_distance: str | None = None  # "A:B:METRES", --scale known-distance
    plot: bool = False
    force: bool = False  # ignore the cache
    threads: int = 2  # per session, for the geometric verification (the mapper runs on one: colmap.SERIAL)
    max_features: int = 2048
    first_octave: int = 0  # 0: SIFT at native resolution (-1 upsamples: 3x slower, no better here)
    overlap: int = 5  # keyframes matched with the next N (tracks alive across 1 s tie the scale together)
    tracks_per_view: int = 60  # GLOMAP: tracks kept per image for global positioning (cost ~ tracks)
    retriangulate: bool = True  # GLOMAP: retriangulation pass (3-7x lower ATE, steadier scale)
    refine_intrinsics: bool = True  # focal length and k1 refined from calib.txt's start (SIMPLE_RADIAL)
    mask: str | None = None  # a PNG the size of the frames: black where corners must not be tracked (a mount)
    chunk_keyframes: int = 400  # longer sessions are mapped in parts of at most this many keyframes, joined on
    # shared points (packer/slam/mapping/chunks.py): memory and time per part stay those of a ~40 s session;
    # 0: never split
    chunk_overlap: int = 40  # keyframes two consecutive parts share (the join is fitted on them)
    min_frames: int = 10
    min_registered: float = 0.5  # refuse below this registered fraction
    min_baseline: float = 0.005  # refuse scale when the path (RMS) spans less of the median scene depth
    max_imu_offset: float | None = None  # bound the clock search (s) around start alignment
    max_gyro_disagreement: float = 0.1  # refuse when the gyro-vs-SfM rotation residual exceeds this share of the
    # rotation rate (good models: <= 2%; a wrong or partly wrong model: 15-120%, bench/results/slam_hard.csv)
    gyro_std_factor: float = 0.8  # the scale's std gets this times that share above gyro_noise_floor (in
    # quadrature): a distorted model's scale error grows with it (6% disagreement: 3-4% scale error on
    # low-texture sessions; good models sit at 1-1.5%, what gyro noise and a rolling shutter leave)
    gyro_noise_floor: float = 0.015
    readout_std_factor: float = 0.1  # the scale's std gets this times the rolling-shutter readout (s) in quadrature:
    # 0.2% at 20 ms, what the correction leaves (blur + rolling shutter, 20 seeds: errors to 0.48% at a 0.11% fit std)
    sfm_rel_std: float = 0.0015  # and this in quadrature: the SfM path's slow distortion, which the IMU fit's residuals
    # cannot see (with the true positions the IMU scale is within 0.07%; with the SfM's, 0.5-0.7% from the path's best
    # similarity on 10 s hand sessions whose fit std said 0.12-0.25%: glove, exposure, fast, 20 seeds each)
    solver: str = "auto"  # --scale imu: "auto" (the windowed solve's checks, then the visual-inertial bundle
    # adjustment's scale and poses: viba_scale.refine_accepted) | "window" (accelerometer least squares on the SfM
    # trajectory alone) | "viba" (the bundle adjustment alone, GTSAM: poses, landmarks, camera and scale solved with
    # the IMU; bench/results/viba.md)
    rolling_shutter: float | None = None  # the sensor's readout in s (0: global shutter); None: measured against the
    # gyro on the busiest 4 s (packer/slam/frontend/rolling.py); the tracks (and viba's observations) are corrected
    # for it
    gyro_prior: bool = False  # experimental: the gyro's relative rotations as the SfM's two-view rotations, and tracks
    # off the gyro's geometry dropped (packer/slam/inertial/gyro_prior.py; bench/results/slam_hard_rolling.csv)
    seed: int = 0
    scale_options: ScaleOptions = field(default_factory=ScaleOptions)
    progress: bool = True

    def validate(self) -> None:
        if self.mapper not in MAPPERS:
            raise ShardshipError(f"--mapper must be one of {', '.join(MAPPERS)}, got {self.mapper!r}")
        if self.scale not in SCALE_METHODS:
            raise ShardshipError(f"--scale must be one of {', '.join(SCALE_METHODS)}, got {self.scale!r}")
        if self.frontend not in FRONTENDS:
            raise ShardshipError(f"--frontend must be one of {', '.join(FRONTENDS)}, got {self.frontend!r}")
        if self.solver not in SOLVERS:
            raise ShardshipError(f"--solver must be one of {', '.join(SOLVERS)}, got {self.solver!r}")
        if self.rolling_shutter is not None and not 0 <= self.rolling_shutter <= 0.1:
            raise ShardshipError(f"[slam] rolling_shutter must be 0..0.1 s (a readout), got {self.rolling_shutter}")
        if not isinstance(self.sfm_rel_std, (int, float)) or not 0 <= self.sfm_rel_std < 0.02:
            raise ShardshipError(f"[slam] sfm_rel_std must be a number in 0..0.02 (a share of the scale, 0.0015 = "
                                 f"0.15%), got {self.sfm_rel_std!r}")
        if self.chunk_keyframes != 0 and not 100 <= self.chunk_keyframes:
            raise ShardshipError(
                f"[slam] chunk_keyframes must be 0 (never split) or >= 100, got {self.chunk_keyframes}")
        if self.chunk_keyframes and not 10 <= self.chunk_overlap < self.chunk_keyframes // 2:
            raise ShardshipError(f"[slam] chunk_overlap must be 10..{self.chunk_keyframes // 2 - 1} keyframes "
                                 f"(less than half a part), got {self.chunk_overlap}")
        if self.keyframe_step is not None and self.keyframe_step < 1:
            raise ShardshipError("--keyframe-step must be >= 1")
        if self.scale == "marker" and not (self.marker_size and self.marker_size > 0):
            raise ShardshipError("--scale marker needs --marker-size METRES (the printed marker's side length)")
        if self.scale == "known-distance":
            if not self.known_distance:
                raise ShardshipError("--scale known-distance needs --known-distance FRAME_A:FRAME_B:METRES")
            try:
                parse_known_distance(self.known_distance)
            except MarkerError as e:
                raise ShardshipError(str(e)) from None

    def fingerprint_options(self) -> dict[str, Any]:
        """Options that change the output (not progress, plotting, force)."""
        d = dataclasses.asdict(self)
        for k in ("plot", "force", "progress", "threads"):
            d.pop(k)
        if d["solver"] == "window":  # the windowed solve does not read it: sessions cached before it stay cached
            d.pop("solver")
        return d

    def sfm_options(self) -> SfmOptions:
        return SfmOptions(
            mapper=self.mapper, frontend=self.frontend, threads=self.threads, max_features=self.max_features,
            first_octave=self.first_octave, overlap=self.overlap, seed=self.seed,
            tracks_per_view=self.tracks_per_view, retriangulate=self.retriangulate,
            refine_intrinsics=self.refine_intrinsics,
        )

    def step_for(self, fps: float) -> int:
        """Frames between keyframe candidates (klt) or keyframes (sift): the option, else
        0.1 s of video for klt (6 frames at 60 fps, 3 at 30) and 3 frames for sift."""
        if self.keyframe_step is not None:
            return self.keyframe_step
        return max(1, round(fps / 10)) if self.frontend == "klt" else 3

    @classmethod
    def from_config(cls, slam_section: dict[str, Any], scale_section: dict[str, Any],
                    **overrides: Any) -> SlamOptions:
        """[slam] and [scale] sections of shardship.toml, then CLI overrides (None = unset)."""
        names = {f.name for f in dataclasses.fields(cls)} - {"scale_options"}
        snames = {f.name for f in dataclasses.fields(ScaleOptions)}
        kw: dict[str, Any] = {}
        for k, v in slam_section.items():
            k2 = k.replace("-", "_")
            if k2 not in names:
                raise ShardshipError(f"[slam]: unknown key {k!r} (known: {', '.join(sorted(names))})")
            kw[k2] = v
        skw: dict[str, Any] = {}
        for k, v in scale_section.items():
            k2 = k.replace("-", "_")
            if k2 == "method":
                kw["scale"] = v
            elif k2 in snames:
                skw[k2] = v
            else:
                raise ShardshipError(f"[scale]: unknown key {k!r} (known: method, {', '.join(sorted(snames))})")
        kw.update({k: v for k, v in overrides.items() if v is not None})
        return cls(scale_options=ScaleOptions(**skw), **kw)
