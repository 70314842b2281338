"""Peak memory of `packer pack` with its SLAM stage (not cached) on hand-motion
sessions of 30 s, 90 s and 5 minutes (--quick: 30 and 90 s), mapped in parts
(`[slam] chunk_keyframes = 400`, the default) and, as the baseline, whole
(`chunk_keyframes = 0`, what the code did before; 30 and 90 s only: whole, the
5-minute one would need ~7 GB and tens of minutes, extrapolated from those two).

The figure is the process tree's peak (the pack, its JPEG workers and the spawned
SLAM worker, /proc sampled every 20 ms by bench.pack_memory's parent), with the
wall time, the parts and their joins, and the packed poses against the rendered
truth (scale error, ATE), so a bound bought with a wrong answer shows. Sessions are
rendered once into bench/data (a 5-minute one takes ~10 minutes on one core)."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from bench.common import machine, write_csv
from bench.pack_memory import FPS, measure

REPO = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("SHARDSHIP_BENCH_DATA", REPO / "bench" / "data")) / "slam_memory"
NAME = "session_2026-01-08_120000"


def render(seconds: int) -> Path:
    """The cached hand-motion session of `seconds`: what `packer synth --seed 7
    --frames N --export folder` writes."""
    from packer.synth import synth_dataset

    out = DATA / f"hand-{seconds}s"
    if not (out / NAME / "synth_truth.json").exists():
        shutil.rmtree(out, ignore_errors=True)
        synth_dataset(out, sessions=1, frames=seconds * int(FPS), seed=7, export="folder", progress=False)
    return out / NAME


def one(src: Path, chunk: int, tmp: Path) -> dict:
    """One `packer pack` (SLAM forced by a fresh copy) at `[slam] chunk_keyframes = chunk`."""
    from bench.slam_hard import accuracy

    raw = tmp / "raw"
    shutil.rmtree(raw, ignore_errors=True)
    shutil.copytree(src, raw / src.name, ignore=shutil.ignore_patterns("synth_truth.json", "poses.json"))
    config = tmp / "shardship.toml"
    config.write_text(f"[slam]\nchunk_keyframes = {chunk}\n")
    main_mb, tree_mb, wall = measure(raw, tmp / "out", "--config", str(config))
    info = json.loads((raw / src.name / "metadata.json").read_text())["shardship"]
    acc = accuracy(raw / src.name, src)
    parts = info.get("sfm_parts") or []
    return {"keyframes": info["keyframes"], "parts": len(parts) or 1,
            "joins": ";".join(f"{p.get('centre_err_over_depth', 0):.4f}/{p.get('angle_deg', 0):.3f}deg"
                              for p in parts[1:]),
            "peak_rss_tree_mb": round(tree_mb), "peak_rss_main_mb": round(main_mb), "seconds": round(wall, 1),
            "scale_error_pct": round(acc["scale_error_pct"], 3), "rel_std_pct": round(acc["rel_std_pct"], 3),
            "ate_pct": round(acc["ate_pct"], 3), "rot_rms_deg": round(acc["rot_rms_deg"], 3)}


def run(results_dir: Path, quick: bool = False) -> list[dict]:
    rows: list[dict] = []
    for seconds in (30, 90) if quick else (30, 90, 300):
        src = render(seconds)
        for chunk in (400, 0) if seconds <= 90 else (400,):
            with tempfile.TemporaryDirectory(prefix="bench-slammem-") as tmp:
                row = one(src, chunk, Path(tmp))
            rows.append({"session_s": seconds, "chunk_keyframes": chunk, **row, "machine": machine(),
                         "load": round(os.getloadavg()[0], 1),
                         "command": f"packer pack --config (slam.chunk_keyframes = {chunk})"})
            print("   ", rows[-1], flush=True)
    write_csv(results_dir / "slam_memory.csv", rows)
    return rows


if __name__ == "__main__":
    import sys

    run(Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "bench" / "results", quick="--quick" in sys.argv)
