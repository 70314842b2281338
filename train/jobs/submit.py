"""`train submit` over ONE connection (transfer.connect): plan the job (spec +
script + checks), write the script and its [train] TOML to the remote, submit,
parse the job id, record it locally in outputs/jobs.json (records.py).

Everything the user sees goes through the returned objects; the CLI prints them."""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import getpass
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardship.config import DEFAULT_CONFIG, ClusterConfig, Config
from shardship.errors import RemoteError, ShardshipError
from shardship.format import index as fmt
from shardship.units import parse_size
from train.cachesize import CacheSize
from train.jobs import cachemem, checks, foreign, jobenv, measure, render
from train.jobs import log_path as job_log_path
from train.jobs.common import comment
from train.jobs.overrides import apply_sets, check_shapes
from train.jobs.race import check_partitions, submit_copies
from train.jobs.records import JobRecord, append_record, jobs_file, load_records
from train.jobs.remote import connected
from train.jobs.ship import CodeArchive, build_archive, ship
from train.jobs.spec import DEFAULT_STOP_BEFORE_S, JobSpec, build_spec
from train.retention import peak_checkpoint_files

# ---------------------------------------------------------------- job ids
_SGE_ID = re.compile(r"Your job(?:-array)? (\d+)(?:\.\S+)? \(")
_SLURM_ID = re.compile(r"Submitted batch job (\d+)")
_TERSE_ID = re.compile(r"^(\d+)(?:[.;:]\S*)?$")


def parse_job_id(text: str) -> str | None:
    """Job id from what qsub / sbatch printed: `Your job N ("name") has been submitted`,
    `qsub -terse` (`N`, `N.1-4:1`), `Submitted batch job N`, `sbatch --parsable` (`N;cluster`)."""
    for rx in (_SGE_ID, _SLURM_ID):
        m = rx.search(text)
        if m:
            return m.group(1)
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if lines:
        m = _TERSE_ID.match(lines[-1])
        if m:
            return m.group(1)
    return None


def submit_argv(spec: JobSpec) -> list[str]:
    return ["qsub", spec.script_path] if spec.scheduler == "sge" else ["sbatch", spec.script_path]


# ---------------------------------------------------------------- TOML for the trainer
def _plain(v: Any, where: str) -> Any:
    """Mappings as dicts and tuples as lists, as tomli_w writes them; other types
    it cannot write are refused by key."""
    if isinstance(v, Mapping):
        return {str(k): _plain(x, f"{where}.{k}") for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x, where) for x in v]
    if v is None or not isinstance(v, (bool, int, float, str)):
        raise ShardshipError(f"{where}: cannot write {v!r} ({type(v).__name__}) into the job's config")
    return v


def train_toml(train: Mapping[str, Any], source: str) -> str:
    """The [train] section (and [train.model]) as the trainer on the cluster reads
    it, written by a real TOML writer (tomli_w): any session name, emoji, quote,
    backslash or newline reads back as it was."""
    import tomli_w

    body = tomli_w.dumps({"train": _plain(train, "[train]")})
    return f"# [train] for the job, copied from {comment(source)} by `train submit`\n{body}"


# ---------------------------------------------------------------- plan + checks
@dataclass
class Plan:
    spec: JobSpec
    script: str
    train_toml: str
    findings: list[checks.Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # where the numbers came from
    code: CodeArchive | None = None  # shardship's source, shipped with the job
    weights: jobenv.Weights | None = None  # the stack preset's ResNet18 file, shipped once (jobenv.py)


def source_of(cfg: Config, cluster: ClusterConfig) -> str:
    return f"{cfg.path or 'built-in defaults'} [cluster.{cluster.name}] + [train]"


def make_spec(cfg: Config, cluster: ClusterConfig, remote_root: str, *, name: str = "shardship",
              ranks_per_node: int | None = None, stop_before_s: int = DEFAULT_STOP_BEFORE_S,
              train_args: tuple[str, ...] = (), code_dir: str | None = None,
              partitions: tuple[str, ...] = (), command: tuple[str, ...] = (), launcher: str = "torchrun") -> JobSpec:
    return build_spec(cluster, cfg.train, remote_root, source_of(cfg, cluster), name=name,
                      ranks_per_node=ranks_per_node, stop_before_s=stop_before_s, train_args=train_args,
                      code_dir=code_dir, train_where=f"{cfg.path or DEFAULT_CONFIG} [train]", partitions=partitions,
                      command=command, launcher=launcher)


OFFLINE = "not checked (offline)"


@dataclass
class Probed:
    """What the checks read before the script is rendered: the uploaded index (offline: the
    local packed one sizes the cache only), the biggest node, and the decoded-frame cache."""

    index: dict[str, Any] | None  # the cluster's index.json (None offline or when missing)
    node_mem: int | None
    node_src: str
    cache: CacheSize | None = None
    cache_src: str = ""
    findings: list[checks.Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def probe_cluster(spec: JobSpec, cfg: Config, remote: Any | None) -> Probed:
    """The index (a missing or damaged one is a finding), the node's memory, and the cache the
    job's [train] split keeps (sized from the local packed index when offline)."""
    findings: list[checks.Finding] = []
    notes: list[str] = []
    index = _remote_index(spec, remote, findings, notes)
    node_mem, mem_src = measure.node_memory(remote, spec) if remote is not None else (None, OFFLINE)
    sizing, src = index, f"{spec.data_dir}/{fmt.INDEX}"
    if remote is None and (Path(cfg.packed) / fmt.INDEX).is_file():
        with contextlib.suppress(ShardshipError):
            sizing, src = fmt.load(Path(cfg.packed)), f"the local {Path(cfg.packed) / fmt.INDEX}, offline"
    cache, cache_src = cachemem.size_of(cfg.train, sizing, src if sizing is not None else
                                        OFFLINE if remote is None else "none on the cluster")
    return Probed(index, node_mem, mem_src, cache, cache_src, findings, notes)


def run_checks(spec: JobSpec, cfg: Config, cluster: ClusterConfig, remote: Any | None, *, probe: bool = True,
               bench_csv: Path = measure.LOADER_CSV, ship_bytes: int = 0,
               probed: Probed | None = None) -> tuple[list[checks.Finding], list[str]]:
    """All pre-submit checks; returns (findings, notes). `remote` None is a dry run offline:
    the arithmetic that needs no cluster (workers x ranks x RSS vs `mem`, cores per rank,
    checkpoint vs time limit) still runs, and each check that needs the cluster says
    "not checked (offline)" instead of guessing. `probed`: what `plan` already read."""
    known = probed if probed is not None else probe_cluster(spec, cfg, remote)
    findings, notes = list(known.findings), list(known.notes)
    index, node_mem, mem_src = known.index, known.node_mem, known.node_src
    local_packed = Path(cfg.packed) if (Path(cfg.packed) / fmt.INDEX).is_file() else None
    rss, rss_src = measure.worker_rss(spec, local_packed, bench_csv=bench_csv, probe=probe)
    notes.append(f"per-worker RSS {rss / 2**20:.0f} MiB ({rss_src}); biggest node "
                 f"{'unknown' if node_mem is None else f'{node_mem / 2**30:.1f} GiB'} ({mem_src})")
    findings += checks.check_memory(spec, rss, rss_src, node_mem, mem_src)
    findings += cachemem.check_written_mem(spec, known.cache, rss)
    findings += checks.check_cpus(spec)
    step_s, step_src = measure.step_seconds(remote, spec)
    notes.append(f"{step_s:.3g} s per step ({step_src})")
    findings += checks.check_walltime(spec, step_s, step_src)
    ckpt = measure.checkpoint_size(cfg.train, index)
    if ckpt is None:
        findings.append(checks.Finding("warning", "quota", "train.model.checkpoint_bytes is not available: "
                                                           "checkpoint space not checked"))
    elif remote is None:
        notes.append(f"checkpoint {ckpt / 2**20:.1f} MiB x {peak_checkpoint_files(spec.keep)}; quota {OFFLINE}")
    else:
        limit, headroom, src = _quota(remote, cluster, spec)
        if headroom is not None and ship_bytes:  # what submit ships (the ResNet18 weights) comes out of it first
            headroom, src = headroom - ship_bytes, f"{src}, less {ship_bytes / 2**20:.0f} MiB shipped with the job"
        existing = measure.dir_bytes(remote, spec.out_dir)
        notes.append(f"checkpoint {ckpt / 2**20:.1f} MiB x {peak_checkpoint_files(spec.keep)}; "
                     f"{'unknown' if headroom is None else f'{headroom / 2**20:.0f} MiB'} free ({src})")
        findings += checks.check_quota(spec, ckpt, headroom, limit, src, existing)
    return findings, notes


def env_checks(cfg: Config, cluster: ClusterConfig, remote: Any | None,
               root: str) -> tuple[list[checks.Finding], list[str], jobenv.Weights | None]:
    """The job's python through the setup lines (the shipped source needs >= 3.10) and, for the
    stack preset, its ResNet18 weights where the job will look: (findings, notes, weights to ship)."""
    from train.config import model_config

    hub = jobenv.needs_hub_weights(model_config(cfg.train))
    if remote is None:
        return [], [f"python{' and ResNet18 weights' if hub else ''} on the cluster: {OFFLINE}"], None
    env = jobenv.probe(remote, cluster)
    if isinstance(env, str):
        return [checks.Finding("error", "python", f"{env}; fix [cluster.{cluster.name}] python / setup "
                                                  "(`train doctor` shows what they give)")], [], None
    bad = jobenv.python_problem(env, cluster)
    findings = [checks.Finding("error", "python", bad)] if bad else []
    notes = [] if bad else [f"python {env.python} ({env.executable}) after the setup lines"]
    weights = None
    if hub:
        weights, err, note = jobenv.plan_weights(env, root)
        findings += [checks.Finding("error", "weights", err)] if err else []
        notes += [note] if note else []
    return findings, notes, weights


def foreign_checks(spec: JobSpec, script_text: str | None) -> tuple[list[checks.Finding], list[str]]:
    """The checks that hold for any training: workers x ranks x RSS vs one node's memory (the
    default per-worker RSS: another loader is not measured), cores per rank, the launch contract."""
    rss = checks.DEFAULT_WORKER_RSS
    hit = foreign.override_int(spec.command, "num_workers")  # the command's own data.num_workers=N wins
    setting, workers = ("[train] num_workers = {n} (--set num_workers={n})", "[train] num_workers")
    if hit is not None:
        spec = dataclasses.replace(spec, num_workers=hit[1])
        setting, workers = (hit[0] + "={n} on the command", hit[0])
    findings = checks.check_memory(spec, rss, "default: your script's DataLoader is not measured",
                                   workers_setting=setting)
    findings += checks.check_cpus(spec, workers_setting=setting)
    findings += foreign.check_command(spec, script_text)
    notes = [f"command: {' '.join(spec.command)} launched by {spec.launcher} on {spec.nodes} node(s) x "
             f"{spec.ranks_per_node} rank(s); {workers} = {spec.num_workers} taken as its DataLoader "
             "workers per rank",
             "data, checkpoint interval and quota: not checked (the script's own)"]
    return findings, notes


def _remote_index(spec: JobSpec, remote: Any | None, findings: list[checks.Finding],
                  notes: list[str]) -> dict[str, Any] | None:
    """The uploaded index.json (None when missing, damaged, or offline), with a finding saying why."""
    index_path = posixpath.join(spec.data_dir, fmt.INDEX)
    if remote is None:
        notes.append(f"data: {index_path} {OFFLINE}")
        return None
    if not remote.exists(index_path):
        findings.append(checks.Finding("error", "data", f"no packed data on {remote.label}: {index_path} is missing; "
                                                        "run `transfer upload` first"))
        return None
    try:
        return fmt.parse(remote.read_file(index_path), f"{remote.label}:{index_path}", fix=fmt.REUPLOAD).doc
    except ShardshipError as e:  # a damaged or partial upload: say so, the other checks still run
        findings.append(checks.Finding("error", "data", str(e)))
    except (RemoteError, OSError) as e:
        findings.append(checks.Finding("error", "data", f"cannot read {index_path} on {remote.label}: {e}"))
    return None


def offline_root(cluster: ClusterConfig) -> tuple[str, str | None]:
    """(remote root, note) without a connection: an absolute remote_dir as is, a local: cluster's
    real path, else /home/USER/<remote_dir> with a note that the real home is not known offline."""
    if posixpath.isabs(cluster.remote_dir):
        return posixpath.normpath(cluster.remote_dir), None
    if cluster.is_local:
        from transfer.connection import local_home

        return posixpath.join(str(local_home(cluster.host)), cluster.remote_dir), None
    user = cluster.user or getpass.getuser()
    root = posixpath.join("/home", user, cluster.remote_dir)
    return root, (f"remote home {OFFLINE}: paths assume /home/{user}; the submitted script uses the home "
                  f"{cluster.host or 'the login node'} reports")


def _quota(remote: Any, cluster: ClusterConfig, spec: JobSpec) -> tuple[int | None, int | None, str]:
    """(limit, headroom, source): the live quota, or the configured one minus what is used."""
    from transfer.quota import live_quota  # lazily, like every transfer import in train

    q = None
    with contextlib.suppress(RemoteError, OSError):
        q = live_quota(remote, spec.data_dir)
    if str(cluster.quota).lower() != "auto":
        # a configured quota covers what shardship keeps under remote_dir (as `packer budget`)
        limit = parse_size(cluster.quota)
        headroom = limit - measure.dir_bytes(remote, remote.root)
        if q is not None and q.avail_bytes is not None:
            headroom = min(headroom, q.avail_bytes)
        return limit, headroom, f"[cluster.{cluster.name}] quota = {cluster.quota}"
    if q is None:
        return None, None, "no quota tool answered"
    return q.limit_bytes, q.headroom_bytes, q.source


def job_train(cfg: Config, sets: tuple[str, ...] = ()) -> dict[str, Any]:
    """[train] as the job will read it: `--set` overrides applied, every value's shape checked."""
    train = apply_sets(cfg.train, sets) if sets else dict(cfg.train)
    check_shapes(train, f"{cfg.path or DEFAULT_CONFIG} [train]{' with --set' if sets else ''}")
    return train


def plan(cfg: Config, cluster: ClusterConfig, remote: Any | None, *, name: str = "shardship",
         ranks_per_node: int | None = None, stop_before_s: int = DEFAULT_STOP_BEFORE_S,
         train_args: tuple[str, ...] = (), probe: bool = True, bench_csv: Path = measure.LOADER_CSV,
         sets: tuple[str, ...] = (), partitions: tuple[str, ...] = (), command: str | None = None,
         launcher: str = "auto") -> Plan:
    """Spec, script, TOML and checks; `remote` None plans offline (see run_checks); `command`
    is someone else's training instead of `train run` (foreign.py)."""
    cfg = dataclasses.replace(cfg, train=job_train(cfg, sets))
    if len(partitions) == 1:  # one partition is no race: it is the partition
        cluster, partitions = dataclasses.replace(cluster, partition=partitions[0]), ()
    root, root_note = (remote.root, None) if remote is not None else offline_root(cluster)
    words = foreign.parse_command(command) if command else ()
    local_script = foreign.script_file(words) if words else None
    script_text = local_script.read_text(errors="replace") if local_script else None
    code = build_archive() if cluster.ship_code and not words else None
    spec = make_spec(cfg, cluster, root, name=name, ranks_per_node=ranks_per_node, stop_before_s=stop_before_s,
                     train_args=train_args, code_dir=code.remote_dir(root) if code else None,
                     partitions=partitions, command=words,
                     launcher=foreign.pick_launcher(launcher, script_text) if words else "torchrun")
    probed = None if words else probe_cluster(spec, cfg, remote)
    if probed is not None:  # the decoded-frame cache in the memory request, before anything reads it
        spec, cache_notes = cachemem.count_cache(spec, probed.cache, probed.cache_src, probed.node_mem,
                                                 probed.node_src)
        probed.notes += cache_notes
    if len(partitions) > 1:
        check_partitions(spec)
    script = render(spec)
    weights = None
    if words:
        findings, notes = foreign_checks(spec, script_text)
    else:
        findings, notes, weights = env_checks(cfg, cluster, remote, root)
        more, more_notes = run_checks(spec, cfg, cluster, remote, probe=probe, bench_csv=bench_csv,
                                      ship_bytes=weights.size if weights else 0, probed=probed)
        findings, notes = findings + more, notes + more_notes
    if weights:  # the job reads the shipped copy (its [train.model] in the job's TOML)
        cfg.train["model"] = {**dict(cfg.train.get("model") or {}), "backbone_weights": weights.remote}
    toml = train_toml(cfg.train, source_of(cfg, cluster))
    if root_note:
        notes.insert(0, root_note)
    if code:
        notes.append(f"code: {code.name} ({code.files} files, {len(code.data) / 1024:.0f} KiB) -> {spec.code_dir}")
    return Plan(spec, script, toml, findings, notes, code, weights)


# ---------------------------------------------------------------- submit
@dataclass
class SubmitResult:
    plan: Plan
    record: JobRecord | None  # None for a dry run
    offline: str | None = None  # a dry run without the cluster: why (the connection error, or --offline)
    copies: list[JobRecord] = field(default_factory=list)  # every copy queued (one unless --partitions)


def _connection(cluster: ClusterConfig, remote: Any, accept_new_host_key: bool, dry_run: bool, offline: bool,
                stack: contextlib.ExitStack) -> tuple[Any | None, str | None]:
    """(remote, None), or for a dry run that cannot (or need not) reach the cluster (None, why):
    previewing a script must not need an account, a network, or a login node that is up."""
    if remote is not None:
        return remote, None
    if offline:
        if not dry_run:
            raise ShardshipError("--offline renders and checks without the cluster, so it needs --dry-run: "
                                 "a real submission has to reach the login node")
        return None, "--offline"
    try:
        return stack.enter_context(connected(cluster, None, accept_new_host_key)), None
    except ShardshipError as e:  # unresolvable host, refused, no account yet, unknown host key ...
        if not dry_run:
            raise
        return None, str(e)


def submit_job(cfg: Config, cluster: ClusterConfig, *, dry_run: bool = False, remote: Any = None,
               accept_new_host_key: bool = False, name: str = "shardship", ranks_per_node: int | None = None,
               stop_before_s: int = DEFAULT_STOP_BEFORE_S, train_args: tuple[str, ...] = (), probe: bool = True,
               bench_csv: Path = measure.LOADER_CSV, sets: tuple[str, ...] = (), offline: bool = False,
               partitions: tuple[str, ...] = (), command: str | None = None, launcher: str = "auto") -> SubmitResult:
    """Plan, check, write, submit, record. A dry run returns the plan (findings
    included) without writing anything on the remote; offline when the cluster
    cannot be reached (or `offline`), with the cluster-side checks "not checked"."""
    with contextlib.ExitStack() as stack:
        r, why_offline = _connection(cluster, remote, accept_new_host_key, dry_run, offline, stack)
        p = plan(cfg, cluster, r, name=name, ranks_per_node=ranks_per_node, stop_before_s=stop_before_s,
                 train_args=train_args, probe=probe, bench_csv=bench_csv, sets=sets, partitions=partitions,
                 command=command, launcher=launcher)
        if dry_run or r is None:
            return SubmitResult(p, None, why_offline)
        spec = p.spec
        checks.raise_for(p.findings, f"[cluster.{cluster.name}] job {spec.name}")
        _refuse_if_active(cfg, cluster, r, spec)
        if p.code is not None:
            ship(r, p.code, spec.data_dir)
        if p.weights is not None:
            jobenv.ship_weights(r, p.weights)
        r.mkdir(spec.log_dir)
        r.mkdir(spec.out_dir)
        r.write_file(spec.config_path, p.train_toml.encode())
        r.write_file(spec.script_path, p.script.encode())
        copies = submit_copies(r, spec, parse_job_id) if len(spec.partitions) > 1 else [(_sbatch(r, spec), "")]
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        recs = [JobRecord(cluster=cluster.name, host=cluster.host, scheduler=spec.scheduler, job_id=job_id,
                          name=spec.name, script=spec.script_path, log=job_log_path(spec, job_id),
                          out_dir=spec.out_dir, data_dir=spec.data_dir, global_batch=spec.batch_size * spec.ranks,
                          submitted=now, partition=part, group=copies[0][0] if part else "")
                for job_id, part in copies]
        for rec in recs:
            append_record(jobs_file(cfg), rec)
        return SubmitResult(p, recs[0], copies=recs)


def _sbatch(r: Any, spec: JobSpec) -> str:
    """Submit the one script; its job id."""
    res = r.run(submit_argv(spec), cwd=posixpath.dirname(spec.script_path), timeout=120)
    res.check(submit_argv(spec)[0])
    job_id = parse_job_id(res.stdout)
    if job_id is None:
        raise RemoteError(f"{r.label}: `{submit_argv(spec)[0]}` printed no job id: "
                          f"{(res.stdout.strip() or res.stderr.strip())[:200]!r}")
    return job_id


def _refuse_if_active(cfg: Config, cluster: ClusterConfig, remote: Any, spec: JobSpec) -> None:
    """Two jobs writing the same outputs would clobber each other's checkpoints."""
    from train.jobs.status import ACTIVE, query_state

    for rec in load_records(jobs_file(cfg)):
        if rec.cluster != cluster.name or rec.out_dir != spec.out_dir:
            continue
        st = query_state(remote, rec.scheduler, rec.job_id)
        if st.state in ACTIVE:
            cancel = "qdel" if rec.scheduler == "sge" else "scancel"
            raise ShardshipError(
                f"[cluster.{cluster.name}] job {rec.job_id} ({rec.name}) is {st.state.lower()} on the same outputs "
                f"{spec.out_dir}: wait for it (`train status`) or cancel it (`{cancel} {rec.job_id}`) first")
