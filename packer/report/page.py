"""The page machinery every report shares (`packer report`, `train eval`): a Jinja2
environment over the package's templates, figures as inline base64 PNG, and the
atomic write of one self-contained HTML file.

Self-contained means it opens from a laptop, from a `transfer pull`ed folder or
an e-mail attachment: no server, no network, no file next to it. So the CSS sits
in the base template and every image is a data: URI. Templates autoescape: a
session name or a warning is text, never markup. matplotlib runs on Agg (no
display, also on a cluster node), imported only when a figure is drawn."""
from __future__ import annotations

import base64
import datetime as _dt
import io
import os
from pathlib import Path
from typing import Any

import jinja2

from shardship import __version__
from shardship.atomic import atomic_open

PACKAGE = "packer.report"
DPI = 72  # a figure at 72 dpi: sharp enough on screen, ~15-40 KB of PNG each


def environment(*packages: str) -> jinja2.Environment:
    """Templates from `packages` first (a later stage's own pages), then this
    package's (base.html.j2, the macros), so `{% extends "base.html.j2" %}` works
    from any of them."""
    loaders: list[jinja2.BaseLoader] = [jinja2.PackageLoader(p, "templates") for p in packages if p != PACKAGE]
    loaders.append(jinja2.PackageLoader(PACKAGE, "templates"))
    env = jinja2.Environment(loader=jinja2.ChoiceLoader(loaders), autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters.update(num=fmt_num, pct=fmt_pct, anchor=anchor)
    return env


def anchor(name: str) -> str:
    """A session's id in the page (links from the overview land on its section)."""
    return "s-" + "".join(c if c.isalnum() else "-" for c in name)


def fmt_num(v: Any, digits: int = 3) -> str:
    """A number for a table cell: `digits` significant digits, '-' for none."""
    if v is None:
        return "-"
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    if f != f:
        return "-"
    return f"{f:.{digits}g}"


def fmt_pct(v: Any, digits: int = 0) -> str:
    return "-" if v is None else f"{100 * float(v):.{digits}f}%"


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (imported on first use: `import packer`
    and the CLI's --help stay fast)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png_uri(fig: Any, dpi: int = DPI) -> str:
    """A matplotlib figure as a data: URI (PNG); the figure is closed."""
    plt = pyplot()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def jpeg_uri(data: bytes) -> str:
    """JPEG bytes as they are (a packed frame is shown exactly as the trainer reads it)."""
    return "data:image/jpeg;base64," + base64.b64encode(data).decode("ascii")


def render(template: str, context: dict[str, Any], out: str | os.PathLike, *packages: str) -> Path:
    """Render `template` with `context` (plus `generated` and `tool`) into `out`,
    atomically: a reader never sees half a page. Returns the path."""
    env = environment(*packages)
    ctx = {"generated": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "tool": f"shardship {__version__}", **context}
    html = env.get_template(template).render(**ctx)
    path = Path(out)
    with atomic_open(path, "wb") as f:
        f.write(html.encode("utf-8"))
    return path
