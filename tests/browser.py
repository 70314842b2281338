"""A real headless Chromium, driven over the DevTools protocol on a pipe
(--remote-debugging-pipe: no port, nothing on the network), to look at a report
page as a person's browser does: console errors, uncaught exceptions, whether
every <img> decoded, the page's text, and a full-page PNG screenshot.

    python -m tests.browser PAGE.html OUT.png [--width 1280] [--colors 128]   # what docs/ shows

`open_page` raises BrowserUnavailable (tests skip with its message) when no
chromium is installed or it cannot start here."""
from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
         "--hide-scrollbars", "--mute-audio", "--remote-debugging-pipe"]
IMAGES_JS = "Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth, i.naturalHeight])"


class BrowserUnavailable(RuntimeError):
    """No chromium here, or it would not start (the reason is the message)."""


@dataclass
class PageResult:
    errors: list[str] = field(default_factory=list)  # console errors, exceptions, failed loads
    images: list[tuple[str, bool, int, int]] = field(default_factory=list)  # alt, complete, naturalW, naturalH
    text: str = ""  # document.body.innerText
    png: bytes = b""  # full-page screenshot


def find_chromium() -> str:
    for n in NAMES:
        p = shutil.which(n)
        if p:
            return p
    raise BrowserUnavailable(f"no chromium on PATH (tried {', '.join(NAMES)}): apt-get install chromium")


class _Pipe:
    """NUL-delimited JSON messages to and from the browser's fds 3 and 4."""

    def __init__(self, exe: str, profile: str):
        to_r, self._w = os.pipe()
        self._r, from_w = os.pipe()

        def child() -> None:
            os.dup2(to_r, 3)
            os.dup2(from_w, 4)

        # stderr to a file, not a pipe: chromium logs freely and a full pipe would block it
        self._log = open(Path(profile) / "chromium.log", "w+b")
        self.proc = subprocess.Popen([exe, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                     pass_fds=(3, 4, to_r, from_w), preexec_fn=child, start_new_session=True,
                                     stdout=subprocess.DEVNULL, stderr=self._log)
        os.close(to_r)
        os.close(from_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout: float = 60.0) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        try:
            os.write(self._w, json.dumps(msg).encode() + b"\0")
        except BrokenPipeError:  # chromium died before reading: say why, as a closed read side does
            raise self._died() from None
        while True:
            m = self._next(timeout)
            if m.get("id") == self._id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def wait_event(self, method: str, timeout: float = 60.0) -> dict[str, Any]:
        for i, e in enumerate(self.events):
            if e.get("method") == method:
                return self.events.pop(i)
        while True:
            m = self._next(timeout)
            if m.get("method") == method:
                return m
            self.events.append(m)

    def _next(self, timeout: float) -> dict[str, Any]:
        import select

        end = time.monotonic() + timeout
        while b"\0" not in self._buf:
            left = end - time.monotonic()
            ready, _, _ = select.select([self._r], [], [], max(0.0, left))
            if not ready:
                raise TimeoutError(f"chromium said nothing for {timeout:.0f} s")
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                raise self._died()
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def _died(self) -> BrowserUnavailable:
        code = self.proc.wait()
        self._log.seek(0)
        err = self._log.read().decode(errors="replace")[-800:]
        return BrowserUnavailable(f"chromium exited ({code}): {err.strip()}")

    def close(self) -> None:
        self._log.close()
        for fd in (self._w, self._r):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        try:  # its renderer and helpers too: one still writing into the profile failed its removal under load
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass


def open_page(page: str | os.PathLike, width: int = 1280, screenshot: bool = True,
              timeout: float = 60.0) -> PageResult:
    """Load `page` (a file) in headless chromium; see the module docstring."""
    exe = find_chromium()
    with tempfile.TemporaryDirectory(prefix="shardship-chromium-", ignore_cleanup_errors=True) as profile:
        try:
            pipe = _Pipe(exe, profile)
        except OSError as e:
            raise BrowserUnavailable(f"{exe} would not start: {e}") from None
        try:
            return _look(pipe, Path(page).resolve().as_uri(), width, screenshot, timeout)
        finally:
            pipe.close()


def _look(pipe: _Pipe, url: str, width: int, screenshot: bool, timeout: float) -> PageResult:
    try:
        target = pipe.send("Target.createTarget", {"url": "about:blank"}, timeout=timeout)["targetId"]
    except TimeoutError as e:
        raise BrowserUnavailable(f"chromium started but did not answer: {e}") from None
    sid = pipe.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    for domain in ("Page", "Runtime", "Log", "Network"):
        pipe.send(f"{domain}.enable", session=sid)
    pipe.send("Emulation.setDeviceMetricsOverride",
              {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False}, session=sid)
    pipe.send("Page.navigate", {"url": url}, session=sid)
    pipe.wait_event("Page.loadEventFired", timeout)
    res = PageResult()
    ev = pipe.send("Runtime.evaluate", {"expression": IMAGES_JS, "returnByValue": True}, session=sid)
    res.images = [tuple(x) for x in ev["result"]["value"]]  # type: ignore[misc]
    ev = pipe.send("Runtime.evaluate", {"expression": "document.body.innerText", "returnByValue": True}, session=sid)
    res.text = ev["result"]["value"]
    if screenshot:
        shot = pipe.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True},
                         session=sid, timeout=timeout)
        res.png = base64.b64decode(shot["data"])
    res.errors = _errors(pipe.events)
    return res


def _errors(events: list[dict[str, Any]]) -> list[str]:
    out = []
    for e in events:
        m, p = e.get("method"), e.get("params", {})
        if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append("console: " + " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
        elif m == "Runtime.exceptionThrown":
            out.append("exception: " + str(p.get("exceptionDetails", {}).get("text")))
        elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            out.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}")
        elif m == "Network.loadingFailed":
            out.append(f"load failed: {p.get('errorText')}")
        elif m == "Network.requestWillBeSent" and not p.get("request", {}).get("url", "").startswith(("file:", "data:",
                                                                                                      "about:")):
            out.append(f"network request: {p['request']['url']}")
    return out


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("page")
    ap.add_argument("png")
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--colors", type=int, default=0, help="write a palette PNG of this many colours (smaller file)")
    a = ap.parse_args(argv)
    r = open_page(a.page, a.width)
    if a.colors:
        import io

        from PIL import Image

        Image.open(io.BytesIO(r.png)).convert("RGB").quantize(a.colors).save(a.png, optimize=True)
        r.png = Path(a.png).read_bytes()
    else:
        Path(a.png).write_bytes(r.png)
    bad = [i for i in r.images if not i[2]]
    print(f"{a.png}: {len(r.png)} bytes; {len(r.images)} images, {len(bad)} not decoded; {len(r.errors)} errors")
    for e in r.errors:
        print("  " + e)
    return 1 if bad or r.errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
