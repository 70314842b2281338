"""Shared CLI plumbing for packer, transfer and train: expected failures become
one line on stderr and an exit code (shardship.errors.Exit); ctrl-C says what was kept."""
from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from shardship.errors import ShardshipError

F = TypeVar("F", bound=Callable[..., Any])
INTERRUPTED = "interrupted: finished work is saved; run the same command again to continue"


def _rank_prefix() -> str:
    """Under torchrun every rank may fail; say which one did."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    return f"rank {os.environ.get('RANK', '0')}: " if world > 1 else ""


def friendly_errors(fn: F | None = None, *, interrupted: str = INTERRUPTED) -> Any:
    """Decorator (bare or with `interrupted=` text) for click command callbacks."""

    def deco(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return f(*args, **kwargs)
            except ShardshipError as e:
                click.echo(f"error: {_rank_prefix()}{e}", err=True)
                sys.exit(int(e.code))
            except KeyboardInterrupt:
                click.echo(f"\n{interrupted}", err=True)
                sys.exit(130)

        return wrapper  # type: ignore[return-value]

    return deco(fn) if fn is not None else deco


def config_option(dest: str = "config_path") -> Callable[[F], F]:
    """--config, the same for every command of every tool."""
    return click.option("--config", dest, type=click.Path(dir_okay=False, path_type=Path), default=None,
                        help="shardship.toml (default: ./shardship.toml or $SHARDSHIP_CONFIG).")


cluster_option = click.option(
    "--cluster", default=None, metavar="NAME",
    help="[cluster.NAME] from shardship.toml (default: the only one), or local:PATH (a directory standing in "
         "for the remote home).")

host_key_option = click.option(
    "--accept-new-host-key", is_flag=True,
    help="Trust and save an unknown SSH host key (a changed key is still refused).")
