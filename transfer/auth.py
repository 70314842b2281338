"""SSH authentication the way a cluster with Duo MFA needs it.

One connection per command means the user answers MFA once, so the prompts
the server sends (keyboard-interactive: "Password:", "Passcode or option
(1-3):") must reach the terminal as they are. paramiko's legacy auth only
does keyboard-interactive after a *partial* key success and then echoes the
answers; Fabric's OpenSSHAuthStrategy never does it. This strategy tries the
keys OpenSSH would (agent, IdentityFile from ~/.ssh/config, ~/.ssh/id_*),
then keyboard-interactive with every prompt passed to the terminal (hidden
input unless the server asks for echo), then a password prompt. Answers are
never printed, logged or kept.
"""
from __future__ import annotations

import getpass
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paramiko
from paramiko.auth_strategy import AuthFailure, AuthResult, AuthStrategy, SourceResult

from shardship.errors import RemoteError

#: `prompter(text, echo) -> answer`: how a prompt from the server reaches a person.
Prompter = Callable[[str, bool], str]

DEFAULT_IDENTITIES = ("id_ed25519", "id_ecdsa", "id_rsa")


def terminal_prompter(text: str, echo: bool) -> str:
    """Ask on the controlling terminal (not stdout: that may be piped to a log).
    Hidden input unless the server asked for echo (Duo's "option (1-3)" does)."""
    try:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError:
        raise RemoteError(
            "the server asks for interactive login (password / Duo) but there is no terminal: "
            "run the command in a terminal, or use a key that needs no prompt"
        ) from None
    os.close(fd)
    if not echo:
        return getpass.getpass(text)  # reads /dev/tty itself, echo off
    with open("/dev/tty", "wb", buffering=0) as out, open("/dev/tty", "rb", buffering=0) as inp:
        out.write(text.encode())
        line = b""
        while not line.endswith(b"\n"):
            b = inp.read(1)
            if not b:
                break
            line += b
    return line.decode(errors="replace").rstrip("\r\n")


def _print_to_terminal(text: str) -> None:
    try:
        with open("/dev/tty", "wb", buffering=0) as tty:
            tty.write((text + "\n").encode())
    except OSError:
        print(text, file=sys.stderr)


class InteractiveAuth(AuthStrategy):
    """Keys first, then keyboard-interactive (MFA) prompts, then a password prompt.

    Fabric instantiates it per connection (also per ProxyJump hop) with
    `ssh_config`, `fabric_config` and `username`. The prompter comes from the
    Fabric config key `shardship_prompter` so tests can answer real server
    prompts without a terminal."""

    def __init__(self, ssh_config: Any, fabric_config: Any = None, username: str | None = None):
        super().__init__(ssh_config=ssh_config)
        self.username = username or getpass.getuser()
        self.prompter: Prompter = terminal_prompter
        if fabric_config is not None:
            custom = fabric_config.get("shardship_prompter") if hasattr(fabric_config, "get") else None
            if callable(custom):
                self.prompter = custom
        self.agent: paramiko.Agent | None = None
        self._prompt_error: RemoteError | None = None

    # -- key sources -------------------------------------------------------
    def _identity_paths(self) -> list[Path]:
        paths = [Path(os.path.expanduser(p)) for p in self.ssh_config.get("identityfile", [])]
        if not paths:
            paths = [Path.home() / ".ssh" / n for n in DEFAULT_IDENTITIES]
        return [p for p in paths if p.is_file()]

    def _load_key(self, path: Path) -> paramiko.PKey | None:
        try:
            return paramiko.PKey.from_path(str(path))
        except paramiko.PasswordRequiredException:
            try:
                phrase = self.prompter(f"Enter passphrase for key '{path}': ", False)
            except RemoteError:
                return None  # no terminal: skip encrypted keys, as `ssh -o BatchMode` would
            try:
                return paramiko.PKey.from_path(str(path), passphrase=phrase.encode())
            except (paramiko.SSHException, ValueError):
                return None
        except (OSError, paramiko.SSHException, ValueError):
            return None

    def get_sources(self) -> Iterator[paramiko.PKey]:
        """Keys in OpenSSH's order: agent, then identity files."""
        try:
            self.agent = paramiko.Agent()
            agent_keys = list(self.agent.get_keys())
        except Exception:  # no agent, or a broken socket: keys from files still work
            agent_keys = []
        yield from agent_keys
        for path in self._identity_paths():
            key = self._load_key(path)
            if key is not None:
                yield key

    # -- the flow ----------------------------------------------------------
    def _kbd_handler(self, title: str, instructions: str, prompts: list[tuple[str, bool]]) -> list[str]:
        # Runs in paramiko's transport thread: an exception here would only be logged
        # there, so a prompt failure is kept and re-raised by authenticate().
        if self._prompt_error is not None:
            return ["" for _ in prompts]
        try:
            for text in (title, instructions):
                if text and text.strip():
                    _print_to_terminal(text.strip())
            return [self.prompter(prompt, bool(echo)) for prompt, echo in prompts]
        except (RemoteError, EOFError, KeyboardInterrupt, OSError) as e:
            self._prompt_error = e if isinstance(e, RemoteError) else RemoteError(
                f"login prompt aborted ({type(e).__name__})")
            return ["" for _ in prompts]

    def authenticate(self, transport: paramiko.Transport) -> AuthResult:
        result = AuthResult(strategy=self)
        allowed: set[str] | None = None  # None: the server has not told us yet
        user = self.username
        try:
            for key in self.get_sources():
                try:
                    remaining = transport.auth_publickey(user, key)
                except paramiko.BadAuthenticationType as e:
                    allowed = set(e.allowed_types)
                    result.append(SourceResult(f"publickey {key.get_name()}", e))
                    break
                except paramiko.AuthenticationException as e:
                    result.append(SourceResult(f"publickey {key.get_name()}", e))
                    continue
                result.append(SourceResult(f"publickey {key.get_name()}", remaining))
                if transport.is_authenticated():
                    return result
                allowed = set(remaining)  # partial success: the server wants a second factor
                break
            if allowed is None or "keyboard-interactive" in allowed:
                try:
                    transport.auth_interactive(user, self._kbd_handler)
                    result.append(SourceResult("keyboard-interactive", []))
                    if transport.is_authenticated():
                        return result
                except paramiko.BadAuthenticationType as e:
                    allowed = set(e.allowed_types)
                    result.append(SourceResult("keyboard-interactive", e))
                except paramiko.AuthenticationException as e:
                    if self._prompt_error is not None:
                        raise self._prompt_error from None
                    result.append(SourceResult("keyboard-interactive", e))
            if allowed is not None and "password" in allowed:
                try:
                    secret = self.prompter(f"{user}@{transport.getpeername()[0]}'s password: ", False)
                    transport.auth_password(user, secret, fallback=False)
                    del secret
                    result.append(SourceResult("password", []))
                    if transport.is_authenticated():
                        return result
                except paramiko.AuthenticationException as e:
                    result.append(SourceResult("password", e))
        finally:
            if self.agent is not None:
                self.agent.close()
        raise AuthFailure(result=result)


def fabric_overrides(prompter: Prompter | None) -> dict[str, Any]:
    """Fabric config overrides that install this strategy (and an optional prompter)."""
    over: dict[str, Any] = {"authentication": {"strategy_class": InteractiveAuth}}
    if prompter is not None:
        over["shardship_prompter"] = prompter
    return over
