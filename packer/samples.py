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

from packer.actions import POSE_DIMS, RunningStats, obs_stats, segmented_chunks, step_known
from packer.clock import FrameClock, frame_clock
from packer.encoders import JOINTS, Encoders, reading_gaps, usable, valid_at
from packer.frametimes import breaks, describe_gaps
from packer.imageops import ResizeSpec, rescale_intrinsics
from packer.session import (
    CAPTURE_ULTRAWIDE,
    RAW_HEIGHT,
    RAW_WIDTH,
    Session,
    load_encoders,
    load_pose_flags,
    load_poses,
    poses_are_metric,
)
from shardship.config import PackOptions

MIN_READINGS_INSIDE = 0.5  # fewer of the glove's readings inside the video: its clock is not the frames'
# without video.mov the frame numbers are the clock; without poses nothing checks it (`packer slam` does)
NO_CLOCK_CHECK = ("no video.mov and no poses: frames the camera dropped (under 0.4 s in all) cannot be seen, so each "
                  "later frame's joints may be read early; keep video.mov, or pack with SLAM, which finds them")
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
    joints: Joints  # the glove's joints at the kept frames, known per frame and joint
    clock: dict[str, Any]
    frames_without_pose: int
    breaks: list[int]  # frames that start a new run after a gap (time or numbering)

    @property
    def joints_valid(self) -> bool:
        """Some frame has its joints (the session recorded the glove)."""
        return self.joints.any_valid


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
    jt = _joints(session, clock, t)
    step = max(1, opts.stride)
    cut = breaks(t, np.array(idx), session.fps, step)
    if cut.any():
        session.warnings.append(f"frames not consecutive in time ({describe_gaps(t, np.array(idx), cut)})"
                                ": no action chunk or observation window spans one")
    jv = jt.frame_valid
    poses: np.ndarray | None = None
    if posed.any():
        assert by_index is not None  # a frame is posed only when by_index holds its pose
        poses = np.stack([by_index[i] if p else np.eye(4) for i, p in zip(idx, posed)])
    actions, mask = segmented_chunks(poses, posed, jt.values, opts.horizon, cut)
    jmask = step_known(jv, posed, opts.horizon, cut)
    if posed.any() and not posed.all():
        session.warnings.append(
            f"poses.json covers frames {idx[int(np.argmax(posed))]}-{idx[len(idx) - 1 - int(np.argmax(posed[::-1]))]}"
            f" of {idx[0]}-{idx[-1]}: {int((~posed).sum())} frame(s) outside get no pose and no action")
    astats, pstats, ostats = _stats(actions, mask, jmask, posed, poses, jt, cut)
    metric = bool(poses_are_metric(session) and poses is not None)
    metas = SampleMetas(session.name, idx, t, opts.size, k, metric, flags, posed, poses, jt.values, jv,
                        actions, mask, None if jt.usable.all() or not jt.usable.any() else jt.usable, jmask)
    return SessionPlan(session, signature, keep, metas, astats, pstats, ostats, jt, clock.to_json(),
                       int((~posed).sum()) if poses is not None else len(idx), [idx[i + 1] for i in np.nonzero(cut)[0]])


def _stats(actions: np.ndarray | None, mask: np.ndarray, jmask: np.ndarray, posed: np.ndarray,
           poses: np.ndarray | None, jt: Joints, cut: np.ndarray,
           ) -> tuple[RunningStats | None, RunningStats | None, list[RunningStats] | None]:
    """Action, proprio and observation statistics: pose dimensions from every real
    step, a joint's only from steps where the joints are known (masked joints are
    zeros, not data)."""
    pose_dims = np.zeros(POSE_DIMS + len(JOINTS), bool)
    pose_dims[:POSE_DIMS] = True
    joint_dims = np.zeros_like(pose_dims)
    joint_dims[POSE_DIMS:] = jt.usable
    jv = jt.frame_valid
    astats = pstats = None
    if actions is not None:
        astats = RunningStats(actions.shape[-1])
        astats.add(actions[posed][mask[posed].astype(bool)], pose_dims)
        sel = posed & jv
        astats.add(actions[sel][(mask[sel] & jmask[sel]).astype(bool)], joint_dims)
    ostats = obs_stats(poses, posed, jt.values, pose_dims | joint_dims, cut, jv)
    if jt.any_valid:
        pstats = RunningStats(len(JOINTS))
        pstats.add(jt.values[jv], jt.usable)
    return astats, pstats, ostats


def label_summary(plan: SessionPlan) -> dict[str, Any]:
    """What index.json and the report say about the session's labels: where its frame
    times come from, the frames that start a new run after a gap, and the glove's
    coverage (share of kept frames with every usable joint known), usable joints and
    silent stretches (s from frame 0, length s)."""
    jt = plan.joints
    return {"frame_times": plan.session.timestamp_source, "breaks": plan.breaks,
            "joints_coverage": round(float(jt.frame_valid.mean()), 4) if len(jt.known) else 0.0,
            "joints_usable": [bool(u) for u in jt.usable],
            "glove_gaps": [[round(a, 3), round(n, 3)] for a, n in jt.gaps]}


def sample_json(meta: dict[str, Any]) -> bytes:
    """A sample's .json member. orjson where installed: formatting the ~200 floats
    of a sample (pose, action chunk) was the largest per-sample cost of the main
    process, ~150 us with json, ~10-60 us with orjson here. The same values
    either way (orjson writes 1.2e-5 where json writes 1.2e-05). With orjson,
    pose, proprio and action are numpy rows (see _r)."""
    if orjson is not None:
        return orjson.dumps(meta, option=orjson.OPT_SERIALIZE_NUMPY)
    return json.dumps(meta, separators=(",", ":")).encode()


@dataclass
class Joints:
    """The glove's joints at the kept frames: values (N, J) degrees, 0 where not
    known; known (N, J) where a reading brackets the frame (`encoders.valid_at`);
    usable (J,) joints that read at all; the stretches without a reading."""

    values: np.ndarray
    known: np.ndarray
    usable: np.ndarray
    gaps: list[tuple[float, float]]  # (s from frame 0, length s)

    @property
    def frame_valid(self) -> np.ndarray:
        """(N,) every usable joint known at the frame (the sample's `joints_valid`)."""
        if not self.usable.any():
            return np.zeros(len(self.known), bool)
        return np.asarray(self.known[:, self.usable].all(1), bool)

    @property
    def any_valid(self) -> bool:
        return bool(self.frame_valid.any())

    @classmethod
    def masked(cls, n: int) -> Joints:
        return cls(np.zeros((n, len(JOINTS))), np.zeros((n, len(JOINTS)), bool), np.zeros(len(JOINTS), bool), [])


def _joints(session: Session, clock: FrameClock, t: np.ndarray) -> Joints:
    """The joints at the kept frames' times, known per frame and per joint. Without a
    usable glove recording every joint is masked, so the session still packs with the
    same action layout as the others; where the glove was silent (late connect, a
    dropout, an early disconnect) those frames alone are masked, never held or
    straight-lined across the hole."""
    enc = load_encoders(session)
    if enc is None:
        session.warnings.append("no encoders.json (the glove was not connected): joints masked")
        return Joints.masked(len(t))
    session.warnings.extend(enc.warnings)
    use = usable(enc)
    if not use.any():
        return Joints.masked(len(t))
    if clock.frame0_epoch is None:
        session.warnings.append("encoders.json: no clock to place the readings on the frames "
                                "(no imu.json, no startTime): joints masked")
        return Joints.masked(len(t))
    epoch = clock.epoch(t)
    _refuse_misplaced(session, enc, epoch, clock)
    if session.timestamp_source == "index/fps" and session.capture == CAPTURE_ULTRAWIDE and not session.pose_entries:
        session.warnings.append(NO_CLOCK_CHECK)
    known = valid_at(enc, epoch) & use[None]
    values = np.where(known, enc.at(epoch), 0.0)
    gaps = [(a - clock.frame0_epoch, n) for a, n in reading_gaps(enc, float(epoch[0]), float(epoch[-1]))]
    out = Joints(values, known, use, gaps)
    cov = float(out.frame_valid.mean())
    if gaps:
        where = ", ".join(f"{a:.2f}-{a + n:.2f} s" for a, n in gaps[:4]) + (" ..." if len(gaps) > 4 else "")
        session.warnings.append(f"glove silent {len(gaps)} time(s) ({where}): joints cover {cov:.0%} of the frames; "
                                "the frames without a reading have their joints masked")
    return out


def _refuse_misplaced(session: Session, enc: Encoders, epoch: np.ndarray, clock: FrameClock) -> None:
    """Refuse when the readings mostly fall outside the video: the clocks disagree, so
    any joint placed on a frame would be wrong. A glove that connected late or left
    early has its readings inside the video, just fewer: that is masked, not refused."""
    t = np.unique(np.concatenate([x for x in enc.t if len(x)]))
    inside = float(np.mean((t >= epoch[0] - 1.0) & (t <= epoch[-1] + 1.0)))
    if inside < MIN_READINGS_INSIDE:
        assert clock.frame0_epoch is not None  # epoch came from it
        lo, hi = float(t[0]), float(t[-1])
        raise session.error(
            "encoders.json",
            f"{1 - inside:.0%} of the readings ({lo - clock.frame0_epoch:+.2f} s to {hi - clock.frame0_epoch:+.2f} s "
            f"from frame 0, placed by {clock.source}) fall outside the video: the clocks disagree, so every joint "
            "would be wrong; fix the timestamps, or remove encoders.json to pack with joints masked")


class SampleMetas(Sequence):
    """Each kept frame's sample JSON, built from the session's arrays BLOCK frames
    at a time as the writer reads them in order: the whole session's at once, as
    Python lists (the action chunk alone is 16 x 13 floats), took ~8 kB per frame,
    0.15 GB for a 5-minute session (as numpy rows for orjson still ~1 kB of dict
    per frame). Rounded per block, not per frame: per-frame numpy calls were a
    tenth of the main process's work."""

    def __init__(self, session: str, idx: list[int], t: np.ndarray, size: int, k: Any, metric: bool,
                 flags: dict[int, str], posed: np.ndarray, poses: np.ndarray | None, joints: np.ndarray,
                 joints_valid: np.ndarray, actions: np.ndarray | None, mask: np.ndarray,
                 joint_mask: np.ndarray | None = None, joints_mask: np.ndarray | None = None):
        self.session, self.idx, self.t, self.size, self.k, self.metric = session, idx, t, size, k, metric
        self.flags, self.posed, self.poses, self.joints, self.joints_valid = flags, posed, poses, joints, joints_valid
        self.actions, self.mask = actions, mask
        self.joint_mask = None if joint_mask is None else [int(x) for x in joint_mask]  # (J,) when a joint is dead
        # (N, H): a real step whose joints are not known (the glove silent then); only frames with
        # known joints of their own need it (the others have every joint masked)
        self.joints_mask = joints_mask
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
        jm = self.joints_mask[sl] if self.joints_mask is not None else None
        assert joint_l is not None  # joints is an array, zeros when masked
        posed_l, t_l, jv_l = self.posed[sl].tolist(), self.t[sl].tolist(), self.joints_valid[sl].tolist()
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
                "joints_valid": jv_l[j],
                "action": action_l[j] if action_l is not None and p else None,
                "action_mask": mask_l[j],
            })
            if self.joint_mask is not None:  # only then: every other sample's bytes stay as they were
                out[-1]["joint_mask"] = self.joint_mask
            if jm is not None and jv_l[j] and action_l is not None and p and not jm[j].all():  # likewise
                out[-1]["joints_mask"] = jm[j].tolist()
        return out


def _r(x: np.ndarray | None) -> np.ndarray | list | None:
    """Micrometre / micro-radian precision: keeps sample JSON small. Rows stay
    numpy arrays where orjson writes them (the same bytes as from lists, without a
    Python float object per number); lists for the json fallback."""
    if x is None:
        return None
    x = np.round(x, 6)
    return x if orjson is not None else x.tolist()
