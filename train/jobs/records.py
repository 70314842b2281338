"""The local record of submitted jobs (outputs/jobs.json): what `train status` and
`train fetch` look up, and what stops a second job on the same outputs."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from shardship.atomic import write_json
from shardship.config import Config
from shardship.errors import ShardshipError

JOBS_FILE = "jobs.json"


@dataclass
class JobRecord:
    cluster: str
    host: str
    scheduler: str
    job_id: str
    name: str
    script: str
    log: str
    out_dir: str
    data_dir: str
    submitted: str  # ISO-8601 UTC
    partition: str = ""  # with `--partitions`: the partition this copy was queued in
    group: str = ""  # with `--partitions`: the first copy's job id, shared by every copy of the run
    global_batch: int = 0  # batch_size x ranks: samples per optimizer step (status turns samples/s into an ETA)


def jobs_file(cfg: Config) -> Path:
    return Path(cfg.outputs) / JOBS_FILE


def load_records(path: Path) -> list[JobRecord]:
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (ValueError, UnicodeDecodeError) as e:
        raise ShardshipError(f"{path}: not a shardship jobs file ({e}); move it away") from None
    names = set(JobRecord.__dataclass_fields__)
    return [JobRecord(**{k: v for k, v in r.items() if k in names}) for r in doc.get("jobs", [])]


def append_record(path: Path, rec: JobRecord) -> None:
    recs = load_records(path) + [rec]
    write_json(path, {"format": "shardship-jobs", "version": 1, "jobs": [asdict(r) for r in recs]})
