"""Progress that suits where the output goes: a bar on a terminal, plain lines elsewhere.

A tqdm bar redraws itself with carriage returns: in a cluster job's log file or
a CI log that is one unreadable line per refresh. So a bar is drawn only when
stderr is a terminal; otherwise `Lines` prints one plain line per ~10% done or
per minute (whichever comes first), and `--quiet` (enabled=False) prints nothing.
Both have the small part of tqdm's interface the stages use: update, total,
set_postfix_str, close, context manager.
"""
from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from shardship.units import plural

STEP = 0.10  # a plain line per 10% done ...
EVERY_S = 60.0  # ... or per minute, whichever comes first


def bar(total: float, desc: str, unit: str = "it", enabled: bool | None = None, *, bytes_: bool = False,
        initial: float = 0, stream: TextIO | None = None, **tqdm_kw: Any) -> Any:
    """A tqdm bar on a terminal, `Lines` off one, nothing when `enabled` is False.
    `enabled=None`: bar on a terminal, plain lines otherwise; True forces output
    (bar or lines, by the stream)."""
    out = stream or sys.stderr
    tty = out.isatty()
    if enabled is False or not tty:
        return Lines(total, desc, unit, bytes_, out, silent=enabled is False, initial=initial)
    from tqdm import tqdm

    if bytes_:
        tqdm_kw.update(unit_scale=True, unit_divisor=1024)
    tqdm_kw.setdefault("mininterval", 0.5)
    return tqdm(total=total, desc=desc, unit="B" if bytes_ else unit, file=out, dynamic_ncols=True, initial=initial,
                **tqdm_kw)


def _amount(n: float, bytes_: bool, unit: str) -> str:
    if not bytes_:
        return f"{n:,.0f} {plural(unit, n)}"
    from shardship.units import human

    return human(int(n))


class Lines:
    """One plain line per STEP of the total or per EVERY_S seconds, and one at the end."""

    def __init__(self, total: float, desc: str, unit: str, bytes_: bool, stream: TextIO, silent: bool = False,
                 initial: float = 0):
        self.total = total
        self.desc, self.unit, self.bytes_, self.stream, self.silent = desc, unit, bytes_, stream, silent
        self.n = self.initial = float(initial)
        self.t0 = self.last_t = time.monotonic()
        self.last_frac = self.n / total if total else 0.0
        self.postfix = ""
        self.closed = False

    def update(self, n: float = 1) -> None:
        self.n += n
        now = time.monotonic()
        frac = self.n / self.total if self.total else 0.0
        if frac - self.last_frac >= STEP or now - self.last_t >= EVERY_S:
            self._line(now)
            self.last_frac, self.last_t = frac, now

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = s

    def set_postfix(self, refresh: bool = True, **kw: Any) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in kw.items())

    def _line(self, now: float) -> None:
        if self.silent:
            return
        dt = max(now - self.t0, 1e-9)
        pct = f"{100 * self.n / self.total:3.0f}% " if self.total else ""
        rate = (_amount((self.n - self.initial) / dt, True, "") if self.bytes_
                else f"{(self.n - self.initial) / dt:,.1f} {self.unit}") + "/s"  # "2.5 shard/s": a unit, no plural
        # "15 of 15 shards", not "15 shard of 15 shard"
        done = f"{self.n:,.0f}" if self.total and not self.bytes_ else _amount(self.n, self.bytes_, self.unit)
        total = f" of {_amount(self.total, self.bytes_, self.unit)}" if self.total else ""
        tail = f" [{self.postfix}]" if self.postfix else ""
        print(f"{self.desc}: {pct}{done}{total}, {rate}, {dt:.0f} s{tail}", file=self.stream, flush=True)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.n > self.initial and self.last_frac < 1.0:
                self._line(time.monotonic())

    def write(self, msg: str) -> None:
        if not self.silent:
            print(msg, file=self.stream, flush=True)

    def __enter__(self) -> Lines:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
