"""Shared CLI plumbing: expected failures become one line on stderr and an exit
code from DESIGN.md; ctrl-C says what was kept."""
from __future__ import annotations

import functools
import sys
from typing import Any, Callable, TypeVar

import click

from packer.errors import ShardshipError

F = TypeVar("F", bound=Callable[..., Any])


def friendly_errors(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ShardshipError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(int(e.code))
        except KeyboardInterrupt:
            click.echo("\ninterrupted: finished work is saved; run the same command again to continue", err=True)
            sys.exit(130)

    return wrapper  # type: ignore[return-value]
