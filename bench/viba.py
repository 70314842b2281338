"""The two `--scale imu` solvers on the SAME reconstructions: the windowed
accelerometer solve (`--solver window`, today's default) against the
visual-inertial bundle adjustment (`--solver viba`, packer/slam/inertial/viba.py).

Per session: render (cached by bench.slam_hard.render), the keyframe SfM once at
the defaults, then each solver as `packer.slam.scale.scale_methods.metric_scale` runs it
(its refusals included). The error is bench.slam_hard's: from the keyframes'
sim(3) fit of the estimate on the truth, truth / estimate - 1 (> 0: too small):
the window solve's keyframes are the SfM's times its scale, viba's are its
refined poses. Per profile and solver: accepted %, scale error median / worst,
|error| / reported std (RMS, worst, how many over 3), wrong acceptances (error
> 2% or > 3 std), seconds of the solver alone.

    python -m bench.viba [--profiles easy,fast,low-texture,all] [--seeds 0-5] [--frames 600] [--out CSV]
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from bench.common import machine, write_csv


def _keyframes(src: Path):
    from packer.session import load_imu, load_session
    from packer.slam.options import SlamOptions
    from packer.slam.pipeline import _reconstruct_keyframes

    s = load_session(src)
    imu = load_imu(s)  # as the stage runs it: the readout measured against the gyro, the tracks corrected
    _kpos, model, key_pos, key_T = _reconstruct_keyframes(s, SlamOptions(progress=False), lambda _x: None, imu)
    return s, imu, model, key_pos, key_T


def run_session(src: Path, solvers: list[str]) -> list[dict]:
    """One record per solver: accepted, error, std, seconds, the refusal's words."""
    from packer.slam.options import SlamOptions
    from packer.slam.rotations import umeyama
    from packer.slam.scale.scale_methods import metric_scale
    from packer.synth import truth
    from shardship.errors import SessionError

    s, imu, model, key_pos, key_T = _keyframes(src)
    gt = np.asarray(truth(src)["poses"])[s.frames[key_pos], :3, 3]
    out = []
    for solver in solvers:
        opts = SlamOptions(progress=False, solver=solver)
        rec: dict = {"session": f"{src.parent.name}/{src.name}", "solver": solver}
        t0 = time.perf_counter()
        try:
            scale, _m, extra = metric_scale(s, opts, imu, key_pos, s.timestamps[key_pos], key_T, model)
            T = extra.get("keyframe_poses")
            est = scale * key_T[:, :3, 3] if T is None else T[:, :3, 3]
            rec.update(accepted=True, error_pct=100 * (1 / umeyama(gt, est)[0] - 1),  # as bench.slam_hard
                       std_pct=100 * float(extra["scale_rel_std"]), used=extra.get("solver", "window"),
                       fit_std_pct=100 * float(extra.get("scale_fit_rel_std", np.nan)),
                       model_std_pct=100 * float(extra.get("scale_model_rel_std", np.nan)),
                       viba_refused=extra.get("viba_refused"))
            if "window_scale" in extra:  # --solver auto: the windowed solve's answer on the same model
                rec["window_error_pct"] = 100 * (1 / umeyama(gt, extra["window_scale"] * key_T[:, :3, 3])[0] - 1)
                rec["window_std_pct"] = 100 * float(extra["window_rel_std"])
        except SessionError as e:
            rec.update(accepted=False, refusal=str(e).split(": ", 1)[-1][:90])
        rec["seconds"] = time.perf_counter() - t0
        rec["load"] = os.getloadavg()[0]
        out.append(rec)
    return out


def summarise(profile: str, solver: str, runs: list[dict]) -> dict:
    ok = [r for r in runs if r["accepted"]]
    row: dict = {"profile": profile, "solver": solver, "sessions": len(runs),
                 "accepted_pct": round(100 * len(ok) / max(len(runs), 1), 1)}
    if ok:
        err = np.array([abs(r["error_pct"]) for r in ok])
        z = np.array([abs(r["error_pct"]) / r["std_pct"] for r in ok])
        row.update(err_median_pct=round(float(np.median(err)), 3), err_worst_pct=round(float(err.max()), 3),
                   z_rms=round(float(np.sqrt(np.mean(z**2))), 2), z_worst=round(float(z.max()), 2),
                   wrong_accepted=int(np.sum((err > 2) | (z > 3))))
    row["solver_s_median"] = round(float(np.median([r["seconds"] for r in runs])), 2)
    row["load_median"] = round(float(np.median([r["load"] for r in runs])), 1)
    return row


def main(argv: list[str] | None = None) -> None:
    from bench.slam_hard import render

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profiles", default="easy,fast,low-texture,all")
    ap.add_argument("--seeds", default="0-2", help="A-B (inclusive) or a comma list")
    ap.add_argument("--frames", type=int, default=600)
    ap.add_argument("--solvers", default="window,auto,viba")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "viba.csv")
    ap.add_argument("--log", type=Path, default=None, help="append one JSON line per session and solver")
    a = ap.parse_args(argv)
    lo, _, hi = a.seeds.partition("-")
    seeds = list(range(int(lo), int(hi) + 1)) if hi else [int(x) for x in a.seeds.split(",")]
    solvers = a.solvers.split(",")
    rows = []
    for prof in a.profiles.split(","):
        runs: dict[str, list[dict]] = {s: [] for s in solvers}
        for seed in seeds:
            for rec in run_session(render(prof, seed, a.frames), solvers):
                rec["seed"] = seed
                runs[rec["solver"]].append(rec)
                print(json.dumps(rec), flush=True)
                if a.log:
                    with a.log.open("a") as f:
                        f.write(json.dumps(rec) + "\n")
        rows += [dict(machine=machine(), frames=a.frames, **summarise(prof, s, v)) for s, v in runs.items()]
    write_csv(a.out, rows)
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
