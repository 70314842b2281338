"""Someone else's training, as it is usually written: a PyTorch Lightning module, a
Hydra-style command line (`trainer.max_epochs=2 data.batch_size=8`, `+group.key=v` to add
a key), checkpoints in the run directory, and a restart that resumes with
`trainer.fit(..., ckpt_path="last")`. shardship does not import it: `train submit
--command "python examples/lightning_train.py ..." --launcher lightning` runs it on a
cluster (README, "Other people's training"); tests/test_lightning_2node.py does that on
the two-node SLURM of CI.

On SLURM Lightning takes its ranks from srun (SLURM_PROCID, SLURM_NTASKS); the defaults of
trainer.devices / trainer.num_nodes are the allocation's tasks per node and nodes, so the
same command runs on 1 x 1 and 2 x 2. Where shardship runs it, it reads SHARDSHIP_OUT (the
run directory) and SHARDSHIP_TIME_LIMIT (seconds after SHARDSHIP_JOB_START): it saves
last.ckpt and stops before the wall clock, and the job is requeued to resume from there.

Made to show the classic failures too: trainer.devices set to 1 on 2 tasks per node,
`data.num_workers` with `data.worker_buffer_mb` (what each DataLoader worker holds:
decode buffers, a shuffle buffer) past the node's memory. `model.step_seconds` stands in
for the compute of a real model (a sleep per step) so a CI run has a known length."""
from __future__ import annotations

import ast
import os
import socket
import sys
import time
from typing import Any

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ[name].split("(")[0])  # SLURM_NTASKS_PER_NODE may read "2(x2)"
    except (KeyError, ValueError):
        return default


CONFIG: dict[str, Any] = {
    "trainer": {"max_epochs": 2, "accelerator": "auto", "devices": _env_int("SLURM_NTASKS_PER_NODE", 1),
                "num_nodes": _env_int("SLURM_NNODES", 1), "log_every_n_steps": 1},
    "data": {"batch_size": 8, "num_workers": 0, "size": 256, "worker_buffer_mb": 0},
    "model": {"hidden": 32, "lr": 0.01, "step_seconds": 0.0},
    "out": os.environ.get("SHARDSHIP_OUT", "outputs/lightning"),
    "seed": 0,
}


def apply_overrides(cfg: dict[str, Any], args: list[str]) -> dict[str, Any]:
    """Hydra's command-line grammar, the part people use: `a.b=v` sets an existing key (an
    unknown one is refused, as Hydra's struct mode does), `+a.b=v` adds one. Values are
    Python literals where they parse (2, 0.1, True, None, [1,2]), else strings."""
    for arg in args:
        key, sep, text = arg.partition("=")
        if not sep:
            raise SystemExit(f"override {arg!r}: use key=value (e.g. trainer.max_epochs=2)")
        add = key.startswith("+")
        *parents, leaf = key.lstrip("+").split(".")
        node = cfg
        for p in parents:
            node = node.setdefault(p, {}) if add else node.get(p)
            if not isinstance(node, dict):
                raise SystemExit(f"override {arg!r}: no config group {p!r} (add one with +{key})")
        if leaf not in node and not add:
            raise SystemExit(f"override {arg!r}: key {key!r} is not in the config (add it with +{key})")
        try:
            node[leaf] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            node[leaf] = {"true": True, "false": False, "null": None}.get(text.lower(), text)
    return cfg


class Synthetic(Dataset):
    """y = x @ w + noise, the same on every rank (seeded); the DistributedSampler splits it."""

    def __init__(self, size: int, dim: int = 16) -> None:
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(size, dim, generator=g)
        self.y = self.x @ torch.randn(dim, 1, generator=g) + 0.01 * torch.randn(size, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def _hold_buffer(mb: int):
    """worker_init_fn: each worker holds `mb` MiB, touched, for its lifetime (decode buffers)."""
    def init(_: int) -> None:
        global _BUFFER
        _BUFFER = bytearray(mb * 2**20)
        for i in range(0, len(_BUFFER), 4096):
            _BUFFER[i] = 1
    return init


_BUFFER = bytearray()


class Regressor(pl.LightningModule):
    def __init__(self, hidden: int, lr: float, step_seconds: float) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
        if self.hparams.step_seconds:
            time.sleep(self.hparams.step_seconds)
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class StopBeforeWallClock(pl.Callback):
    """Save last.ckpt and stop when SHARDSHIP_TIME_LIMIT is reached. Every rank takes the
    same decision (one all-reduce of a flag per step), else the ranks would part ways."""

    def __init__(self, ckpt_dir: str) -> None:
        self.ckpt_dir = ckpt_dir
        self.limit = float(os.environ.get("SHARDSHIP_TIME_LIMIT", "inf"))
        self.start = float(os.environ.get("SHARDSHIP_JOB_START", time.time()))

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        print(f"lightning: rank {trainer.global_rank}/{trainer.world_size} on {socket.gethostname()} "
              f"(local rank {trainer.local_rank}, node {trainer.node_rank}), world size {trainer.world_size}, "
              f"starting at global step {trainer.global_step} epoch {trainer.current_epoch}", flush=True)

    def on_train_batch_end(self, trainer: pl.Trainer, *_: Any) -> None:
        late = time.time() - self.start >= self.limit
        if trainer.strategy.reduce_boolean_decision(late, all=False) and not trainer.should_stop:
            trainer.save_checkpoint(os.path.join(self.ckpt_dir, "last.ckpt"))
            trainer.should_stop = True
            if trainer.is_global_zero:
                print(f"lightning: time limit: saved last.ckpt at global step {trainer.global_step}", flush=True)


def main(argv: list[str]) -> None:
    cfg = apply_overrides(CONFIG, argv)
    pl.seed_everything(cfg["seed"], workers=True)
    d, m, out = cfg["data"], cfg["model"], cfg["out"]
    workers = int(d["num_workers"])
    loader = DataLoader(Synthetic(int(d["size"])), batch_size=int(d["batch_size"]), shuffle=True,
                        num_workers=workers, persistent_workers=workers > 0,
                        worker_init_fn=_hold_buffer(int(d["worker_buffer_mb"])) if d["worker_buffer_mb"] else None)
    ckpt = pl.callbacks.ModelCheckpoint(dirpath=out, save_last=True, every_n_train_steps=5)
    trainer = pl.Trainer(**cfg["trainer"], default_root_dir=out, enable_progress_bar=False,
                         logger=pl.loggers.CSVLogger(out, name="", version=""),
                         callbacks=[ckpt, StopBeforeWallClock(out)])
    trainer.fit(Regressor(int(m["hidden"]), float(m["lr"]), float(m["step_seconds"])), loader, ckpt_path="last")
    print(f"lightning: rank {trainer.global_rank}/{trainer.world_size} done at global step {trainer.global_step} "
          f"epoch {trainer.current_epoch}", flush=True)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        # every rank past fit before the group goes: a rank exiting while gloo's threads still run aborted
        # ("terminate called without an active exception") and srun failed a finished job
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
