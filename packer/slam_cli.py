"""`packer slam`: metric poses for every session under --raw (thin CLI over packer.slam).

Registered by packer/cli.py with `main.add_command(slam)`. Exit 0 when every
session is ok / cached / skipped, 1 when any failed (one line each, no traceback),
2 for usage errors."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from shardship.errors import Exit, ShardshipError
from shardship.units import plural


@click.command("slam")
@click.option("--raw", "raw", type=click.Path(path_type=Path), default=None,
              help="directory of sessions (default: [paths] raw in shardship.toml, else data/raw)")
@click.option("--session", "only", multiple=True, help="only this session (name under --raw; repeatable)")
@click.option("--config", "config_path", type=click.Path(path_type=Path), default=None,
              help="shardship.toml ([slam] and [scale] sections give defaults)")
@click.option("--mapper", type=click.Choice(["global", "incremental"]), default=None,
              help="global (GLOMAP, default, fast) or incremental")
@click.option("--frontend", type=click.Choice(["klt", "sift"]), default=None,
              help="klt (default): corners tracked through the video, keyframes chosen by parallax; "
                   "sift: SIFT + sequential matching on every Nth frame (slower; the old default)")
@click.option("--keyframe-step", type=click.IntRange(min=1), default=None,
              help="klt: a keyframe candidate every N frames (default: 0.1 s of video); sift: SfM on every "
                   "Nth frame (default 3). The other frames are interpolated")
@click.option("--scale", "scale_method", type=click.Choice(["imu", "marker", "known-distance", "none"]),
              default=None, help="metric scale from the IMU (default), an ArUco marker, a known distance, or none")
@click.option("--solver", type=click.Choice(["auto", "window", "viba"]), default=None,
              help="--scale imu: auto (default: the windowed solve checks the model, then the visual-inertial "
                   "bundle adjustment refines poses, structure and camera with the IMU and gives the scale), "
                   "window (accelerometer least squares on the SfM trajectory alone) or viba (the bundle "
                   "adjustment alone; experimental: it has accepted wrong scales on the hardest renders)")
@click.option("--marker-size", type=float, default=None, help="ArUco marker side length in metres (--scale marker)")
@click.option("--marker-dict", default=None, help="ArUco dictionary (default DICT_4X4_50)")
@click.option("--known-distance", default=None, metavar="A:B:METRES",
              help="camera centres of frames A and B are METRES apart (--scale known-distance)")
@click.option("--mask", default=None, metavar="PNG",
              help="black where corners must never be tracked (the glove's mount, a watermark); a path relative to "
              "each session folder or absolute. Tracks that stay put while the camera turns are dropped anyway")
@click.option("--plot", is_flag=True, default=False, help="write <session>/slam.png (top + side view)")
@click.option("--jobs", type=int, default=None, help="sessions in parallel (default: cores / threads, fewer where "
              "memory is short)")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="threads per session for matching verification (default 2; the mapper runs on one thread so "
              "that the same input gives the same poses)")
@click.option("--force", is_flag=True, default=False, help="recompute even when cached")
@click.option("--quiet", is_flag=True, default=False, help="no progress bars")
def slam(raw: Path | None, only: tuple[str, ...], config_path: Path | None, mapper: str | None,
         frontend: str | None, keyframe_step: int | None, scale_method: str | None, solver: str | None,
         marker_size: float | None,
         marker_dict: str | None, known_distance: str | None, mask: str | None, plot: bool, jobs: int | None,
         threads: int | None, force: bool, quiet: bool) -> None:
    """Camera poses in metres for each session: pycolmap SfM + IMU scale calibration."""
    try:
        code = _run(raw, only, config_path, mapper, frontend, keyframe_step, scale_method, solver, marker_size,
                    marker_dict, known_distance, mask, plot, jobs, threads, force, quiet)
    except ShardshipError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(int(e.code))
    sys.exit(code)


def _run(raw, only, config_path, mapper, frontend, keyframe_step, scale_method, solver, marker_size, marker_dict,
         known_distance, mask, plot, jobs, threads, force, quiet) -> int:
    from packer.session import discover
    from packer.slam import SlamOptions, slam_sessions
    from shardship.config import load_config

    cfg = load_config(config_path)
    opts = SlamOptions.from_config(
        cfg.slam, cfg.scale, mapper=mapper, frontend=frontend, keyframe_step=keyframe_step, scale=scale_method,
        solver=solver, marker_size=marker_size, marker_dict=marker_dict, known_distance=known_distance, mask=mask,
        threads=threads, plot=plot or None, force=force or None, progress=False if quiet else None,
    )
    opts.validate()
    root = raw if raw is not None else cfg.raw
    discover(root)  # a clear error when the directory is missing
    from packer.intake import extract_all

    _done, bad_zips = extract_all(Path(root))
    for z, why in sorted(bad_zips.items()):
        click.echo(f"FAIL  {z}: {why}", err=True)
    from packer.duplicates import unique_sessions

    paths, skipped, _ = unique_sessions(discover(root))
    for name, why in sorted(skipped.items()):
        click.echo(f"skip   {name}: {why}")
    if only:
        wanted = set(only)
        missing = sorted(wanted - {p.name for p in paths})
        if missing:
            raise ShardshipError(f"no session {', '.join(missing)} under {root}")
        paths = [p for p in paths if p.name in wanted]
    if not paths:
        raise ShardshipError(f"no sessions under {root}: run `packer synth --out {root}` or pass --raw DIR")
    results = slam_sessions(paths, opts, jobs)
    failed = 0
    for r in results:
        if r.failed:
            failed += 1
            click.echo(f"FAIL  {r.message}", err=True)
        else:
            line = f"{r.status:7s} {r.session}: {r.message}"
            if r.plot is not None:
                line += f" [plot {r.plot}]"
            click.echo(line)
    failed += len(bad_zips)
    ok = len(results) + len(bad_zips) - failed
    total = len(results) + len(bad_zips)
    click.echo(f"slam: {ok} of {total} {plural('session', total)} ok" + (f", {failed} failed" if failed else ""))
    return int(Exit.PARTIAL) if failed else int(Exit.OK)
