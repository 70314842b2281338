"""Will it fit? What a training run will keep on the cluster (packed data,
checkpoints sized from the real model, normaliser, logs, Python env) against the
quota from the config, the command line or live from the cluster.

It composes every stage (the packed index, the trainer's model and checkpoint
retention, the transfer connection for the live quota), so it lives with the last
stage; `packer budget` parses options, calls `plan_budget` and prints. The
arithmetic (`compute`) is pure, so its numbers are tested exactly."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardship.config import DEFAULT_CONFIG, Config
from shardship.errors import ShardshipError
from shardship.format import index as fmt
from shardship.units import human, parse_size
from train.cachesize import CacheSize, budget_line, cache_mode, for_train
from train.retention import peak_checkpoint_files


@dataclass
class BudgetInputs:
    packed_bytes: int  # shards + index.json
    packed_files: int
    checkpoint_bytes: int  # one checkpoint file: model + EMA + optimizer state
    keep: int  # periodic checkpoints retained
    quota_bytes: int
    env_bytes: int = 4 * 1024**3  # a venv with CUDA torch; 0 when the cluster provides it as a module
    env_files: int = 60_000
    log_bytes: int = 50 * 1024**2  # metrics JSONL, plots, scheduler logs
    normaliser_bytes: int = 64 * 1024
    weights_bytes: int = 0  # the stack preset's ResNet18 file, shipped once by `train submit`
    used_bytes: int = 0  # already used on the cluster by other things (live quota only)
    inode_limit: int | None = None
    inodes_used: int = 0
    quota_source: str = "config"
    margin: float = 0.05  # keep 5% free: quotas are enforced on blocks, not bytes
    # the trainer's decoded-frame cache ([train] cache): memory, not disk, so shown but not summed
    cache: CacheSize | None = None
    cache_mode: str = "auto"
    cache_problem: str = ""  # why the cache could not be sized (the split cannot be made)


@dataclass
class BudgetRow:
    item: str
    bytes: int
    files: int
    note: str = ""


@dataclass
class Budget:
    rows: list[BudgetRow]
    total: int
    total_files: int
    quota: int
    used_other: int
    headroom: int
    inode_limit: int | None
    inode_headroom: int | None
    over: bool
    suggestions: list[str] = field(default_factory=list)
    memory: list[str] = field(default_factory=list)  # memory the run takes (not disk, not in `total`)


def compute(b: BudgetInputs) -> Budget:
    n_ckpt = peak_checkpoint_files(b.keep)
    rows = [
        BudgetRow("packed data", b.packed_bytes, b.packed_files, "shards + index.json"),
        BudgetRow("checkpoints", n_ckpt * b.checkpoint_bytes, n_ckpt,
                  f"{n_ckpt} x {human(b.checkpoint_bytes)} "
                  f"({b.keep} kept + best + one being written; model+EMA+AdamW)"),
        BudgetRow("normaliser", b.normaliser_bytes, 1, "action/proprio statistics"),
        *([BudgetRow("ResNet18 weights", b.weights_bytes, 1, "stack preset: shipped once by `train submit`")]
          if b.weights_bytes else []),
        BudgetRow("logs", b.log_bytes, 20, "metrics JSONL, plots, job logs"),
        BudgetRow("python env", b.env_bytes, b.env_files if b.env_bytes else 0,
                  "venv with CUDA torch" if b.env_bytes else "provided by the cluster"),
    ]
    total = sum(r.bytes for r in rows)
    files = sum(r.files for r in rows)
    usable = int(b.quota_bytes * (1 - b.margin))
    headroom = usable - b.used_bytes - total
    inode_headroom = None if b.inode_limit is None else b.inode_limit - b.inodes_used - files
    over = headroom < 0 or (inode_headroom is not None and inode_headroom < 0)
    memory = ([budget_line(b.cache, b.cache_mode)] if b.cache is not None else
              [f"decoded-frame cache: not sized ({b.cache_problem})"] if b.cache_problem else [])
    return Budget(rows, total, files, b.quota_bytes, b.used_bytes, headroom, b.inode_limit, inode_headroom,
                  over, suggestions(b, headroom, inode_headroom) if over else [], memory)


def suggestions(b: BudgetInputs, headroom: int, inode_headroom: int | None) -> list[str]:
    """Concrete changes, each with the bytes it frees, biggest first."""
    need = -headroom
    out: list[tuple[int, str]] = []
    if need > 0:
        if b.env_bytes:
            out.append((b.env_bytes, "use the cluster's torch module instead of a venv ([budget] env = 0): "
                                     f"frees {human(b.env_bytes)}"))
        if b.keep > 1:
            k = b.keep - 1
            while k > 0 and (b.keep - k) * b.checkpoint_bytes < need:
                k -= 1
            freed = (b.keep - k) * b.checkpoint_bytes
            out.append((freed, f"keep fewer checkpoints ([train] keep = {k}): frees {human(freed)}"))
        half = b.packed_bytes // 2
        out.append((half, f"pack every 2nd frame (packer pack --stride 2): frees ~{human(half)}"))
        q = int(b.packed_bytes * 0.3)
        out.append((q, f"lower JPEG quality (packer pack --quality 75): frees ~{human(q)}"))
    out.sort(key=lambda x: -x[0])
    lines = [s for _, s in out]
    if inode_headroom is not None and inode_headroom < 0:
        lines.append(f"{-inode_headroom} files over the inode quota: larger shards (--shard-mb) or no venv")
    return lines


def render(bud: Budget, quota_source: str) -> str:
    w = max(len(r.item) for r in bud.rows) + 2
    lines = [f"{'item':<{w}}{'size':>10}  {'files':>7}  note"]
    for r in bud.rows:
        lines.append(f"{r.item:<{w}}{human(r.bytes):>10}  {r.files:>7}  {r.note}")
    lines.append(f"{'total':<{w}}{human(bud.total):>10}  {bud.total_files:>7}")
    inodes = "" if bud.inode_limit is None else bud.inode_limit
    lines.append(f"{'quota':<{w}}{human(bud.quota):>10}  {inodes:>7}  from {quota_source}")
    if bud.used_other:
        lines.append(f"{'used by others':<{w}}{human(bud.used_other):>10}           on the cluster, not this dataset")
    sign = "-" if bud.headroom < 0 else ""
    inode = "" if bud.inode_headroom is None else bud.inode_headroom
    lines.append(f"{'headroom':<{w}}{sign + human(abs(bud.headroom)):>10}  {inode:>7}  after a 5% safety margin")
    lines += bud.memory
    return "\n".join(lines)


def plan_budget(cfg: Config, out_dir: Path, *, quota: str | None = None, remote: str | None = None,
                keep: int | None = None, env_size: str | None = None,
                accept_new_host_key: bool = False) -> tuple[Budget, str]:
    """(the budget, where the quota came from) for the packed data in `out_dir`.
    Quota source, in order: live from `remote`, `quota`, a single configured
    cluster's quota, 10G."""
    from train.config import TrainConfig, check_train_types

    where = f"{cfg.path or DEFAULT_CONFIG} [train]"
    check_train_types(cfg.train, where)  # keep = "2" is one line, not int("2")
    from train.model import checkpoint_bytes  # torch

    index = fmt.load(out_dir)
    assert index is not None
    packed = sum(s["bytes"] for s in index["shards"]) + (out_dir / fmt.INDEX).stat().st_size
    train_cfg = dict(cfg.train)
    ckpt = checkpoint_bytes({**train_cfg, "action_dim": index.get("action_dim") or 9,
                             "horizon": index.get("horizon") or 16, "proprio_dim": len(index.get("joints", []))})
    inputs = BudgetInputs(
        packed_bytes=packed, packed_files=len(index["shards"]) + 1, checkpoint_bytes=ckpt,
        keep=keep if keep is not None else int(train_cfg.get("keep", TrainConfig.keep)), quota_bytes=0,
        env_bytes=parse_size(env_size if env_size is not None else cfg.budget.get("env", "4G")),
        weights_bytes=_weights_bytes(train_cfg),
        cache_mode=cache_mode(train_cfg, where),
    )
    try:
        inputs.cache = for_train(index, train_cfg)
    except ShardshipError as e:  # every session held out: `train run` says the same
        inputs.cache_problem = str(e)
    source = "default 10G"
    if remote:
        q, already = live_quota_and_uploaded(cfg, remote, index, accept_new_host_key)
        if q is None or not q.limit_bytes:
            raise ShardshipError(f"{remote}: no quota found (tried quota, lfs, mmlsquota, df): pass --quota SIZE")
        # shards already uploaded are in `used` and in the packed-data row: count them once
        inputs.quota_bytes, inputs.used_bytes = q.limit_bytes, max(0, (q.used_bytes or 0) - already)
        inputs.inode_limit, inputs.inodes_used, source = q.inode_limit, q.inode_used or 0, f"{q.source} on {remote}"
    elif quota:
        inputs.quota_bytes, source = parse_size(quota), "--quota"
    elif cfg.clusters and len(cfg.clusters) == 1 and next(iter(cfg.clusters.values())).quota != "auto":
        c = next(iter(cfg.clusters.values()))
        inputs.quota_bytes, source = parse_size(c.quota), f"[cluster.{c.name}] quota"
    else:
        inputs.quota_bytes = parse_size("10G")
    return compute(inputs), source


RESNET18_BYTES = 46_830_571  # torchvision's resnet18-f37072fd.pth


def _weights_bytes(train_cfg: dict[str, Any]) -> int:
    """The hub file's size when the model reads it (the local copy's, else the published one's)."""
    from train.config import model_config
    from train.jobs.jobenv import local_hub_file, needs_hub_weights

    if not needs_hub_weights(model_config(train_cfg)):
        return 0
    here = local_hub_file()
    return here.stat().st_size if here.is_file() else RESNET18_BYTES


def live_quota_and_uploaded(cfg: Config, name: str, index: dict[str, Any],
                            accept_new_host_key: bool) -> tuple[Any, int]:
    """(quota, bytes of this dataset's shards already on the cluster), one connection."""
    from transfer import connect, live_quota

    with connect(cfg.cluster(name), accept_new_host_key=accept_new_host_key) as r:
        q = live_quota(r, r.root)
        present = r.listdir("")
    already = sum(sh["bytes"] for sh in index["shards"]
                  if sh["name"] in present and present[sh["name"]].size == sh["bytes"])
    return q, already
