"""`packer pack`: sessions -> 224x224 JPEG samples -> tar shards + index.json.

One worker pool decodes/resizes/encodes frames of all sessions in order while the
main process writes tar members and builds each sample's JSON. A session becomes
visible in index.json only after all its shards are renamed into place, so a killed
run resumes at the first unfinished session and an unchanged session (same
fingerprint) is never re-encoded."""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from packer.actions import OBS_STATS_STEPS, POSE_DIMS, RunningStats
from packer.duplicates import unique_sessions
from packer.encoders import JOINTS, UNITS
from packer.fingerprint import content_fingerprint, stat_signature
from packer.framepool import FramePool
from packer.imageops import ResizeSpec
from packer.intake import extract_all
from packer.outdir import Publisher, disk_error, file_ok, locked, remember, shards_ok
from packer.samples import SessionPlan, kept_frames, label_summary, plan_session, sample_json
from packer.session import (
    Session,
    discover,
    load_session,
)
from shardship.atomic import interrupts_deferred, remove_stale_temps
from shardship.config import PackOptions
from shardship.errors import Exit, SessionError, ShardshipError
from shardship.format import index as manifest
from shardship.format.shards import ShardWriter
from shardship.pil import describe as pil_describe
from shardship.progress import bar as progress_bar


@dataclass
class PackReport:
    out: Path
    packed: list[str] = field(default_factory=list)  # encoded this run
    reused: list[str] = field(default_factory=list)  # unchanged, kept
    failed: dict[str, str] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)
    extracted: list[str] = field(default_factory=list)  # zip exports unpacked this run
    skipped: dict[str, str] = field(default_factory=dict)  # second copies of a session (packer.duplicates): why
    warnings: dict[str, list[str]] = field(default_factory=dict)  # per session, packed or kept
    raw_bytes: int = 0
    packed_bytes: int = 0
    images: int = 0  # frames encoded this run
    seconds: float = 0.0
    encode_seconds: float = 0.0  # the resize/encode/write phase alone
    pil: str = ""
    # CPU seconds of this process (threads included) per phase, from process start:
    # what `packer pack --timings` prints next to the workers' CPU
    cpu: dict[str, float] = field(default_factory=dict)

    def mark(self, phase: str) -> None:
        self.cpu[phase] = time.process_time() - sum(self.cpu.values())

    @property
    def saving(self) -> float:
        return 1.0 - self.packed_bytes / self.raw_bytes if self.raw_bytes else 0.0


def pack_options_dict(opts: PackOptions) -> dict[str, Any]:
    """The options that change shard bytes: not workers, and not compress (the .tar
    bytes are the same either way; the .tar.zst copies follow the mode at every run,
    so switching it never re-encodes a session)."""
    d = asdict(opts)
    d.pop("workers", None)
    d.pop("compress", None)
    return d


@dataclass
class Pending:
    """A session to encode. Its plan (sample JSON, action chunks, statistics) is made
    in the main process while the workers already encode its frames."""
    session: Session
    keep: Any  # np.ndarray of positions into session.frames
    signature: str

    @property
    def paths(self) -> list[str]:
        return frame_list(self.session, self.keep)


def frame_list(session: Session, keep: Any) -> list[str]:
    """The kept frames' files, as the workers are given them."""
    return [str(session.frame_paths[i]) for i in keep]


def _session_entry(plan: SessionPlan, fingerprint: str, shards: list, raw_bytes: int) -> dict[str, Any]:
    s = plan.session
    return {
        "fingerprint": fingerprint, "stat_signature": plan.signature, "frames": s.n_frames, "samples": len(plan.keep),
        "raw_bytes": raw_bytes, "packed_bytes": sum(x.bytes for x in shards),
        "shards": [x.name for x in shards], "intrinsics": plan.metas.k if len(plan.metas) else None,
        "pose_metric": plan.metas.pose_metric,
        "calibration": s.metadata.get("shardship"), "warnings": s.warnings, "joints": list(JOINTS),
        "joints_valid": plan.joints_valid, "capture": s.capture, "fps": s.fps, "fps_source": s.fps_source,
        "pose_source": s.pose_source, "frames_without_pose": plan.frames_without_pose, "clock": plan.clock,
        "labels": label_summary(plan),
        "stats": {"action": plan.action_stats.to_json() if plan.action_stats else None,
                  "proprio": plan.proprio_stats.to_json() if plan.proprio_stats else None,
                  "obs": [o.to_json() for o in plan.obs_stats] if plan.obs_stats else None},
    }


def _drop_session(index: dict[str, Any], name: str) -> None:
    """Forget a session in the document; its files go at the next save (Publisher)."""
    entry = index["sessions"].pop(name, None)
    names = set(entry["shards"]) if entry else set()
    index["shards"] = [s for s in index["shards"] if s["name"] not in names]


def _merged(entries: Iterable[dict[str, Any]], key: str, step: int | None = None) -> RunningStats | None:
    """Merge one kind of per-session statistics (of one backward offset `step` for
    the per-offset "obs" list); sessions whose dimension differs from the first
    (packed by an older layout) are left out of the normaliser."""
    total: RunningStats | None = None
    for entry in entries:
        d = (entry.get("stats") or {}).get(key)
        if d and step is not None:
            d = d[step] if step < len(d) else None
        if not d:
            continue
        part = RunningStats.from_json(d)
        if total is None:
            total = part
        elif len(part.s) == len(total.s):
            total.merge(part)
    return total


def _finalise_stats(index: dict[str, Any]) -> None:
    """Normalisation statistics over all packed sessions, merged from per-session sums."""
    sessions = list(index["sessions"].values())
    astats, pstats = _merged(sessions, "action"), _merged(sessions, "proprio")
    index["joints"], index["joint_units"] = list(JOINTS), UNITS
    index["action_dim"] = POSE_DIMS + len(JOINTS)
    merged = [_merged(sessions, "obs", d) for d in range(OBS_STATS_STEPS)]
    obs = [o.to_json() for o in merged if o is not None]
    index["stats"] = {"action": astats.summary() if astats else None,
                      "proprio": pstats.summary() if pstats else None,
                      "obs": obs if len(obs) == OBS_STATS_STEPS else None,
                      "count": astats.count if astats else 0, "pose_dims": POSE_DIMS}


def load_valid_sessions(paths: Iterable[Path], failed: dict[str, str], check_images: bool) -> Iterator[Session]:
    """Each session that loads (one at a time, so the caller can act on it before
    the next is read); the others go to `failed`."""
    for path in paths:
        try:
            yield load_session(path, check_images=check_images)
        except SessionError as e:
            failed[path.name] = f"{e.path}: {e.reason}"


def pack(
    raw: str | os.PathLike,
    out: str | os.PathLike,
    opts: PackOptions | None = None,
    *,
    progress: bool = True,
    prepare: Callable[[list[Session]], dict[str, str]] | None = None,
    ready: Callable[[Session], bool] | None = None,
    frames: FramePool | None = None,
) -> PackReport:
    """Pack every valid session under `raw` into `out`. Raises only for problems that
    stop everything (unusable or busy out dir, index.json cannot be saved);
    per-session problems land in report.failed.
    `prepare` runs once over the valid sessions before packing (the SLAM stage: it
    may rewrite poses.json/metadata.json) and returns {session: reason} refusals.
    `ready(session)` says prepare has nothing to do for it (its SLAM result is
    cached), so its frames may be encoded before prepare runs.
    `frames`: a pool already encoding (packer.framepool.prefeed, for these options);
    the caller closes it. Without one, pack runs its own."""
    opts = opts or PackOptions()
    if opts.crop not in ("squash", "center"):
        raise ShardshipError(f"--crop {opts.crop!r}: use squash or center")
    if not 1 <= opts.quality <= 100:
        raise ShardshipError(f"--quality {opts.quality}: use 1..100")
    raw, out = Path(raw), Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ShardshipError(f"cannot create output directory {out}: {e.strerror}") from None
    with locked(out) as lock_fd:
        if frames is not None:
            assert frames.spec == ResizeSpec(opts.size, opts.crop, opts.quality)
            return _pack_locked(raw, out, opts, progress, prepare, ready, frames)
        with FramePool.for_options(opts, lock_fd) as own:
            return _pack_locked(raw, out, opts, progress, prepare, ready, own)


def _pack_locked(raw: Path, out: Path, opts: PackOptions, progress: bool,
                 prepare: Callable[[list[Session]], dict[str, str]] | None, ready: Callable[[Session], bool] | None,
                 frames: FramePool) -> PackReport:
    t0 = time.perf_counter()
    report = PackReport(out=out)
    report.mark("start-up (interpreter, imports)")
    remove_stale_temps(out)
    pil = report.pil = pil_describe()
    options = pack_options_dict(opts)
    # Changed options change every session's signature and fingerprint, so all are re-packed.
    index = manifest.load(out, required=False) or manifest.empty(options, pil)
    index["options"], index["pil"], index["failed"] = options, pil, {}
    pub = Publisher(out, index, _finalise_stats)

    unzipped, bad_zips = extract_all(raw)
    report.extracted = [e.session_dir.name for e in unzipped if e.status == "extracted"]
    report.failed.update({Path(z).stem: f"{z}: {why}" for z, why in bad_zips.items()})
    paths, skipped, content = unique_sessions(discover(raw))
    report.skipped = {e.zip_path.name: e.why for e in unzipped if e.status == "duplicate"} | skipped
    sessions = _load_feeding(paths, opts, index, ready, frames, report.failed)
    report.mark("load and check sessions")
    if prepare is not None and sessions:
        sessions = _prepared(sessions, prepare, report.failed)
    report.mark("SLAM stage")
    present = {p.name for p in paths}
    report.removed = [name for name in index["sessions"] if name not in present]
    for name in report.removed:
        _drop_session(index, name)
    if report.removed:
        _save(pub)  # publish the removal, then its files go (frees their space before encoding)

    todo = _to_encode(sessions, opts, options, index, pub, report)
    for name in [*report.failed, *report.skipped]:
        frames.drop(name)
    report.mark("reuse decisions")
    if todo:
        _encode_all(todo, frames, pub, opts, report, progress)
        report.mark("encode: plan, sample JSON, tar, publish")
        report.encode_seconds = time.perf_counter() - max(frames.started or t0, t0)

    index["failed"], index["skipped"] = dict(report.failed), dict(report.skipped)
    for name, entry in index["sessions"].items():  # what packer.duplicates and the train split compare
        entry["content_key"] = content.get(name, entry.get("content_key"))
    _apply_compression(pub, opts.compress)
    _save(pub)
    report.raw_bytes = sum(e.get("raw_bytes", 0) for e in index["sessions"].values())
    # what is on disk: every .tar, plus its .tar.zst where compression wrote one
    report.packed_bytes = sum(s["bytes"] + (s["compressed"] or {}).get("bytes", 0) for s in index["shards"])
    report.seconds = time.perf_counter() - t0
    report.mark("finish (index.json, compression)")
    return report


def _load_feeding(paths: list[Path], opts: PackOptions, index: dict[str, Any], ready: Callable[[Session], bool] | None,
                  frames: FramePool, failed: dict[str, str]) -> list[Session]:
    """Load and check every session; feed the workers at once the frames of each one
    that will surely be encoded: not in index.json, and nothing for `prepare` to do
    (`ready`). Up to the pool's early budget, so results that wait for a long SLAM
    run on other sessions stay a few hundred MB at most."""
    out: list[Session] = []
    for s in load_valid_sessions(paths, failed, check_images=True):
        out.append(s)
        keep = kept_frames(s, opts)
        fl = frame_list(s, keep)
        if frames.fed(s.name, fl):
            continue  # prefed from the directory listing, and it matches
        if s.name not in index["sessions"] and len(fl) <= frames.early and (ready is None or ready(s)):
            frames.feed(s.name, fl)
            frames.early -= len(fl)
    return out


def _prepared(sessions: list[Session], prepare: Callable[[list[Session]], dict[str, str]],
              failed: dict[str, str]) -> list[Session]:
    """Run the SLAM stage, then read again the sessions whose poses.json or
    metadata.json it rewrote (their frames were checked and are unchanged); the
    others, e.g. every session on a cached re-run, are kept as loaded."""
    def stamp(s: Session) -> list[tuple[int, int] | None]:
        out: list[tuple[int, int] | None] = []
        for name in ("poses.json", "metadata.json"):
            try:
                st = s.file(name).stat()
                out.append((st.st_size, st.st_mtime_ns))
            except OSError:
                out.append(None)
        return out

    before = {s.name: stamp(s) for s in sessions}
    failed.update(prepare(sessions))
    kept: list[Session] = []
    changed: list[Session] = []
    for s in sessions:
        if s.name not in failed:
            (kept if stamp(s) == before[s.name] else changed).append(s)
    reread = {s.name: s for s in load_valid_sessions([s.path for s in changed], failed, check_images=False)}
    return [reread.get(s.name, s) for s in kept + changed if s.name not in failed]


def _to_encode(sessions: list[Session], opts: PackOptions, options: dict[str, Any], index: dict[str, Any],
               pub: Publisher, report: PackReport) -> list[Pending]:
    """The sessions whose shards must be written; an unchanged one (same stat
    signature, else same content fingerprint) with intact shards is kept."""
    todo: list[Pending] = []
    for s in sessions:
        try:
            keep = kept_frames(s, opts)
            sig = stat_signature(s, keep, options, manifest.VERSION)
            entry = index["sessions"].get(s.name)
            if shards_ok(pub.out, entry, index, pub.stats) and entry is not None and (
                    entry.get("stat_signature") == sig
                    or entry.get("fingerprint") == content_fingerprint(s, keep, options, manifest.VERSION)):
                entry["stat_signature"] = sig  # e.g. copied with new mtimes: same content
                if "obs" not in (entry.get("stats") or {}):  # packed before obs statistics: add them, no re-encode
                    plan = plan_session(s, opts, sig)
                    entry.setdefault("stats", {})["obs"] = ([o.to_json() for o in plan.obs_stats]
                                                            if plan.obs_stats else None)
                report.reused.append(s.name)
                if entry.get("warnings"):
                    report.warnings[s.name] = list(entry["warnings"])
                continue
            todo.append(Pending(s, keep, sig))
        except SessionError as e:
            report.failed[s.name] = f"{e.path}: {e.reason}"
    return todo


def _save(pub: Publisher) -> None:
    """A save outside a session's own: failing to write index.json stops the run
    with one line (exit 1); the index.json on disk is the previous, complete one."""
    try:
        pub.save()
    except OSError as e:
        raise ShardshipError(disk_error(e, pub.out, "index.json"), Exit.PARTIAL) from None


def _apply_compression(pub: Publisher, mode: str) -> None:
    """Probe once, then keep every shard's optional .tar.zst in step with its .tar
    (a damaged or missing one is written again). Unused .tar.zst files are removed
    by the next save, once index.json no longer names them."""
    from packer.compress import compress_shard, decide

    out, index = pub.out, pub.index
    first = out / index["shards"][0]["name"] if index["shards"] else None
    use, ratio = decide(mode, first)
    index["compression"] = {"mode": mode, "probe_ratio": ratio, "used": use}
    try:
        for sh in index["shards"]:
            if use:
                c = sh.get("compressed")
                if not c or not file_ok(out, c, pub.stats):
                    sh["compressed"] = compress_shard(out / sh["name"])
                    remember(out, pub.stats, [sh["compressed"]["name"]])
            else:
                sh["compressed"] = None
    except OSError as e:  # e.g. disk full: the plain .tar shards are complete, ship those
        for sh in index["shards"]:
            sh["compressed"] = None
        index["compression"].update(used=False, error=disk_error(e, out))


def _encode_all(todo: list[Pending], frames: FramePool, pub: Publisher, opts: PackOptions, report: PackReport,
                progress: bool) -> None:
    """Queue every session not fed yet, then write and publish them in order."""
    for p in todo:
        if not frames.fed(p.session.name, p.paths):
            frames.feed(p.session.name, p.paths)
    with progress_bar(sum(len(p.keep) for p in todo), "pack", "img", None if progress else False) as bar:
        for p in todo:
            _encode_session(p, frames.results(p.session.name), pub, opts, report, bar)


def _encode_session(pending: Pending, results, pub: Publisher, opts: PackOptions, report: PackReport,
                    bar) -> None:
    """Plan the session (the workers are busy with its frames meanwhile), consume
    exactly its results (even after a failure, to stay in step with the ordered
    result stream), write its shards, then publish it."""
    s, out = pending.session, pub.out
    error: str | None = None
    try:
        plan = plan_session(s, opts, pending.signature)
    except SessionError as e:
        plan, error = None, f"{e.path}: {e.reason}"
    writer = ShardWriter(out, s.name, opts.shard_bytes)
    digests: list[bytes] = []
    try:
        for j, i in enumerate(pending.keep):
            jpg, digest, err = next(results)
            bar.update(1)
            if error is not None:
                continue
            assert plan is not None  # error is set whenever planning failed
            if err is not None:
                error = f"rgb/{s.frame_paths[i].name}: {err}; re-copy it from the phone or delete the frame"
                writer.abort()
                continue
            digests.append(digest)
            meta = plan.metas[j]
            key = f"{s.name}/{meta['frame']:06d}"
            try:
                writer.add(key, jpg, sample_json(meta), meta["action"] is not None)
            except OSError as e:
                writer.abort()
                error = disk_error(e, out)
        if error is None:
            assert plan is not None
            error = _publish_session(plan, writer, pub, digests, report)
    except BaseException:
        writer.abort()
        raise
    if error is not None:
        report.failed[s.name] = error


def _publish_session(plan: SessionPlan, writer: ShardWriter, pub: Publisher, digests: list[bytes],
                     report: PackReport) -> str | None:
    """Rename the session's shards into place and save index.json naming them; on a
    full disk (or any write error) undo to the index.json on disk and say why."""
    s, out, index = plan.session, pub.out, pub.index
    try:
        # Un-publish the old version first: the manifest must never name a
        # shard file whose bytes are about to change.
        if s.name in index["sessions"]:
            _drop_session(index, s.name)
            pub.save()
    except OSError as e:
        writer.abort()
        return disk_error(e, out, "index.json")
    fp = content_fingerprint(s, plan.keep, index["options"], manifest.VERSION, digests)
    with interrupts_deferred():  # a Ctrl-C between the renames and index.json would leave unnamed shards
        try:
            shards = writer.commit()
        except OSError as e:
            writer.abort()
            pub.discard({x.name for x in writer.done})
            return disk_error(e, out)
        index["shards"].extend(x.to_json() for x in shards)
        index["sessions"][s.name] = _session_entry(plan, fp, shards, s.raw_bytes())
        remember(out, pub.stats, [x.name for x in shards])
        try:
            pub.save()
        except OSError as e:  # index.json not written: these shards are unnamed, take them away again
            _drop_session(index, s.name)
            pub.discard({x.name for x in shards})
            return disk_error(e, out, "index.json")
    report.packed.append(s.name)
    report.images += len(plan.keep)
    if s.warnings:
        report.warnings[s.name] = list(s.warnings)
    return None
