"""`train fetch`: the best checkpoint (else last), metrics, plots, the eval page and
the newest job log, via `transfer pull` (resumed, sha256-verified). Someone else's run
(`--command`) is fetched by the names Lightning writes: last.ckpt and the CSVLogger's
metrics.csv."""
from __future__ import annotations

import posixpath
from pathlib import Path
from typing import Any

from shardship.config import ClusterConfig, Config
from shardship.errors import ShardshipError
from train.jobs.race import follow
from train.jobs.records import jobs_file, load_records
from train.jobs.remote import connected


def fetch_results(cfg: Config, cluster: ClusterConfig, *, remote: Any = None, name: str = "shardship",
                  dest: Path | None = None, accept_new_host_key: bool = False) -> tuple[Path, list[Any]]:
    """Best checkpoint (else last), metrics, plots and the newest job log via `transfer pull`."""
    from transfer.pull import pull

    recs = [r for r in load_records(jobs_file(cfg)) if r.cluster == cluster.name and r.name == name]
    dest = Path(dest) if dest is not None else Path(cfg.outputs) / cluster.name / name
    with connected(cluster, remote, accept_new_host_key) as r:
        rec = follow(r, recs) if recs else None  # with --partitions: the copy that won
        out_dir = rec.out_dir if rec else r.path("outputs", name)
        entries = r.listdir(out_dir)
        if not entries:
            raise ShardshipError(f"{r.label}: nothing in {out_dir} yet: has the job run? (`train status`)")
        # shardship's trainer: best.pt / last.pt + metrics.jsonl; a --command Lightning run: last.ckpt + metrics.csv
        wanted = [next((n for n in ("best.pt", "last.pt", "last.ckpt") if n in entries), "last.pt"),
                  "metrics.jsonl", "metrics.csv"]
        # plots, and `train eval`'s page (eval.html, self-contained) with its numbers
        wanted += sorted(n for n in entries if n.endswith((".png", ".html")) or n == "eval.json")
        paths = [posixpath.join(out_dir, n) for n in wanted if n in entries]
        if rec and r.exists(rec.log):
            paths.append(rec.log)
        outcomes = pull(r, paths, dest)
    return dest, outcomes
