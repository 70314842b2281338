"""The reads before an upload sends a byte: the local index, what the remote already
holds (verified by hash, cached in the remote state file), the live quota, and the
plan that says what goes and whether it fits. Nothing here writes except
`write_state`, which `transfer.upload` calls after verifying."""
from __future__ import annotations

import json
import tarfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from shardship.errors import Exit, RemoteError, ShardshipError
from shardship.format import index
from shardship.units import parse_size
from transfer import unpack
from transfer.hashing import sha256_many
from transfer.manifest import INDEX, PART, REMOTE_STATE, ShardFile, load_local, local_file
from transfer.plan import DEFAULT_MARGIN, Item, Plan, RemoteEntry, build_plan
from transfer.quota import Quota, live_quota
from transfer.remote import Remote
from transfer.signature import signatures, trusted


class UnsafeShardError(ShardshipError):
    """A shard's tar has members that could write outside their directory."""

    code = Exit.PARTIAL



# ---------------------------------------------------------------------------
# remote bookkeeping
# ---------------------------------------------------------------------------


def read_state(remote: Remote) -> dict[str, dict[str, Any]]:
    """{name: {size, sig, sha256}} of files verified earlier (sig: transfer.signature; {} when absent)."""
    if remote.stat(REMOTE_STATE) is None:
        return {}
    try:
        obj = json.loads(remote.read_file(REMOTE_STATE))
        files = obj.get("files", {})
        return {k: v for k, v in files.items() if isinstance(v, dict)}
    except (ValueError, RemoteError, OSError):
        return {}  # a damaged state only costs re-hashing on the remote


def write_state(remote: Remote, state: dict[str, dict[str, Any]]) -> None:
    data = json.dumps({"format": "shardship-remote-state", "version": 1, "files": state}, indent=0).encode()
    remote.write_file(REMOTE_STATE, data)


def remote_entries(
    remote: Remote, items: list[Item], listing: dict, state: dict
) -> tuple[dict[str, RemoteEntry], dict]:
    """What the remote holds for each shard; hashes (on the remote) only what the state
    file cannot vouch for and whose size matches. Returns (entries, new state rows)."""
    entries: dict[str, RemoteEntry] = {}
    to_hash: list[str] = []
    present = any(it.name in listing for it in items)
    sigs = signatures(remote) if present else {}  # before hashing: a later change moves the ctime
    for it in items:
        st = listing.get(it.name)
        if st is None or st.is_dir:
            continue
        known = state.get(it.name)
        if trusted(known, sigs.get(it.name)) and known is not None and known.get("size") == st.size:
            entries[it.name] = RemoteEntry(st.size, known.get("sha256"))
        elif st.size == it.bytes:
            to_hash.append(it.name)
        else:
            entries[it.name] = RemoteEntry(st.size, None)
    fresh: dict[str, dict[str, Any]] = {}
    if to_hash:
        hashes = sha256_many(remote, to_hash)
        for name in to_hash:
            digest = hashes[remote.path(name)]
            st = listing[name]
            entries[name] = RemoteEntry(st.size, digest)
            if sigs.get(name):
                fresh[name] = {"size": st.size, "sig": sigs[name], "sha256": digest}
    return entries, fresh


def remote_parts(items: list[Item], listing: dict) -> dict[str, int]:
    """{send_name: bytes already there}: NAME.part, or a complete NAME.tar.zst not yet unpacked."""
    parts: dict[str, int] = {}
    for it in items:
        st = listing.get(it.send_name + PART)
        if st is not None and not st.is_dir:
            parts[it.send_name] = st.size
        if it.compressed:
            done = listing.get(it.send_name)
            if done is not None and not done.is_dir:
                parts[it.send_name] = max(parts.get(it.send_name, 0), done.size)
    return parts


def remote_can_unzstd(remote: Remote) -> bool:
    argv, stdin = unpack.remote_call("probe")
    res = remote.run(argv, stdin=stdin)
    if not res.ok:
        return False
    try:
        return bool(json.loads(res.stdout).get("zstd"))
    except ValueError:
        return False


def apply_config_quota(q: Quota | None, configured: str | None, remote: Remote) -> Quota | None:
    """Combine the live answer with `quota = "10G"` from shardship.toml: the tighter limit
    wins. When only df answered (no per-user quota tool), df's "used" is the whole
    filesystem's, so usage comes from `du -sk` of the remote home instead."""
    if not configured or str(configured).lower() == "auto":
        return q
    limit = parse_size(configured)
    if q is not None and q.source != "df -P":
        return replace(q, limit_bytes=min(q.limit_bytes, limit) if q.limit_bytes else limit,
                       source=f"{q.source} + config {configured}")
    used = 0  # a home that does not exist yet (local:PATH) holds nothing
    if remote.stat(remote.home) is not None:
        res = remote.run(["du", "-sk", "--", remote.home])
        try:
            used = int(res.stdout.split()[0]) * 1024
        except (ValueError, IndexError):
            raise RemoteError(f"{remote.label}: cannot measure the usage of {remote.home} with du: "
                              f"{res.stderr.strip()[:200]}") from None
    return Quota(limit, used, None, None, f"config {configured} + du", avail_bytes=q.avail_bytes if q else None,
                 filesystem=q.filesystem if q else None)


def prepare(remote: Remote, out_dir: Path, *, margin: str | int = DEFAULT_MARGIN, use_compressed: bool = True,
            config_quota: str | None = None) -> tuple[Plan, bytes, dict, dict]:
    """Everything up to the verdict; reads only. Returns (plan, index bytes, state, fresh state rows)."""
    index_bytes, shards = load_local(out_dir)
    items = choose_items(remote, out_dir, shards, use_compressed)
    listing = remote.listdir()
    if INDEX in listing:
        check_remote_version(remote, index_bytes)
    state = read_state(remote) if REMOTE_STATE in listing else {}
    entries, fresh = remote_entries(remote, items, listing, state)
    parts = remote_parts(items, listing)
    quota = apply_config_quota(live_quota(remote, remote.root), config_quota, remote)
    plan = build_plan(items, entries, parts, quota, margin, len(index_bytes))
    check_tars(out_dir, plan)
    stale = sorted(n for n in listing if n.endswith(".tar") and n not in {i.name for i in items})
    if stale:
        plan.notes.append(f"{len(stale)} .tar files on the remote are not in the local index (kept for jobs still "
                          "reading an older index.json; --prune removes them): "
                          + ", ".join(stale[:3]) + (" ..." if len(stale) > 3 else ""))
    return plan, index_bytes, state, fresh


def check_remote_version(remote: Remote, index_bytes: bytes) -> None:
    """Refuse, before anything is sent, to replace the cluster's index.json with one of an
    older format: a newer shardship wrote it (another machine, a colleague), and silently
    swapping it would hand that one's jobs an index its reader may not expect."""
    try:
        v = index.version_of(remote.read_file(INDEX))
    except (RemoteError, OSError):
        return  # unreadable: the upload replaces it, as it replaces a damaged one
    ours = index.version_of(index_bytes)
    if v is not None and ours is not None and v > ours:
        raise ShardshipError(
            f"{remote.label}:{remote.path(INDEX)} is format version {v}, newer than this pack's ({ours}): a newer "
            f"shardship uploaded it. Upgrade shardship here and re-run `packer pack`, or upload into another "
            f"remote_dir; nothing was sent")


def check_tars(out_dir: Path, plan: Plan) -> None:
    """Refuse, before anything is sent, a plain .tar shard with members that could land
    outside their directory when someone runs `tar xf` on it (a .tar.zst is checked
    on the remote while it is unpacked)."""
    for step in plan.sends:
        if step.item.compressed:
            continue
        path = out_dir / step.item.name
        try:
            bad = unpack.check_tar_file(str(path))
        except (OSError, tarfile.TarError) as e:
            raise UnsafeShardError(f"{path}: not a readable tar ({e}); re-run `packer pack`") from None
        if bad is not None:
            raise UnsafeShardError(f"{path}: unsafe tar member {bad[0]!r} ({bad[1]}); nothing was sent. "
                                   f"Re-pack this session with `packer pack`")


def choose_items(remote: Remote, out_dir: Path, shards: list[ShardFile], use_compressed: bool) -> list[Item]:
    """Send the .tar.zst where we have it and the remote can unpack it, else the .tar."""
    have_zst = {s.name for s in shards if use_compressed and s.compressed and local_file(out_dir, s.compressed)}
    can = bool(have_zst) and remote_can_unzstd(remote)
    items = []
    for s in shards:
        # the .tar.zst only where it is there, smaller, and the remote can unpack it
        use_c = (can and s.name in have_zst and s.compressed is not None
                 and (s.compressed.bytes < s.bytes or local_file(out_dir, s.ref) is None))
        if not use_c and local_file(out_dir, s.ref) is None:
            why = (" (the remote cannot unpack the .tar.zst: install zstd there, or re-pack with compress = \"none\")"
                   if s.name in have_zst else "")
            raise ShardshipError(f"{Path(out_dir) / s.name}: missing or not {s.bytes} bytes as index.json says"
                                 f"{why}; re-run `packer pack`")
        items.append(Item.of(s, use_c))
    return items
