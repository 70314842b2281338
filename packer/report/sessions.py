"""One section per packed session: its numbers (from index.json), its figures
(from the shards, and from the raw folder when it is there), its filmstrip and
its action statistics; plus the few numbers the outlier check compares.

`session_section` is one process's work for one session, so the report can fan
sessions out over cores; it returns plain data (strings, numbers), cheap to send
back."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from packer.report import figures
from packer.report.page import anchor, jpeg_uri
from packer.report.raw import GloveEvents, glove_events, rotation_rates
from packer.report.series import read_series
from shardship.format.index import Index

ACTION_COLUMNS = ("dx", "dy", "dz")  # then the rot6d block (summarised) and the joints


def session_section(out_dir: Path, raw_dir: Path | None, index: Index, name: str) -> dict[str, Any]:
    """Everything the template needs for session `name` (see the module docstring)."""
    entry = index.doc["sessions"][name]
    joint_names = list(entry.get("joints") or index.doc.get("joints") or [])
    cal = entry.get("calibration") or {}
    s = read_series(out_dir, index, name)
    sdir = (raw_dir / name) if raw_dir is not None else Path("/nonexistent") / name
    rates, rates_note = rotation_rates(s, sdir, cal)
    glove, glove_note = (glove_events(sdir, (entry.get("clock") or {}).get("frame0_epoch"))
                         if s.joints_valid else (None, ""))
    speed = s.speed()
    jr = np.ptp(s.joints, axis=0) if s.joints_valid and len(s.joints) else np.zeros(0)
    metrics = {
        "scale": cal.get("scale") if cal.get("metric") else None,
        "speed": float(np.median(speed)) if len(speed) and s.metric else None,
        "joint_range": float(np.mean(jr)) if len(jr) else None,
        "gyro_residual": cal.get("gyro_residual"),
    }
    fps = float(entry.get("fps") or 0)
    return {
        "name": name, "anchor": anchor(name),
        "frames": entry.get("frames"), "samples": entry.get("samples"), "fps": fps,
        "seconds": (float(entry.get("frames", 0)) / fps) if fps else None,
        "capture": entry.get("capture"), "pose_source": entry.get("pose_source"),
        "frames_without_pose": entry.get("frames_without_pose", 0), "metric": bool(entry.get("pose_metric")),
        "joints_valid": bool(entry.get("joints_valid")), "warnings": list(entry.get("warnings") or []),
        "cal": _calibration(cal), "rates_note": rates_note, "glove_note": glove_note,
        "rate_corr": None if rates is None else rates.correlation,
        "glove": _glove_lines(joint_names, glove), "labels": label_line(entry.get("labels"), joint_names),
        "joint_names": joint_names, "joint_range": [float(x) for x in jr],
        "path_length": float(np.sum(speed * np.diff(s.t[s.posed]))) if len(speed) else None,
        "speed_median": metrics["speed"], "speed_max": float(np.max(speed)) if len(speed) else None,
        "metrics": metrics,
        "trajectory_png": figures.trajectory_figure(s),
        "signals_png": figures.signals_figure(s, joint_names, glove, rates),
        "film": [jpeg_uri(b) for b in s.film],
        "film_frames": [int(s.frame[i]) for i in np.linspace(0, len(s.frame) - 1, len(s.film)).round().astype(int)]
        if len(s.film) else [],
        "actions": action_table(entry.get("stats") or {}, joint_names),
        "thumb_png": figures.thumbnail(s),
    }


def label_line(labels: dict[str, Any] | None, names: list[str]) -> str:
    """What the labels rest on, in a line: where the frame times come from, the gaps
    no chunk spans, the share of frames with known joints and where the glove was silent."""
    if not labels:
        return ""
    parts = [f"frame times from {labels.get('frame_times')}"]
    breaks = labels.get("breaks") or []
    parts.append(f"{len(breaks)} gap(s) in time or numbering, no chunk spans one" if breaks else "no gap")
    parts.append(f"joints known on {100 * float(labels.get('joints_coverage') or 0):.0f}% of the frames")
    dead = [n for n, u in zip(names, labels.get("joints_usable") or []) if not u]
    if dead and len(dead) < len(names):
        parts.append(f"{', '.join(dead)} never read (masked)")
    gaps = labels.get("glove_gaps") or []
    if gaps:
        parts.append("glove silent " + ", ".join(f"{a:.1f}-{a + n:.1f} s" for a, n in gaps[:4])
                     + (" ..." if len(gaps) > 4 else ""))
    return "; ".join(parts)


def _glove_lines(names: list[str], glove: GloveEvents | None) -> list[str]:
    """The joints with read errors or gaps, one line each; one line when none has."""
    if glove is None:
        return []
    bad = [f"{n}: {len(e)} read error(s), {len(g)} gap(s) > 0.1 s"
           for n, e, g in zip(names, glove.errors, glove.gaps) if len(e) or len(g)]
    return bad or [f"{glove.rows} readings: no read error, no gap > 0.1 s"]


def _calibration(cal: dict[str, Any]) -> dict[str, Any]:
    """The calibration numbers a person checks, with their units applied."""
    lag = cal.get("imu_lag")
    return {
        "present": bool(cal),
        "method": cal.get("method"), "metric": cal.get("metric"), "scale": cal.get("scale"),
        "scale_rel_std": cal.get("scale_rel_std"),
        "registered_fraction": cal.get("registered_fraction"), "keyframes": cal.get("keyframes"),
        "registered_keyframes": cal.get("registered_keyframes"),
        "reprojection_error": cal.get("reprojection_error"), "points": cal.get("points"),
        "imu_lag_ms": None if lag is None else 1000.0 * float(lag),
        "gyro_correlation": cal.get("gyro_correlation"), "gyro_residual": cal.get("gyro_residual"),
        "mapper": cal.get("mapper"), "frontend": cal.get("frontend"),
    }


def action_table(stats: dict[str, Any], joint_names: list[str]) -> list[dict[str, Any]]:
    """Per action dimension that a person reads (position in cm, joints in deg):
    mean, std, min, max over every step of every chunk. The 6-D rotation is left
    out: its numbers mean little by eye, the trajectory shows it."""
    a = stats.get("action") or {}
    n, s, ss = (np.asarray(a.get(k) or [], dtype=np.float64) for k in ("n", "sum", "sumsq"))
    lo, hi = (np.asarray(a.get(k) or [], dtype=np.float64) for k in ("min", "max"))
    if not len(n) or len(n) != len(s) or len(lo) != len(n):
        return []
    mean = np.divide(s, n, out=np.zeros_like(s), where=n > 0)
    var = np.divide(ss, n, out=np.zeros_like(s), where=n > 0) - mean**2
    std = np.sqrt(np.maximum(var, 0.0))
    dims = [(i, ACTION_COLUMNS[i], "cm", 100.0) for i in range(3)]
    dims += [(9 + j, jn, "deg", 1.0) for j, jn in enumerate(joint_names) if 9 + j < len(n)]
    return [{"name": label, "unit": unit, "n": int(n[i]), "mean": mean[i] * k, "std": std[i] * k,
             "min": lo[i] * k, "max": hi[i] * k} for i, label, unit, k in dims if n[i] > 0]
