"""index.json -> flat numpy arrays, so a forked DataLoader worker shares the index
with its parent page-for-page.

A Python list of per-sample tuples would be touched by reference counting in every
worker and copied page by page (copy-on-write growth: RSS per worker climbs over an
epoch). Here every per-sample column is one numpy buffer; only per-shard and
per-session metadata (hundreds of entries, not millions) are Python objects."""
from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from packer.actions import split_runs
from shardship.errors import ShardshipError
from shardship.format import index as fmt


@dataclass
class ShardIndex:
    """The trainable samples of a packed directory, shard-major.

    Samples of shard `s` occupy the contiguous range `starts[s] : starts[s] + counts[s]`
    of every per-sample array; samples without an action chunk are left out."""

    root: Path
    # per shard (small)
    shard_names: list[str]
    shard_bytes: np.ndarray  # int64
    shard_sha256: list[str]
    shard_session: np.ndarray  # int32, into session_names
    # per sample (numpy only)
    shard: np.ndarray  # int32
    jpg_offset: np.ndarray  # int64
    jpg_size: np.ndarray  # int64
    json_offset: np.ndarray  # int64
    json_size: np.ndarray  # int64
    session: np.ndarray  # int32
    keys: np.ndarray  # fixed-width bytes ("S"), one buffer
    # place in the sample's run of consecutive posed frames of its session: frames
    # of the run before it (its obs window reaches that far back) and after it (its
    # action chunk is real for min(horizon, run_after) steps)
    run_before: np.ndarray  # int32
    run_after: np.ndarray  # int32
    # per session / dataset
    session_names: list[str]
    joints: list[str]
    action_dim: int
    horizon: int
    image_size: tuple[int, int]  # (width, height)
    stats: dict[str, Any] = field(default_factory=dict)
    pose_metric: bool = True
    # session -> what the phone recorded (index.json "content_key", packer.duplicates):
    # two names with one key are one recording, which split_sessions never splits
    session_content: dict[str, str] = field(default_factory=dict)
    # session -> its joints that read at all (index.json labels.joints_usable): a joint
    # that only ever read -1 is masked alone, in every sample of that session
    joints_usable: dict[str, list[bool]] = field(default_factory=dict)

    def joint_mask(self, samples: np.ndarray) -> np.ndarray:
        """(B, J) float32: 1 where the sample's session recorded that joint."""
        return self._joint_table[self.session[samples]]

    @functools.cached_property
    def _joint_table(self) -> np.ndarray:
        """(sessions, J) float32 of `joints_usable`, built once: joint_mask runs per batch."""
        table = np.ones((len(self.session_names), len(self.joints)), np.float32)
        for i, name in enumerate(self.session_names):
            use = self.joints_usable.get(name)
            if use is not None and len(use) == len(self.joints):
                table[i] = use
        return table

    @property
    def n_samples(self) -> int:
        return int(self.shard.shape[0])

    @property
    def n_shards(self) -> int:
        return len(self.shard_names)

    @property
    def proprio_dim(self) -> int:
        return len(self.joints)

    @property
    def counts(self) -> np.ndarray:
        """Samples per shard (int64)."""
        return np.bincount(self.shard, minlength=self.n_shards).astype(np.int64)

    @property
    def starts(self) -> np.ndarray:
        c = self.counts
        return np.concatenate([[0], np.cumsum(c)[:-1]]).astype(np.int64)

    def key(self, i: int) -> str:
        return self.keys[i].decode()

    def shard_path(self, s: int) -> Path:
        return self.root / self.shard_names[s]

    def fingerprint(self) -> str:
        """Identity of the sample set (shards' sha256 + counts): a checkpoint's reader
        position only means something for the same fingerprint."""
        h = hashlib.sha256()
        for name, sha, n in zip(self.shard_names, self.shard_sha256, self.counts.tolist(), strict=True):
            h.update(f"{name}:{sha}:{n}\n".encode())
        return h.hexdigest()[:16]

    def select_sessions(self, names: Sequence[str]) -> ShardIndex:
        """The sub-index of whole sessions (train/val split by session: one
        session's frames never land on both sides)."""
        want = {self.session_names.index(n) for n in names}
        keep_shards = np.array([int(s) in want for s in self.shard_session], dtype=bool)
        new_id = np.cumsum(keep_shards) - 1
        mask = keep_shards[self.shard]
        return ShardIndex(
            root=self.root,
            shard_names=[n for n, k in zip(self.shard_names, keep_shards, strict=True) if k],
            shard_bytes=self.shard_bytes[keep_shards],
            shard_sha256=[h for h, k in zip(self.shard_sha256, keep_shards, strict=True) if k],
            shard_session=self.shard_session[keep_shards],
            shard=new_id[self.shard[mask]].astype(np.int32),
            jpg_offset=self.jpg_offset[mask],
            jpg_size=self.jpg_size[mask],
            json_offset=self.json_offset[mask],
            json_size=self.json_size[mask],
            session=self.session[mask],
            keys=self.keys[mask],
            run_before=self.run_before[mask],
            run_after=self.run_after[mask],
            session_names=list(self.session_names),
            joints=list(self.joints),
            action_dim=self.action_dim,
            horizon=self.horizon,
            image_size=self.image_size,
            stats=self.stats,
            pose_metric=self.pose_metric,
            session_content=self.session_content,
        )

    def sessions_present(self) -> list[str]:
        return [self.session_names[i] for i in sorted(set(self.shard_session.tolist()))]


def load_index(root: str | Path) -> ShardIndex:
    """Read `root/index.json` (FORMAT.md, version 1) into a ShardIndex."""
    return _build(fmt.read(root), Path(root))


def index_from_doc(doc: dict[str, Any], root: Path, where: str = fmt.INDEX) -> ShardIndex:
    """A ShardIndex from an index.json document already in memory (validated by
    the format module, as `load_index` does)."""
    return _build(fmt.validate(doc, where), Path(root))


def _build(ix: fmt.Index, root: Path) -> ShardIndex:
    """Flatten the validated shards' sample columns into one numpy array per column,
    keeping only samples with an action chunk (the only ones a policy trains on)."""
    doc = ix.doc
    sessions = doc.get("sessions") or {}
    session_names = sorted(sessions.keys())
    session_id = {n: i for i, n in enumerate(session_names)}
    shard_names: list[str] = []
    shard_bytes: list[int] = []
    shard_sha: list[str] = []
    shard_sess: list[int] = []
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("shard", "jpg_offset", "jpg_size", "json_offset",
                                                         "json_size", "session", "keys", "run_before",
                                                         "run_after")}
    runs = _session_runs(ix.shards, {n: set((e.get("labels") or {}).get("breaks") or ())
                                     for n, e in sessions.items() if isinstance(e, dict)})
    for sh in ix.shards:
        if sh.session not in session_id:
            session_id[sh.session] = len(session_names)
            session_names.append(sh.session)
        keep = sh.samples.has_action
        if not keep.any():
            continue
        s = len(shard_names)
        shard_names.append(sh.name)
        shard_bytes.append(sh.bytes)
        shard_sha.append(sh.sha256)
        shard_sess.append(session_id[sh.session])
        n = int(keep.sum())
        cols["shard"].append(np.full(n, s, dtype=np.int32))
        for name in ("jpg_offset", "jpg_size", "json_offset", "json_size"):
            cols[name].append(getattr(sh.samples, name)[keep])
        cols["session"].append(np.full(n, session_id[sh.session], dtype=np.int32))
        before, after = runs[sh.name]
        cols["run_before"].append(before[keep])
        cols["run_after"].append(after[keep])
        kept = keep.tolist()
        cols["keys"].append(np.array([k.encode() for k, k_ok in zip(sh.samples.keys, kept, strict=True) if k_ok]))

    if not shard_names:
        raise ShardshipError(f"{ix.where}: no samples with an action chunk (sessions need poses: run `packer slam`)")

    def cat(name: str, dtype: Any) -> np.ndarray:
        return np.concatenate(cols[name]).astype(dtype, copy=False)

    width = max(k.dtype.itemsize for k in cols["keys"])
    keys = np.concatenate([k.astype(f"S{width}") for k in cols["keys"]])
    opts = doc.get("options", {})
    size = opts.get("size", 224)
    image_size = (int(size[0]), int(size[1])) if isinstance(size, (list, tuple)) else (int(size), int(size))
    metric = all(bool(sessions.get(session_names[i], {}).get("pose_metric", True)) for i in set(shard_sess))
    return ShardIndex(
        root=root,
        shard_names=shard_names,
        shard_bytes=np.array(shard_bytes, dtype=np.int64),
        shard_sha256=shard_sha,
        shard_session=np.array(shard_sess, dtype=np.int32),
        shard=cat("shard", np.int32),
        jpg_offset=cat("jpg_offset", np.int64),
        jpg_size=cat("jpg_size", np.int64),
        json_offset=cat("json_offset", np.int64),
        json_size=cat("json_size", np.int64),
        session=cat("session", np.int32),
        keys=keys,
        run_before=cat("run_before", np.int32),
        run_after=cat("run_after", np.int32),
        session_names=session_names,
        joints=[str(j) for j in doc.get("joints", [])],
        action_dim=int(doc.get("action_dim", 9 + len(doc.get("joints", [])))),
        horizon=int(doc.get("horizon", opts.get("horizon", 16))),
        image_size=image_size,
        stats=dict(doc.get("stats", {})),
        pose_metric=metric,
        session_content={n: str(e["content_key"]) for n, e in sessions.items()
                         if isinstance(e, dict) and e.get("content_key")},
        joints_usable={n: [bool(u) for u in e["labels"]["joints_usable"]] for n, e in sessions.items()
                       if isinstance(e, dict) and isinstance(e.get("labels"), dict)
                       and isinstance(e["labels"].get("joints_usable"), list)},
    )


def _session_runs(shards: Sequence[fmt.Shard], breaks: dict[str, set[int]] | None = None,
                  ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per shard, for each of its rows: how many rows of the same run of posed
    frames (`has_action` rows in a row, across the session's shards in index
    order, which is frame order) come before it and after it. A run also ends
    before a frame in the session's `breaks` (index.json labels: the first frame
    after a gap in time or numbering), so no observation window spans a gap. Rows
    without an action get 0, 0."""
    by_session: dict[str, list[fmt.Shard]] = {}
    for sh in shards:
        by_session.setdefault(sh.session, []).append(sh)
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for session, group in by_session.items():
        has = np.concatenate([sh.samples.has_action for sh in group]) if group else np.zeros(0, bool)
        cut = None
        starts = (breaks or {}).get(session)
        if starts:
            frames = np.array([_frame_of(k) for sh in group for k in sh.samples.keys], dtype=np.int64)
            cut = np.isin(frames[1:], list(starts))
        before = np.zeros(len(has), np.int32)
        after = np.zeros(len(has), np.int32)
        for a, b in split_runs(has, cut):
            before[a:b] = np.arange(b - a)
            after[a:b] = np.arange(b - a)[::-1]
        at = 0
        for sh in group:
            n = len(sh.samples)
            out[sh.name] = (before[at:at + n], after[at:at + n])
            at += n
    return out


def _frame_of(key: str) -> int:
    """The frame number of a sample key ("<session>/<frame>"); -1 when it has none."""
    tail = key.rsplit("/", 1)[-1]
    return int(tail) if tail.isdigit() else -1
