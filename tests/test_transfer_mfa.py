"""MFA against a real sshd that wants the key AND a keyboard-interactive answer (PAM asks,
as Duo does after the key), on both transports.

OpenSSH answers its prompts on the terminal itself; without one the tests give it
SSH_ASKPASS (tests/sshd.py `askpass_env`: the answer comes from the environment).
The point of the OpenSSH transport is the last test: a whole training round trip,
five commands in five processes, is ONE keyboard-interactive login in the sshd log.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardship.errors import RemoteError
from shardship.units import human
from tests.sshd import SSHD, make_packed
from transfer import connect

pytestmark = pytest.mark.sshd
ROOT = Path(__file__).resolve().parents[1]
KBD = "Accepted keyboard-interactive/pam"


@pytest.fixture(scope="module")
def mfa_sshd() -> Iterator[tuple[SSHD, str]]:
    """A second sshd that wants the key AND a keyboard-interactive answer (PAM password)."""
    import secrets

    from tests.sshd import skip_reason, start_sshd

    if skip_reason():
        pytest.skip(skip_reason())
    secret = secrets.token_urlsafe(16)
    # 256 MiB: room for `train submit`'s checkpoint check in the round trip
    with start_sshd(quota_bytes=256 * 1024 * 1024, overrides={"UsePAM": "yes", "KbdInteractiveAuthentication": "yes",
                               "AuthenticationMethods": "publickey,keyboard-interactive"}, password=secret) as s:
        yield s, secret
        s.disconnect()


@pytest.fixture(params=["openssh", "paramiko"])
def mfa(mfa_sshd: tuple[SSHD, str], request: pytest.FixtureRequest) -> Iterator[tuple[SSHD, str]]:
    """The MFA server on one transport, with no master connection before or after."""
    s, secret = mfa_sshd
    s.transport = request.param
    s.disconnect()
    yield s, secret
    s.disconnect()
    s.transport = "auto"


def write_config(tmp_path: Path, s: SSHD, extra: str = "") -> Path:
    cfg = tmp_path / "shardship.toml"
    cfg.write_text(extra + s.toml())
    return cfg


def tool(name: str, args: list[str], env: dict[str, str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", name, *args], cwd=ROOT, env=env, capture_output=True, timeout=180,
                          **kw)


def test_keyboard_interactive_prompt_answered(mfa, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    s, secret = mfa
    monkeypatch.setenv("HOME", str(s.client_home))
    asked: list[tuple[str, bool]] = []

    def prompter(text: str, echo: bool) -> str:
        asked.append((text, echo))
        return secret

    if s.transport == "openssh":  # ssh asks itself: here through SSH_ASKPASS, as there is no terminal
        for k, v in s.askpass_env(secret, tmp_path / "asked").items():
            monkeypatch.setenv(k, v)
    with connect(s.cluster(), prompter=prompter if s.transport == "paramiko" else None) as remote:
        assert remote.run(["whoami"]).stdout.strip() == s.user
    if s.transport == "openssh":
        asked = [(line, False) for line in (tmp_path / "asked").read_text().splitlines()]
        assert len(asked) == 1 and asked[0][0].endswith("Password: ")  # OpenSSH adds "(user@host) "
    else:
        assert asked == [("Password: ", False)]  # the server's own prompt, input hidden
    assert KBD in s.log.read_text()


def test_keyboard_interactive_wrong_answer_is_a_clean_error(mfa, monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path: Path) -> None:
    s, secret = mfa
    monkeypatch.setenv("HOME", str(s.client_home))
    for k, v in s.askpass_env("wrong-" + secret, tmp_path / "asked").items():
        monkeypatch.setenv(k, v)
    prompter = (lambda text, echo: "wrong-" + secret) if s.transport == "paramiko" else None
    with pytest.raises(RemoteError) as e:
        connect(s.cluster(), prompter=prompter)
    assert e.value.code == 4 and "authentication failed" in str(e.value)
    assert secret not in str(e.value)


def test_mfa_prompt_passes_through_the_terminal(mfa, tmp_path: Path) -> None:
    """The CLI in a pseudo-terminal: the server's prompt appears there, the answer typed
    there logs in, and the answer is not echoed."""
    import pty
    import select

    s, secret = mfa
    cfg = write_config(tmp_path, s)
    pid, fd = pty.fork()
    if pid == 0:  # child: its controlling terminal is the pty
        os.chdir(ROOT)
        os.execve(sys.executable, [sys.executable, "-m", "transfer", "quota", "--config", str(cfg)], s.env())
    seen = b""
    answered = False
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        r, _, _ = select.select([fd], [], [], 0.5)
        if not r:
            continue
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
        if not answered and b"Password: " in seen:
            os.write(fd, secret.encode() + b"\n")
            answered = True
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    text = seen.decode(errors="replace")
    assert answered, text
    assert os.WEXITSTATUS(status) == 0, text
    assert human(s.quota_bytes) in text and secret not in text


def test_mfa_without_a_terminal_says_so(mfa, tmp_path: Path) -> None:
    s, _ = mfa
    cfg = write_config(tmp_path, s)
    p = subprocess.run([sys.executable, "-m", "transfer", "quota", "--config", str(cfg)], cwd=ROOT, env=s.env(),
                       stdin=subprocess.DEVNULL, capture_output=True, start_new_session=True, timeout=60)
    assert p.returncode == 4, p.stderr.decode()
    err = p.stderr
    assert b"no terminal" in err and b"Traceback" not in err and b"Unknown exception" not in err


def _job_record(outputs: Path, s: SSHD) -> None:
    """What `train submit` records after a real submission (this server has no scheduler:
    `train status` asks scontrol/squeue over the connection and reports GONE)."""
    from train.jobs.records import JOBS_FILE, JobRecord, append_record

    run = str(s.home / "shardship" / "outputs" / "shardship")
    append_record(outputs / JOBS_FILE, JobRecord("test", s.alias, "slurm", "4242", "shardship",
                                                 str(s.home / "shardship" / "jobs" / "job.sh"), run + "/job.log", run,
                                                 str(s.home / "shardship"), "2026-01-01T00:00:00Z"))
    os.makedirs(run, exist_ok=True)
    for name, data in (("last.pt", b"\0" * 4096), ("metrics.jsonl", b'{"step": 1}\n'), ("job.log", b"done\n")):
        Path(run, name).write_bytes(data)
    for d, _, files in os.walk(s.home / "shardship" / "outputs"):
        os.chown(d, s.uid, -1)
        for f in files:
            os.chown(os.path.join(d, f), s.uid, -1)


def test_one_mfa_login_for_a_whole_round_trip(mfa_sshd: tuple[SSHD, str], tmp_path: Path) -> None:
    """upload, status, submit --dry-run, train status, fetch: five processes, ONE login
    (keyboard-interactive) on the OpenSSH transport; the rest ride on its master."""
    s, secret = mfa_sshd
    s.transport = "openssh"
    s.disconnect()
    try:
        packed, outputs = tmp_path / "packed", tmp_path / "outputs"
        make_packed(packed)
        cfg = write_config(tmp_path, s, f'[paths]\npacked = "{packed}"\noutputs = "{outputs}"\n\n'
                                        '[train]\nnum_workers = 1\n\n[train.model]\npreset = "tiny"\n\n')
        with open(cfg, "a") as f:
            f.write('scheduler = "slurm"\ngpus = 0\ncpus = 2\nmem = "4G"\n')
        env = {**s.env(), **s.askpass_env(secret, tmp_path / "asked")}
        logins = s.log.read_text().count(KBD)
        steps = [("transfer", ["upload", "--no-progress"]), ("transfer", ["status"]),
                 ("train", ["submit", "--dry-run", "--no-probe"]), ("train", ["status"]), ("train", ["fetch"])]
        for i, (name, args) in enumerate(steps):
            if i == 3:
                _job_record(outputs, s)
            p = tool(name, [*args, "--config", str(cfg)], env)
            assert p.returncode == 0, f"{name} {args}: {p.stderr.decode()[-2000:]}"
        assert s.log.read_text().count(KBD) == logins + 1
        assert len((tmp_path / "asked").read_text().splitlines()) == 1  # one prompt answered, in the first command
        assert (outputs / "test" / "shardship" / "last.pt").stat().st_size == 4096
    finally:
        s.disconnect()
        s.transport = "auto"
