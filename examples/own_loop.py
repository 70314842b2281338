"""Train your own model on shardship's shards, in your own loop (README: "Use the
shards from your own training loop").

    python examples/own_loop.py --data data/demo/packed --steps 20
    python examples/own_loop.py --data data/demo/packed --steps 0 --checkpoint outputs/demo/last.pt

1. split the sessions, open a reader for the training ones: 2 frames (t-1, t), windows
   inside the session, actions min-max to [-1, 1], proprio z-scored (the
   corneliusgruss/stack trainer's observation and normalisation);
2. train a deliberately tiny model on it (stand-in for yours), masking padded steps;
3. save the model with the reader's position; `--resume` continues the data stream
   exactly where it stopped;
4. with `--checkpoint`, load a `train run` checkpoint and call its policy on a
   validation batch, reporting the position error in cm."""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from train.api import load_index, load_policy, make_loader, open_dataset, split_sessions


class TinyPolicy(nn.Module):
    """Pooled pixels of every frame + proprio -> the whole action chunk (one linear map)."""

    def __init__(self, frames: int, proprio: int, horizon: int, action_dim: int):
        super().__init__()
        self.horizon, self.action_dim = horizon, action_dim
        self.net = nn.Sequential(nn.Linear(frames * (3 * 16 + proprio), 128), nn.ReLU(),
                                 nn.Linear(128, horizon * action_dim))

    def forward(self, image: torch.Tensor, proprio: torch.Tensor) -> torch.Tensor:
        b, n = image.shape[:2]
        x = F.adaptive_avg_pool2d(image.flatten(0, 1).float() / 255.0, 4).reshape(b, n, -1)  # (B, N, 48)
        h = torch.cat([x, proprio], dim=-1).reshape(b, -1)
        return self.net(h).reshape(b, self.horizon, self.action_dim)


def train_own(data: Path, out: Path, steps: int, batch_size: int, workers: int, resume: bool) -> float:
    """Train TinyPolicy for `steps` steps; returns the last loss."""
    index = load_index(data)
    train_names, _ = split_sessions(index.sessions_present(), val_fraction=0.2, seed=0)
    ds = open_dataset(index, batch_size, obs_horizon=2, normalize="minmax", edges="inside", sessions=train_names)
    model = TinyPolicy(2, ds.index.proprio_dim + 9, ds.index.horizon, ds.index.action_dim)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step, last = 0, float("nan")
    ckpt = out / "own.pt"
    if resume and ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        ds.load_state_dict(state["reader"])  # the data stream continues where it stopped
        step = state["step"]
    target = step + steps
    while step < target:
        for batch in make_loader(ds, workers):
            pred = model(batch["image"], batch["proprio"])
            w = batch["action_mask"] * batch["weight"][:, None]  # 0: padded step / padded sample
            loss = ((pred - batch["action"]).pow(2).mean(-1) * w).sum() / w.sum().clamp_min(1)
            opt.zero_grad()
            loss.backward()
            opt.step()
            ds.consumed += ds.batch_size * ds.world_size  # the reader position a checkpoint keeps
            step, last = step + 1, float(loss)
            if step >= target:
                break
        else:
            ds.set_state(ds.epoch + 1)  # epoch done
    out.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "reader": ds.state_dict(), "step": step,
                "normalizer": ds.normalizer.state_dict() if ds.normalizer else None}, ckpt)
    print(f"own loop: {step} steps, last loss {last:.4f}, reader at epoch {ds.epoch} sample {ds.consumed}; "
          f"saved {ckpt}")
    return last


def call_policy(data: Path, checkpoint: Path) -> float:
    """A `train run` checkpoint's policy on one validation batch: mean position error (cm)."""
    policy = load_policy(checkpoint)
    ck_obs = policy.cfg["obs_horizon"] or None
    index = load_index(data)
    _, val_names = split_sessions(index.sessions_present(), val_fraction=0.2, seed=0)
    ds = open_dataset(index, 8, obs_horizon=ck_obs, normalize=None, edges="mask", tail="pad",
                      sessions=val_names or None)  # raw units: the policy normalises itself
    batch = next(iter(make_loader(ds, 0)))
    with torch.no_grad():
        chunk = policy.sample(batch["image"], batch["proprio"], generator=torch.Generator().manual_seed(0))
    m = batch["action_mask"] * batch["weight"][:, None]
    err = (chunk[..., :3] - batch["action"][..., :3]).norm(dim=-1)
    cm = float((err * m).sum() / m.sum().clamp_min(1)) * 100
    print(f"policy {checkpoint}: action chunk {tuple(chunk.shape)}, position error {cm:.2f} cm")
    return cm


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="a packed directory (index.json + shards)")
    ap.add_argument("--out", type=Path, default=Path("outputs/own_loop"))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--resume", action="store_true", help="continue from OUT/own.pt (model, optimizer, data position)")
    ap.add_argument("--checkpoint", type=Path, help="a `train run` checkpoint to call (e.g. outputs/demo/last.pt)")
    a = ap.parse_args(argv)
    if a.steps:
        train_own(a.data, a.out, a.steps, a.batch_size, a.workers, a.resume)
    if a.checkpoint:
        call_policy(a.data, a.checkpoint)


if __name__ == "__main__":
    main()
