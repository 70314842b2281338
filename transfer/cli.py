"""`transfer quota | upload | status | pull | connect | disconnect`: thin click wrappers.

Each command opens the cluster's Remote once (transfer.connect); on the OpenSSH
transport that is a channel of the cluster's one master connection, which
`connect` opens explicitly (the one login, with its MFA prompts, on the
terminal) and `disconnect` closes.

Expected failures print one line (no traceback) and exit with the code from
shardship.errors: 2 usage/config, 3 over quota (nothing sent), 4 remote /
connection, 1 partial (disk full mid-way: verified shards kept).
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import click

from shardship.cliopts import cluster_option, config_option, friendly_errors, host_key_option, tool_group
from shardship.config import load_config
from shardship.errors import Exit, QuotaError, ShardshipError
from shardship.units import human, parse_size
from transfer.connection import connect
from transfer.plan import DEFAULT_MARGIN
from transfer.quota import live_quota


def _common(f: Callable) -> Callable:
    """--cluster, --config, --accept-new-host-key: every command that connects."""
    f = host_key_option(f)
    f = config_option("config")(f)
    f = cluster_option(f)
    return f


def _packed(f: Callable) -> Callable:
    """--out, for the commands that read the local packed directory (upload, status)."""
    return click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path), default=None,
                        help="Local packed directory (default: paths.packed from the config, data/packed).")(f)


_errors = friendly_errors(interrupted="interrupted: partial files are kept; rerun the same command to resume")


def _setup(cluster: str | None, config: Path | None, out: Path | None):
    cfg = load_config(config)
    return cfg, cfg.cluster(cluster), (out if out is not None else cfg.packed)


@tool_group
def main() -> None:
    """Move packed shards to a cluster: quota-aware, resumable, verified, one SSH connection per command."""


@main.command()
@_common
@click.option("--json", "as_json", is_flag=True, help="Print the numbers as JSON.")
@_errors
def quota(cluster: str | None, config: Path | None, accept_new_host_key: bool, as_json: bool) -> None:
    """Live quota and usage (space and inodes) of the cluster's remote_dir."""
    cfg, cl, _ = _setup(cluster, config, None)
    with connect(cl, accept_new_host_key) as remote:
        q = live_quota(remote)
        if as_json:
            click.echo(json.dumps({"where": f"{remote.label}:{remote.root}", **(q.__dict__ if q else {}),
                                   "headroom_bytes": q.headroom_bytes if q else None}))
            return
        if q is None:
            raise ShardshipError(f"{remote.label}: no quota tool answered (not even df)", code=Exit.REMOTE)
        click.echo(f"{remote.label}:{remote.root}")
        click.echo(f"  space : {human(q.used_bytes or 0)} used" +
                   (f" of {human(q.limit_bytes)}" if q.limit_bytes is not None else "") +
                   (f", {human(max(q.headroom_bytes, 0))} free" if q.headroom_bytes is not None else ""))
        if q.inode_limit is not None:
            click.echo(f"  files : {q.inode_used or 0:,} of {q.inode_limit:,}")
        click.echo(f"  source: {q.source}" + (f" ({q.filesystem})" if q.filesystem else ""))


@main.command()
@_common
@_packed
@click.option("--dry-run", is_flag=True,
              help="Print the plan (what would be sent, peak usage vs quota); send nothing. "
                   "Exit 3 if it would not fit.")
@click.option("--margin", default=DEFAULT_MARGIN, show_default=True,
              help="Safety margin kept free under the quota: a percentage of the limit or a size (200M).")
@click.option("--bwlimit", default=None, help="Limit the upload rate, e.g. 20M (bytes per second).")
@click.option("--no-compress", is_flag=True, help="Send .tar even where a .tar.zst exists.")
@click.option("--progress/--no-progress", default=None,
              help="Progress (default: a bar on a terminal, else a plain line per ~10% or per minute).")
@click.option("--quiet", is_flag=True, help="No progress output at all (same as --no-progress).")
@click.option("--prune", is_flag=True,
              help="After index.json is switched, delete shards of older packs (shards are content-named, so a "
                   "re-pack uploads new files and a job still reading the old index keeps its old shards).")
@_errors
def upload(cluster: str | None, config: Path | None, out: Path | None, accept_new_host_key: bool, dry_run: bool,
           margin: str, bwlimit: str | None, no_compress: bool, progress: bool | None, quiet: bool,
           prune: bool) -> None:
    """Send new/changed shards, verify each by sha256 on the remote, write index.json last.
    Sends the .tar.zst where `packer pack --compress` wrote one (unpacked and checked there)."""
    from transfer.upload import upload as do_upload

    progress = False if quiet else progress
    cfg, cl, packed = _setup(cluster, config, out)
    rate = parse_size(bwlimit) if bwlimit else None
    with connect(cl, accept_new_host_key) as remote:
        result = do_upload(remote, packed, margin=margin, dry_run=dry_run, bwlimit=rate, config_quota=cl.quota,
                           use_compressed=not no_compress, progress=progress, prune=prune)
        if dry_run or result.plan.sends:
            click.echo(f"plan for {result.where}:")
            for line in result.plan.lines():
                click.echo(line)
        if dry_run and result.plan.sends and not result.plan.fits:
            raise QuotaError(result.plan.refusal(result.where))  # same verdict and exit code (3) as a real run
        click.echo(result.summary())


@main.command()
@_common
@_packed
@click.option("--verify", is_flag=True, help="Re-hash every shard (remote side on the remote, local side here).")
@_errors
def status(cluster: str | None, config: Path | None, out: Path | None, accept_new_host_key: bool,
           verify: bool) -> None:
    """What is local, remote, verified, missing. Exit 1 while the remote does not hold the
    local pack yet (a shard missing, partial or different, index.json not the same)."""
    from transfer.manifest import load_local
    from transfer.status import local_verify
    from transfer.status import status as do_status

    cfg, cl, packed = _setup(cluster, config, out)
    with connect(cl, accept_new_host_key) as remote:
        report = do_status(remote, packed, verify=verify)
    for line in report.lines():
        click.echo(line)
    if verify and report.index_local:
        bad = local_verify(packed, load_local(packed)[1])
        if bad:
            click.echo(f"  local shards that differ from index.json: {', '.join(bad)} (re-run `packer pack`)")
    why = report.incomplete()
    if why:
        raise ShardshipError(why, code=Exit.PARTIAL)


@main.command()
@_common
@click.argument("paths", nargs=-1, required=True)
@click.option("--dest", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Local directory to put the files in (default: paths.outputs, outputs/).")
@click.option("--progress/--no-progress", default=None,
              help="Progress (default: a bar on a terminal, else a plain line per ~10% or per minute).")
@click.option("--quiet", is_flag=True, help="No progress output at all (same as --no-progress).")
@_errors
def pull(cluster: str | None, config: Path | None, accept_new_host_key: bool,
         paths: tuple[str, ...], dest: Path | None, progress: bool | None, quiet: bool) -> None:
    """Fetch files or directories (relative to remote_dir) back, resumed and verified."""
    from transfer.pull import pull as do_pull

    progress = False if quiet else progress
    cfg, cl, _ = _setup(cluster, config, None)
    target = dest if dest is not None else cfg.outputs
    with connect(cl, accept_new_host_key) as remote:
        outcomes = do_pull(remote, list(paths), target, progress=progress)
    got = [o for o in outcomes if not o.skipped]
    click.echo(f"{len(got)} files fetched and verified ({human(sum(o.received for o in got))}), "
               f"{len(outcomes) - len(got)} already here, into {target}")


@main.command(name="connect")
@_common
@_errors
def connect_cmd(cluster: str | None, config: Path | None, accept_new_host_key: bool) -> None:
    """Log in once (MFA prompts here) and keep the connection for ControlPersist (default 8h):
    every later transfer/train/packer command to this cluster reuses it without a prompt."""
    from transfer.connection import master_for, transport

    _, cl, _ = _setup(cluster, config, None)
    if transport(cl) != "openssh":
        click.echo(f"[cluster.{cl.name}] uses the paramiko transport: each command logs in on its own; "
                   f"nothing to keep open (transport = \"openssh\" needs the `ssh` client)")
        return
    m = master_for(cl, accept_new_host_key)
    reused = m.ensure()
    whose = "your ControlPath from ~/.ssh/config" if not m.own_socket else "shardship's socket"
    click.echo(f"{m.label}: {'already connected' if reused else 'connected'} ({whose}: {m.control_path}); "
               f"commands reuse it without logging in" + ("" if reused else f" for {m.persist} of idle time") +
               "; `transfer disconnect` closes it")


@main.command()
@config_option("config")
@cluster_option
@_errors
def disconnect(cluster: str | None, config: Path | None) -> None:
    """Close the cluster's OpenSSH master connection (the next command logs in again)."""
    from transfer.connection import master_for, transport

    cl = load_config(config).cluster(cluster)
    if transport(cl) != "openssh":
        click.echo(f"[cluster.{cl.name}] uses the paramiko transport: no connection is kept open")
        return
    m = master_for(cl)
    click.echo(f"{m.label}: {'disconnected' if m.stop() else 'no open connection'} ({m.control_path})")
