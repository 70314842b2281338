"""Per-stage timing of one session's SLAM, and an optional tqdm bar for it."""
from __future__ import annotations

import sys
import time

STAGES = ("check", "features", "matching", "mapping", "scale", "write")


class Stages:
    """Per-stage timing and an optional tqdm bar (one per session, left behind)."""

    def __init__(self, name: str, progress: bool):
        self.name = name
        self.seconds: dict[str, float] = {}
        self._seen: set[str] = set()  # a long session maps in parts: each stage counts once on the bar
        self._cur: str | None = None
        self._t = time.perf_counter()
        self.bar = None
        if progress and sys.stderr.isatty():  # off a terminal the session line below says enough
            from tqdm import tqdm

            self.bar = tqdm(total=len(STAGES), desc=name, unit="stage", leave=False)

    def __call__(self, stage: str) -> None:
        now = time.perf_counter()
        if self._cur is not None:
            self.seconds[self._cur] = self.seconds.get(self._cur, 0.0) + now - self._t
            if self.bar is not None and self._cur not in self._seen:
                self.bar.update(1)
            self._seen.add(self._cur)
        self._cur, self._t = stage.split(" ")[0], now
        if self.bar is not None:
            self.bar.set_postfix_str(stage)

    def close(self) -> dict[str, float]:
        self("done")
        if self.bar is not None:
            self.bar.close()
        self.seconds.pop("done", None)
        return self.seconds
