"""Test data built from the real pipeline: rendered sessions (packer.synth) and
shards packed by packer.pack. `metric_poses=True` writes the synthetic ground
truth as the user's own calibrated SLAM would (run_slam.py + calibrate_scale.py:
poses.json in metres, slamProcessed, scale_factor), so action chunks exist
without running SfM."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from shardship.config import PackOptions


def make_raw(root: Path, sessions: int = 3, frames: int = 60, seed: int = 0, metric_poses: bool = False) -> Path:
    from packer.synth import synth_dataset

    raw = Path(root)
    raw.mkdir(parents=True, exist_ok=True)
    paths = synth_dataset(raw, sessions=sessions, frames=frames, seed=seed, progress=False)
    if metric_poses:
        for p in paths:
            write_truth_as_metric(p)
    return raw


def write_truth_as_metric(session_dir: Path) -> None:
    """poses.json <- ground truth in the user's calibrated-SLAM format (i/60 stamps,
    as their run_slam.py writes them), metadata <- slamProcessed, poseCount, scale_factor."""
    truth = json.loads((session_dir / "synth_truth.json").read_text())
    present = {int(p.stem) for p in (session_dir / "rgb").glob("*.jpg")}
    poses = [{"timestamp": i / 60.0, "rgbIndex": i, "depth": None, "transform": m}
             for i, m in enumerate(truth["poses"]) if i in present]
    (session_dir / "poses.json").write_text(json.dumps(poses, indent=2))
    md_path = session_dir / "metadata.json"
    md = json.loads(md_path.read_text())
    md.update(slamProcessed=True, poseCount=len(poses), scale_factor=1.0)
    md_path.write_text(json.dumps(md, indent=2))


def make_packed(root: Path, sessions: int = 3, frames: int = 60, seed: int = 0, shard_bytes: int | None = None,
                metric_poses: bool = True, **pack_kw) -> Path:
    """A packed dir (index.json + shards) from rendered sessions; returns its path."""
    from packer.pack import pack

    root = Path(root)
    raw = make_raw(root / "raw", sessions, frames, seed, metric_poses=metric_poses)
    out = root / "packed"
    opts = PackOptions(workers=2, **pack_kw)
    if shard_bytes:
        opts.shard_bytes = shard_bytes
    report = pack(raw, out, opts, progress=False)
    if report.failed:
        raise RuntimeError(f"packing test data failed: {report.failed}")
    return out


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def index_doc(sessions: dict[str, tuple[int, int]], size: int | list[int] = 224,
              content: dict[str, str] | None = None) -> dict:
    """A valid index.json document without shard files: per session (posed, unposed) sample
    counts, the posed ones (has_action) first; `content` names content keys (one recording).
    For sizing arithmetic (train.cachesize, budget, job memory), not for reading frames."""
    from shardship.format import index as fmt

    doc = fmt.empty({"horizon": 16, "size": size}, "test")
    doc.update(action_dim=9, joints=[])
    for s, (name, (posed, unposed)) in enumerate(sorted(sessions.items())):
        rows = [[f"{name}/{i:06d}", 1024 * i, 100, 1024 * i + 512, 50, int(i < posed)]
                for i in range(posed + unposed)]
        doc["shards"].append({"name": f"shard-{s:06d}.tar", "bytes": 1024 * (len(rows) + 1), "sha256": "0" * 64,
                              "session": name, "samples": rows})
        doc["sessions"][name] = {"frames": posed + unposed, **({"content_key": content[name]}
                                                                if content and name in content else {})}
    return doc
