"""The report's matplotlib figures, each returned as an inline PNG data: URI.

Views of a trajectory are along its own principal axes (the SfM frame has no
"up"), as `packer slam --plot` draws them: "top" shows the two directions of
largest motion, "side" the largest against the smallest. Time is colour
(viridis, start dark), registered keyframes are black dots: a stretch without
dots was interpolated. Figures are small and few per session (two, plus a
thumbnail) because savefig dominates the report's time."""
from __future__ import annotations

from typing import Any

import numpy as np

from packer.report.page import png_uri, pyplot
from packer.report.raw import GloveEvents, Rates
from packer.report.series import Series

CMAP = "viridis"
JOINT_COLOURS = ("C0", "C1", "C2", "C3", "C4", "C5")


def principal_axes(pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(centre (3,), axes (3,3) as rows, largest motion first) of positions (N,3):
    other points (a policy's predictions) go into the same view with `(p - c) @ axes.T`."""
    c = pos.mean(0)
    if len(pos) < 3:
        return c, np.eye(3)
    _u, _s, vt = np.linalg.svd(pos - c, full_matrices=False)
    return c, (vt if vt.shape[0] == 3 else np.eye(3))


def principal(pos: np.ndarray) -> np.ndarray:
    """Positions (N,3) in their principal axes, centred (N,3)."""
    c, axes = principal_axes(pos)
    return (pos - c) @ axes.T


def _style(ax: Any) -> None:
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=8)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def thin(n: int, most: int) -> np.ndarray:
    """At most `most` evenly spaced indices of n (first and last kept): a 30-s
    session has 1,800 frames, a figure 500 px; drawing every one costs time only."""
    return np.unique(np.linspace(0, n - 1, min(n, most)).round().astype(np.int64)) if n else np.zeros(0, np.int64)


def _trajectory(ax: Any, q: np.ndarray, t: np.ndarray, key: np.ndarray, i: int, j: int, marker: float = 5,
                most: int = 600) -> Any:
    ax.plot(q[:, i], q[:, j], "-", color="0.75", lw=0.8, zorder=1)
    k = thin(len(q), most)
    sc = ax.scatter(q[k, i], q[k, j], c=t[k], cmap=CMAP, s=marker, lw=0, zorder=2)
    kf = np.flatnonzero(key)
    if len(kf):
        kf = kf[thin(len(kf), most // 2)]
        ax.plot(q[kf, i], q[kf, j], ".", color="k", ms=marker * 0.6, zorder=3)
    ax.plot(q[:1, i], q[:1, j], "o", mfc="none", mec="C3", ms=7, mew=1.5, zorder=4)
    ax.set_aspect("equal", adjustable="datalim")
    return sc


def trajectory_figure(s: Series) -> str | None:
    """Top and side view, coloured by time, keyframes marked; None without poses."""
    ok = s.posed
    if ok.sum() < 2:
        return None
    plt = pyplot()
    q = principal(s.pos[ok]) * (100.0 if s.metric else 1.0)
    unit = "cm" if s.metric else "SfM units"
    # fixed margins: constrained layout would cost half of the figure's time
    fig, axes = plt.subplots(1, 2, figsize=(7.2, 3.3))
    fig.subplots_adjust(left=0.09, right=0.87, bottom=0.14, top=0.91, wspace=0.32)
    key = s.flag[ok] == "registered"
    for ax, (i, j), title in zip(axes, ((0, 1), (0, 2)), ("top (axes 1-2)", "side (axes 1-3)")):
        sc = _trajectory(ax, q, s.t[ok], key, i, j)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(f"axis {i + 1} ({unit})", fontsize=8)
        ax.set_ylabel(f"axis {j + 1} ({unit})", fontsize=8)
        _style(ax)
    cbar = fig.colorbar(sc, cax=fig.add_axes((0.90, 0.16, 0.015, 0.72)))
    cbar.set_label("time (s)", fontsize=8)
    cbar.ax.tick_params(labelsize=7)
    return png_uri(fig)


def thumbnail(s: Series) -> str | None:
    """The overview's small multiple: the top view alone, no axes (the page frames
    a flagged session's in red)."""
    ok = s.posed
    if ok.sum() < 2:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(1.9, 1.6))
    fig.subplots_adjust(0.02, 0.02, 0.98, 0.98)
    q = principal(s.pos[ok])
    _trajectory(ax, q, s.t[ok], s.flag[ok] == "registered", 0, 1, marker=2, most=200)
    ax.set_axis_off()
    return png_uri(fig)


def signals_figure(s: Series, joint_names: list[str], glove: GloveEvents | None, rates: Rates | None) -> str:
    """Joints over time (read errors as red ticks, gaps shaded) above the gyro
    rate overlaid on the visual rotation rate (that panel only when there is a
    gyro alignment to show: the page says why not otherwise)."""
    plt = pyplot()
    both = rates is not None and len(rates.t) > 0
    fig, axes = plt.subplots(2 if both else 1, 1, figsize=(7.2, 4.4 if both else 2.5), sharex=True,
                             squeeze=False)
    if both:
        fig.subplots_adjust(left=0.09, right=0.80, bottom=0.1, top=0.89, hspace=0.32)
    else:
        fig.subplots_adjust(left=0.09, right=0.80, bottom=0.17, top=0.8)
    ax = axes[0, 0]
    if s.joints_valid and s.joints.shape[1]:
        _joints(ax, s, joint_names, glove)
    else:
        ax.text(0.5, 0.5, "recorded without the glove: joints masked", ha="center", va="center",
                transform=ax.transAxes, fontsize=9, color="0.4")
    ax.set_ylabel("joint (deg)", fontsize=8)
    _style(ax)
    if both:
        assert rates is not None
        ax = axes[1, 0]
        ax.plot(rates.t, rates.visual, "-", color="C0", lw=1.4, label="camera (SfM)")
        ax.plot(rates.t, rates.gyro, "--", color="C3", lw=1.1, label="gyro at the found offset")
        ax.legend(["camera\n(SfM)", "gyro at the\nfound offset"], fontsize=7, loc="center left",
                  bbox_to_anchor=(1.0, 0.5), frameon=False)
        ax.set_title(f"rotation rate: corr. {rates.correlation:.3f}, rms diff. {rates.rms_diff:.3f} rad/s",
                     fontsize=8.5, loc="left")
        ax.set_ylabel("rad/s", fontsize=8)
        _style(ax)
    axes[-1, 0].set_xlabel("time on the frame clock (s)", fontsize=8)
    return png_uri(fig)


def _joints(ax: Any, s: Series, names: list[str], glove: GloveEvents | None) -> None:
    for j in range(s.joints.shape[1]):
        ax.plot(s.t, s.joints[:, j], color=JOINT_COLOURS[j % len(JOINT_COLOURS)], lw=1.1,
                label=names[j] if j < len(names) else f"joint {j}")
    title = "joints (deg) as packed"
    if glove is not None:
        lo, hi = ax.get_ylim()
        n_err = sum(len(e) for e in glove.errors)
        n_gap = sum(len(g) for g in glove.gaps)
        for j, (err, gaps) in enumerate(zip(glove.errors, glove.gaps)):
            c = JOINT_COLOURS[j % len(JOINT_COLOURS)]
            for a, b in gaps:
                ax.axvspan(a, b, color=c, alpha=0.15, lw=0)
            if len(err):
                y = lo + (0.02 + 0.04 * j) * (hi - lo)
                ax.plot(err, np.full(len(err), y), "|", color="C3", ms=6, mew=1.2)
        ax.set_ylim(lo, hi)
        title += f"\n{n_err} read error(s) (red ticks, a row per joint), {n_gap} gap(s) > 0.1 s (shaded)"
    ax.set_title(title, fontsize=8.5, loc="left")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
