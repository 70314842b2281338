"""What an upload does when the remote disk fills up or the connection drops.

Kept apart from the send loop (transfer.upload) because the rules are the
same wherever the failure shows (a shard's data, its rename, index.json):
a dropped connection keeps every `.part` for the rerun to resume; a full disk
removes the partial file(s), keeps every verified shard and says how much must
be freed; index.json is never updated after a failure.
"""
from __future__ import annotations

import errno
from collections.abc import Sequence
from typing import Any

from shardship.errors import Exit, RemoteError, ShardshipError
from shardship.units import human
from transfer.manifest import INDEX, PART
from transfer.plan import Plan, Step
from transfer.quota import live_quota
from transfer.remote import Remote

NO_SPACE = {errno.ENOSPC, errno.EDQUOT}


class DiskFullError(ShardshipError):
    """The remote filled up mid-upload: verified shards are kept, exit code 1."""

    code = Exit.PARTIAL


def write_index(remote: Remote, index_bytes: bytes, plan: Plan, where: str) -> bool:
    """index.json last (atomic: temp file + rename); False when the remote one is already it.
    A full disk here is the same one-line DiskFullError (exit 1) as mid-shard."""
    current = None
    if remote.stat(INDEX) is not None:
        try:
            current = remote.read_file(INDEX)
        except RemoteError:
            current = None
    if current == index_bytes:
        return False
    try:
        remote.write_file(INDEX, index_bytes)
    except (OSError, RemoteError) as e:
        if not alive(remote):
            raise RemoteError(f"{where}: connection lost while writing index.json ({e}); "
                              f"rerun to finish (the shards are verified)") from None
        q = quota_or_none(remote)
        head = q.headroom_bytes if q is not None else None
        if not (says_no_space(e) or (head is not None and head < len(index_bytes) + 1024 * 1024)):
            if isinstance(e, RemoteError):
                raise
            raise RemoteError(f"{where}: writing index.json failed: {e}; rerun") from None
        n = len(plan.steps)
        raise DiskFullError(
            f"{where}: remote disk full while writing index.json: kept {n} verified shards "
            f"({human(sum(s.item.bytes for s in plan.steps))}); {human(max(head or 0, 0))} free now "
            f"({q.describe() if q else 'quota unknown'}); index.json not updated (a job there still sees the "
            f"previous dataset, if any). Free at least 1 MB on the cluster and rerun"
        ) from None
    return True


def says_no_space(err: Exception) -> bool:
    return getattr(err, "errno", None) in NO_SPACE or "No space left" in str(err) or "quota" in str(err).lower()


def quota_or_none(remote: Remote) -> Any:
    try:
        return live_quota(remote, remote.root)
    except (RemoteError, OSError):
        return None


def handle_failure(remote: Remote, step: Step, written: int, err: Exception, verified: list[Step], plan: Plan,
                   where: str, others: Sequence[Step] = ()) -> None:
    """Turn a failed write into the right error. Disk full: drop the .part (and those of
    `others`, the shards that were in flight beside it), keep the verified shards.
    `written`: bytes of this shard in its .part (for the message)."""
    if not alive(remote):
        raise RemoteError(f"{where}: connection lost while sending {step.item.send_name} ({err}); "
                          f"rerun to resume from the partial file") from None
    it = step.item
    q = quota_or_none(remote)
    try:
        in_part = remote.size(it.send_name + PART) or 0
    except (RemoteError, OSError):
        in_part = 0
    no_space = says_no_space(err)
    head = q.headroom_bytes if q is not None else None
    # SFTP reports ENOSPC as a bare "Failure": judge by the space left (the .part goes away)
    if not no_space and head is not None and (head < 1024 * 1024 or head + in_part < it.send_bytes + 64 * 1024):
        no_space = True
    if not no_space:
        if isinstance(err, RemoteError):
            return  # re-raised by the caller as is
        raise RemoteError(f"{where}: writing {it.send_name} failed: {err}") from None
    for name in (it.send_name + PART, "." + it.name + ".unpack.tmp", *(o.item.send_name + PART for o in others)):
        try:
            remote.remove(name)
        except (RemoteError, OSError):
            pass
    if it.compressed:
        try:
            if remote.stat(it.send_name) is not None and remote.stat(it.name) is None:
                remote.remove(it.send_name)
        except (RemoteError, OSError):
            pass
    kept = len(verified)
    kept_bytes = sum(s.item.bytes for s in verified)
    remaining = [s for s in plan.sends if s not in verified]
    need = sum(s.item.bytes for s in remaining)
    after = live_quota(remote, remote.root) if q is not None else None
    free = after.headroom_bytes if after is not None else None
    raise DiskFullError(
        f"{where}: remote disk full while sending {it.send_name} "
        f"({human(written)} of {human(it.send_bytes)} written): removed the partial file; "
        f"kept {kept} verified shards ({human(kept_bytes)}); {len(remaining)} shards ({human(need)}) not sent; "
        f"{human(max(free or 0, 0))} free now ({after.describe() if after else 'quota unknown'}); "
        "index.json not updated. "
        f"Free at least {human(max(need - (free or 0), 0))} on the cluster and rerun"
    ) from None


def alive(remote: Remote) -> bool:
    """False when an SSH remote's connection has dropped (a local one is always there)."""
    return bool(getattr(remote, "alive", True))
