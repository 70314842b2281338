"""`transfer status`: what is local, what is remote, what is verified, what is missing.

Cheap by default (one listing + the remote bookkeeping file: a shard counts as
verified when the sha256 recorded at upload still matches the local index and
the file's signature, size/mtime/ctime/inode (transfer.signature), is unchanged). `verify=True` re-hashes every remote
shard on the remote instead and decides with `shardship.format.check.check_files`,
the same check `packer verify` runs locally, for the local index and for the
remote index.json (what a job there reads).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from shardship.format import index
from shardship.format.check import Problem, check_files
from shardship.hashing import sha256_file
from shardship.units import human
from transfer.hashing import sha256_many
from transfer.manifest import INDEX, PART, REMOTE_STATE, ShardFile, load_local, local_file
from transfer.preflight import read_state
from transfer.quota import Quota, live_quota
from transfer.remote import FileStat, Remote
from transfer.signature import signatures, trusted


@dataclass
class ShardStatus:
    name: str
    bytes: int
    local: bool  # the local file (or its .tar.zst) is there with the right size
    remote_bytes: int | None  # None: not on the remote
    verified: bool  # remote sha256 == index sha256
    part_bytes: int = 0  # a partial upload waiting to be resumed

    @property
    def state(self) -> str:
        if self.verified:
            return "verified"
        if self.remote_bytes is not None:
            return "differs" if self.remote_bytes == self.bytes else "incomplete"
        if self.part_bytes:
            return f"partial ({human(self.part_bytes)})"
        return "missing"


@dataclass
class StatusReport:
    where: str
    shards: list[ShardStatus] = field(default_factory=list)
    remote_only: list[str] = field(default_factory=list)
    index_local: bool = False
    index_remote: str = "missing"  # "missing" | "same" | "differs"
    quota: Quota | None = None
    remote_dataset: list[str] | None = None  # --verify: problems of the remote index.json's own files

    @property
    def complete(self) -> bool:
        return bool(self.shards) and all(s.verified for s in self.shards) and self.index_remote == "same"

    def incomplete(self) -> str | None:
        """Why the remote does not hold this pack yet, in one line; None when it does (or
        there is no local index.json to hold it to). `transfer status` exits 1 (Exit.PARTIAL)
        with it: scripted as `transfer status && sbatch ...`, exit 0 said "ready" while
        shards were missing, and the job then failed on the cluster."""
        if not self.index_local:
            return None
        bad = [s for s in self.shards if not s.verified]
        parts = []
        if bad:
            names = ", ".join(f"{s.name} ({s.state})" for s in bad[:3]) + (" ..." if len(bad) > 3 else "")
            parts.append(f"{len(bad)} of {len(self.shards)} shards not verified on the remote: {names}")
        if self.index_remote != "same":
            parts.append(f"the remote index.json is {self.index_remote}")
        if self.remote_dataset:
            parts.append(f"the remote index.json names {len(self.remote_dataset)} missing or damaged files")
        if not parts:
            return None
        return f"{self.where}: incomplete: {'; '.join(parts)}; run `transfer upload` to finish"

    def lines(self) -> list[str]:
        out = [f"{self.where}"]
        for s in self.shards:
            out.append(f"  {s.name:<44} {human(s.bytes):>10}  local:{'yes' if s.local else 'NO ':<3}  {s.state}")
        n_ok = sum(s.verified for s in self.shards)
        out.append(f"  {n_ok}/{len(self.shards)} shards verified on the remote; "
                   f"{sum(1 for s in self.shards if not s.verified)} missing or different; "
                   f"remote index.json: {self.index_remote}")
        if self.remote_only:
            out.append(f"  on the remote only: {', '.join(self.remote_only[:5])}"
                       + (" ..." if len(self.remote_only) > 5 else ""))
        if self.remote_dataset is not None:
            out.append("  remote dataset (its index.json + shards): " + (
                "consistent" if not self.remote_dataset else
                f"{len(self.remote_dataset)} problems: " + "; ".join(self.remote_dataset[:3])
                + (" ..." if len(self.remote_dataset) > 3 else "") + "; rerun `transfer upload`"))
        if self.quota is not None:
            out.append(f"  quota: {self.quota.describe()}")
        return out


def status(remote: Remote, out_dir: str | Path, *, verify: bool = False, with_quota: bool = True) -> StatusReport:
    out_dir = Path(out_dir)
    report = StatusReport(f"{remote.label}:{remote.root}")
    shards: list[ShardFile] = []
    index_bytes = None
    if (out_dir / INDEX).is_file():
        index_bytes, shards = load_local(out_dir)
        report.index_local = True
    listing = remote.listdir()
    state = read_state(remote) if REMOTE_STATE in listing else {}
    names = [s.name for s in shards if s.name in listing and not listing[s.name].is_dir]
    bad: set[str] = set()
    if verify and index_bytes is not None:
        bad = {p.name for p in remote_problems(remote, index.parse(index_bytes, str(out_dir / INDEX)), listing)}
    sigs = signatures(remote) if (state and names and not verify) else {}
    for s in shards:
        st = listing.get(s.name)
        have_local = local_file(out_dir, s.ref) is not None or (
            s.compressed is not None and local_file(out_dir, s.compressed) is not None)
        if st is None or st.is_dir:
            send = s.compressed.name if s.compressed else s.name
            part = listing.get(send + PART) or listing.get(s.name + PART)
            report.shards.append(ShardStatus(s.name, s.bytes, have_local, None, False, part.size if part else 0))
            continue
        if verify:
            ok = s.name not in bad
        else:
            ok = trusted(state.get(s.name), sigs.get(s.name), s.sha256)
        report.shards.append(ShardStatus(s.name, s.bytes, have_local, st.size, ok))
    local_names = {s.name for s in shards} | {s.compressed.name for s in shards if s.compressed}
    report.remote_only = sorted(n for n in listing if n.endswith((".tar", ".tar.zst")) and n not in local_names)
    if INDEX in listing:
        remote_index = remote.read_file(INDEX)
        report.index_remote = "same" if remote_index == index_bytes else "differs"
        if verify:  # what a job on the cluster reads: the remote index.json and the files next to it
            where = f"{remote.label}:{remote.path(INDEX)}"
            theirs = index.parse(remote_index, where, fix=index.REUPLOAD)  # the fix is an upload, not a re-pack
            report.remote_dataset = [str(p) for p in remote_problems(remote, theirs, listing)]
    if with_quota:
        report.quota = live_quota(remote, remote.root)
    return report


def remote_problems(remote: Remote, idx: index.Index, listing: dict[str, FileStat]) -> list[Problem]:
    """shardship.format.check_files on the remote files: sizes from the listing, sha256
    computed on the remote in batches (only for files whose size is right)."""
    sizes = {n: st.size for n, st in listing.items() if not st.is_dir}
    want = [sh.name for sh in idx.shards if sizes.get(sh.name) == sh.bytes]
    hashes = sha256_many(remote, want) if want else {}
    return check_files(idx, sizes, lambda name: hashes[remote.path(name)])


def local_verify(out_dir: Path, shards: list[ShardFile]) -> list[str]:
    """Names of local shards whose sha256 differs from the index (for `status --verify`)."""
    bad = []
    for s in shards:
        p = local_file(out_dir, s.ref)
        if p is not None and sha256_file(p) != s.sha256:
            bad.append(s.name)
    return bad
