"""What every sample of a session says, computed once per session in the main
process before its frames are encoded: timestamps, intrinsics, the pose and its
provenance flag, the glove's joints at the frame's time, and the action chunk.
Pure per-session planning; `packer.pack` does the I/O."""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

try:
    import orjson
except ImportError:  # optional: the standard json writes the same values
    orjson = None  # type: ignore[assignment]

from packer.actions import POSE_DIMS, RunningStats, obs_stats, segmented_chunks
from packer.clock import FrameClock, frame_clock
from packer.encoders import JOINTS, coverage
from packer.imageops import ResizeSpec, rescale_intrinsics
from packer.session import RAW_HEIGHT, RAW_WIDTH, Session, load_encoders, load_pose_flags, load_poses, poses_are_metric
from shardship.config import PackOptions

MIN_ENCODER_COVERAGE = 0.5  # below this the joints would mostly be held values: refuse
BLOCK = 512  # frames whose sample JSON is built at a time (see SampleMetas)


@dataclass
class SessionPlan:
    session: Session
    signature: str  # stat signature; the content fingerprint comes from the workers
    keep: np.ndarray  # positions into session.frames kept after stride
    metas: SampleMetas  # per kept frame sample JSON (without image), built as read
    action_stats: RunningStats | None
    proprio_stats: RunningStats | None
    obs_stats: list[RunningStats] | None  # relative proprio per backward offset (actions.obs_stats)
    joints_valid: bool
    clock: dict[str, Any]
    frames_without_pose: int


def kept_frames(session: Session, opts: PackOptions) -> np.ndarray:
    return np.arange(0, session.n_frames, max(1, opts.stride))


def plan_session(session: Session, opts: PackOptions, signature: str) -> SessionPlan:
    """Everything a sample's JSON needs, computed once per session in the main process."""
    keep = kept_frames(session, opts)
    t = session.timestamps[keep]
    idx = [int(session.frames[i]) for i in keep]
    spec = ResizeSpec(opts.size, opts.crop, opts.quality)
    k = rescale_intrinsics(session.intrinsics, RAW_WIDTH, RAW_HEIGHT, spec) if session.intrinsics else None

    by_index = load_poses(session)
    flags = load_pose_flags(session)
    posed = np.array([by_index is not None and i in by_index for i in idx], dtype=bool)
    clock = frame_clock(session, by_index)
    joints, joints_valid = _joints(session, clock, t)
    poses: np.ndarray | None = None
    if posed.any():
        assert by_index is not None  # a frame is posed only when by_index holds its pose
        poses = np.stack([by_index[i] if p else np.eye(4) for i, p in zip(idx, posed)])
    actions, mask = segmented_chunks(poses, posed, joints, opts.horizon)
    if posed.any() and not posed.all():
        session.warnings.append(
            f"poses.json covers frames {idx[int(np.argmax(posed))]}-{idx[len(idx) - 1 - int(np.argmax(posed[::-1]))]}"
            f" of {idx[0]}-{idx[-1]}: {int((~posed).sum())} frame(s) outside get no pose and no action")

    dims = np.ones(POSE_DIMS + len(JOINTS), bool)
    dims[POSE_DIMS:] = joints_valid
    astats = pstats = None
    if actions is not None:
        astats = RunningStats(actions.shape[-1])
        astats.add(actions[posed][mask[posed].astype(bool)], dims)
    ostats = obs_stats(poses, posed, joints, dims)
    if joints_valid:
        pstats = RunningStats(len(JOINTS))
        pstats.add(joints)

    metric = bool(poses_are_metric(session) and poses is not None)
    metas = SampleMetas(session.name, idx, t, opts.size, k, metric, flags, posed, poses, joints, joints_valid,
                        actions, mask)
    return SessionPlan(session, signature, keep, metas, astats, pstats, ostats, joints_valid, clock.to_json(),
                        int((~posed).sum()) if poses is not None else len(idx))


def sample_json(meta: dict[str, Any]) -> bytes:
    """A sample's .json member. orjson where installed: formatting the ~200 floats
    of a sample (pose, action chunk) was the largest per-sample cost of the main
    process, ~150 us with json, ~10-60 us with orjson here. The same values
    either way (orjson writes 1.2e-5 where json writes 1.2e-05). With orjson,
    pose, proprio and action are numpy rows (see _r)."""
    if orjson is not None:
        return orjson.dumps(meta, option=orjson.OPT_SERIALIZE_NUMPY)
    return json.dumps(meta, separators=(",", ":")).encode()


def _joints(session: Session, clock: FrameClock, t: np.ndarray) -> tuple[np.ndarray, bool]:
    """(N, 4) joint angles in degrees at the kept frames' times, and whether they are
    real. Without a usable glove recording the joints are zeros and masked, so the
    session still packs with the same action layout as the others."""
    zeros = np.zeros((len(t), len(JOINTS)))
    enc = load_encoders(session)
    if enc is None:
        session.warnings.append("no encoders.json (the glove was not connected): joints masked")
        return zeros, False
    session.warnings.extend(enc.warnings)
    if not enc.valid:
        return zeros, False
    if clock.frame0_epoch is None:
        session.warnings.append("encoders.json: no clock to place the readings on the frames "
                                "(no imu.json, no startTime): joints masked")
        return zeros, False
    epoch = clock.epoch(t)
    cov = coverage(enc, epoch)
    lo, hi = enc.span
    if cov < MIN_ENCODER_COVERAGE:
        raise session.error(
            "encoders.json",
            f"the readings ({lo - clock.frame0_epoch:+.2f} s to {hi - clock.frame0_epoch:+.2f} s from frame 0, "
            f"placed by {clock.source}) cover {cov:.0%} of the video: the clocks disagree, so every joint would be "
            "wrong; fix the timestamps, or remove encoders.json to pack with joints masked")
    if cov < 0.95:
        session.warnings.append(f"encoders.json covers {cov:.0%} of the video: joints held at the first/last reading "
                                "outside it")
    return enc.at(epoch), True


class SampleMetas(Sequence):
    """Each kept frame's sample JSON, built from the session's arrays BLOCK frames
    at a time as the writer reads them in order: the whole session's at once, as
    Python lists (the action chunk alone is 16 x 13 floats), took ~8 kB per frame,
    0.15 GB for a 5-minute session (as numpy rows for orjson still ~1 kB of dict
    per frame). Rounded per block, not per frame: per-frame numpy calls were a
    tenth of the main process's work."""

    def __init__(self, session: str, idx: list[int], t: np.ndarray, size: int, k: Any, metric: bool,
                 flags: dict[int, str], posed: np.ndarray, poses: np.ndarray | None, joints: np.ndarray,
                 joints_valid: bool, actions: np.ndarray | None, mask: np.ndarray):
        self.session, self.idx, self.t, self.size, self.k, self.metric = session, idx, t, size, k, metric
        self.flags, self.posed, self.poses, self.joints, self.joints_valid = flags, posed, poses, joints, joints_valid
        self.actions, self.mask = actions, mask
        self._block: tuple[int, list[dict[str, Any]]] = (-1, [])

    def __len__(self) -> int:
        return len(self.idx)

    @property
    def pose_metric(self) -> bool:
        """Does any sample carry a metric pose?"""
        return bool(self.metric and self.posed.any())

    def __getitem__(self, j):  # type: ignore[override]
        if isinstance(j, slice):
            return [self[i] for i in range(*j.indices(len(self)))]
        if not -len(self) <= j < len(self):
            raise IndexError(j)
        j %= len(self)
        b = j // BLOCK
        if self._block[0] != b:
            self._block = (b, self._build(b * BLOCK, min(len(self), (b + 1) * BLOCK)))
        return self._block[1][j - b * BLOCK]

    def _build(self, lo: int, hi: int) -> list[dict[str, Any]]:
        sl = slice(lo, hi)
        pose_l = _r(self.poses[sl] if self.poses is not None else None)
        action_l = _r(self.actions[sl] if self.actions is not None else None)
        joint_l, mask_l = _r(self.joints[sl]), self.mask[sl].tolist()
        assert joint_l is not None  # joints is an array, zeros when masked
        posed_l, t_l = self.posed[sl].tolist(), self.t[sl].tolist()
        flags, has_poses = self.flags, self.poses is not None
        out = []
        for j, frame in enumerate(self.idx[sl]):
            p = posed_l[j]
            out.append({
                "session": self.session, "frame": frame, "timestamp": t_l[j],
                "image_size": [self.size, self.size], "intrinsics": self.k,
                "pose": pose_l[j] if pose_l is not None and p else None,  # posed[j] implies poses is set
                "pose_metric": self.metric and p,
                "pose_flag": flags.get(frame, "given") if p else ("outside" if has_poses else None),
                "interpolated": flags.get(frame, "registered") != "registered" if p else False,
                "proprio": joint_l[j],
                "joints_valid": self.joints_valid,
                "action": action_l[j] if action_l is not None and p else None,
                "action_mask": mask_l[j],
            })
        return out


def _r(x: np.ndarray | None) -> np.ndarray | list | None:
    """Micrometre / micro-radian precision: keeps sample JSON small. Rows stay
    numpy arrays where orjson writes them (the same bytes as from lists, without a
    Python float object per number); lists for the json fallback."""
    if x is None:
        return None
    x = np.round(x, 6)
    return x if orjson is not None else x.tolist()
