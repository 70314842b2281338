"""Exit codes and the one exception type every CLI turns into a one-line message.

Expected failures (bad session, over quota, host down) are `ShardshipError`s and
never print a traceback; anything else is a bug and should."""
from __future__ import annotations

import enum


class Exit(enum.IntEnum):
    OK = 0
    PARTIAL = 1  # some sessions / shards failed, the others are done
    USAGE = 2  # usage or config error
    QUOTA = 3  # would exceed quota, nothing sent
    REMOTE = 4  # remote / connection failure


class ShardshipError(Exception):
    """A failure the user can act on: the message names the file/session/host and
    says what to do; `code` is the process exit code."""

    code: Exit = Exit.USAGE

    def __init__(self, message: str, code: Exit | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code


class SessionError(ShardshipError):
    """One session cannot go through; the others still do (exit code 1)."""

    code = Exit.PARTIAL

    def __init__(self, session: str, path: str, reason: str):
        self.session, self.path, self.reason = session, path, reason
        super().__init__(f"session {session}: {path}: {reason}")


class QuotaError(ShardshipError):
    code = Exit.QUOTA


class RemoteError(ShardshipError):
    code = Exit.REMOTE
