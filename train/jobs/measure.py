"""Where the pre-submit checks get their numbers, each with a note saying so:

- per-worker RSS: `bench/results/loader.csv` (the loader benchmark) when present,
  else a short local probe (one real DataLoader worker over the local shards),
  else the documented default in checks.py;
- node memory: `sinfo` (SLURM) / `qhost` (SGE) on the cluster;
- seconds per step: the run's own metrics.jsonl on the cluster (a resubmission),
  else the documented default;
- checkpoint size: `train.model.checkpoint_bytes` for the configured model."""
from __future__ import annotations

import csv
import json
import posixpath
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from shardship.units import parse_size
from train.jobs import checks
from train.jobs.spec import JobSpec

LOADER_CSV = Path("bench/results/loader.csv")
_UNIT = {"bytes": 1, "b": 1, "kb": 1024, "kib": 1024, "mb": 1024**2, "mib": 1024**2, "gb": 1024**3, "gib": 1024**3}


def worker_rss_from_csv(path: Path) -> int | None:
    """Largest per-worker RSS of our loader in the benchmark CSV (bench/loader.py writes
    `rss_worker_peak_mb` per loader): columns whose name holds 'rss' and 'worker', unit
    from the name (_mb, _mib, _bytes, ...), rows of loader "shardship" when there is a
    loader column."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except (FileNotFoundError, csv.Error, UnicodeDecodeError):
        return None
    if rows and "loader" in rows[0]:  # the benchmark compares loaders: ours is "shardship"
        rows = [r for r in rows if r.get("loader") == "shardship"]
    if not rows:
        return None
    cols = [c for c in rows[0] if c and "rss" in c.lower() and "worker" in c.lower()]
    best: int | None = None
    for col in cols:
        m = re.search(r"(bytes|kib|kb|mib|mb|gib|gb|b)\b", col.lower().replace("_", " "))
        scale = _UNIT[m.group(1)] if m else 1024**2  # a bare number is MB in our CSVs
        for r in rows:
            try:
                v = float(r[col])
            except (TypeError, ValueError):
                continue
            if v > 0:
                best = max(best or 0, int(v * scale))
    return best


_PROBE = r"""
import os, sys, json
from pathlib import Path
from train.data import ShardDataset, load_index, make_loader
index = load_index(Path(sys.argv[1]))
# the trainer's reader: obs_horizon frames per sample (default 2), so batches as large as in training
n_obs = int(sys.argv[3]) if len(sys.argv) > 3 else 2
ds = ShardDataset(index, int(sys.argv[2]), 0, 1, seed=0, tail="pad", obs_horizon=n_obs)
me = os.getpid()
def children():
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                        out.append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    return out
def hwm(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0
peak = 0
for i, batch in enumerate(make_loader(ds, 1, False, seed=0)):
    for pid in children():
        try:
            peak = max(peak, hwm(pid))
        except OSError:
            pass
    if i >= 8:
        break
print(json.dumps({"worker_rss": peak}))
"""


def probe_worker_rss(packed: Path, batch_size: int, timeout: float = 120) -> int | None:
    """Peak RSS of one real DataLoader worker reading a few batches of the local shards."""
    if not (packed / "index.json").is_file():
        return None
    try:
        p = subprocess.run([sys.executable, "-c", _PROBE, str(packed), str(batch_size)], capture_output=True,
                           text=True, timeout=timeout)
    except (subprocess.TimeoutExpired, OSError):
        return None
    if p.returncode != 0:
        return None
    try:
        v = int(json.loads(p.stdout.strip().splitlines()[-1])["worker_rss"])
    except (ValueError, KeyError, IndexError):
        return None
    return v or None


def worker_rss(spec: JobSpec, packed: Path | None, bench_csv: Path = LOADER_CSV,
               probe: bool = True) -> tuple[int, str]:
    """(bytes, where the number came from)."""
    v = worker_rss_from_csv(bench_csv)
    if v:
        return v, f"measured, {bench_csv}"
    if probe and packed is not None:
        v = probe_worker_rss(packed, spec.batch_size)
        if v:
            return v, f"measured by a local probe on {packed}"
    return checks.DEFAULT_WORKER_RSS, "default, nothing measured"


def _slurm_mb(token: str) -> int | None:
    m = re.match(r"^(\d+)", token.strip())
    return int(m.group(1)) * 1024**2 if m else None


def parse_sinfo_mem(text: str) -> int | None:
    """`sinfo -h -o %m` lines (MB per node, maybe '257000+') -> the biggest, in bytes."""
    vals = [v for v in (_slurm_mb(t) for t in text.split()) if v]
    return max(vals) if vals else None


def parse_qhost_mem(text: str) -> int | None:
    """`qhost` table -> the biggest MEMTOT, in bytes ('-' rows such as 'global' skipped)."""
    lines = text.splitlines()
    head = next((ln.split() for ln in lines if ln.split()[:1] == ["HOSTNAME"]), None)
    if not head or "MEMTOT" not in head:
        return None
    col = head.index("MEMTOT")
    best = None
    for ln in lines:
        parts = ln.split()
        if len(parts) != len(head) or parts[0] in ("HOSTNAME", "global") or parts[col] == "-":
            continue
        try:
            v = parse_size(parts[col])
        except Exception:
            continue
        best = max(best or 0, v)
    return best


def node_memory(remote: Any, spec: JobSpec) -> tuple[int | None, str]:
    """The biggest node's memory as the scheduler reports it (None when it will not say)."""
    if spec.scheduler == "slurm":
        argv = ["sinfo", "-h", "-o", "%m"] + (["-p", spec.cluster.partition] if spec.cluster.partition else [])
        res = remote.run(argv, timeout=60)
        return (parse_sinfo_mem(res.stdout) if res.ok else None), "sinfo"
    res = remote.run(["qhost"], timeout=60)
    return (parse_qhost_mem(res.stdout) if res.ok else None), "qhost"


def step_seconds(remote: Any, spec: JobSpec) -> tuple[float, str]:
    """Seconds per optimizer step from the run's own metrics on the cluster (a
    resubmission), else the default for a GPU."""
    path = posixpath.join(spec.out_dir, "metrics.jsonl")
    if remote is not None and remote.exists(path):
        res = remote.run(["tail", "-n", "50", path], timeout=60)
        rates = []
        for line in res.stdout.splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            sps = rec.get("samples_per_s")
            if isinstance(sps, (int, float)) and sps > 0:
                rates.append(float(sps))
        if rates:
            rates.sort()
            median = rates[len(rates) // 2]
            return spec.batch_size * spec.ranks / median, f"measured, {path}"
    return checks.DEFAULT_STEP_SECONDS, "default for a GPU"


def dir_bytes(remote: Any, path: str) -> int:
    """Disk use under a remote directory (0 when it does not exist)."""
    if not remote.exists(path):
        return 0
    res = remote.run(["du", "-sk", path], timeout=300)
    try:
        return int(res.stdout.split()[0]) * 1024 if res.ok else 0
    except (IndexError, ValueError):
        return 0


def checkpoint_size(train: Mapping[str, Any], index: Mapping[str, Any] | None) -> int | None:
    """Bytes of one checkpoint for the configured model (None while train.model is missing)."""
    try:
        from train.model import checkpoint_bytes
    except ImportError:
        return None
    cfg: dict[str, Any] = dict(train)
    if index:  # the data decides the shapes, as in the trainer
        cfg.update(action_dim=index.get("action_dim") or 9, horizon=index.get("horizon") or 16,
                   proprio_dim=len(index.get("joints") or []))
        size = (index.get("options") or {}).get("size")
        if size:
            cfg["image_size"] = int(size)
    try:
        return int(checkpoint_bytes(cfg))
    except TypeError:  # an older signature
        return None
