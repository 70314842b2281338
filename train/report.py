"""`train eval`'s page: the policy on each validation session, next to what was
recorded, as one self-contained HTML file beside eval.json (`train fetch` brings
it back). Built with packer's report machinery (the same look as `packer report`)
and its shard reader, so the recorded trajectory is exactly what was packed.

Each sampled chunk is relative to its frame t (position in t's camera frame);
the page puts it into the session's world frame with t's recorded pose
(p_t + R_t x) so predicted and recorded paths overlay; joints are absolute
already and sit at the times of the steps they predict."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from packer.report.figures import JOINT_COLOURS, principal_axes
from packer.report.page import anchor, png_uri, pyplot, render
from packer.report.series import Series, read_series
from shardship.format import index as fmt

MAX_CHUNKS_DRAWN = 40  # per session: more make the overlay unreadable


def write_eval_page(data: Path, keys: list[str], pred: np.ndarray, true: np.ndarray, mask: np.ndarray,
                    res: dict[str, Any], path: Path, png: Path | None = None) -> Path:
    """The page for `train eval` (see the module docstring); `keys`: the sampled
    chunks' sample keys, in the order of `pred`/`true`/`mask`."""
    index = fmt.read(data)
    by_session: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        by_session.setdefault(k.split("/", 1)[0], []).append(i)
    sections = []
    for name in res.get("val_sessions") or sorted(by_session):
        rows = by_session.get(name, [])
        s = read_series(data, index, name, film=0)
        sections.append({"name": name, "anchor": anchor(name), "chunks": len(rows),
                         "errors": (res.get("per_session") or {}).get(name, {}),
                         "png": _session_figure(s, keys, rows, pred, true, mask, list(index.doc.get("joints") or []))
                         if rows else None})
    overall = {k: res.get(k) for k in ("position_cm", "rotation_deg", "joint_deg")}
    steps = None
    if png is not None and png.exists():
        import base64

        steps = "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode("ascii")
    ctx = {"title": f"shardship eval: {Path(res.get('checkpoint', '')).name} at step {res.get('step')}",
           "res": res, "overall": overall, "sessions": sections, "steps_png": steps, "data": str(data)}
    return render("eval.html.j2", ctx, path, "train")


def _world(s: Series, pos: int, chunk: np.ndarray) -> np.ndarray:
    """(T,3) chunk positions (frame `pos`'s camera frame) in the session's world."""
    return s.pos[pos] + chunk[:, :3] @ s.rot[pos].T


def _session_figure(s: Series, keys: list[str], rows: list[int], pred: np.ndarray, true: np.ndarray,
                    mask: np.ndarray, joint_names: list[str]) -> str | None:
    where = {k: i for i, k in enumerate(s.key)}
    ok = s.posed
    if ok.sum() < 2:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), layout="constrained", width_ratios=[1, 1, 1.6])
    c, ax3 = principal_axes(s.pos[ok])
    k = 100.0 if s.metric else 1.0
    rec = (s.pos[ok] - c) @ ax3.T * k
    for ax, (i, j), title in zip(axes[:2], ((0, 1), (0, 2)), ("top", "side")):
        ax.plot(rec[:, i], rec[:, j], "-", color="0.55", lw=1.2, label="recorded")
        ax.set_title(f"{title}: recorded (grey) vs predicted chunks (red)", fontsize=8.5)
        ax.set_aspect("equal", adjustable="datalim")
    picks = rows if len(rows) <= MAX_CHUNKS_DRAWN else [rows[i] for i in
                                                         np.linspace(0, len(rows) - 1, MAX_CHUNKS_DRAWN).astype(int)]
    ja = axes[2]
    for j in range(s.joints.shape[1] if s.joints_valid else 0):
        ja.plot(s.t, s.joints[:, j], color=JOINT_COLOURS[j % len(JOINT_COLOURS)], lw=1.0,
                label=joint_names[j] if j < len(joint_names) else f"joint {j}")
    for r in picks:
        pos = where.get(keys[r])
        if pos is None or not ok[pos]:
            continue
        m = mask[r].astype(bool)
        q = (np.vstack([s.pos[pos], _world(s, pos, pred[r][m])]) - c) @ ax3.T * k
        for ax, (i, j) in zip(axes[:2], ((0, 1), (0, 2))):
            ax.plot(q[:, i], q[:, j], "-", color="C3", lw=0.8, alpha=0.7)
        if s.joints_valid and pred.shape[-1] > 9:
            t = s.t[np.minimum(pos + 1 + np.flatnonzero(m), len(s.t) - 1)]
            for j in range(min(s.joints.shape[1], pred.shape[-1] - 9)):
                ja.plot(t, pred[r][m, 9 + j], "--", color=JOINT_COLOURS[j % len(JOINT_COLOURS)], lw=0.9)
    unit = "cm" if s.metric else "SfM units"
    for ax in axes[:2]:
        ax.set_xlabel(f"axis 1 ({unit})", fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    axes[0].set_ylabel(f"axis 2 ({unit})", fontsize=8)
    axes[1].set_ylabel(f"axis 3 ({unit})", fontsize=8)
    ja.set_title("joints: recorded (solid) vs predicted chunks (dashed)" if s.joints_valid else
                 "recorded without the glove: no joints", fontsize=8.5)
    ja.set_xlabel("time (s)", fontsize=8)
    ja.set_ylabel("deg", fontsize=8)
    ja.grid(alpha=0.3)
    ja.tick_params(labelsize=7)
    if s.joints_valid:
        ja.legend(fontsize=7, frameon=False, ncol=2)
    return png_uri(fig)
