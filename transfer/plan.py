"""What an upload will do and whether it fits: pure functions, no I/O.

Delta: a shard is skipped only when the remote has a file of that name with
the same size AND sha256; otherwise it is sent (or resumed from a `.part`).
Peak: shards go one at a time, so the worst moment is while one shard's
`.part` sits next to the file it replaces, or, for a `.tar.zst`, while the
compressed file and the unpacked `.tar` both exist. The plan fits when that
peak stays under the quota minus a safety margin (and under the filesystem's
free space), and the inode count fits too. Over: nothing is sent.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from shardship.errors import ShardshipError
from shardship.units import human, parse_size
from transfer.manifest import ShardFile
from transfer.quota import Quota

BLOCK = 4096  # allocation rounding per file (tmpfs, ext4, xfs); generous for small files
BOOKKEEPING = 64 * 1024  # remote state file + temp copies
DEFAULT_MARGIN = "5%"


@dataclass(frozen=True)
class Item:
    """A shard as sent: `send_*` is the file that travels (the .tar.zst when compressed)."""

    name: str
    bytes: int
    sha256: str
    send_name: str
    send_bytes: int
    send_sha256: str

    @property
    def compressed(self) -> bool:
        return self.send_name != self.name

    @classmethod
    def of(cls, shard: ShardFile, use_compressed: bool) -> Item:
        c = shard.compressed if use_compressed else None
        if c is None:
            return cls(shard.name, shard.bytes, shard.sha256, shard.name, shard.bytes, shard.sha256)
        return cls(shard.name, shard.bytes, shard.sha256, c.name, c.bytes, c.sha256)


@dataclass(frozen=True)
class RemoteEntry:
    size: int
    sha256: str | None  # None: not hashed (only possible when the size already differs)


@dataclass(frozen=True)
class Step:
    item: Item
    action: str  # "skip" | "send" | "resume" | "replace"
    part_bytes: int = 0  # bytes of an existing NAME.part (already counted in the remote usage)
    old_bytes: int = 0  # size of the remote file this shard replaces

    @property
    def to_send(self) -> int:
        """Bytes to send when the existing .part turns out good (the usual case)."""
        if self.action == "skip":
            return 0
        return self.item.send_bytes - (self.part_bytes if self.part_bytes <= self.item.send_bytes else 0)


@dataclass(frozen=True)
class Plan:
    steps: list[Step]
    quota: Quota | None
    margin_bytes: int
    peak_bytes: int  # most extra bytes above today's usage at any moment
    final_bytes: int  # extra bytes once everything is done
    allowed_bytes: int | None  # extra bytes we may add: headroom minus margin (None: unknown)
    new_inodes: int  # extra files at the peak
    index_bytes: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def sends(self) -> list[Step]:
        return [s for s in self.steps if s.action != "skip"]

    @property
    def bytes_to_send(self) -> int:
        return sum(s.to_send for s in self.steps)

    @property
    def fits_space(self) -> bool:
        return self.allowed_bytes is None or self.peak_bytes <= self.allowed_bytes

    @property
    def fits_inodes(self) -> bool:
        h = self.quota.inode_headroom if self.quota else None
        return h is None or self.new_inodes <= h

    @property
    def fits(self) -> bool:
        return self.fits_space and self.fits_inodes

    def refusal(self, where: str) -> str:
        """The one-line reason an over-quota plan is refused, with the numbers and what to do."""
        q = self.quota
        if not self.fits_space:
            head = q.headroom_bytes if q else None
            return (
                f"{where}: upload would exceed the quota: needs {human(self.peak_bytes)} at peak "
                f"({human(self.bytes_to_send)} to send in {len(self.sends)} shards"
                + (", incl. unpacking .tar.zst" if any(s.item.compressed for s in self.sends) else "")
                + f"), but only {human(max(self.allowed_bytes or 0, 0))} may be added "
                f"({human(max(head or 0, 0))} free - {human(self.margin_bytes)} safety margin; "
                f"{q.describe() if q else 'no quota info'}). Nothing was sent. Free space on the cluster, "
                f"make the data smaller (packer: lower JPEG quality, larger frame stride, fewer sessions), "
                f"or lower --margin"
            )
        return (
            f"{where}: upload needs {self.new_inodes} more files but only {q.inode_headroom if q else '?'} "
            f"are left ({q.describe() if q else ''}). Nothing was sent. Delete files on the cluster "
            f"or pack into fewer, larger shards (packer shard_bytes)"
        )

    def lines(self) -> list[str]:
        """Human-readable plan (`--dry-run`)."""
        out = []
        for s in self.steps:
            it = s.item
            what = {"skip": "up to date", "send": "send", "resume": f"resume at {human(s.part_bytes)}",
                    "replace": f"replace ({human(s.old_bytes)} there differs)"}[s.action]
            via = f" as {it.send_name} ({human(it.send_bytes)}), unpack" if it.compressed and s.action != "skip" else ""
            out.append(f"  {it.name:<40} {human(it.bytes):>10}  {what}{via}")
        out.append(
            f"  {len(self.sends)} of {len(self.steps)} shards to send, {human(self.bytes_to_send)}; "
            f"peak +{human(self.peak_bytes)}, final +{human(self.final_bytes)}"
        )
        if self.quota is not None:
            out.append(f"  remote: {self.quota.describe()}; margin {human(self.margin_bytes)}; "
                       + ("fits" if self.fits else "DOES NOT FIT"))
        out.extend(f"  note: {n}" for n in self.notes)
        return out


def parse_margin(text: str | int, limit: int | None) -> int:
    """'5%' of the quota limit, or a size ('200M'); 0 disables."""
    if isinstance(text, int):
        return text
    t = str(text).strip()
    if t.endswith("%"):
        try:
            pct = float(t[:-1])
        except ValueError:
            raise ShardshipError(f"--margin {text!r}: use a percentage like 5% or a size like 200M") from None
        return int(math.ceil(pct / 100.0 * limit)) if limit else 0
    return parse_size(t)


def decide(item: Item, remote: dict[str, RemoteEntry], parts: dict[str, int]) -> Step:
    """Skip / send / resume / replace for one shard."""
    have = remote.get(item.name)
    part = parts.get(item.send_name, 0)
    if have is not None and have.size == item.bytes and have.sha256 == item.sha256:
        return Step(item, "skip")
    old = have.size if have is not None else 0
    if have is not None:
        return Step(item, "replace", part_bytes=part, old_bytes=old)
    if 0 < part <= item.send_bytes:
        return Step(item, "resume", part_bytes=part)
    return Step(item, "send", part_bytes=part)


def _rounded(n: int) -> int:
    return ((n + BLOCK - 1) // BLOCK) * BLOCK


def peak_profile(steps: list[Step], index_bytes: int) -> tuple[int, int, int]:
    """(peak extra bytes, final extra bytes, peak extra files) for shards sent in order."""
    running = peak = 0
    files = peak_files = 0
    for s in steps:
        if s.action == "skip":
            continue
        it = s.item
        during = running + _rounded(it.send_bytes) - _rounded(s.part_bytes)  # .part grown to full size
        if it.compressed:
            during += _rounded(it.bytes)  # .tar being unpacked next to the .tar.zst (and the old .tar)
        peak = max(peak, during)
        peak_files = max(peak_files, files + 2)  # .part / unpack temp
        running += _rounded(it.bytes) - _rounded(s.old_bytes) - _rounded(s.part_bytes)
        if s.old_bytes == 0:
            files += 1
    # index.json: temp copy next to the old one, then the old one goes
    peak = max(peak, running + 2 * _rounded(index_bytes) + BOOKKEEPING)
    final = running + _rounded(index_bytes) + BOOKKEEPING
    peak_files = max(peak_files, files + 3)
    return peak, final, peak_files


def build_plan(shards: list[Item], remote: dict[str, RemoteEntry], parts: dict[str, int], quota: Quota | None,
               margin: str | int = DEFAULT_MARGIN, index_bytes: int = 0) -> Plan:
    """The whole pre-flight: delta, peak usage and the verdict."""
    steps = [decide(it, remote, parts) for it in shards]
    peak, final, files = peak_profile(steps, index_bytes)
    margin_bytes = parse_margin(margin, quota.limit_bytes if quota else None)
    head = quota.headroom_bytes if quota else None
    allowed = None if head is None else head - margin_bytes
    return Plan(steps, quota, margin_bytes, peak, final, allowed, files, index_bytes)
