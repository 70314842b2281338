"""shardship.progress: a job log gets plain lines, not a redrawn bar."""
from __future__ import annotations

import io

from shardship import progress


class _Pipe(io.StringIO):
    def isatty(self) -> bool:
        return False


def test_off_a_terminal_one_line_per_tenth() -> None:
    out = _Pipe()
    with progress.bar(1000, "upload", enabled=None, bytes_=True, stream=out) as bar:
        for _ in range(100):
            bar.update(10)
    lines = out.getvalue().splitlines()
    assert 9 <= len(lines) <= 11 and "\r" not in out.getvalue()
    assert lines[-1].startswith("upload: 100% ")


def test_a_minute_without_a_tenth_still_prints(monkeypatch) -> None:
    out = _Pipe()
    now = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    bar = progress.bar(10**9, "train", "step", stream=out, initial=5)
    now[0] = 61.0
    bar.update(1)
    bar.set_postfix(loss="0.1")
    assert len(out.getvalue().splitlines()) == 1 and "train:" in out.getvalue()


def test_quiet_prints_nothing() -> None:
    out = _Pipe()
    with progress.bar(10, "pull", enabled=False, stream=out) as bar:
        bar.update(10)
    assert out.getvalue() == ""
