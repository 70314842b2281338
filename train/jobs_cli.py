"""`train submit | status | fetch`: thin click commands over `train.jobs.submit`.

train/cli.py registers these module-level commands on its group. Heavy imports
happen inside the commands so `train --help` stays fast."""
from __future__ import annotations

from pathlib import Path

import click

from shardship.cliopts import cluster_option, config_option, friendly_errors, host_key_option

_CLUSTER, _CONFIG, _HOSTKEY = cluster_option, config_option(), host_key_option
_QUIET_SUBMIT = click.option("--quiet", "-q", is_flag=True,
                             help="Print only the job id (one per partition copy), and warnings and errors: "
                                  "for scripts (JOB=$(train submit -q)).")
_QUIET_FETCH = click.option("--quiet", "-q", is_flag=True,
                            help="Print only the folder the results are in, not each file fetched.")


def _load(config_path: str | None, cluster: str | None):
    from shardship.config import load_config

    cfg = load_config(config_path)
    return cfg, cfg.cluster(cluster)


@click.command()
@_CLUSTER
@_CONFIG
@click.option("--dry-run", is_flag=True,
              help="Render and check the script, print it, submit nothing. Works offline: when the cluster "
                   "cannot be reached, the checks that need it say \"not checked (offline)\".")
@click.option("--offline", is_flag=True, help="With --dry-run: do not even try to connect.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override a [train] value for this job only (repeatable): --set lr=1e-4 --set model.preset=tiny "
                   "--set unet_dims=[32,64]. Values are TOML; the job's copy of [train] gets them.")
@click.option("--name", default="shardship", show_default=True,
              help="Job name; also the run directory outputs/NAME on the cluster (resubmitting resumes it).")
@click.option("--partitions", default=None, metavar="A,B",
              help="SLURM: queue a copy in each partition; the first to start cancels the others, and status / "
                   "logs / fetch follow it (see `train where` for the start estimates).")
@click.option("--nproc-per-node", type=click.IntRange(1), default=None,
              help="Training processes per node for a CPU job (gpus = 0); with GPUs it is one per GPU.")
@click.option("--command", default=None, metavar='"python train.py ..."',
              help="Run your own training script instead of shardship's trainer, given as for ONE process; the job "
                   "adds torchrun / srun for the nodes and ranks, with the same RAM / CPU checks and requeue. Paths "
                   "are relative to the remote directory; SHARDSHIP_DATA / SHARDSHIP_OUT / SHARDSHIP_TIME_LIMIT "
                   "are set.")
@click.option("--launcher", type=click.Choice(["auto", "torchrun", "lightning"]), default="auto", show_default=True,
              help="--command: torchrun (one task per node) or Lightning's SLURM contract (one task per rank, "
                   "srun python); auto reads the script for a lightning import.")
@click.option("--max-steps", type=click.IntRange(1), default=None, help="Passed to `train run --max-steps`.")
@click.option("--no-probe", is_flag=True, help="Do not measure a DataLoader worker locally for the RAM check.")
@_QUIET_SUBMIT
@_HOSTKEY
@friendly_errors
def submit(cluster: str | None, config_path: str | None, dry_run: bool, offline: bool, sets: tuple[str, ...],
           name: str, partitions: str | None, nproc_per_node: int | None, command: str | None, launcher: str,
           max_steps: int | None, no_probe: bool, quiet: bool, accept_new_host_key: bool) -> None:
    """Write the SGE/SLURM script for the cluster, check it, submit it, record the job id.

    Before anything is submitted: data workers x ranks x measured worker RSS against one
    node's memory (host OOM), workers against cores per rank, the first checkpoint against
    the wall clock, checkpoints against the quota. Preview with --dry-run (offline too)."""
    from shardship.errors import ShardshipError
    from train.jobs import checks
    from train.jobs.records import jobs_file
    from train.jobs.submit import submit_job

    cfg, cl = _load(config_path, cluster)
    extra = ("--max-steps", str(max_steps)) if max_steps else ()
    res = submit_job(cfg, cl, dry_run=dry_run, accept_new_host_key=accept_new_host_key, name=name,
                     ranks_per_node=nproc_per_node, train_args=extra, probe=not no_probe, sets=sets, offline=offline,
                     partitions=tuple(p.strip() for p in (partitions or "").split(",") if p.strip()),
                     command=command, launcher=launcher)
    p = res.plan
    if res.offline and not quiet:
        click.echo(f"offline ({res.offline}): rendered and checked without the cluster", err=True)
    if dry_run:
        click.echo(p.script, nl=False)
    for note in [] if quiet else p.notes:
        click.echo(f"check: {note}", err=True)
    for f in p.findings:
        click.echo(f"{f.level}: {f}", err=True)
    if res.record is None:
        errs = checks.errors(p.findings)
        if errs:
            raise ShardshipError(f"dry run: `train submit` would refuse this job ({len(errs)} check(s) failed)")
        copies = f" (a copy to each of {', '.join(p.spec.partitions)})" if p.spec.partitions else ""
        click.echo(f"dry run: script for {p.spec.scheduler} would go to {p.spec.script_path}{copies}; "
                   "nothing submitted", err=True)
        return
    rec = res.record
    if quiet:
        click.echo(" ".join(c.job_id for c in res.copies) if len(res.copies) > 1 else rec.job_id)
        return
    if len(res.copies) > 1:
        click.echo(f"submitted {len(res.copies)} copies of {rec.name}, the first to start cancels the others: "
                   + ", ".join(f"job {c.job_id} in {c.partition}" for c in res.copies))
    click.echo(f"submitted job {rec.job_id} ({rec.name}) to [cluster.{rec.cluster}] ({rec.scheduler})")
    click.echo(f"  script:  {rec.script}")
    click.echo(f"  log:     {rec.log}")
    click.echo(f"  outputs: {rec.out_dir} (resubmitting resumes from last.pt there)")
    click.echo(f"  recorded in {jobs_file(cfg)}; follow it with `train status`, get results with `train fetch`")


@click.command()
@_CLUSTER
@_CONFIG
@click.option("--job", "job_id", default=None, help="Only this job id.")
@_HOSTKEY
@friendly_errors
def status(cluster: str | None, config_path: str | None, job_id: str | None, accept_new_host_key: bool) -> None:
    """State of the jobs `train submit` recorded (qstat/qacct or scontrol/squeue), with the run's
    step, loss, samples/s and ETA from its metrics.jsonl."""
    from train.jobs.records import jobs_file
    from train.jobs.status import ACTIVE, job_status

    cfg, cl = _load(config_path, cluster)
    rows = job_status(cfg, cl, job_id=job_id, accept_new_host_key=accept_new_host_key)
    if not rows:
        click.echo(f"no jobs recorded for [cluster.{cl.name}] in {jobs_file(cfg)}")
        return
    for rec, st, prog in rows:
        code = "" if st.exit_code is None else f" exit {st.exit_code}"
        again = f", {st.restarts} restart(s)" if st.restarts else ""
        detail = f" ({st.detail})" if st.detail else ""
        click.echo(f"{rec.job_id:>10}  {rec.name:<16} {st.state:<10}{code}{again}{detail}  submitted {rec.submitted}")
        if prog is not None:
            if st.state not in ACTIVE:  # a finished or stopped run has no ETA
                prog.eta_s = None
            click.echo(f"{'':>10}  {prog}")
        click.echo(f"{'':>10}  log {rec.log}")


@click.command()
@_CLUSTER
@_CONFIG
@click.option("--name", default=None, help="Run name given to `train submit` (default: the newest job).")
@click.option("--job", "job_id", default=None, help="This job id.")
@click.option("--lines", "-n", type=click.IntRange(1), default=50, show_default=True, help="Last lines to show.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines until the job leaves the queue.")
@_HOSTKEY
@friendly_errors
def logs(cluster: str | None, config_path: str | None, name: str | None, job_id: str | None, lines: int,
         follow: bool, accept_new_host_key: bool) -> None:
    """The scheduler log of a recorded job (requeued runs append to the same file)."""
    from shardship.errors import ShardshipError
    from train.jobs.logs import follow_log, pick_record

    cfg, cl = _load(config_path, cluster)
    rec = pick_record(cfg, cl, name=name, job_id=job_id)
    if rec is None:
        raise ShardshipError(f"no job recorded for [cluster.{cl.name}]"
                             f"{f' named {name}' if name else ''}{f' with id {job_id}' if job_id else ''}: "
                             "`train submit` first (`train status` lists the recorded ones)")
    for chunk in follow_log(cfg, cl, rec, lines=lines, follow=follow, accept_new_host_key=accept_new_host_key):
        click.echo(chunk, nl=False)


@click.command()
@_CLUSTER
@_CONFIG
@_HOSTKEY
@friendly_errors
def doctor(cluster: str | None, config_path: str | None, accept_new_host_key: bool) -> None:
    """Check the login node as you would by hand before a first job: python and torch through your
    `setup` lines, CUDA (a login node cannot say for the GPU nodes: it says so), modules, the
    scheduler's commands, quota and inodes, free space for checkpoints. Exit 1 when a check fails."""
    from shardship.errors import Exit, ShardshipError
    from train.config import model_config
    from train.jobs.doctor import run_doctor
    from train.jobs.measure import checkpoint_size
    from train.jobs.remote import connected
    from train.jobs.submit import job_train
    from train.retention import peak_checkpoint_files

    cfg, cl = _load(config_path, cluster)
    from train.jobs.spec import train_settings

    train = job_train(cfg)
    keep = train_settings(train)["keep"]
    with connected(cl, None, accept_new_host_key) as r:
        click.echo(f"[cluster.{cl.name}] {r.label}: {r.root}")
        checks = run_doctor(r, cl, checkpoint_size(train, None), peak_checkpoint_files(keep), model_config(train))
    for c in checks:
        click.echo(str(c))
    failed = [c for c in checks if c.level == "fail"]
    if failed:
        raise ShardshipError(f"doctor: {len(failed)} check(s) failed on [cluster.{cl.name}]: "
                             f"{', '.join(c.what for c in failed)}", code=Exit.PARTIAL)


@click.command()
@_CLUSTER
@_CONFIG
@click.option("--name", default="shardship", show_default=True, help="Run name given to `train submit`.")
@click.option("--dest", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Local directory [outputs/CLUSTER/NAME].")
@_QUIET_FETCH
@_HOSTKEY
@friendly_errors
def fetch(cluster: str | None, config_path: str | None, name: str, dest: Path | None, quiet: bool,
          accept_new_host_key: bool) -> None:
    """Pull the best checkpoint, metrics, plots and the job log (transfer pull: resumed, verified)."""
    from train.jobs.fetch import fetch_results

    cfg, cl = _load(config_path, cluster)
    where, outcomes = fetch_results(cfg, cl, name=name, dest=dest, accept_new_host_key=accept_new_host_key)
    for o in [] if quiet else outcomes:
        click.echo(f"{'up to date' if o.skipped else 'fetched':>10}  {o.local_path}")
    click.echo(f"results in {where}")


@click.command()
@_CLUSTER
@_CONFIG
@click.option("--nproc-per-node", type=click.IntRange(1), default=None,
              help="Processes per node for a CPU job, as for `train submit`.")
@_HOSTKEY
@friendly_errors
def where(cluster: str | None, config_path: str | None, nproc_per_node: int | None, accept_new_host_key: bool) -> None:
    """Where this job would start soonest: per partition (queue) and GPU type, free / total GPUs and
    cores, and SLURM's own start estimate for this job's resources (sbatch --test-only). Then
    `train submit --partitions a,b` to queue in several and keep the first that starts."""
    from train.jobs.remote import connected
    from train.jobs.submit import job_train, make_spec
    from train.jobs.where import soonest
    from train.jobs.where import where as pools_of

    cfg, cl = _load(config_path, cluster)
    cfg.train = job_train(cfg)
    with connected(cl, None, accept_new_host_key) as r:
        spec = make_spec(cfg, cl, r.root, ranks_per_node=nproc_per_node)
        pools, extra = pools_of(r, spec.scheduler, spec)
    click.echo(f"[cluster.{cl.name}] {spec.nodes} node(s) x {spec.cpus_per_node} cores, "
               f"{spec.gpus_per_node} GPU(s) per node, {spec.mem} per node, {spec.walltime}:")
    for p in pools:
        click.echo(f"  {p}")
    if extra:
        click.echo(extra)
    best = soonest(pools)
    if best is not None:
        click.echo(f"soonest: {best.partition} ({best.start}); several at once: "
                   f"train submit --partitions {','.join(sorted({p.partition for p in pools}))}")
