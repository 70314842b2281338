"""What `packer check` says about a session: what was found, and what `packer pack`
will do with it. Reads only; every line names the file it is about."""
from __future__ import annotations

from packer.encoders import JOINTS, Encoders, coverage, reading_gaps, usable
from packer.imu_gaps import find_gaps
from packer.session import Session, load_encoders

_POSES = {
    None: "poses.json empty -> `packer slam` computes metric poses (IMU scale)",
    "shardship": "poses.json from packer slam ({metric}) -> used",
    "user-calibrated": "poses.json from your own SLAM, scale_factor {scale} -> used as they are (metres)",
    "user-slam": "poses.json from your own SLAM without scale_factor -> `packer slam` redoes them "
                 "(yours kept as poses.orig.json)",
    "arkit": "poses.json from ARKit (metric) -> converted to OpenCV camera axes",
    "foreign": "poses.json of unknown origin, not marked metric -> `packer slam` replaces them "
               "(kept as poses.orig.json)",
}


def describe(s: Session) -> tuple[str, list[str]]:
    """(one summary line, detail lines) for a session that loaded."""
    span = float(s.timestamps[-1] - s.timestamps[0])
    gaps = int(s.frames[-1] - s.frames[0] + 1 - s.n_frames)
    head = (f"{s.n_frames} frames{f' ({gaps} missing)' if gaps else ''}, {span:.1f} s at {s.fps:g} fps "
            f"[{s.fps_source}], {s.capture}")
    lines = []
    if s.imu is not None:
        lines.append(f"imu.json: {len(s.imu.t)} samples over {s.imu.t[-1] - s.imu.t[0]:.1f} s")
        lines += [f"imu.json: gap of {g.length:.2f} s without samples at {g.at:.2f} s after its start (the phone's "
                  "main thread busy) -> left out of `packer slam`'s IMU terms" for g in find_gaps(s.imu.t)]
    else:
        lines.append("imu.json: absent" + (" (ARKit session: not needed)" if s.capture == "arkit"
                                            else " -> IMU scale impossible: --scale marker/known-distance/none"))
    lines.append(_glove(s))
    ours = s.metadata.get("shardship")
    md = ours if isinstance(ours, dict) else {}
    metric = f"metric, scale {md.get('scale'):.4g}" if md.get("metric") and md.get("scale") else "not metric"
    sf = s.metadata.get("scale_factor")
    lines.append(_POSES[s.pose_source].format(metric=metric, scale=f"{sf:.6g}" if isinstance(sf, (int, float)) else sf))
    if s.intrinsics is None:
        lines.append("calib.txt: absent -> SfM estimates the intrinsics")
    refine = " (refined by gyro alignment once poses exist)" if s.imu is not None else ""
    lines.append(f"clock: frame 0 placed on the phone's clock by {s.frame0_source or 'nothing: joints masked'}{refine}")
    return head, lines + [f"warning: {w}" for w in s.warnings]


def _glove(s: Session) -> str:
    enc = load_encoders(s)
    if enc is None:
        return "encoders.json: absent (glove not connected) -> joints masked, same 13-D action layout"
    errs = sum(enc.read_errors)
    clock = "ESP32 clock (de-jittered)" if enc.clock == "esp" else "BLE receive times"
    use = usable(enc)
    state = "" if use.all() else " -> joints masked" if not use.any() else (
        f" -> {', '.join(n for n, u in zip(JOINTS, use) if not u)} masked")
    return (f"encoders.json: {enc.rows} readings of {len(JOINTS)} joints in degrees, {errs} read errors dropped, "
            f"{clock}{state}" + "".join(f"; {w}" for w in enc.warnings) + _coverage(s, enc))


def _coverage(s: Session, enc: Encoders) -> str:
    """'\n        glove: joints on 64% of the frames, silent 2.0-4.0 s -> those frames' joints masked'
    on the first guess of the clock (`packer pack` places frame 0 more exactly)."""
    if s.frame0_epoch is None or not usable(enc).any():
        return ""
    epoch = s.frame0_epoch + s.timestamps
    cov = coverage(enc, epoch)
    gaps = reading_gaps(enc, float(epoch[0]), float(epoch[-1]))
    silent = ", ".join(f"{a - s.frame0_epoch:.1f}-{a + n - s.frame0_epoch:.1f} s" for a, n in gaps[:6])
    more = f" and {len(gaps) - 6} more" if len(gaps) > 6 else ""
    return (f"\n        glove: joints on {cov:.0%} of the frames" + (f", silent {silent}{more} -> those frames' joints "
            "masked (never held or straight-lined)" if gaps else ""))
