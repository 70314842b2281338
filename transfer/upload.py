"""`transfer upload`: send the packed shards, never blowing the quota, verified.

Order of work (one connection, one SFTP session):
  1. local index.json -> shards; remote listing + bookkeeping -> what is there
     (sha256 computed on the remote only for files whose hash is not known);
  2. live quota -> plan (transfer.plan): over quota -> QuotaError (exit 3)
     before anything is written, not even a directory;
  3. per shard: into NAME.part (pipelined SFTP, or an OpenSSH channel; the
     OpenSSH transport sends `remote.streams` shards at once, each on its own
     channel), resuming from the .part's size when its prefix hashes the same
     as ours; sha256 on the remote; a mismatch is retried once from zero;
     atomic rename in shard order; `.tar.zst` unpacked (checked);
  4. remote index.json last, atomically, and only when every shard made it.
A killed or dropped run leaves only `.part` files and verified shards: the
rerun resumes. A full disk mid-shard removes that `.part`, keeps the verified
shards and exits 1 with the numbers.
"""
from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from shardship import progress as progress_mod
from shardship.errors import Exit, QuotaError, RemoteError, ShardshipError
from shardship.hashing import sha256_file
from shardship.units import human
from transfer import unpack
from transfer.failures import DiskFullError, handle_failure, write_index
from transfer.hashing import RemoteHasher, sha256
from transfer.lock import UploadLock
from transfer.manifest import PART
from transfer.plan import DEFAULT_MARGIN, Item, Plan, Step
from transfer.preflight import UnsafeShardError, prepare, read_state, write_state
from transfer.remote import Remote
from transfer.signature import signatures

Event = Callable[..., None]  # on_event(kind: str, **info)
_BAR_LOCK = threading.Lock()  # several senders update one progress display
__all__ = ["DiskFullError", "UnsafeShardError", "upload", "prune_unlisted", "UploadResult", "ShardOutcome"]


@dataclass
class ShardOutcome:
    name: str
    action: str  # the planned action
    sent: int = 0  # bytes sent by this run
    resumed_from: int = 0  # .part bytes reused
    restarted: bool = False  # an existing .part did not match and was thrown away
    retried: bool = False  # the first verification failed, sent again from zero
    done: bool = False


@dataclass
class UploadResult:
    where: str
    plan: Plan
    outcomes: list[ShardOutcome] = field(default_factory=list)
    index_written: bool = False
    dry_run: bool = False
    seconds: float = 0.0
    pruned: list[str] = field(default_factory=list)

    @property
    def bytes_sent(self) -> int:
        return sum(o.sent for o in self.outcomes)

    def summary(self) -> str:
        if self.dry_run:
            return f"{self.where}: dry run, nothing sent"
        n = sum(1 for o in self.outcomes if o.done)
        rate = self.bytes_sent / self.seconds / 1e6 if self.seconds > 0 else 0.0
        skipped = sum(1 for s in self.plan.steps if s.action == "skip")
        return (f"{self.where}: {n} shard{'' if n == 1 else 's'} sent and verified "
                f"({human(self.bytes_sent)}, {rate:.1f} MB/s), "
                f"{skipped} already there" + ("; index.json updated" if self.index_written else "")
                + (f"; pruned {len(self.pruned)} old shard file(s)" if self.pruned else ""))


class RateLimit:
    """Token bucket for --bwlimit (be polite on a shared login node)."""

    def __init__(self, bytes_per_s: int):
        self.bps = float(bytes_per_s)
        self.t0 = time.monotonic()
        self.n = 0

    def __call__(self, nbytes: int) -> None:
        ahead = self.n / self.bps - (time.monotonic() - self.t0)
        if ahead > 0:
            time.sleep(ahead)
        self.n += nbytes


# ---------------------------------------------------------------------------
# the upload (the pre-flight reads are in transfer.preflight)
# ---------------------------------------------------------------------------


def upload(remote: Remote, out_dir: str | Path, *, margin: str | int = DEFAULT_MARGIN, dry_run: bool = False,
           bwlimit: int | None = None, config_quota: str | None = None, use_compressed: bool = True,
           progress: bool | None = None, on_event: Event | None = None,
           log: Callable[[str], None] | None = None, prune: bool = False, streams: int | None = None) -> UploadResult:
    """Upload `out_dir` (index.json + shards) to `remote.root`. Raises QuotaError (exit 3)
    before sending when the plan does not fit, DiskFullError (exit 1) when the disk fills
    mid-way, RemoteError (exit 4) on connection loss or while another upload holds the
    remote lock (transfer.lock), UnsafeShardError for unsafe tars. Shards are content-
    named, so shards of an older pack stay until `prune` removes them (after the new
    index.json is in place: a job reading the old index never loses a file).
    `streams`: shards in flight at once (default and maximum: `remote.streams`, what the
    transport can do; 1 under `bwlimit`)."""
    say = log or _default_log
    lock = UploadLock(remote, say)
    if not dry_run and remote.exists(""):
        lock.acquire()  # before the plan: no other upload changes what it is based on
    try:
        result = _upload(remote, Path(out_dir), lock, margin, dry_run, bwlimit, config_quota, use_compressed,
                         progress, on_event or (lambda kind, **kw: None), say, streams)
        if prune and not dry_run:
            result.pruned = prune_unlisted(remote, {s.item.name for s in result.plan.steps})
        return result
    finally:
        lock.release()


def _upload(remote: Remote, out_dir: Path, lock: UploadLock, margin: str | int, dry_run: bool,
            bwlimit: int | None, config_quota: str | None, use_compressed: bool, progress: bool | None,
            event: Event, say: Callable[[str], None], streams: int | None = None) -> UploadResult:
    t0 = time.monotonic()
    where = f"{remote.label}:{remote.root}"
    plan, index_bytes, state, fresh = prepare(remote, out_dir, margin=margin, use_compressed=use_compressed,
                                              config_quota=config_quota)
    result = UploadResult(where, plan, dry_run=dry_run)
    event("plan", plan=plan)
    if dry_run:
        return result
    if plan.sends and not plan.fits:
        raise QuotaError(plan.refusal(where))

    # --- from here on we write -------------------------------------------------
    remote.mkdir()
    lock.acquire()  # a no-op when taken before the plan
    state.update(fresh)
    throttle = RateLimit(bwlimit) if bwlimit else None
    bar = progress_mod.bar(plan.bytes_to_send, "upload", enabled=progress, bytes_=True)
    verified = [s for s in plan.steps if s.action == "skip"]
    ctx = _Ctx(remote, out_dir, bar, throttle, say, event, verified, plan, where)
    streams = 1 if throttle else max(1, min(streams or remote.streams, remote.streams))
    try:
        _send_all(ctx, result, streams)
    finally:
        bar.close()
        _save_state(remote, state, [s for s in verified if s.action != "skip"], fresh)

    if write_index(remote, index_bytes, plan, where):
        result.index_written = True
        event("index_written")
    result.seconds = time.monotonic() - t0
    return result


def _send_all(ctx: _Ctx, result: UploadResult, streams: int) -> None:
    """Send, verify and rename every planned shard, `streams` at a time.

    One stream (Fabric: its one SFTP session is not shared between threads; or
    --bwlimit): shard i is hashed on the remote (its own channel) while shard i+1
    is sent, and renamed by this thread. Several (OpenSSH): each sender thread
    takes a shard through send, remote sha256 (its own long-lived hasher) and
    rename, so the round trips of one shard overlap the bytes of the others.
    Failures surface in shard order; a full disk removes every partial file."""
    remote, plan = ctx.remote, ctx.plan
    senders: Any = _Inline() if streams == 1 else ThreadPoolExecutor(streams, thread_name_prefix="send")
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="remote-sha256")
    hashers: dict[int, RemoteHasher] = {}  # one per thread: each is used by its thread only
    here = getattr(remote, "sha256_here", None)  # OpenSSH: on the thread's own receiver channel

    def remote_hash(path: str) -> tuple[str, int | None]:
        if here is not None:
            return here(path)
        h = hashers.get(threading.get_ident())
        if h is None:
            h = hashers[threading.get_ident()] = RemoteHasher(remote)
        return h.sha256(path)

    def ship(step: Step, outcome: ShardOutcome) -> Future | None:
        _transmit(ctx, step, outcome)
        part = step.item.send_name + PART
        if streams == 1:
            return pool.submit(remote_hash, part)  # finished by the caller after the next send
        digest: Future = Future()
        digest.set_result(remote_hash(part))
        ctx.guard(step, outcome, partial(_finish, ctx, step, outcome, digest))
        return None

    todo = deque(plan.sends)
    inflight: deque[tuple[Step, ShardOutcome, Future]] = deque()
    try:
        while todo or inflight:
            while todo and len(inflight) <= streams and not any(_failed(f) for _, _, f in inflight):
                step = todo.popleft()
                outcome = ShardOutcome(step.item.name, step.action)
                result.outcomes.append(outcome)
                ctx.bar.set_postfix_str(step.item.name[-40:], refresh=False)
                ctx.event("shard_start", name=step.item.name, step=step)
                inflight.append((step, outcome, senders.submit(ship, step, outcome)))
            step, outcome, fut = inflight.popleft()
            try:
                digest = fut.result()
            except DiskFullError:
                _settle(inflight)
                _remove_parts(remote, [s for s, _, _ in inflight])
                raise
            except (OSError, RemoteError) as e:
                _settle(inflight)
                handle_failure(remote, step, outcome.resumed_from + outcome.sent, e, ctx.verified, plan, ctx.where,
                               [s for s, _, _ in inflight])
                raise
            if digest is not None:
                ctx.guard(step, outcome, partial(_finish, ctx, step, outcome, digest))
    finally:
        _settle(inflight)
        senders.shutdown(wait=True)
        pool.shutdown(wait=True)
        for h in hashers.values():
            h.close()


def _remove_parts(remote: Remote, steps: list[Step]) -> None:
    for s in steps:
        try:
            remote.remove(s.item.send_name + PART)
        except (RemoteError, OSError):
            pass


def prune_unlisted(remote: Remote, keep: set[str]) -> list[str]:
    """Remove shard files (.tar / .tar.zst) the current remote index.json does not name;
    returns their names. Only after index.json names the new shards: a job started on
    the old index may still be reading the old ones, so this runs only when asked."""
    gone = sorted(n for n, st in remote.listdir().items()
                  if not st.is_dir and n.endswith((".tar", ".tar.zst")) and n not in keep)
    for n in gone:
        remote.remove(n)
    if gone:
        state = read_state(remote)
        write_state(remote, {k: v for k, v in state.items() if k not in gone})
    return gone


@dataclass
class _Ctx:
    """What every per-shard step needs (keeps the signatures short)."""

    remote: Remote
    out_dir: Path
    bar: Any
    throttle: RateLimit | None
    say: Callable[[str], None]
    event: Event
    verified: list[Step]
    plan: Plan
    where: str

    def guard(self, step: Step, outcome: ShardOutcome, fn: Callable[[], None]) -> None:
        """Run fn; a failed write becomes DiskFullError / RemoteError with the numbers."""
        try:
            fn()
        except (OSError, RemoteError) as e:
            handle_failure(self.remote, step, outcome.resumed_from + outcome.sent, e, self.verified, self.plan,
                           self.where)
            raise


def _save_state(remote: Remote, state: dict, done: list[Step], fresh: dict) -> None:
    """Record size/signature/sha256 of what was verified this run: one stat pass, one write.
    Best effort: the state is only a cache (a lost one costs re-hashing on the remote)."""
    if not done and not fresh:
        return
    try:
        sigs = signatures(remote)
        for s in done:
            sig = sigs.get(s.item.name)
            if sig is not None:
                state[s.item.name] = {"size": int(sig.split(":")[0]), "sig": sig, "sha256": s.item.sha256}
            else:
                state.pop(s.item.name, None)
        write_state(remote, state)
    except (RemoteError, OSError):
        pass


def _transmit(ctx: _Ctx, step: Step, outcome: ShardOutcome, from_zero: bool = False) -> None:
    """Get the complete send file into NAME.part on the remote (resuming when the part is good)."""
    remote, it = ctx.remote, step.item
    local = ctx.out_dir / it.send_name
    part = it.send_name + PART
    offset = 0
    if not from_zero:
        have = step.part_bytes
        if it.compressed and have and remote.stat(it.send_name) is not None:
            remote.rename(it.send_name, part)  # sent earlier, not unpacked yet: verify it like a .part
        if 0 < have <= it.send_bytes:
            have = remote.size(part) or 0
        if 0 < have <= it.send_bytes:
            if sha256(remote, part) == sha256_file(local, limit=have):
                offset = have
            else:
                ctx.say(f"{it.send_name}: the partial upload on the remote does not match the local file; "
                        f"starting over")
                outcome.restarted = True
                ctx.event("corrupt_part", name=it.send_name, bytes=have)
        outcome.resumed_from = offset
        if offset != step.part_bytes and step.part_bytes <= it.send_bytes:
            ctx.bar.total = (ctx.bar.total or 0) + step.part_bytes - offset  # the plan counted on that part

    def moved(n: int) -> None:
        outcome.sent += n
        with _BAR_LOCK:
            ctx.bar.update(n)

    ctx.remote.put(local, part, offset, callback=moved, throttle=ctx.throttle)


def _check_size(remote: Remote, part: str, size: int | None, expected: int) -> None:
    """NFS may report a full disk only at close, which SFTP servers may not relay: a
    short file is a failed write (judged by handle_failure), not a hash mismatch."""
    if size is None:
        size = remote.size(part)
    if size != expected:
        raise OSError(f"{part} has {size} bytes on the remote after sending {expected}")


def _finish(ctx: _Ctx, step: Step, outcome: ShardOutcome, digest_future: Future) -> None:
    """Verify (retry once from zero on a mismatch), rename into place, unpack a .tar.zst."""
    remote, it = ctx.remote, step.item
    part = it.send_name + PART
    digest, size = digest_future.result()
    _check_size(remote, part, size, it.send_bytes)
    if digest != it.send_sha256:
        ctx.event("verify_mismatch", name=it.send_name, attempt=1, got=digest)
        ctx.say(f"{it.send_name}: sha256 on the remote does not match; sending it again from the start")
        outcome.retried = True
        ctx.bar.total = (ctx.bar.total or 0) + it.send_bytes
        _transmit(ctx, step, outcome, from_zero=True)
        _check_size(remote, part, None, it.send_bytes)
        digest = sha256(remote, part)
        if digest != it.send_sha256:
            ctx.event("verify_mismatch", name=it.send_name, attempt=2, got=digest)
            remote.remove(part)
            raise RemoteError(f"{remote.label}: {it.send_name} arrived with sha256 {digest[:12]}... twice instead of "
                              f"{it.send_sha256[:12]}...; removed it. Check the local file (`sha256sum`) and the "
                              f"network, then rerun")
    remote.rename(part, it.send_name)
    if it.compressed:
        _unpack(remote, it)
    outcome.done = True
    ctx.verified.append(step)
    ctx.event("shard_done", name=it.name, outcome=outcome)


def _unpack(remote: Remote, it: Item) -> None:
    argv, stdin = unpack.remote_call("unpack", remote.path(it.send_name), remote.path(it.name), it.sha256)
    res = remote.run(argv, stdin=stdin)
    if res.ok:
        return
    msg = (res.stderr.strip().splitlines() or ["no message"])[-1]
    if res.returncode == unpack.EXIT_UNSAFE:
        remote.remove(it.send_name)
        raise UnsafeShardError(f"{remote.label}: {it.send_name}: refused to unpack: {msg}; removed it. "
                               f"Re-pack this session with `packer pack`")
    if res.returncode == unpack.EXIT_MISMATCH:
        remote.remove(it.send_name)
        raise ShardshipError(f"{remote.label}: {it.send_name}: {msg}: the local .tar.zst and index.json disagree; "
                             f"re-run `packer pack`", code=Exit.PARTIAL)
    raise RemoteError(f"{remote.label}: unpacking {it.send_name} failed (exit {res.returncode}): {msg}")


class _Inline:
    """An executor that runs each task at once in the caller's thread (one stream)."""

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        fut: Future = Future()
        try:
            fut.set_result(fn(*args))
        except BaseException as e:  # noqa: B036 (handed to the caller through the future, as a pool does)
            if not isinstance(e, Exception):
                raise
            fut.set_exception(e)
        return fut

    def shutdown(self, wait: bool = True) -> None:
        pass


def _failed(fut: Future) -> bool:
    return fut.done() and not fut.cancelled() and fut.exception() is not None


def _settle(inflight: deque[tuple[Step, ShardOutcome, Future]]) -> None:
    """Cancel the sends not started; wait for the running ones (their errors are theirs)."""
    for _, _, fut in inflight:
        if not fut.cancel():
            try:
                digest = fut.result()
                if digest is not None:
                    digest.result()
            except Exception:  # noqa: S110 (the first failure is the one reported)
                pass


def _default_log(msg: str) -> None:
    from tqdm import tqdm

    tqdm.write(msg, file=sys.stderr)
