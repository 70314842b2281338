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


class Group(click.Group):
    """The click group of all three tools: `-h` as well as `--help` (on every subcommand too,
    through the context), and a usage error as one line naming the command's help, exit 2
    (click's own is three lines: usage, a hint, the error)."""

    context_settings = {"help_option_names": ["-h", "--help"]}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("context_settings", dict(self.context_settings))
        super().__init__(*args, **kwargs)

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,  # type: ignore
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except click.UsageError as e:
            where = e.ctx.command_path if e.ctx is not None else self.name
            click.echo(f"error: {e.format_message()} (`{where} -h` for help)", err=True)
            sys.exit(e.exit_code)
        except click.ClickException as e:
            e.show()
            sys.exit(e.exit_code)
        except click.Abort as e:  # ctrl-C (or end of input) outside a command's own handler
            ctrl_c = isinstance(e.__cause__, KeyboardInterrupt)
            click.echo("interrupted" if ctrl_c else "aborted", err=True)
            sys.exit(130 if ctrl_c else 1)
        sys.exit(rv if type(rv) is int else 0)  # click.exceptions.Exit (--help, --version) returns its code


def tool_group(fn: Callable[..., Any]) -> click.Group:
    """`@tool_group` on a tool's top-level function: the Group above, with --version."""
    return click.group(cls=Group)(click.version_option(package_name="shardship", message="%(prog)s %(version)s")(fn))
