"""`packer`: check, synth, slam, pack, verify, budget, report. Each command parses its options,
calls the module that does the work, prints its summary and exits with a code
from shardship.errors.Exit."""
from __future__ import annotations

import sys
from pathlib import Path

from shardship.interrupt import quiet_imports

with quiet_imports():  # a Ctrl-C during these imports: one line, no traceback
    import click

    from packer.effects import EFFECTS, PHONE_RIGS, PROFILES
    from packer.encoders import JOINTS
    from shardship.cliopts import cluster_option, config_option, friendly_errors, host_key_option, tool_group
    from shardship.config import Config, PackOptions, load_config
    from shardship.errors import Exit, SessionError, ShardshipError
    from shardship.pil import describe
    from shardship.units import human, plural

CONFIG_OPT = config_option()


def _cfg(config_path: str | None) -> Config:
    return load_config(config_path)


@tool_group
def main() -> None:
    """shardship packer: phone sessions -> metric poses -> 224x224 tar shards.

    \b
    Typical use:
      packer synth --out data/raw --sessions 3     # demo data (or copy real sessions there)
      packer check                                 # validate every session, say what is wrong
      packer pack                                  # poses + shards into data/packed
      packer verify                                # shards on disk == index.json?
      packer budget                                # will it fit the cluster quota?
      packer report                                # one HTML page to look at every session
    """


@main.command()
@click.option("--raw", type=click.Path(file_okay=False), default=None, help="Raw sessions directory [data/raw].")
@click.option("--pil", is_flag=True, help="Only report which PIL build is active.")
@CONFIG_OPT
@friendly_errors
def check(raw: str | None, pil: bool, config_path: str | None) -> None:
    """Validate sessions (layout, JPEGs, timestamps, IMU) and report per session."""
    click.echo(f"PIL: {describe()}")
    if pil:
        return
    from packer.describe import describe as describe_session
    from packer.duplicates import unique_sessions
    from packer.intake import extract_all
    from packer.session import discover, load_session, no_sessions

    cfg = _cfg(config_path)
    root = Path(raw) if raw else cfg.raw
    discover(root)  # a clear error when the directory is missing
    unzipped, bad_zips = extract_all(root)
    for e in unzipped:
        if e.status == "extracted":
            click.echo(f"unzip {e.zip_path.name} -> {e.session_dir.name}/"
                       + (" (metadata.json from the sidecar)" if e.sidecar_used else ""))
    for z, why in sorted(bad_zips.items()):
        click.echo(f"FAIL  {z}: {why}")
    paths, skipped, _ = unique_sessions(discover(root))
    skipped = {e.zip_path.name: e.why for e in unzipped if e.status == "duplicate"} | skipped
    for name, why in sorted(skipped.items()):
        click.echo(f"skip  {name}: {why}")
    if not paths and not bad_zips:
        raise no_sessions(root)
    bad = len(bad_zips)
    for p in paths:
        try:
            head, lines = describe_session(load_session(p, check_images=True))
            click.echo(f"ok    {p.name}: {head}" + "".join(f"\n        {x}" for x in lines))
        except SessionError as e:
            bad += 1
            click.echo(f"FAIL  {e}")
    total = len(paths) + len(bad_zips)
    click.echo(f"{total - bad} of {total} {plural('session', total)} ok")
    sys.exit(Exit.PARTIAL if bad else Exit.OK)


@main.command()
@click.option("--out", type=click.Path(file_okay=False), default="data/raw", show_default=True,
              help="Where the sessions go (the raw directory `packer check` / `pack` read).")
@click.option("--sessions", type=click.IntRange(1), default=3, show_default=True, help="How many sessions.")
@click.option("--frames", type=click.IntRange(2), default=180, show_default=True, help="Frames per session.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed: same seed, same bytes.")
@click.option("--motion", type=click.Choice(["hand", "weak", "rotation-only", "static", "fast", "vigorous"]),
              default="hand", show_default=True, help="weak: a hand that barely moves (scale still observable); "
              "rotation-only: scale is unobservable (SLAM must refuse); static: identical frames; fast: real hand "
              "speeds (to ~3 rad/s and 0.8 m/s, pauses, flicks); vigorous: faster and sustained (~1 g, ~1 m/s, "
              "to ~3 rad/s, no pauses).")
@click.option("--effect", "effects", multiple=True, type=click.Choice(list(EFFECTS)),
              help="What a real phone camera does, repeatable: glove (palm and fingers in view), lens (focal 3%% "
              "off calib.txt, distortion), blur (8 ms), rolling-shutter (20 ms), exposure (auto-exposure and white "
              "balance drift), low-texture (plain table and walls).")
@click.option("--profile", type=click.Choice(list(PROFILES)), default=None,
              help="A SLAM benchmark profile: its motion and effects (overrides --motion and --effect); "
              "'all' is fast motion with every effect; 'fast-phone' vigorous motion on a phone whose IMU sits "
              "4-8 cm from the camera, starts 0.05-0.3 s before frame 0, with an off-centre principal point "
              "('fast-phone-all': with every effect too); 'photos': fast hand in a room papered with real "
              "photographs, every effect but plain surfaces, that phone (needs scikit-image).")
@click.option("--export", type=click.Choice(["zip", "folder"]), default="zip", show_default=True,
              help="zip: what the app hands you (session_X.zip + session_X.metadata.json); folder: unzipped.")
@click.option("--fps", type=click.Choice(["60", "30"]), default="60", show_default=True,
              help="The app records 60 fps, 30 when the camera cannot.")
@click.option("--glove/--no-glove", default=True, show_default=True,
              help="--no-glove: no encoders.json (BLE not connected).")
@click.option("--capture", type=click.Choice(["ultrawide", "arkit"]), default="ultrawide", show_default=True,
              help="arkit: the legacy ARKit layout (metric poses, no IMU).")
@click.option("--clock-step", type=float, default=0.0, show_default=True, metavar="SECONDS",
              help="The phone's wall clock jumps by this much mid-recording (an NTP correction: imu.json, "
                   "encoders.json and endTime are stamped with it), e.g. 0.5 or -0.5.")
@click.option("--video/--no-video", default=False, show_default=True,
              help="Also write video.mov as the app does: HEVC, every delivered frame at its time on the 1/600 s "
                   "timescale (the record of the frames the camera dropped).")
@click.option("--drop-rate", type=click.FloatRange(0.0, 0.5, max_open=True), default=0.0, show_default=True,
              metavar="SHARE", help="The camera discards this share of late frames (0.03 = 3%%): the numbering runs "
                                    "on over each gap in time; only video.mov records where.")
@click.option("--glove-gap", "glove_gaps", multiple=True, metavar="START:SECONDS",
              help="The glove sends nothing for SECONDS from START s after frame 0, repeatable: a dropout (2:2), a "
                   "late connect (-1:3), an early disconnect (8:99).")
@click.option("--dead-joint", type=click.Choice(list(JOINTS)), default=None,
              help="This joint reads -1 (an I2C error) in every notification.")
@click.option("--workers", type=click.IntRange(1), default=1, show_default=True, help="Render in parallel.")
@click.option("--quiet", is_flag=True,
              help="No progress output (default: a bar on a terminal, else a plain line per ~10% or per minute).")
@friendly_errors
def synth(out: str, sessions: int, frames: int, seed: int, motion: str, effects: tuple[str, ...],
          profile: str | None, export: str, fps: str, glove: bool, capture: str, clock_step: float,
          video: bool, drop_rate: float, glove_gaps: tuple[str, ...], dead_joint: str | None,
          workers: int, quiet: bool) -> None:
    """Render synthetic sessions exactly as the StackCapture app writes them.

    A textured 3-D room along a hand-like path: 480x360 JPEGs, IMU (200 Hz, epoch
    clock), the glove's encoders (degrees, ESP32 millis, BLE receive times),
    calib.txt and metadata.json in the app's own JSON layout. Ground truth goes to
    synth_truth.json in each session; the pipeline never reads it."""
    from packer.effects import CameraEffects
    from packer.synth import Faults, synth_dataset

    fx = CameraEffects.from_names(effects)
    rig = None
    if profile is not None:
        motion, fx = PROFILES[profile]
        rig = PHONE_RIGS.get(profile)
    faults = Faults(drop_rate=drop_rate, glove_gaps=tuple(_start_length(g) for g in glove_gaps),
                    dead_joint=dead_joint)
    paths = synth_dataset(Path(out), sessions=sessions, frames=frames, seed=seed, motion=motion, workers=workers,
                          export=export, fps=float(fps), encoders=glove, capture=capture, effects=fx,
                          clock_step=clock_step, rig=rig, progress=not quiet, video=video, faults=faults)
    click.echo(f"wrote {len(paths)} {plural('session', len(paths))} to {out}"
               + (" as zip exports" if export == "zip" else ""))


def _start_length(text: str) -> tuple[float, float]:
    """'2:1.5' -> (2.0, 1.5) for --glove-gap; a one-line usage error otherwise."""
    try:
        start, length = (float(x) for x in text.split(":"))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not START:SECONDS, e.g. 2:1.5", param_hint="--glove-gap") from None
    if not length > 0:
        raise click.BadParameter(f"{text!r}: SECONDS must be > 0", param_hint="--glove-gap")
    return start, length


def _pack_options(cfg: Config, **flags) -> PackOptions:
    opts = cfg.pack
    for k, v in flags.items():
        if v is not None:
            setattr(opts, k, v)
    return opts


@main.command()
@click.option("--raw", type=click.Path(file_okay=False), default=None, help="Raw sessions [data/raw].")
@click.option("--out", type=click.Path(file_okay=False), default=None, help="Packed output [data/packed].")
@click.option("--crop", type=click.Choice(["squash", "center"]), default=None, help="Resize mode [squash].")
@click.option("--quality", type=click.IntRange(1, 100), default=None, help="JPEG quality [90].")
@click.option("--stride", type=click.IntRange(1), default=None, help="Keep every Nth frame [1].")
@click.option("--shard-mb", type=float, default=None, help="Target shard size in MiB [8].")
@click.option("--horizon", type=click.IntRange(1), default=None, help="Action chunk length [16].")
@click.option("--workers", type=click.IntRange(0), default=None, help="Worker processes [all cores].")
@click.option("--compress", type=click.Choice(["auto", "zstd", "none"]), default=None,
              help="Also write a .tar.zst beside each .tar (two copies on disk; uploads send the .zst): "
                   "auto = only if a probe saves >10% [none].")
@click.option("--slam/--no-slam", default=True, show_default=True,
              help="Run `packer slam` first for sessions without metric poses (cached).")
@click.option("--quiet", is_flag=True,
              help="No progress output (default: a bar on a terminal, else a plain line per ~10% or per minute).")
@click.option("--timings", is_flag=True, help="Also print where the CPU time went (main process per phase, workers).")
@CONFIG_OPT
@friendly_errors
def pack(raw, out, crop, quality, stride, shard_mb, horizon, workers, compress, slam, quiet, timings,
         config_path) -> None:
    """Resize frames to 224x224 and write indexed tar shards + index.json.

    Re-running is cheap: unchanged sessions are kept as they are, a killed run
    resumes at the first unfinished session. Exit 1 if some sessions failed."""
    from packer.framepool import FramePool, prefeed

    cfg = _cfg(config_path)
    opts = _pack_options(cfg, crop=crop, quality=quality, stride=stride, horizon=horizon, workers=workers,
                         compress=compress,
                         shard_bytes=int(shard_mb * 1024 * 1024) if shard_mb is not None else None)
    opts.validate("--shard-mb" if shard_mb is not None else f"{cfg.path or 'shardship.toml'} [pack]")
    raw_dir, out_dir = Path(raw) if raw else cfg.raw, Path(out) if out else cfg.packed
    click.echo(f"PIL: {describe()}")
    # the workers start on a first pack's frames before numpy and the sessions are loaded
    with FramePool.for_options(opts) as frames:  # entered first: a Ctrl-C while prefeed starts it stops it
        prefeed(frames, raw_dir, out_dir, opts)
        from packer.pack import pack as do_pack

        prepare, ready = _slam_stage(cfg, quiet) if slam else (None, None)
        r = do_pack(raw_dir, out_dir, opts, progress=not quiet, prepare=prepare, ready=ready, frames=frames)
    for name in r.extracted:
        click.echo(f"unzipped {name}.zip -> {name}/")
    for name, why in sorted(r.skipped.items()):
        click.echo(f"skip  {name}: {why}", err=True)
    for name, ws in sorted(r.warnings.items()):
        for w in ws:
            click.echo(f"warn  session {name}: {w}", err=True)
    for name, why in sorted(r.failed.items()):
        click.echo(f"FAIL  session {name}: {why}", err=True)
    for name in sorted(r.removed):  # a session moved out of raw/: its shards go, say so
        click.echo(f"removed session {name} from index.json: it is no longer in {raw_dir} (put it back and "
                   "re-run to keep it)", err=True)
    n_ok = len(r.packed) + len(r.reused)
    if not n_ok and not r.failed:
        from packer.session import no_sessions

        raise no_sessions(raw_dir)
    rate = f", encoding {r.images / r.encode_seconds:.0f} img/s" if r.images and r.encode_seconds else ""
    click.echo(f"packed {len(r.packed)} {plural('session', len(r.packed))}, kept {len(r.reused)} unchanged, "
               f"{f'removed {len(r.removed)}, ' if r.removed else ''}{len(r.failed)} failed"
               f" ({r.images} images in {r.seconds:.1f}s{rate})")
    if n_ok:
        click.echo(f"raw {human(r.raw_bytes)} -> packed {human(r.packed_bytes)}: saved {100 * r.saving:.0f}%"
                   f"  ({out_dir / 'index.json'})")
    if timings:
        _print_timings(r.cpu)
    sys.exit(Exit.PARTIAL if r.failed else Exit.OK)


def _print_timings(cpu: dict[str, float]) -> None:
    """CPU seconds: this process per phase (threads included), then the worker
    processes (reaped when the pool closed). On N cores the wall time is at least
    the total over N: this says which part of the total to shrink."""
    import resource

    workers = resource.getrusage(resource.RUSAGE_CHILDREN)
    parts = {**cpu, "workers (decode, resize, encode, frame digest)": workers.ru_utime + workers.ru_stime}
    for phase, s in parts.items():
        click.echo(f"cpu   {s:7.3f} s  {phase}")
    click.echo(f"cpu   {sum(parts.values()):7.3f} s  total")


@main.command()
@click.option("--out", type=click.Path(file_okay=False), default=None, help="Packed directory [data/packed].")
@click.option("--quick", is_flag=True, help="Sizes only, no sha256.")
@CONFIG_OPT
@friendly_errors
def verify(out: str | None, quick: bool, config_path: str | None) -> None:
    """Check the packed directory against index.json: every shard (and .tar.zst)
    there with its size and sha256, no stray shards. Exit 1 listing each bad file."""
    from packer.outdir import verify as do_verify

    out_dir = Path(out) if out else _cfg(config_path).packed
    problems = do_verify(out_dir, quick=quick)
    for p in problems:
        click.echo(f"BAD   {out_dir / p.name}: {p.detail}", err=True)
    if problems:
        click.echo(f"{len(problems)} file(s) in {out_dir} differ from index.json: run `packer pack` (it rewrites "
                   "damaged or missing shards and removes stray ones), then `transfer upload`", err=True)
        sys.exit(Exit.PARTIAL)
    click.echo(f"ok: every file index.json names is in {out_dir}" + (" with its size" if quick else
                                                                      ", size and sha256 match"))


def _slam_stage(cfg: Config, quiet: bool):
    """Metric poses for every session before packing (parallel, cached: a session
    whose inputs did not change costs a stat per frame, asked of the sessions pack
    has loaded already). ARKit sessions are skipped. Returns (prepare, ready) for
    packer.pack.pack: ready(session) is True when its result is cached, so pack may
    encode its frames before prepare runs. Without a [scale] method in the config, a
    session keeps the scale method its last `packer slam` used (--scale none stays none)."""
    import dataclasses

    from packer.slam import SlamOptions, slam_sessions
    from packer.slam.pipeline import cached_by_stat
    from packer.slam.store import scale_choice

    opts = SlamOptions.from_config(cfg.slam, cfg.scale)
    opts.progress = not quiet
    opts.validate()
    cached: set[str] = set()

    def opts_for(session) -> SlamOptions:
        choice = None if "method" in cfg.scale else scale_choice(session)
        return dataclasses.replace(opts, **choice) if choice else opts

    def ready(session) -> bool:
        if cached_by_stat(session, opts_for(session)) is None:
            return False
        cached.add(session.name)
        return True

    def prepare(sessions) -> dict[str, str]:
        failed = {}
        groups: dict[str, tuple[SlamOptions, list]] = {}
        for s in sessions:
            if s.name not in cached and not ready(s):
                o = opts_for(s)
                groups.setdefault(repr(o), (o, []))[1].append(s.path)
        for o, todo in groups.values():
            for r in slam_sessions(todo, o, isolate=True):
                if r.status == "failed":
                    why = r.message.removeprefix(f"session {r.session}: ")  # the FAIL line names it already
                    failed[r.session] = f"slam: {why} (fix it, or pack without poses: --no-slam)"
        return failed

    return prepare, ready


@main.command()
@click.option("--out", type=click.Path(file_okay=False), default=None, help="Packed directory [data/packed].")
@click.option("--quota", default=None, help="Quota to check against, e.g. 10G [cluster quota or 10G].")
@cluster_option
@click.option("--remote", "remote", default=None, metavar="NAME", hidden=True,
              help="Deprecated name of --cluster.")
@click.option("--keep", type=click.IntRange(0), default=None, help="Periodic checkpoints kept [train.keep or 2].")
@click.option("--env", "env_size", default=None, help="Python env size on the cluster, 0 if a module [4G].")
@host_key_option
@CONFIG_OPT
@friendly_errors
def budget(out, quota, cluster, remote, keep, env_size, accept_new_host_key, config_path) -> None:
    """Will data + checkpoints + env fit the cluster quota? Exit 3 when over.

    With --cluster, the quota is read live from the cluster; without, from
    [cluster] quota in shardship.toml (or --quota)."""
    from train.budget import plan_budget, render

    if remote is not None:
        if cluster is not None and cluster != remote:
            raise ShardshipError(f"--remote is the old name of --cluster: give one (--cluster {cluster})")
        click.echo("warning: --remote is deprecated: use --cluster NAME", err=True)
        cluster = remote
    remote = cluster
    cfg = _cfg(config_path)
    b, source = plan_budget(cfg, Path(out) if out else cfg.packed, quota=quota, remote=remote, keep=keep,
                            env_size=env_size, accept_new_host_key=accept_new_host_key)
    click.echo(render(b, source))
    if b.over:
        click.echo("\nOVER QUOTA. What would make it fit:", err=True)
        for s in b.suggestions:
            click.echo(f"  - {s}", err=True)
        sys.exit(Exit.QUOTA)
    click.echo("fits.")


@main.command()
@click.option("--raw", type=click.Path(file_okay=False), default=None,
              help="Raw sessions [data/raw]; optional: without it the page shows what the shards hold.")
@click.option("--out", type=click.Path(file_okay=False), default=None, help="Packed directory [data/packed].")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), default=None,
              help="The HTML file to write [OUT/report.html].")
@click.option("--quota", default=None, help="Quota the size is shown against, e.g. 10G [as packer budget].")
@click.option("--budget/--no-budget", default=True, show_default=True,
              help="Size the trainer's checkpoints for the quota table (loads torch: ~2-4 s).")
@click.option("--workers", type=click.IntRange(1), default=None, help="Processes drawing sessions [cores, max 4].")
@CONFIG_OPT
@friendly_errors
def report(raw, out, report_path, quota, budget, workers, config_path) -> None:
    """One self-contained HTML page to look at every session before training:
    packed / refused / skipped and why, size against the quota, the split, the
    warnings; per session the trajectory, scale, joints, gyro vs camera, frames,
    action statistics, and a flag when it is unusual against the others."""
    from packer.report import DEFAULT_NAME, write_dataset_report

    cfg = _cfg(config_path)
    out_dir = Path(out) if out else cfg.packed
    raw_dir = Path(raw) if raw else cfg.raw
    path = Path(report_path) if report_path else out_dir / DEFAULT_NAME
    ov = write_dataset_report(out_dir, raw_dir if raw_dir.is_dir() else None, path, train_cfg=dict(cfg.train),
                              budget=_report_budget(cfg, out_dir, quota) if budget else None, workers=workers)
    for name, why in ov["refused"]:
        click.echo(f"refused {name}: {why}")
    click.echo(f"report: {ov['n_packed']} packed, {ov['n_refused']} refused, {ov['n_skipped']} skipped -> {path}")


def _report_budget(cfg: Config, out_dir: Path, quota: str | None) -> dict | None:
    """`packer budget`'s table as plain numbers for the page (offline: the quota from
    --quota or the config); None, with a line saying why, when it cannot be sized."""
    try:
        from train.budget import plan_budget
    except ImportError as e:  # a packing-only install without torch
        click.echo(f"note: no quota table in the report ({e})", err=True)
        return None
    from shardship.errors import ShardshipError

    try:
        b, source = plan_budget(cfg, out_dir, quota=quota)
    except ShardshipError as e:
        click.echo(f"note: no quota table in the report ({e})", err=True)
        return None
    sign = "-" if b.headroom < 0 else ""
    return {"rows": [{"item": r.item, "size": human(r.bytes), "note": r.note} for r in b.rows],
            "total": human(b.total), "quota": human(b.quota), "source": source, "over": b.over,
            "headroom": sign + human(abs(b.headroom)), "fraction": b.total / b.quota if b.quota else 1.0,
            "suggestions": list(b.suggestions)}


with quiet_imports():
    from packer.slam_cli import slam as _slam  # noqa: E402

main.add_command(_slam)
