"""`train eval`: how far the EMA policy's DDIM-sampled chunks are from the truth on
the validation sessions, in the units a robot cares about.

Position error: Euclidean distance between predicted and true chunk positions
(metres in the current camera frame -> cm). Rotation error: geodesic angle
between the rotations given by the 6-D representations (deg). Both are averaged
over the real (unmasked) steps of every chunk, and reported per horizon step.
A PNG shows the errors per step and a few predicted vs true trajectories."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shardship.atomic import atomic_open, write_json
from shardship.errors import ShardshipError
from train.checkpoint import load_checkpoint
from train.data import ShardDataset, load_index, make_loader, verify_shards
from train.data.dataset import unwrap_worker_error
from train.model import DiffusionPolicy


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


def chunk_errors(pred: np.ndarray, true: np.ndarray, mask: np.ndarray,
                 joints_valid: np.ndarray | None = None) -> dict[str, Any]:
    """Errors of (N, T, D) chunks; mask (N, T) marks real steps; joints_valid (N,)
    leaves samples recorded without the glove out of the joint error."""
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
    if pred.shape[-1] > 9 and jm.any():
        out["joint_mae"] = float(np.abs(pred[..., 9:] - true[..., 9:])[jm].mean())
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
             seed: int = 0, progress: bool = True) -> dict[str, Any]:
    """Evaluate the EMA policy of a checkpoint on its validation sessions; writes
    eval.json and eval.png next to the checkpoint and returns the metrics."""
    from tqdm import tqdm

    data, out = Path(data), Path(out)
    ck_path = pick_checkpoint(out, checkpoint)
    ck = load_checkpoint(ck_path)
    val_names = list(ck.get("val_sessions") or [])
    if not val_names:
        raise ShardshipError(f"{ck_path}: trained without validation sessions (one session, or val_fraction = 0): "
                             "nothing held out to evaluate on")
    index = load_index(data)
    missing = [n for n in val_names if n not in index.session_names]
    if missing:
        raise ShardshipError(f"{data}: validation session(s) {', '.join(missing)} of {ck_path.name} are not in this "
                             "index.json: evaluate on the data the model was trained with (--data)")
    val_ix = index.select_sessions(val_names)
    verify_shards(val_ix, progress=progress)
    dev = torch.device("cuda" if device in ("auto", "cuda") and torch.cuda.is_available() else "cpu")
    if device == "cuda" and dev.type != "cuda":
        raise ShardshipError("device=cuda but torch sees no GPU")
    model = DiffusionPolicy(ck["model_config"])
    model.load_state_dict(ck["ema"]["module"])
    model.to(dev).eval()

    n_obs = ck["model_config"].get("obs_horizon") or None  # the frames the model was trained on
    ds = ShardDataset(val_ix, batch_size, seed=seed, tail="pad", obs_horizon=n_obs)
    gen = torch.Generator(device=dev).manual_seed(seed)
    preds, trues, masks, jvalid = [], [], [], []
    n = 0
    want = min(max_samples, val_ix.n_samples) if max_samples > 0 else val_ix.n_samples
    bar = tqdm(total=want, desc="eval", unit="sample", disable=not progress, leave=False)
    it = iter(make_loader(ds, num_workers, dev.type == "cuda", seed=seed))
    while n < want:
        try:
            batch = next(it)
        except StopIteration:
            break
        except ShardshipError as e:
            raise unwrap_worker_error(e) from None
        keep = batch["weight"] > 0
        sampled = model.sample(batch["image"].to(dev), batch["proprio"].to(dev), steps=ddim_steps, generator=gen)
        preds.append(sampled.float().cpu()[keep].numpy())
        trues.append(batch["action"][keep].numpy())
        masks.append(batch["action_mask"][keep].numpy())
        jvalid.append(batch["joints_valid"][keep].numpy())
        n += int(keep.sum())
        bar.update(int(keep.sum()))
    bar.close()
    del it
    pred, true, mask, jv = (np.concatenate(x)[:want] for x in (preds, trues, masks, jvalid))
    res = chunk_errors(pred, true, mask, jv > 0)
    res.update({
        "checkpoint": str(ck_path), "step": int(ck["step"]), "val_sessions": val_names,
        "ddim_steps": int(ddim_steps or ck["model_config"]["ddim_steps"]),
        "pose_metric": bool(index.pose_metric),
        "units": "cm / deg" if index.pose_metric else "SfM units x 100 / deg (poses are not metric)",
    })
    write_json(ck_path.parent / "eval.json", res)
    plot_eval(pred, true, mask, res, ck_path.parent / "eval.png")
    res["png"] = str(ck_path.parent / "eval.png")
    return res


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
        f"DDIM {res['ddim_steps']} steps",
        f"position error: {res['position_error_cm']:.2f} cm mean, {res['position_error_cm_median']:.2f} cm median",
        f"rotation error: {res['rotation_error_deg']:.2f} deg mean, {res['rotation_error_deg_median']:.2f} deg median",
    ]
    if "joint_mae" in res:
        lines.append(f"joint MAE: {res['joint_mae']:.2f} deg")
    if not res["pose_metric"]:
        lines.append("note: poses are not metric (no scale calibration): position errors are not in cm")
    last = res["position_error_cm_per_step"][-1]
    if last is not None and not math.isnan(last):
        lines.append(f"at the last horizon step: {last:.2f} cm, {res['rotation_error_deg_per_step'][-1]:.2f} deg")
    lines.append(f"plot: {res['png']}")
    return lines


__all__ = ["evaluate", "chunk_errors", "rotation_error_deg", "rot6d_to_matrix", "summary_lines"]
