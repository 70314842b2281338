"""`packer pack` as the user runs it against the user's own packing script, same frames.

Measured: the whole command, `python -m packer pack --raw RAW --out OUT` with its
defaults (SLAM stage on, already cached; a fresh out dir each time), timed as a
subprocess from start to exit, against the user's `pack_for_scc.py` loop
(bench/pack_loop.py: PIL open, resize 224x224, q85, one tar per session), also
a subprocess. Further rows: the bench's earlier loop (bench/pack_loop_convert.py,
with a convert("RGB") the user's script does not make), `packer pack` as the
code was before issue 24 (BASELINE_REF, checked out into a git worktree: the
"before" CPU), and two user loops at once (what 2 cores give any method at best:
nothing shared). The runs are interleaved (each repetition runs every method,
the next one in the other order), so the drift of a shared 2-core VM hits every
method alike; each row gives the median with min and max, the ratio of the
medians and the spread of the per-repetition ratios, and the load average
before and after. Every checkout is byte-compiled first, as an installed
package is (PYTHONDONTWRITEBYTECODE would otherwise make each run compile).

Also: CPU seconds of the process tree per 1,000 frames; the command's CPU
profile (`packer pack --timings`); the single-core rate of decode+resize+encode
alone (the user's code and packer.imageops); and the image difference of the
packed frames against the plain Pillow path, next to what a q90 re-encode
changes (bench/imagediff.py).

    python -m bench --only pack     # or: make bench
    SHARDSHIP_BENCH_BASELINE=<git ref> python -m bench --only pack"""
from __future__ import annotations

import contextlib
import io
import json
import multiprocessing as mp
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from PIL import Image

from bench.common import baseline_worktree, machine, write_csv
from shardship.pil import describe

ROOT = Path(__file__).resolve().parent.parent
REPEATS = 5
LOOP = [sys.executable, "bench/pack_loop.py"]
LOOP_CONVERT = [sys.executable, "bench/pack_loop_convert.py"]
PACK = [sys.executable, "-m", "packer", "pack"]
# main just before issue 24 (simplejpeg decode, CRC-32 frame digests, orjson): the "before" row
BASELINE_REF = os.environ.get("SHARDSHIP_BENCH_BASELINE", "b3fb826")

Cmd = tuple[list[str], Path]  # argv, and the checkout it runs in (cwd and PYTHONPATH)


def cache_slam_from_truth(raw: Path) -> None:
    """Leave each session as a finished `packer slam` run leaves it (poses.json +
    metadata.json with its fingerprint, input stat and IMU clock offset), with the
    synthetic ground truth as the poses: SfM itself costs minutes per session
    (bench/slam.py measures it) and is not what `packer pack` re-does when cached."""
    import numpy as np

    from packer.session import discover, load_session
    from packer.slam import FLAG_NAMES, REGISTERED, SlamOptions, store

    opts = SlamOptions()
    fo, use_imu = opts.fingerprint_options(), opts.scale == "imu"
    for path in discover(raw):
        s = load_session(path)
        truth = json.loads((path / "synth_truth.json").read_text())
        poses = np.array([truth["poses"][int(i)] for i in s.frames])
        assert s.imu is not None
        info = {"version": store.SLAM_VERSION, "fingerprint": store.input_fingerprint(s, fo, use_imu),
                "input_stat": store.input_stat(s, fo, use_imu), "mapper": opts.mapper,
                "keyframes": len(poses), "registered_keyframes": len(poses), "registered_fraction": 1.0,
                "other_models": 0, "reprojection_error": 0.0, "metric": True, "scale": 1.0, "method": opts.scale,
                "imu_offset": truth["imu_offset"], "imu_lag": truth["imu_offset"] - float(s.imu.t[0])}
        store.write_results(s, poses, np.full(len(poses), REGISTERED, np.int8), FLAG_NAMES, info)


def cache_in(checkout: Path, raw: Path) -> None:
    """cache_slam_from_truth as `checkout`'s own code writes it (its SLAM_VERSION and
    fingerprint), so that its `packer pack` finds the cache and does not redo SfM."""
    code = "import sys; from pathlib import Path; from bench.pack import cache_slam_from_truth; " \
           "cache_slam_from_truth(Path(sys.argv[1]))"
    subprocess.run([sys.executable, "-c", code, str(raw)], cwd=checkout, check=True,
                   env={**os.environ, "PYTHONPATH": str(checkout)})


def timed(cmds: list[Cmd], outs: list[Path]) -> tuple[float, float]:
    """(wall seconds until the last one exits, CPU seconds of all their process
    trees) of commands started together, each from a fresh out dir; all must succeed.
    Each runs in its checkout, with that checkout's code first on the path."""
    for out in outs:
        shutil.rmtree(out, ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    procs = [subprocess.Popen(c, cwd=root, env=dict(os.environ, PYTHONPATH=str(root)), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for c, root in cmds]
    done = [(c, p, p.communicate()) for (c, _), p in zip(cmds, procs)]
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    for c, p, (_, err) in done:
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(c)} exited {p.returncode}: {err[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def byte_compile(*roots: Path) -> None:
    """What pip does at install: without it, PYTHONDONTWRITEBYTECODE=1 (set on some
    machines) makes every `packer pack` compile its modules again."""
    for root in roots:
        subprocess.run([sys.executable, "-m", "compileall", "-q", "shardship", "packer"], cwd=root,
                       env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
                       check=True, stdout=subprocess.DEVNULL)


def cpu_profile(cmd: list[str], out: Path, runs: int = 3) -> dict[str, float]:
    """Median CPU seconds per line of `packer pack --timings` ("cpu   S s  phase")."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # this checkout's code, whatever is installed
    seen: dict[str, list[float]] = {}
    for _ in range(runs):
        shutil.rmtree(out, ignore_errors=True)
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=True)
        for line in r.stdout.splitlines():
            if line.startswith("cpu "):
                secs, phase = line[4:].split(" s  ", 1)
                seen.setdefault(f"cpu_s {phase.strip()}", []).append(float(secs))
    return {k: round(statistics.median(v), 3) for k, v in seen.items()}


def kernel_rate(raw: Path, reference: bool, limit: int = 1000) -> float:
    """Single-core decode+resize+encode rate, no I/O, no tar: the user's code
    (open, resize, q85) or packer.imageops' (the pack's defaults, q90)."""
    from packer.imageops import ResizeSpec, resize_jpeg
    from shardship.config import PackOptions
    from shardship.pil import cache_image_buffers

    blobs = [p.read_bytes() for p in sorted(raw.glob("*/rgb/*.jpg"))[:limit]]
    o = PackOptions()
    spec = ResizeSpec(o.size, o.crop, o.quality)
    if not reference:
        cache_image_buffers()
    t0 = time.perf_counter()
    for b in blobs:
        if reference:
            im = Image.open(io.BytesIO(b)).resize((224, 224), Image.BILINEAR)  # type: ignore[attr-defined]
            im.save(io.BytesIO(), format="JPEG", quality=85)
        else:
            resize_jpeg(b, spec)
    return len(blobs) / (time.perf_counter() - t0)


def fresh(fn, *args):
    """Run fn in a new interpreter: a PIL loop's speed depends on the process's
    malloc history, so nothing is timed inside this long-lived bench process."""
    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as ex:
        return ex.submit(fn, *args).result()


def _summary(walls: list[float], cpus: list[float], images: int) -> dict[str, Any]:
    med = statistics.median(walls)
    return {"median_s": round(med, 3), "min_s": round(min(walls), 3), "max_s": round(max(walls), 3),
            "images_per_s": round(images / med, 1), "cpu_s": round(statistics.median(cpus), 3)}


def run(results_dir: Path, quick: bool = False) -> list[dict]:
    from packer.synth import synth_dataset

    sessions, frames = (3, 200) if quick else (6, 400)
    repeats = 3 if quick else REPEATS
    work = Path(tempfile.mkdtemp(prefix="bench-pack-"))
    stack = contextlib.ExitStack()  # the baseline worktree, removed before its directory
    try:
        raw = work / "raw"
        synth_dataset(raw, sessions=sessions, frames=frames, seed=11, export="folder", workers=os.cpu_count() or 1,
                      progress=False)
        base, base_rev = stack.enter_context(baseline_worktree(BASELINE_REF, work / "baseline"))
        raw_before = work / "raw_before"
        if base:  # its own copy, cached by its own code: the SLAM cache's fingerprint changed since
            shutil.copytree(raw, raw_before)
            cache_in(base, raw_before)
        cache_in(ROOT, raw)
        for p in [*raw.rglob("*.jpg"), *raw_before.rglob("*.jpg")]:  # warm the page cache for every method alike
            p.read_bytes()
        byte_compile(ROOT, *([base] if base else []))
        out, out2 = work / "out", work / "out2"
        methods: dict[str, list[Cmd]] = {
            "loop": [(LOOP + [str(raw), str(out)], ROOT)],
            "pack": [(PACK + ["--raw", str(raw), "--out", str(out)], ROOT)],
            "loop_convert": [(LOOP_CONVERT + [str(raw), str(out)], ROOT)],
            # the ceiling 2 cores give any method: two loops at once, nothing shared
            "loop_x2": [(LOOP + [str(raw), str(out)], ROOT), (LOOP + [str(raw), str(out2)], ROOT)],
        }
        if base:
            methods["pack_before"] = [(PACK + ["--raw", str(raw_before), "--out", str(out)], base)]
        walls: dict[str, list[float]] = {k: [] for k in methods}
        cpus: dict[str, list[float]] = {k: [] for k in methods}
        load = [os.getloadavg()[0]]
        for rep in range(repeats):
            for name in (list(methods) if rep % 2 == 0 else list(methods)[::-1]):
                w, c = timed(methods[name], [out, out2])
                walls[name].append(w)
                cpus[name].append(c)
        load.append(os.getloadavg()[0])
        profile = cpu_profile(methods["pack"][0][0] + ["--timings"], out)
        single = [fresh(kernel_rate, raw, True) for _ in range(3)]
        kernel = [fresh(kernel_rate, raw, False) for _ in range(3)]
        images = sessions * frames
        rows = _rows(methods, walls, cpus, images, repeats, load, max(single), max(kernel), base_rev)
        common = {k: rows[0][k] for k in ("machine", "cores", "pil", "images", "load_avg_1m")}
        rows.append({**common, "method": "CPU profile of packer pack (median of 3 runs of --timings): main "
                                          "process per phase, workers",
                     "command": _shown([methods["pack"][0][0] + ["--timings"]]), "repeats": 3, **profile})
        rows += _image_rows(raw, common)
        write_csv(results_dir / "pack.csv", rows)
        return rows
    finally:
        stack.close()
        shutil.rmtree(work, ignore_errors=True)


def _image_rows(raw: Path, common: dict[str, Any]) -> list[dict]:
    """The image-difference figure: every 8th frame (300 of 2,400), squash and
    center, in a fresh interpreter."""
    from packer.imageops import ResizeSpec

    frames = sorted(raw.glob("*/rgb/*.jpg"))[::8]
    rows = []
    for crop in ("squash", "center"):
        d = fresh(_image_difference, frames, ResizeSpec(crop=crop))
        new, q90 = d["new_vs_old"], d["q90_reencode"]
        rows.append({**common, "images": d["frames"],
                     "method": f"image difference, --crop {crop}: packer.imageops ({d['decoder']}) vs the plain "
                               "Pillow path, against one more q90 re-encode of the packed frames",
                     "command": "bench/imagediff.py, in a fresh interpreter",
                     "identical_bytes": d["identical_bytes"],
                     "psnr_db_rgb": "/".join(map(str, new["psnr_db"])),
                     "max_abs_rgb": "/".join(map(str, new["max_abs"])),
                     "q90_psnr_db_rgb": "/".join(map(str, q90["psnr_db"])),
                     "q90_max_abs_rgb": "/".join(map(str, q90["max_abs"]))})
    return rows


def _image_difference(frames: list[Path], spec: Any) -> dict[str, Any]:
    from bench.imagediff import image_difference

    return image_difference(frames, spec)


def _shown(cmds: list[list[str]]) -> str:
    """The command line(s) as run, with the temp paths and the interpreter shortened."""
    one = [" ".join("python" if a == sys.executable else Path(a).name if a.startswith("/") else a for a in c)
           for c in cmds]
    return " & ".join(one)


LABELS = {
    "loop": "the user's pack_for_scc.py loop (PIL open, resize 224x224, q85, one tar/session), whole process",
    "pack": "packer pack, defaults (SLAM cached, q90, one .tar copy), whole command",
    "loop_convert": "the bench's earlier loop (the user's plus a convert(\"RGB\") per frame), whole process",
    "loop_x2": "two user loops at once, each on all frames (the most 2 cores give: nothing shared, no overhead)",
    "pack_before": "packer pack before issue 24 ({rev}: Pillow decode, sha256 digests, json), whole command",
}


def _rows(methods: dict[str, list[Cmd]], walls: dict[str, list[float]], cpus: dict[str, list[float]], images: int,
          repeats: int, load: list[float], single: float, kernel: float, base_rev: str) -> list[dict]:
    """One row per method: median/min/max wall, rate, CPU (and per 1,000 frames),
    the ratio of medians to the user's loop, the spread of the per-repetition
    ratios, and cpu_bound_ratio = cores x loop CPU / method CPU (per image): the
    ratio 2 idle cores could give at best."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    common = {"machine": machine(), "cores": cores, "pil": describe(), "images": images, "repeats": repeats,
              "load_avg_1m": f"{load[0]:.1f}-{load[1]:.1f}"}
    loop, loop_cpu = statistics.median(walls["loop"]), statistics.median(cpus["loop"])
    rows = []
    for name, cmds in methods.items():
        n = len(cmds)  # each command packs every image
        med, cpu = statistics.median(walls[name]), statistics.median(cpus[name])
        pairs = [n * a / b for a, b in zip(walls["loop"], walls[name])]
        rows.append({**common, "method": LABELS[name].format(rev=base_rev), "command": _shown([c for c, _ in cmds]),
                     "images": n * images, **_summary(walls[name], cpus[name], n * images),
                     "cpu_s_per_1000_frames": round(1000 * cpu / (n * images), 3),
                     "ratio_vs_loop": round(n * loop / med, 3),
                     "ratio_min": round(min(pairs), 3), "ratio_max": round(max(pairs), 3),
                     "cpu_bound_ratio": round(cores * n * loop_cpu / cpu, 3) if name != "loop" else ""})
    for label, rate in (("single-core decode+resize+encode only, the user's code (q85, no I/O, no tar)", single),
                        ("single-core decode+resize+encode only, packer.imageops (q90, no I/O, no tar)", kernel)):
        rows.append({**common, "method": label, "command": "in a fresh interpreter, best of 3",
                     "images_per_s": round(rate, 1), "ratio_vs_loop": round(rate * loop / images, 3)})
    return rows
