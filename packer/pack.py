"""`packer pack`: sessions -> 224x224 JPEG samples -> tar shards + index.json.

One worker pool decodes/resizes/encodes frames of all sessions in order while the
main process writes tar members and builds each sample's JSON. A session becomes
visible in index.json only after all its shards are renamed into place, so a killed
run resumes at the first unfinished session and an unchanged session (same
fingerprint) is never re-encoded."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from packer.actions import OBS_STATS_STEPS, POSE_DIMS, RunningStats
from packer.encoders import JOINTS, UNITS
from packer.fingerprint import content_fingerprint, stat_signature
from packer.imageops import ResizeSpec, process_frame
from packer.intake import extract_all
from packer.outdir import Publisher, disk_error, file_ok, locked, remember, shards_ok
from packer.samples import SessionPlan, kept_frames, plan_session
from packer.session import (
    Session,
    discover,
    load_session,
)
from shardship.atomic import remove_stale_temps
from shardship.config import PackOptions
from shardship.errors import Exit, SessionError, ShardshipError
from shardship.format import index as manifest
from shardship.format.shards import ShardWriter
from shardship.pil import cache_image_buffers
from shardship.pil import describe as pil_describe


@dataclass
class PackReport:
    out: Path
    packed: list[str] = field(default_factory=list)  # encoded this run
    reused: list[str] = field(default_factory=list)  # unchanged, kept
    failed: dict[str, str] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)
    extracted: list[str] = field(default_factory=list)  # zip exports unpacked this run
    warnings: dict[str, list[str]] = field(default_factory=dict)  # per session, packed or kept
    raw_bytes: int = 0
    packed_bytes: int = 0
    images: int = 0  # frames encoded this run
    seconds: float = 0.0
    encode_seconds: float = 0.0  # the resize/encode/write phase alone
    pil: str = ""

    @property
    def saving(self) -> float:
        return 1.0 - self.packed_bytes / self.raw_bytes if self.raw_bytes else 0.0


def pack_options_dict(opts: PackOptions) -> dict[str, Any]:
    """The options that change shard bytes (workers does not)."""
    d = asdict(opts)
    d.pop("workers", None)
    return d


def _session_entry(plan: SessionPlan, fingerprint: str, shards: list, raw_bytes: int) -> dict[str, Any]:
    s = plan.session
    return {
        "fingerprint": fingerprint, "stat_signature": plan.signature, "frames": s.n_frames, "samples": len(plan.keep),
        "raw_bytes": raw_bytes, "packed_bytes": sum(x.bytes for x in shards),
        "shards": [x.name for x in shards], "intrinsics": plan.metas[0]["intrinsics"] if plan.metas else None,
        "pose_metric": any(m["pose_metric"] for m in plan.metas),
        "calibration": s.metadata.get("shardship"), "warnings": s.warnings, "joints": list(JOINTS),
        "joints_valid": plan.joints_valid, "capture": s.capture, "fps": s.fps, "fps_source": s.fps_source,
        "pose_source": s.pose_source, "frames_without_pose": plan.frames_without_pose, "clock": plan.clock,
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


def load_valid_sessions(paths: Iterable[Path], failed: dict[str, str], check_images: bool) -> list[Session]:
    out = []
    for path in paths:
        try:
            out.append(load_session(path, check_images=check_images))
        except SessionError as e:
            failed[path.name] = f"{e.path}: {e.reason}"
    return out


def pack(
    raw: str | os.PathLike,
    out: str | os.PathLike,
    opts: PackOptions | None = None,
    *,
    progress: bool = True,
    prepare: Callable[[list[Session]], dict[str, str]] | None = None,
) -> PackReport:
    """Pack every valid session under `raw` into `out`. Raises only for problems that
    stop everything (unusable or busy out dir, index.json cannot be saved);
    per-session problems land in report.failed.
    `prepare` runs once over the valid sessions before packing (the SLAM stage: it
    may rewrite poses.json/metadata.json) and returns {session: reason} refusals."""
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
        return _pack_locked(raw, out, opts, progress, prepare, lock_fd)


def _pack_locked(raw: Path, out: Path, opts: PackOptions, progress: bool,
                 prepare: Callable[[list[Session]], dict[str, str]] | None, lock_fd: int) -> PackReport:
    t0 = time.perf_counter()
    remove_stale_temps(out)
    pil = pil_describe()
    report = PackReport(out=out, pil=pil)
    options = pack_options_dict(opts)
    # Changed options change every session's signature and fingerprint, so all are re-packed.
    index = manifest.load(out, required=False) or manifest.empty(options, pil)
    index["options"], index["pil"], index["failed"] = options, pil, {}
    pub = Publisher(out, index, _finalise_stats)

    unzipped, bad_zips = extract_all(raw)
    report.extracted = [e.session_dir.name for e in unzipped if e.status == "extracted"]
    report.failed.update({Path(z).stem: f"{z}: {why}" for z, why in bad_zips.items()})
    paths = discover(raw)
    sessions = load_valid_sessions(paths, report.failed, check_images=True)
    if prepare is not None and sessions:
        report.failed.update(prepare(sessions))
        # prepare may have rewritten poses.json/metadata.json: read those again (the
        # frames were checked above and are unchanged)
        ok = [s.path for s in sessions if s.name not in report.failed]
        sessions = load_valid_sessions(ok, report.failed, check_images=False)
    present = {p.name for p in paths}
    report.removed = [name for name in index["sessions"] if name not in present]
    for name in report.removed:
        _drop_session(index, name)
    if report.removed:
        _save(pub)  # publish the removal, then its files go (frees their space before encoding)

    todo: list[SessionPlan] = []
    for s in sessions:
        try:
            keep = kept_frames(s, opts)
            sig = stat_signature(s, keep, options, manifest.VERSION)
            entry = index["sessions"].get(s.name)
            if shards_ok(out, entry, index, pub.stats) and entry is not None and (
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
            todo.append(plan_session(s, opts, sig))
        except SessionError as e:
            report.failed[s.name] = f"{e.path}: {e.reason}"

    total_frames = sum(len(p.keep) for p in todo)
    if todo:
        t_enc = time.perf_counter()
        _encode_all(todo, pub, opts, report, total_frames, progress, lock_fd)
        report.encode_seconds = time.perf_counter() - t_enc

    index["failed"] = dict(report.failed)
    _apply_compression(pub, opts.compress)
    _save(pub)
    report.raw_bytes = sum(e.get("raw_bytes", 0) for e in index["sessions"].values())
    report.packed_bytes = sum(s["bytes"] for s in index["shards"])
    report.seconds = time.perf_counter() - t0
    return report


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


def _tasks(plans: Iterable[SessionPlan], spec: ResizeSpec):
    for plan in plans:
        for i in plan.keep:
            yield (str(plan.session.frame_paths[i]), spec)


def _worker_init(lock_fd: int) -> None:
    """A forked worker drops its copy of the out dir lock: only the pack holds it."""
    try:
        os.close(lock_fd)
    except OSError:
        pass
    cache_image_buffers()


def _encode_all(todo: list[SessionPlan], pub: Publisher, opts: PackOptions, report: PackReport, total: int,
                progress: bool, lock_fd: int) -> None:
    spec = ResizeSpec(opts.size, opts.crop, opts.quality)
    workers = opts.workers or os.cpu_count() or 1
    # fork starts a pool in ~20 ms where spawn takes ~0.5 s (measured here); the
    # workers only run PIL on their own inputs, so no lock state is inherited that
    # they could trip on. Platforms without fork use spawn.
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    bar = tqdm(total=total, unit="img", desc="pack", disable=not progress, dynamic_ncols=True)
    pool = ctx.Pool(workers, initializer=_worker_init, initargs=(lock_fd,))
    try:
        results = pool.imap(process_frame, _tasks(todo, spec), chunksize=32)
        for plan in todo:
            _encode_session(plan, results, pub, opts, report, bar)
    except BaseException:
        pool.terminate()
        raise
    else:
        pool.close()
    finally:
        pool.join()
        bar.close()


def _encode_session(plan: SessionPlan, results, pub: Publisher, opts: PackOptions, report: PackReport,
                    bar) -> None:
    """Consume exactly this session's results (even after a failure, to stay in step
    with the ordered result stream), write its shards, then publish it."""
    s, out = plan.session, pub.out
    writer = ShardWriter(out, s.name, opts.shard_bytes)
    error: str | None = None
    digests: list[bytes] = []
    try:
        for j, i in enumerate(plan.keep):
            jpg, digest, err = next(results)
            bar.update(1)
            if error is not None:
                continue
            if err is not None:
                error = f"rgb/{s.frame_paths[i].name}: {err}; re-copy it from the phone or delete the frame"
                writer.abort()
                continue
            digests.append(digest)
            meta = plan.metas[j]
            key = f"{s.name}/{meta['frame']:06d}"
            try:
                writer.add(key, jpg, json.dumps(meta, separators=(",", ":")).encode(), meta["action"] is not None)
            except OSError as e:
                writer.abort()
                error = disk_error(e, out)
        if error is None:
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
    try:
        shards = writer.commit()
    except OSError as e:
        writer.abort()
        pub.discard({x.name for x in writer.done})
        return disk_error(e, out)
    index["shards"].extend(x.to_json() for x in shards)
    fp = content_fingerprint(s, plan.keep, index["options"], manifest.VERSION, digests)
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
