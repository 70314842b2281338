"""`packer report`: one static, self-contained HTML page for a packed dataset
(and its raw folder when it is there), to look at every session before a day of
GPU queue is spent on them. `page` holds the machinery `train eval` reuses.

Sessions are independent, so their sections (a shard read, two figures, a
thumbnail) fan out over worker processes; the overview and the outlier flags
need them all and are done here after."""
from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from packer.report.outliers import QUANTITIES, flag_sessions
from packer.report.overview import overview
from packer.report.page import render
from shardship.format import index as fmt

DEFAULT_NAME = "report.html"
_WORKER: dict[str, Any] = {}


def _init(out_dir: Path, raw_dir: Path | None) -> None:
    _WORKER.update(out=out_dir, raw=raw_dir, index=fmt.read(out_dir))


def _section(name: str) -> dict[str, Any]:
    from packer.report.sessions import session_section

    return session_section(_WORKER["out"], _WORKER["raw"], _WORKER["index"], name)


def _sections(out_dir: Path, raw_dir: Path | None, names: list[str], workers: int) -> list[dict[str, Any]]:
    if workers <= 1 or len(names) < 4:
        _init(out_dir, raw_dir)
        return [_section(n) for n in names]
    import multiprocessing as mp

    fork = "fork" in mp.get_all_start_methods()
    if fork:  # import matplotlib once, here: every forked worker has it for free
        from packer.report.page import pyplot

        pyplot()
    ctx = mp.get_context("fork" if fork else "spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init, initargs=(out_dir, raw_dir)) as ex:
        return list(ex.map(_section, names, chunksize=max(1, len(names) // (4 * workers))))


def write_dataset_report(out_dir: str | os.PathLike, raw_dir: str | os.PathLike | None, report: str | os.PathLike,
                         *, train_cfg: dict[str, Any] | None = None, budget: dict[str, Any] | None = None,
                         workers: int | None = None) -> dict[str, Any]:
    """Write the page to `report`; returns the overview (counts, refused sessions)
    for the CLI's summary line. `budget`: the quota budget as plain numbers (the
    CLI computes it with the trainer's checkpoint sizes), or None."""
    out = Path(out_dir)
    raw = Path(raw_dir) if raw_dir is not None else None
    index = fmt.read(out)
    names = sorted(index.doc.get("sessions") or {})
    workers = workers if workers is not None else min(os.cpu_count() or 1, 4)
    sections = _sections(out, raw, names, workers)
    flags, flag_note = flag_sessions({s["name"]: s["metrics"] for s in sections})
    for s in sections:
        s["flags"] = [str(f) for f in flags.get(s["name"], [])]
    ov = overview(index.doc, raw, train_cfg or {}, budget)
    val = set(ov["val"])
    for s in sections:
        s["split"] = "validation" if s["name"] in val else "train"
    ctx = {"title": f"shardship dataset report: {out}", "ov": ov, "sessions": sections, "flag_note": flag_note,
           "quantities": QUANTITIES, "n_flagged": sum(1 for s in sections if s["flags"]),
           "out_dir": str(out), "raw_dir": str(raw) if raw is not None else None}
    render("dataset.html.j2", ctx, report)
    return ov
