"""Shared CLI plumbing for packer, transfer and train: expected failures become
one line on stderr and an exit code from DESIGN.md; ctrl-C says what was kept."""
from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable, TypeVar

import click

from packer.errors import ShardshipError

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
