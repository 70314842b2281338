"""`train eval`: how far the EMA policy's sampled chunks (DDIM or DDPM, the model
config's sampler) are from the truth on the validation sessions, in the units a
robot cares about.

Position error: Euclidean distance between predicted and true chunk positions
(metres in the current camera frame -> cm). Rotation error: geodesic angle
between the rotations given by the 6-D representations (deg). Joint error: mean
absolute joint-angle error (deg, samples with the glove only). Averaged over the
real (unmasked) steps of every chunk, and reported per horizon step.

The headline three (`position_cm`, `rotation_deg`, `joint_deg`) are computed as the
user's own evaluation (corneliusgruss/stack, stack/scripts/eval.py) does: each
chunk's mean over its steps, then each session's mean over its chunks, then the
mean over sessions, so they compare with the published 3.3 cm / 6.6 deg / 5.4 deg.
They are also written as TensorBoard scalars (eval/...) at the checkpoint's step,
next to the training curves. A PNG shows the errors per step and a few
predicted vs true trajectories."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from packer.actions import POSE_DIMS
from shardship.atomic import atomic_open, write_json
from shardship.errors import ShardshipError
from train.checkpoint import load_checkpoint
from train.data import ShardDataset, load_index, make_loader, verify_shards
from train.data.dataset import sample_keys, unwrap_worker_error
from train.ddp import pick_device
from train.model import DiffusionPolicy
from train.tblog import ScalarLog


def rot6d_to_matrix(x: np.ndarray) -> np.ndarray:
    """(..., 6) column-major first two columns -> (..., 3, 3) rotation (Gram-Schmidt)."""
    a1, a2 = x[..., 0:3], x[..., 3:6]
    b1 = a1 / np.maximum(np.linalg.norm(a1, axis=-1, keepdims=True), 1e-9)
    a2 = a2 - (b1 * a2).sum(-1, keepdims=True) * b1
    b2 = a2 / np.maximum(np.linalg.norm(a2, axis=-1, keepdims=True), 1e-9)
    b3 = np.cross(b1, b2)
    return np.stack([b1, b2, b3], axis=-1)


def rotation_error_deg(pred6: np.ndarray, true6: np.ndarray) -> np.ndarray:
    r1, r2 = rot6d_to_matrix(pred6), rot6d_to_matrix(true6)
    tr = np.einsum("...ij,...ij->...", r1, r2)  # trace(R1^T R2)
    return np.degrees(np.arccos(np.clip((tr - 1) / 2, -1.0, 1.0)))


def chunk_errors(pred: np.ndarray, true: np.ndarray, mask: np.ndarray, joints_valid: np.ndarray | None = None,
                 sessions: np.ndarray | None = None) -> dict[str, Any]:
    """Errors of (N, T, D) chunks; mask (N, T) marks real steps; joints_valid (N,)
    leaves samples recorded without the glove out of the joint error; sessions (N,)
    groups chunks for the per-session means (session_means)."""
    pos_cm = np.linalg.norm(pred[..., 0:3] - true[..., 0:3], axis=-1) * 100.0
    rot_deg = rotation_error_deg(pred[..., 3:9], true[..., 3:9])
    m = mask.astype(bool)
    per_step_pos = [float(pos_cm[m[:, k], k].mean()) if m[:, k].any() else None for k in range(m.shape[1])]
    per_step_rot = [float(rot_deg[m[:, k], k].mean()) if m[:, k].any() else None for k in range(m.shape[1])]
    out: dict[str, Any] = {
        "samples": int(pred.shape[0]),
        "position_error_cm": float(pos_cm[m].mean()),
        "rotation_error_deg": float(rot_deg[m].mean()),
        "position_error_cm_median": float(np.median(pos_cm[m])),
        "rotation_error_deg_median": float(np.median(rot_deg[m])),
        "position_error_cm_per_step": per_step_pos,
        "rotation_error_deg_per_step": per_step_rot,
    }
    jm = m if joints_valid is None else m & np.asarray(joints_valid, bool)[:, None]
    joint_deg = np.abs(pred[..., 9:] - true[..., 9:]).mean(-1) if pred.shape[-1] > 9 else None
    if joint_deg is not None and jm.any():
        out["joint_mae"] = out["joint_error_deg"] = float(joint_deg[jm].mean())
    out.update(session_means(pos_cm, rot_deg, joint_deg, m, jm, sessions))
    return out


def session_means(pos_cm: np.ndarray, rot_deg: np.ndarray, joint_deg: np.ndarray | None, m: np.ndarray,
                  jm: np.ndarray, sessions: np.ndarray | None) -> dict[str, Any]:
    """The user's aggregation of (N, T) errors: per chunk over its real steps, per
    session over its chunks, then over sessions. `sessions` (N,) ids; None: one session."""
    sess = np.zeros(len(m), np.int64) if sessions is None else np.asarray(sessions)

    def per_chunk(err: np.ndarray, mask: np.ndarray) -> np.ndarray:
        n = mask.sum(1)
        return np.where(n > 0, (err * mask).sum(1) / np.maximum(n, 1), np.nan)

    chunks = {"position_cm": per_chunk(pos_cm, m), "rotation_deg": per_chunk(rot_deg, m)}
    if joint_deg is not None:
        chunks["joint_deg"] = per_chunk(joint_deg, jm)
    per_session: dict[str, dict[str, float]] = {}
    for sid in np.unique(sess):
        rows = sess == sid
        per_session[str(sid)] = {k: float(np.nanmean(v[rows])) for k, v in chunks.items()
                                 if np.isfinite(v[rows]).any()}
    out: dict[str, Any] = {"per_session": per_session}
    for k in chunks:
        vals = [d[k] for d in per_session.values() if k in d]
        if vals:
            out[k] = float(np.mean(vals))
    return out


def pick_checkpoint(out: Path, checkpoint: str | Path | None) -> Path:
    if checkpoint:
        p = Path(checkpoint)
        if not p.exists() and (out / p).exists():
            p = out / p
        if not p.exists():
            raise ShardshipError(f"checkpoint {checkpoint} not found")
        return p
    for name in ("best.pt", "last.pt"):
        if (out / name).exists():
            return out / name
    raise ShardshipError(f"no best.pt or last.pt in {out}: train first (`train run --out {out}`)")


def evaluate(data: str | Path, out: str | Path, checkpoint: str | Path | None = None, max_samples: int = 256,
             ddim_steps: int | None = None, batch_size: int = 32, num_workers: int = 2, device: str = "auto",
             seed: int = 0, progress: bool = True, sampler: str | None = None) -> dict[str, Any]:
    """Evaluate the EMA policy of a checkpoint on its validation sessions; writes
    eval.json, eval.png and eval.html (the page) next to the checkpoint (and eval/
    TensorBoard scalars there) and returns the metrics. `sampler`: ddim or ddpm (default: the model's)."""
    data, out = Path(data), Path(out)
    if max_samples < 0:
        raise ShardshipError(f"--max-samples must be >= 0 (0 = every validation sample; got {max_samples})")
    index = load_index(data)  # first: a wrong --data (the index.json file itself) says so before the checkpoint
    ck_path = pick_checkpoint(out, checkpoint)
    ck = load_checkpoint(ck_path)
    val_names = list(ck.get("val_sessions") or [])
    if not val_names:
        raise ShardshipError(f"{ck_path}: trained without validation sessions (one session, or val_fraction = 0): "
                             "nothing held out to evaluate on")
    missing = [n for n in val_names if n not in index.session_names]
    if missing:
        raise ShardshipError(f"{data}: validation session(s) {', '.join(missing)} of {ck_path.name} are not in this "
                             "index.json: evaluate on the data the model was trained with (--data)")
    val_ix = index.select_sessions(val_names)
    verify_shards(val_ix, progress=progress)
    dev = pick_device(device)
    model = DiffusionPolicy(ck["model_config"])
    model.load_state_dict(ck["ema"]["module"])
    model.to(dev).eval()
    kind = sampler or model.cfg["sampler"]
    want = min(max_samples, val_ix.n_samples) if max_samples > 0 else val_ix.n_samples
    ds = ShardDataset(val_ix, batch_size, seed=seed, tail="pad", obs_horizon=checkpoint_frames(ck, index))
    pred, true, mask, jv, sess, rows = _sample_chunks(model, ds, want, num_workers, dev, seed, ddim_steps, kind,
                                                      progress)
    res = chunk_errors(pred, true, mask, jv > 0, sess)
    res["per_session"] = {val_ix.session_names[int(k)]: v for k, v in res["per_session"].items()}
    steps = int(ddim_steps or (ck["model_config"]["ddim_steps"] if kind == "ddim" else
                               ck["model_config"]["diffusion_steps"]))
    res.update({
        "checkpoint": str(ck_path), "step": int(ck["step"]), "val_sessions": val_names,
        "sampler": kind, "ddim_steps": steps, "device": str(dev),
        "pose_metric": bool(index.pose_metric),
        "units": "cm / deg" if index.pose_metric else "SfM units x 100 / deg (poses are not metric)",
    })
    write_json(ck_path.parent / "eval.json", res)
    plot_eval(pred, true, mask, res, ck_path.parent / "eval.png")
    res["png"] = str(ck_path.parent / "eval.png")
    from train.report import write_eval_page

    res["html"] = str(write_eval_page(data, sample_keys(ds.index, rows), pred, true, mask, res,
                                      ck_path.parent / "eval.html", png=ck_path.parent / "eval.png"))
    log = ScalarLog.open(ck_path.parent)
    log.write({"step": res["step"], **{f"eval/{k}": res[k] for k in ("position_cm", "rotation_deg", "joint_deg")
                                       if k in res}})
    log.close()
    return res


def checkpoint_frames(ck: dict[str, Any], index: Any) -> int | None:
    """The reader layout a checkpoint was trained on: its obs_horizon frames with the
    13-D relative proprio, or None (one frame, joints-only proprio) for a checkpoint
    from before the relative proprio existed (proprio_dim = the joints alone)."""
    mc = ck["model_config"]
    return int(mc.get("obs_horizon") or 1) if int(mc["proprio_dim"]) == POSE_DIMS + index.proprio_dim else None


def _sample_chunks(model: DiffusionPolicy, ds: ShardDataset, want: int, num_workers: int, dev: torch.device,
                   seed: int, steps: int | None, sampler: str, progress: bool) -> tuple[np.ndarray, ...]:
    """(pred, true, mask, joints_valid, session, sample row in ds.index) of the first
    `want` validation samples."""
    from shardship.progress import bar as progress_bar

    gen = torch.Generator(device=dev).manual_seed(seed)
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("pred", "true", "mask", "jv", "sess", "row")}
    n = 0
    bar = progress_bar(want, "eval", "sample", None if progress else False, leave=False)
    it = iter(make_loader(ds, num_workers, dev.type == "cuda", seed=seed))
    while n < want:
        try:
            batch = next(it)
        except StopIteration:
            break
        except ShardshipError as e:
            raise unwrap_worker_error(e) from None
        keep = batch["weight"] > 0
        sampled = model.sample(batch["image"].to(dev), batch["proprio"].to(dev), steps=steps, generator=gen,
                               sampler=sampler)
        cols["pred"].append(sampled.float().cpu()[keep].numpy())
        for k, src in (("true", "action"), ("mask", "action_mask"), ("jv", "joints_valid")):
            cols[k].append(batch[src][keep].numpy())
        cols["sess"].append(ds.index.session[batch["index"][keep].numpy()])
        cols["row"].append(batch["index"][keep].numpy())
        n += int(keep.sum())
        bar.update(int(keep.sum()))
    bar.close()
    del it
    return tuple(np.concatenate(cols[k])[:want] for k in ("pred", "true", "mask", "jv", "sess", "row"))


def plot_eval(pred: np.ndarray, true: np.ndarray, mask: np.ndarray, res: dict[str, Any], png: Path,
              n_traj: int = 4) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_traj = min(n_traj, pred.shape[0])
    fig, axes = plt.subplots(1, 2 + n_traj, figsize=(4 * (2 + n_traj), 3.6), dpi=90)
    steps = np.arange(1, pred.shape[1] + 1)
    axes[0].plot(steps, [np.nan if v is None else v for v in res["position_error_cm_per_step"]], "o-")
    axes[0].set(title=f"position error (mean {res['position_error_cm']:.2f} cm)", xlabel="horizon step", ylabel="cm")
    axes[1].plot(steps, [np.nan if v is None else v for v in res["rotation_error_deg_per_step"]], "o-", color="C1")
    axes[1].set(title=f"rotation error (mean {res['rotation_error_deg']:.2f} deg)", xlabel="horizon step",
                ylabel="deg")
    picks = np.linspace(0, pred.shape[0] - 1, n_traj).round().astype(int) if n_traj else []
    for ax, i in zip(axes[2:], picks):
        m = mask[i].astype(bool)
        # top-down view of the chunk in the current camera frame (x right, z forward), cm
        for arr, style, label in ((true[i], "o-", "true"), (pred[i], "x--", "predicted")):
            ax.plot(np.r_[0, arr[m, 0]] * 100, np.r_[0, arr[m, 2]] * 100, style, ms=3, label=label)
        ax.set(title=f"sample {i}", xlabel="x (cm)", ylabel="z (cm)")
        ax.axis("equal")
        ax.legend(fontsize=7)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_open(png, "wb") as f:
        fig.savefig(f, format="png")
    plt.close(fig)


def summary_lines(res: dict[str, Any]) -> list[str]:
    lines = [
        f"checkpoint {res['checkpoint']} (step {res['step']}), {res['samples']} validation samples, "
        f"{res['sampler'].upper()} {res['ddim_steps']} steps on {res['device']}",
        f"position error: {res['position_error_cm']:.2f} cm mean, {res['position_error_cm_median']:.2f} cm median",
        f"rotation error: {res['rotation_error_deg']:.2f} deg mean, {res['rotation_error_deg_median']:.2f} deg median",
    ]
    if "joint_mae" in res:
        lines.append(f"joint MAE: {res['joint_mae']:.2f} deg")
    three = [f"{res[k]:.2f} {u}" for k, u in (("position_cm", "cm"), ("rotation_deg", "deg"), ("joint_deg", "deg"))
             if k in res]
    lines.append(f"per-session means (the user's eval): {' / '.join(three)} over {len(res['per_session'])} session(s)")
    if not res["pose_metric"]:
        lines.append("note: poses are not metric (no scale calibration): position errors are not in cm")
    last = res["position_error_cm_per_step"][-1]
    if last is not None and not math.isnan(last):
        lines.append(f"at the last horizon step: {last:.2f} cm, {res['rotation_error_deg_per_step'][-1]:.2f} deg")
    lines.append(f"plot: {res['png']}")
    if res.get("html"):
        lines.append(f"page: {res['html']} (predicted vs recorded, per validation session)")
    return lines


__all__ = ["evaluate", "chunk_errors", "rotation_error_deg", "rot6d_to_matrix", "summary_lines"]
