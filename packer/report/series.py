"""A packed session as time series, read back from its shards: what the trainer
will actually see (poses, joints, pose flags, frames), not what the raw folder
says. Reads only the members it needs by byte offset (shardship.format.shards),
so a report costs a fraction of a pack.

The sample JSON carries the action chunk after the pose and the joints; the
report needs none of it, so each JSON is cut before `"action"` when it can be
(three quarters of the bytes); a document that does not cut cleanly is parsed
whole."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from shardship.format.index import Index, Shard
from shardship.format.shards import read_member

_CUT = b',"action":'


@dataclass
class Series:
    """One session, frame by frame (packed frames only, in order)."""

    name: str
    key: list[str]  # sample keys, as index.json names them
    frame: np.ndarray  # (N,) raw frame index
    t: np.ndarray  # (N,) s on the frame clock
    pos: np.ndarray  # (N, 3) camera centre, NaN where the frame has no pose
    rot: np.ndarray  # (N, 3, 3) camera-to-world rotation, NaN where no pose
    flag: np.ndarray  # (N,) str: registered | interpolated | given | outside | none
    joints: np.ndarray  # (N, J) degrees (zeros when recorded without the glove)
    joints_valid: bool
    metric: bool
    film: list[bytes] = field(default_factory=list)  # a few packed JPEGs, evenly spaced

    @property
    def posed(self) -> np.ndarray:
        return np.isfinite(self.pos[:, 0])

    def speed(self) -> np.ndarray:
        """(N-1,) camera speed between consecutive posed frames, units per second."""
        ok = self.posed
        p, t = self.pos[ok], self.t[ok]
        if len(p) < 2:
            return np.zeros(0)
        dt = np.maximum(np.diff(t), 1e-9)
        return np.linalg.norm(np.diff(p, axis=0), axis=1) / dt


def _parse(js: bytes) -> dict:
    cut = js.find(_CUT)
    if cut > 0:
        try:
            return json.loads(js[:cut] + b"}")
        except ValueError:
            pass
    return json.loads(js)


def read_series(directory: str | os.PathLike, index: Index, name: str, film: int = 6) -> Series:
    """The session `name` of a validated index, from its shards in `directory`."""
    shards = [s for s in index.shards if s.session == name]
    docs: list[dict] = []
    keys: list[str] = []
    total = sum(len(s.samples) for s in shards)
    want = set(np.linspace(0, total - 1, min(film, total)).round().astype(int).tolist()) if total else set()
    jpgs: list[bytes] = []
    for sh in shards:
        base = len(keys)
        _read_shard(Path(directory), sh, docs, keys, {i - base for i in want if base <= i < base + len(sh.samples)},
                    jpgs)
    return _series(name, keys, docs, jpgs)


def _read_shard(directory: Path, sh: Shard, docs: list[dict], keys: list[str], film: set[int],
                jpgs: list[bytes]) -> None:
    path = directory / sh.name
    s = sh.samples
    fd = os.open(path, os.O_RDONLY)
    try:
        for i in range(len(s)):
            off, size = int(s.json_offset[i]), int(s.json_size[i])
            docs.append(_parse(read_member(fd, off, size, str(path))))
            keys.append(s.keys[i])
            if i in film:
                jpgs.append(read_member(fd, int(s.jpg_offset[i]), int(s.jpg_size[i]), str(path)))
    finally:
        os.close(fd)


def _series(name: str, keys: list[str], docs: list[dict], jpgs: list[bytes]) -> Series:
    n = len(docs)
    pos = np.full((n, 3), np.nan)
    rot = np.full((n, 3, 3), np.nan)
    for i, d in enumerate(docs):
        T = d.get("pose")
        if T is not None:
            a = np.asarray(T, dtype=np.float64)
            pos[i], rot[i] = a[:3, 3], a[:3, :3]
    nj = max((len(d.get("proprio") or []) for d in docs), default=0)
    joints = np.zeros((n, nj))
    for i, d in enumerate(docs):
        p = d.get("proprio") or []
        joints[i, :len(p)] = p
    return Series(
        name=name, key=keys,
        frame=np.array([int(d.get("frame", i)) for i, d in enumerate(docs)], dtype=np.int64),
        t=np.array([float(d.get("timestamp", 0.0)) for d in docs]),
        pos=pos, rot=rot,
        flag=np.array([str(d.get("pose_flag") or "none") for d in docs]),
        joints=joints,
        joints_valid=bool(docs) and any(d.get("joints_valid", True) for d in docs),
        metric=bool(docs) and all(d.get("pose_metric", False) for d in docs if d.get("pose") is not None),
        film=jpgs,
    )
