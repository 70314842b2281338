"""Stage 1 per session: SfM -> IMU alignment -> metric scale -> poses for every frame.

`slam_session` never raises for a bad session: it returns a SlamResult whose
status is "failed" with a one-line message naming the file and the reason, so one
bad session never stops the others. `slam_sessions` runs sessions in parallel
processes where cores allow (each SfM uses `threads` cores)."""
from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from packer.session import CAPTURE_ARKIT, Imu, Session, load_imu, load_session
from packer.slam import store
from packer.slam.frontend import rolling
from packer.slam.frontend.tracks import TrackOptions, Tracks, read_gray, track_keyframes
from packer.slam.inertial.clock_drift import dropped_reason, offsets_by_third
from packer.slam.mapping.chunks import ChunkOptions, chunk_ranges, reconstruct_chunked
from packer.slam.mapping.colmap import SfmError, SfmModel
from packer.slam.options import SlamOptions
from packer.slam.plot import plot_session, plot_stored
from packer.slam.poses.imu_between import ImuCalibration, imu_between
from packer.slam.poses.interpolate import FLAG_NAMES, INTERPOLATED, OUTSIDE, REGISTERED, interpolate_poses
from packer.slam.repair import gyro_repair, repaired
from packer.slam.scale.marker import MarkerError, parse_known_distance
from packer.slam.scale.refusals import ModelRefused, baseline_reason, gaps_named
from packer.slam.scale.scale_methods import metric_scale
from packer.slam.stages import Stages
from shardship import __version__
from shardship.errors import SessionError, ShardshipError


@dataclass
class SlamResult:
    session: str
    path: Path
    status: str  # "ok" | "cached" | "skipped" | "failed"
    message: str = ""  # one line for the user
    metric: bool = False
    scale: float | None = None
    method: str = ""
    info: dict[str, Any] = field(default_factory=dict)  # what metadata.json["shardship"] holds
    poses: np.ndarray | None = None  # (N,4,4) camera-to-world, every frame (not for cached/skipped)
    flags: np.ndarray | None = None  # (N,) REGISTERED / INTERPOLATED / OUTSIDE
    frames: np.ndarray | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    plot: Path | None = None

    @property
    def failed(self) -> bool:
        return self.status == "failed"


def keyframe_positions(n_frames: int, step: int) -> np.ndarray:
    """Positions (into the session's frame list) of the keyframes: every `step`th
    frame and always the last one, so the registered span can cover the whole video."""
    k = np.arange(0, n_frames, step)
    if k[-1] != n_frames - 1:
        k = np.append(k, n_frames - 1)
    return k


def _preflight(session: Session, opts: SlamOptions) -> Imu | None:
    """Cheap checks that must fail before minutes of SfM: frame count, IMU presence,
    NaN, coverage, marker prerequisites."""
    if session.n_frames < opts.min_frames:
        raise session.error("rgb/", f"only {session.n_frames} frames; SfM needs at least {opts.min_frames}")
    imu = None
    if opts.scale == "imu":
        if not session.file("imu.json").exists():
            raise session.error(
                "imu.json",
                "missing: --scale imu needs the IMU; use --scale none (unscaled poses, marked metric false), "
                "--scale marker or --scale known-distance",
            )
        imu = load_imu(session)  # raises on NaN / non-monotonic stamps
        d_imu = float(imu.t[-1] - imu.t[0])
        d_vid = float(session.timestamps[-1] - session.timestamps[0])
        if d_imu < 0.9 * d_vid:
            raise session.error(
                "imu.json",
                f"IMU covers only {d_imu:.2f} s but the video lasts {d_vid:.2f} s: the IMU must span the whole "
                "recording (re-export it, or use --scale none / marker)",
            )
    if opts.scale == "marker" and session.intrinsics is None:
        raise session.error("calib.txt", "missing: --scale marker needs the camera intrinsics 'fx fy cx cy'")
    if opts.scale == "known-distance":
        a, b, _d = parse_known_distance(opts.known_distance or "")
        have = set(int(f) for f in session.frames)
        for f in (a, b):
            if f not in have:
                raise session.error("rgb/", f"--known-distance frame {f} does not exist")
    return imu


def slam_session(session_dir: str | os.PathLike, opts: SlamOptions | None = None) -> SlamResult:
    """Metric camera-to-world poses for one session (see the module docstring)."""
    opts = opts or SlamOptions()
    path = Path(session_dir)
    stages = Stages(path.name, opts.progress)
    try:
        stages("check")
        result = _run(path, opts, stages)
    except SessionError as e:
        result = SlamResult(path.name, path, "failed", message=str(e))
    except (ShardshipError, MarkerError) as e:
        result = SlamResult(path.name, path, "failed", message=f"session {path.name}: {e}")
    result.seconds = stages.close()
    return result


def _run(path: Path, opts: SlamOptions, stages: Callable[[str], None]) -> SlamResult:
    opts.validate()
    session = load_session(path)
    skipped = _skipped(session, opts, path)
    if skipped is not None:
        return skipped
    imu = _preflight(session, opts)
    use_imu = opts.scale == "imu"
    stat = store.input_stat(session, opts.fingerprint_options(), use_imu)
    # the stored result or refusal of these inputs: by their stat first (no frame read), then by their content
    found = None if opts.force else _stored(session, opts, stat=stat)
    if found is not None:
        return found
    fp = store.input_fingerprint(session, opts.fingerprint_options(), use_imu)
    found = None if opts.force else _stored(session, opts, fp)
    if found is not None:
        return found
    try:
        return _solved(session, opts, stages, imu, fp, stat)
    except SessionError as e:  # the same inputs will get the same refusal: remembered (`store.write_refusal`)
        named = gaps_named(e, imu)  # a gap in imu.json said first (`packer.imu_gaps`)
        store.write_refusal(session, fp, stat, str(named))
        if named is e:
            raise
        raise named from None


def _stored(session: Session, opts: SlamOptions, fp: str | None = None, stat: str | None = None
            ) -> SlamResult | None:
    """The stored result, or the stored refusal, of these exact inputs (None: neither)."""
    cached = store.cached(session, fp, stat)
    if cached is not None:
        return _cached_result(session, opts, cached)
    refused = store.cached_refusal(session, fp, stat)
    if refused is not None:
        return SlamResult(session.name, session.path, "failed", message=f"{refused} ({REFUSED_BEFORE})")
    return None


REFUSED_BEFORE = "refused before on these same inputs and options; --force runs it again"


def _solved(session: Session, opts: SlamOptions, stages: Callable[[str], None], imu: Imu | None, fp: str,
            stat: str) -> SlamResult:
    """The stages after the cheap checks and the cache: SfM, scale, every frame's pose, written."""
    path, name = session.path, session.name
    partial = None  # a model that registered too few keyframes, mapped again on the gyro's rotations below
    try:
        kpos, model, key_pos, key_T = _reconstruct_keyframes(session, opts, stages, imu)
    except repaired.PartialModel as e:
        (kpos, model, key_pos, key_T), partial = e.found, e
    key_ts = session.timestamps[key_pos]
    stages("scale")
    centres = key_T[:, :3, 3]
    extent = float(np.sqrt(np.mean(np.sum((centres - centres.mean(0)) ** 2, axis=1))))
    baseline = extent / model.median_depth if model.median_depth > 0 else 0.0
    info: dict[str, Any] = {
        "version": store.SLAM_VERSION,
        "fingerprint": fp,
        "input_stat": stat,
        "mapper": opts.mapper,
        "frontend": opts.frontend,
        "keyframe_step": opts.step_for(session.fps),
        **_model_fields(kpos, model, key_pos),
        "baseline_over_depth": baseline,
        "frontend_used": model.frontend_note or opts.frontend,
        "rolling_shutter": model.rolling_shutter,  # s, the readout the tracks were corrected for (None: unknown)
        "rolling_shutter_curve": model.rolling_shutter_curve or None,  # candidate ms -> gyro disagreement
        "sfm_parts": model.chunks or None,  # a long session mapped in parts (packer/slam/mapping/chunks.py): each join
        "camera_convention": "opencv (x right, y down, z forward); transform is camera-to-world",
        "world": "SfM frame, origin at the first registered keyframe, scaled to metres when metric",
    }
    if partial is None and imu is not None and session.timestamp_source == "index/fps":  # no video.mov
        thirds = offsets_by_third(key_ts, key_T[:, :3, :3], imu.t, imu.gyro)
        info["clock_drift_ms"] = None if thirds is None else 1000.0 * (thirds[1] - thirds[0])
        if reason := dropped_reason(thirds, session.fps):
            raise session.error("rgb/", reason)
    if opts.scale != "none" and baseline < opts.min_baseline and partial is None:
        raise session.error("rgb/", baseline_reason(baseline, opts.min_baseline))
    spans = None
    if model.chunks:  # the parts' time spans: the IMU scale is solved per part too, as a check of the joins
        ranges = chunk_ranges(len(kpos), opts.chunk_keyframes, opts.chunk_overlap)
        spans = [(float(session.timestamps[kpos[a]]), float(session.timestamps[kpos[b - 1]])) for a, b in ranges]
    try:
        if partial is not None:
            raise partial
        scale, metric, extra = metric_scale(session, opts, imu, key_pos, key_ts, key_T, model, spans)
    except ModelRefused as refusal:
        assert imu is not None
        kpos, key_pos, key_T, model, extra = repaired.repaired_scale(session, opts, imu, model, refusal, stages)
        scale, metric = extra.pop("scale"), True
        key_ts, centres = session.timestamps[key_pos], key_T[:, :3, 3]
        info.update(_model_fields(kpos, model, key_pos), frontend_used="klt, mapped again on the gyro's rotations",
                    world="the gyro's (its first sample), origin at the first registered keyframe, scaled to metres")
    refined = extra.pop("keyframe_poses", None)  # --solver viba: the bundle adjustment's metric keyframes
    info.update(extra)
    info.update({"metric": metric, "scale": scale if metric else None, "method": opts.scale,
                 "scale_choice": {k: getattr(opts, k) for k in store.SCALE_CHOICE}})

    stages("write")
    T = key_T.copy() if refined is None else refined
    T[:, :3, 3] = (centres - centres[0]) * scale if refined is None else refined[:, :3, 3] - refined[0, :3, 3]
    poses, flags = _every_frame(session, key_ts, T, imu, info)
    info["interpolated_frames"] = int(np.sum(flags == INTERPOLATED))
    info["outside_frames"] = [int(f) for f in session.frames[flags == OUTSIDE]]
    info["tool"] = f"shardship {__version__}"
    info = store.write_results(session, poses, flags, FLAG_NAMES, info)
    result = SlamResult(name, path, "ok", _summary(info), metric=metric, scale=scale if metric else None,
                        method=opts.scale, info=info, poses=poses, flags=flags, frames=session.frames)
    if opts.plot:
        result.plot = plot_session(session, poses, flags == REGISTERED, result.message, metric)
    return result


def _skipped(session: Session, opts: SlamOptions, path: Path) -> SlamResult | None:
    """The result for a session whose poses are metric already (ARKit, or the user's own
    calibration unless --force), else None."""
    if session.capture == CAPTURE_ARKIT:
        return SlamResult(session.name, path, "skipped", "captureSource iphone_arkit: ARKit poses are "
                          "already metric", metric=True, method="arkit")
    if session.pose_source == "user-calibrated" and not opts.force:
        sf = session.metadata.get("scale_factor")
        return SlamResult(session.name, path, "skipped", f"poses.json calibrated by your own tools "
                          f"(slamProcessed, scale_factor {sf:.6g}): used as they are (--force redoes them)",
                          metric=True, method="user")
    return None


def _every_frame(session: Session, key_ts: np.ndarray, T: np.ndarray, imu: Imu | None, info: dict[str, Any]
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(poses, flags) of every frame: the keyframes', and between them what the IMU
    measured where the scale stage aligned it (`imu_between`), else the cubic."""
    poses, flags = interpolate_poses(session.timestamps, key_ts, T)
    cal = None if imu is None else ImuCalibration.from_info(info)
    if imu is not None and cal is not None:
        poses = imu_between(session.timestamps, poses, flags, key_ts, T, imu, cal)
    info["between_keyframes"] = "cubic" if cal is None else "imu" if cal.gravity_removed else "gyro, cubic positions"
    return poses, flags


def _model_fields(kpos: np.ndarray, model: SfmModel, key_pos: np.ndarray) -> dict[str, Any]:
    """metadata.json's fields about the model the poses come from."""
    return {
        "keyframes": len(kpos),
        "registered_keyframes": len(key_pos),
        "registered_fraction": len(key_pos) / len(kpos),
        "other_models": model.other_models,
        "reprojection_error": model.reprojection_error,
        "points": model.n_points,
        "camera": model.camera,  # the SfM camera's parameters after bundle adjustment (calib.txt is the start)
    }


def _cached_result(session: Session, opts: SlamOptions, info: dict[str, Any]) -> SlamResult:
    res = SlamResult(session.name, session.path, "cached", _summary(info), metric=bool(info.get("metric")),
                     scale=info.get("scale"), method=str(info.get("method", "")), info=info)
    if opts.plot:
        res.plot = plot_stored(session, res.message, res.metric)
    return res


def cached_by_stat(session: Session, opts: SlamOptions) -> SlamResult | None:
    """The stored result of an already loaded session whose inputs' stat is what
    the last run recorded (no frame read), else None: `packer pack` asks this first
    and sends only the others to `slam_sessions`. Sessions the stage skips (ARKit,
    the user's own calibrated poses) carry no stored stat, so they go there too."""
    if opts.force or session.capture == CAPTURE_ARKIT:
        return None
    try:
        _preflight(session, opts)
    except SessionError:
        return None  # slam_sessions says why
    info = store.cached(session, stat=store.input_stat(session, opts.fingerprint_options(), opts.scale == "imu"))
    return None if info is None else _cached_result(session, opts, info)


def _reconstruct_keyframes(
    session: Session, opts: SlamOptions, stages: Callable[[str], None], imu: Imu | None = None
) -> tuple[np.ndarray, SfmModel, np.ndarray, np.ndarray]:
    """SfM on the keyframes: (keyframe positions, model, registered positions,
    their camera-to-world (M,4,4)). When the KLT front-end registers too little
    (< 90%), the SIFT front-end runs too and the better model is kept (the
    summary says so). Refuses a reconstruction that registered too few keyframes:
    scale and interpolation over the gaps would be guesses."""
    try:
        found = _sfm(session, opts, stages, imu)
    except SessionError as e:
        if opts.frontend != "klt":
            raise
        found, first_error = None, e
    if opts.frontend == "klt" and (found is None or len(found[2]) < FALLBACK_BELOW * len(found[0])):
        alt_opts = dataclasses.replace(opts, frontend="sift", keyframe_step=None)
        try:
            alt = _sfm(session, alt_opts, stages)
        except SessionError:
            alt = None
        if alt is not None and (found is None or len(alt[2]) / len(alt[0]) > len(found[2]) / len(found[0])):
            alt[1].frontend_note = (f"KLT tracks registered {_frac(found)} of the keyframes; the SIFT front-end "
                                    f"registered more and was used")
            if found is not None:  # what `gyro_repair` maps again, and where it may start
                alt[1].tracks = found[1].tracks
                alt[1].gyro_starts = {**found[1].gyro_starts, **gyro_repair.klt_alignment(found, session, imu)}
            found = alt
        if found is None:
            raise first_error
    assert found is not None
    kpos, model, key_pos, key_T = found
    reg_frac = len(key_pos) / len(kpos)
    if reg_frac < opts.min_registered or len(key_pos) < 3:
        raise repaired.too_few_registered(session.error(
            "rgb/",
            f"SfM registered only {len(key_pos)}/{len(kpos)} keyframes ({reg_frac:.0%}, need "
            f"{opts.min_registered:.0%}) with either front-end; other models: {model.other_models or 'none'}. "
            "Too fast for the frame rate, too blurred or too plain: record slower, with more light and more "
            "texture in view"), session, opts, imu, found)
    return kpos, model, key_pos, key_T


FALLBACK_BELOW = 0.9  # registered fraction of the KLT front-end below which SIFT is tried too


def _frac(found: tuple[np.ndarray, SfmModel, np.ndarray, np.ndarray] | None) -> str:
    return "none" if found is None else f"{len(found[2])}/{len(found[0])}"


def _sfm(session: Session, opts: SlamOptions, stages: Callable[[str], None], imu: Imu | None = None
         ) -> tuple[np.ndarray, SfmModel, np.ndarray, np.ndarray]:
    """One front-end's SfM: (keyframe positions, model, registered positions, their
    poses). KLT tracks are freed of the rolling shutter first (`rolling.py`)."""
    step = opts.step_for(session.fps)
    tracks: Tracks | None = None
    if opts.frontend == "klt":
        stages("features (tracking)")
        try:
            skip = max(0, int(np.floor(opts.max_keyframe_gap * session.fps / step + 1e-6)) - 1)
            topt = TrackOptions(max_tracks=opts.max_tracks, min_parallax_px=opts.min_parallax_px, max_gap=skip,
                                mask=_load_mask(session, opts.mask))
            tracks = track_keyframes(session.frame_paths, step, topt)
        except OSError as e:
            raise session.error("rgb/", str(e)) from None
        kpos = np.asarray(tracks.keyframes, dtype=np.int64)
    else:
        kpos = keyframe_positions(session.n_frames, step)
    names = [session.frame_paths[i].name for i in kpos]
    rel = [str(session.frame_paths[i].relative_to(session.path / "rgb")) for i in kpos]
    readout: float | None = None
    curve: dict = {}
    window_al = None
    if tracks is not None:
        tracks, readout, curve, window_al = rolling.shutter_free(session, opts, imu, tracks, rel, kpos, stages)
    try:
        model = reconstruct_chunked(session.path / "rgb", rel, session.intrinsics, opts.sfm_options(),
                                    stage=stages, tracks=tracks,
                                    chunks=ChunkOptions(chunk=opts.chunk_keyframes, overlap=opts.chunk_overlap))
    except SfmError as e:
        raise session.error("rgb/", str(e)) from None
    model.rolling_shutter, model.rolling_shutter_curve = readout, curve
    model.tracks = tracks if not model.chunks else None  # `gyro_repair` maps them again
    model.gyro_starts = {} if window_al is None else {"a 3 s window SfM": window_al}
    key_pos, key_T = model.registered(names, kpos)
    return kpos, model, key_pos, key_T


def _load_mask(session: Session, mask: str | None) -> np.ndarray | None:
    """The user's detection mask (`[slam] mask`, a path relative to the session or
    absolute): a grey PNG, black where nothing may be tracked, resized to the frames."""
    if not mask:
        return None
    import cv2

    p = Path(mask) if Path(mask).is_absolute() else session.path / mask
    img = cv2.imread(str(p), cv2.IMREAD_GRAYSCALE)
    if img is None:
        raise session.error(str(p), "--mask: not a readable image (a PNG, black where the mount is)")
    h, w = read_gray(session.frame_paths[0]).shape
    return np.where(cv2.resize(img, (w, h), interpolation=cv2.INTER_NEAREST) > 127, 255, 0).astype(np.uint8)


def _summary(info: dict[str, Any]) -> str:
    parts = []
    if info.get("metric"):
        s = f"scale {info['scale']:.4g} m/unit ({info['method']}"
        if info.get("scale_rel_std") is not None:
            s += f", +-{info['scale_rel_std']:.1%}"
        if info.get("imu_lag") is not None:
            s += f", frame 0 at {info['imu_lag'] * 1000:+.1f} ms on the IMU clock"
        parts.append(s + ")")
    else:
        parts.append("unscaled poses (metric false)")
    parts.append(f"registered {info['registered_fraction']:.0%} of {info['keyframes']} keyframes")
    parts.append(f"reprojection {info['reprojection_error']:.2f} px")
    if info.get("sfm_parts"):
        parts.append(f"mapped in {len(info['sfm_parts'])} parts")
    if info.get("other_models"):
        parts.append(f"other models {info['other_models']}")
    if info.get("frontend_used") not in (None, "klt", "sift"):
        parts.append(str(info["frontend_used"]))
    if info.get("solver") == "viba":
        parts.append("scaled by the visual-inertial bundle adjustment")
    return ", ".join(parts)


def default_jobs(threads: int) -> int:
    return max(1, (os.cpu_count() or 1) // max(1, threads))


def slam_sessions(paths: Sequence[str | os.PathLike], opts: SlamOptions | None = None,
                  jobs: int | None = None, isolate: bool = False) -> list[SlamResult]:
    """Run `slam_session` over `paths`, in `jobs` processes (default: cores // threads,
    fewer where memory is short: packer.slam.workers).
    Results come back in the order of `paths`. `isolate`: worker processes even
    for one job, so that a Ctrl-C stops a reconstruction at once (`packer pack`):
    in this process it would wait until pycolmap's C++ returns, tens of seconds."""
    opts = opts or SlamOptions()
    opts.validate()
    dirs = [Path(p) for p in paths]
    jobs = default_jobs(opts.threads) if jobs is None or jobs <= 0 else jobs
    jobs = min(jobs, max(1, len(dirs)))
    out: dict[int, SlamResult] = {}
    from shardship.progress import bar as progress_bar

    bar = progress_bar(len(dirs), "slam", "session", None if opts.progress and len(dirs) >= 2 else False)
    if jobs == 1 and not isolate:
        for i, p in enumerate(dirs):
            out[i] = slam_session(p, opts)
            bar.update(1)
    else:
        from packer.slam.workers import run_in_processes

        def failed(i: int, message: str) -> None:
            out[i] = SlamResult(dirs[i].name, dirs[i], "failed", message=message)
            bar.update(1)

        def done(i: int, result: SlamResult) -> None:
            out[i] = result
            bar.update(1)

        run_in_processes(dirs, functools.partial(slam_session, opts=dataclasses.replace(
            opts, progress=opts.progress and jobs == 1)), jobs, done, failed, opts.chunk_keyframes)
    bar.close()
    return [out[i] for i in range(len(dirs))]
