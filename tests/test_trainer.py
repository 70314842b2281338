"""The trainer under real `torchrun --nproc_per_node 2` (gloo, CPU): the loss goes
down, a SIGKILL mid-epoch followed by a restart continues from the last checkpoint
with the same step, learning rate and data position (no sample twice in an epoch),
and an interrupted checkpoint write never replaces a good checkpoint."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from shardship.atomic import TMP_SUFFIX, remove_stale_temps
from shardship.errors import QuotaError, ShardshipError
from tests.datasets import make_packed
from tests.procs import children_by_parent
from train.data import ShardDataset, load_index, split_sessions
from train.data.partition import epoch_order
from train.model import checkpoint_bytes
from train.trainer import TrainConfig, load_checkpoint, lr_at, save_checkpoint

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
TORCHRUN = str(Path(PY).with_name("torchrun"))

MODEL_TOML = """
[train.model]
obs_size = 32
enc_channels = [8, 16, 32]
embed_dim = 64
proprio_embed = 16
time_embed = 32
unet_dims = [32, 64]
diffusion_steps = 50
ddim_steps = 5
"""  # a small model: seconds per step on CPU

CONFIG = """
[train]
batch_size = 8
num_workers = 1
lr = 3e-3
warmup = 5
steps = 42
checkpoint_every = 5
keep = 2
val_every = 20
log_every = 1
log_samples = true
seed = 3
obs_horizon = 2
edges = "inside"
normalize = "minmax"

""" + MODEL_TOML


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    return env


def _jsonl(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a line cut by the kill
    return out


def _descendants(pid: int) -> list[int]:
    """All processes below `pid` (torchrun starts each rank in its own session, so
    killing torchrun's process group alone would leave the ranks running)."""
    children = children_by_parent()
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _sigkill_tree(pid: int) -> None:
    """SIGKILL torchrun and every rank and DataLoader worker under it, as a node
    failure or a scheduler's hard kill would."""
    for p in [pid] + _descendants(pid):
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _losses(recs: list[dict]) -> dict[int, dict]:
    return {r["step"]: r for r in recs if "loss" in r}


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 70 frames: 2 x 53 two-frame windows inside the training sessions = 6 steps per epoch,
    # so checkpoints (every 5) fall mid-epoch
    return make_packed(tmp_path_factory.mktemp("trainer"), sessions=3, frames=70, seed=0)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_torchrun_two_ranks_sigkill_and_resume(packed: Path, tmp_path: Path) -> None:
    cfg_path = tmp_path / "shardship.toml"
    cfg_path.write_text(CONFIG)
    out = tmp_path / "out"
    cmd = [TORCHRUN, "--standalone", "--nproc_per_node", "2", "-m", "train", "run",
           "--data", str(packed), "--out", str(out), "--config", str(cfg_path)]
    log_a = open(tmp_path / "run_a.log", "w")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=log_a, stderr=subprocess.STDOUT, start_new_session=True)
    # kill between two checkpoints (checkpoint_every = 5), after at least one mid-epoch checkpoint
    deadline = time.monotonic() + 300
    killed_at = None
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            recs = _jsonl(out / "metrics.jsonl")
            ckpts = [r["step"] for r in recs if r.get("event") == "checkpoint:periodic"]
            steps = [r["step"] for r in recs if "loss" in r]
            if ckpts and ckpts[-1] >= 10 and steps and steps[-1] % 5 in (2, 3):
                killed_at = steps[-1]
                _sigkill_tree(proc.pid)
                break
            time.sleep(0.05)
    finally:
        if proc.poll() is None and killed_at is None:
            _sigkill_tree(proc.pid)
        proc.wait(timeout=60)
        log_a.close()
    assert killed_at is not None, (tmp_path / "run_a.log").read_text()[-3000:]
    metrics_a = _losses(_jsonl(out / "metrics.jsonl"))
    samples_a = {r: {d["step"]: d for d in _jsonl(out / "samples" / f"rank{r}.jsonl")} for r in range(2)}

    ck = load_checkpoint(out / "last.pt")
    s_ck = ck["step"]
    reader = ck["reader"]
    index = load_index(packed)
    train_names, _ = split_sessions(index.sessions_present(), 0.1, 3)
    train_ix = index.select_sessions(train_names)
    train_ds = ShardDataset(train_ix, 8, obs_horizon=2, edges="inside", run_length=2)  # the windows the run trains on
    n_train = train_ds.n_samples
    assert n_train < train_ix.n_samples  # frames whose window leaves the session are not trained on
    g = 2 * 8
    per_epoch = n_train // g
    assert s_ck < max(metrics_a), "the kill must lose some un-checkpointed steps"
    assert 0 < reader["consumed"] < per_epoch * g, "the checkpoint should sit mid-epoch"
    assert reader["consumed"] == (s_ck % per_epoch) * g and reader["epoch"] == s_ck // per_epoch

    # restart: same command, resumes by itself
    res = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=400)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert f"resuming from {out / 'last.pt'} at step {s_ck}" in res.stdout + res.stderr
    recs = _jsonl(out / "metrics.jsonl")
    metrics_b = _losses(recs)
    total = 42
    assert sorted(metrics_b) == list(range(1, total + 1)), "each step logged once, the redone ones replaced"
    tc = TrainConfig(lr=3e-3, warmup=5)
    for step, r in metrics_b.items():
        assert r["lr"] == pytest.approx(lr_at(step - 1, tc, total), rel=1e-9, abs=0), f"LR off at step {step}"
        if step <= s_ck:
            assert r == metrics_a[step]
    redone = [s for s in metrics_a if s > s_ck]
    assert redone
    for s in redone:  # the same model, data and noise: the same loss as before the kill
        assert metrics_b[s]["loss"] == pytest.approx(metrics_a[s]["loss"], rel=1e-4)

    # data position: per epoch, no sample twice; whole epochs cover the epoch's stream prefix
    by_epoch: dict[int, list[int]] = defaultdict(list)
    for r in range(2):
        rows = {d["step"]: d for d in _jsonl(out / "samples" / f"rank{r}.jsonl")}
        assert sorted(rows) == list(range(1, total + 1))
        for s in redone:  # the restarted run read exactly what the killed run had read
            assert rows[s]["index"] == samples_a[r][s]["index"]
        first_b = rows[s_ck + 1]
        assert first_b["position"][0] == reader["consumed"] + r * 8
        for d in rows.values():
            by_epoch[d["epoch"]].extend(d["position"])
    assert sorted(by_epoch) == list(range(math.ceil(total / per_epoch)))
    for epoch, positions in by_epoch.items():
        steps = min(per_epoch, total - epoch * per_epoch)  # the last epoch may be cut by `steps`
        assert sorted(positions) == list(range(steps * g)), f"epoch {epoch}: a sample repeated or skipped"
    order = train_ds.anchors[epoch_order(train_ds._counts, 3, reader["epoch"], 8, run=2)]
    killed_epoch = [i for r in range(2) for d in _jsonl(out / "samples" / f"rank{r}.jsonl")
                    if d["epoch"] == reader["epoch"] for i in d["index"]]
    assert sorted(killed_epoch) == sorted(order[:per_epoch * g].tolist())

    # learning: the loss went down
    losses = [metrics_b[s]["loss"] for s in range(1, total + 1)]
    first, last = sum(losses[:6]) / 6, sum(losses[-6:]) / 6
    assert last < 0.92 * first, (first, last)
    vals = [r["val_loss"] for r in recs if "val_loss" in r]
    assert vals and all(math.isfinite(v) for v in vals)

    # files: last (step 42), best, keep=2 periodic, plot; no temp files left behind
    final = load_checkpoint(out / "last.pt")
    assert final["step"] == total and final["world_size"] == 2
    assert sorted(p.name for p in out.glob("step_*.pt")) == ["step_40.pt", "step_42.pt"]
    assert (out / "best.pt").exists() and (out / "loss.png").stat().st_size > 1000
    assert not [p for p in out.iterdir() if p.name.endswith(TMP_SUFFIX)]
    real = (out / "last.pt").stat().st_size
    assert abs(checkpoint_bytes(final["model_config"]) - real) <= 0.02 * real + 128 * 1024
    lo, hi = (torch.tensor(index.stats["action"][k]) for k in ("min", "max"))  # minmax: offset = mid-range
    assert final["normaliser"]["action_mean"] == pytest.approx(((lo + hi) / 2).tolist(), rel=1e-5, abs=1e-6)
    mc = final["model_config"]
    assert mc["obs_horizon"] == 2 and mc["proprio_dim"] == 13
    assert killed_epoch and all(int(train_ix.run_before[i]) >= 1 for i in killed_epoch)

    # evaluation of the EMA policy on the held-out session
    ev = subprocess.run([PY, "-m", "train", "eval", "--data", str(packed), "--out", str(out), "--max-samples", "16",
                         "--ddim-steps", "3", "--num-workers", "0"], cwd=ROOT, env=_env(), capture_output=True,
                        text=True, timeout=300)
    assert ev.returncode == 0, ev.stderr[-3000:]
    assert "position error" in ev.stdout and "rotation error" in ev.stdout
    rep = json.loads((out / "eval.json").read_text())
    assert rep["samples"] == 16 and math.isfinite(rep["position_error_cm"]) and rep["rotation_error_deg"] >= 0
    assert (out / "eval.png").stat().st_size > 1000
    page = (out / "eval.html").read_text()  # the page: the held-out session, its figure, the three errors
    assert all(n in page for n in rep["val_sessions"]) and page.count('src="data:image/png;base64,') == 2
    assert "page: " in ev.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigterm_checkpoints_and_stops_then_resumes(packed: Path, tmp_path: Path) -> None:
    """What a scheduler sends before the wall clock: finish the step, checkpoint, exit 0."""
    cfg_path = tmp_path / "shardship.toml"
    cfg_path.write_text(CONFIG.replace("steps = 42", "steps = 400").replace("log_every = 1", "log_every = 2"))
    out = tmp_path / "out"
    cmd = [PY, "-m", "train", "run", "--data", str(packed), "--out", str(out), "--config", str(cfg_path)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline and proc.poll() is None:
            if any(r.get("step", 0) >= 3 for r in _jsonl(out / "metrics.jsonl")):
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        text, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, text[-2000:]
    ck = load_checkpoint(out / "last.pt")
    assert f"stopped at step {ck['step']}/400 (SIGTERM)" in text
    assert 3 <= ck["step"] < 400
    r = subprocess.run(cmd + ["--max-steps", str(ck["step"] + 2)], cwd=ROOT, env=_env(), capture_output=True,
                       text=True, timeout=200)
    assert r.returncode == 0, r.stderr[-2000:]
    k = ck["step"] + 2
    assert f"at step {ck['step']}," in r.stdout + r.stderr
    assert f"done: step {k}/{k} (--max-steps; the schedule has 400 steps" in r.stdout


class _Boom:
    """Pickling this raises: torch.save fails mid-serialisation."""

    def __reduce__(self):  # noqa: D105
        raise RuntimeError("disk on fire")


def test_failed_checkpoint_write_keeps_the_good_one(tmp_path: Path) -> None:
    good = tmp_path / "last.pt"
    save_checkpoint({"format": "shardship-checkpoint", "step": 7, "w": torch.ones(1000)}, good)
    with pytest.raises(RuntimeError, match="disk on fire"):
        save_checkpoint({"format": "shardship-checkpoint", "step": 8, "w": torch.zeros(1000), "x": _Boom()}, good)
    assert load_checkpoint(good)["step"] == 7
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"], "the failed temp file must be removed"


def test_sigkill_during_checkpoint_write_keeps_the_good_one(tmp_path: Path) -> None:
    """A process killed while torch.save writes the new last.pt leaves the old one."""
    marker = tmp_path / "writing"
    script = textwrap.dedent(f"""
        import sys, time, torch
        from pathlib import Path
        from train.trainer import save_checkpoint

        class Slow:
            def __reduce__(self):
                Path({str(marker)!r}).write_text("x")
                time.sleep(120)
                return (int, (0,))

        out = Path({str(tmp_path)!r}) / "last.pt"
        save_checkpoint({{"format": "shardship-checkpoint", "step": 100, "w": torch.ones(10)}}, out)
        save_checkpoint({{"format": "shardship-checkpoint", "step": 101, "w": torch.zeros(10**6), "s": Slow()}}, out)
    """)
    proc = subprocess.Popen([PY, "-c", script], cwd=ROOT, env=_env(), start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert marker.exists(), "the writer never reached the middle of the write"
        temps = [p for p in tmp_path.iterdir() if p.name.endswith(TMP_SUFFIX)]
        assert temps, "the new checkpoint should be going to a temp file"
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert load_checkpoint(tmp_path / "last.pt")["step"] == 100
    assert remove_stale_temps(tmp_path) == len(temps)  # what the next `train run` does first


_CTRL_C_AT_THE_ARCHIVE_END = """
import gc, pathlib, sys
import torch
from train.checkpoint import save_checkpoint

def ctrl_c(frame, event, arg):  # the signal handler's KeyboardInterrupt, at the call that ends the zip archive
    if event == "c_call" and getattr(arg, "__name__", "") == "write_end_of_file":
        sys.setprofile(None)
        raise KeyboardInterrupt

out = pathlib.Path(sys.argv[1])
sys.setprofile(ctrl_c)
try:
    save_checkpoint({"w": torch.zeros(100)}, out / "last.pt")
except KeyboardInterrupt:
    print("interrupted")
sys.setprofile(None)
gc.collect()  # the unfinished zip writer is destroyed here, and finishes its archive
print("left:", sorted(p.name for p in out.iterdir()))
"""


def test_ctrl_c_just_before_the_archive_end_neither_aborts_nor_leaves_a_file(tmp_path: Path) -> None:
    """CI saw `train run` die of SIGABRT ('terminate called ... write to closed file')
    after a second ctrl-C: torch.save's zip writer, left unfinished, finished its
    archive on garbage collection into the file atomic_open had closed. The
    interrupt is put at that exact call, deterministically."""
    r = subprocess.run([sys.executable, "-c", _CTRL_C_AT_THE_ARCHIVE_END, str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120, env=_env())
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["interrupted", "left:", "[]"], r.stdout + r.stderr[-2000:]


def test_full_disk_during_checkpoint_is_a_quota_error_and_keeps_the_good_one(tmpfs_1m: Path) -> None:
    """A real 1 MiB tmpfs: the second checkpoint does not fit."""
    good = tmpfs_1m / "last.pt"
    save_checkpoint({"format": "shardship-checkpoint", "step": 1, "w": torch.ones(1000)}, good)
    with pytest.raises(QuotaError, match="last.pt.*previous last.pt is intact"):
        save_checkpoint({"format": "shardship-checkpoint", "step": 2, "w": torch.ones(400_000)}, good)
    assert load_checkpoint(good)["step"] == 1
    assert [p.name for p in tmpfs_1m.iterdir()] == ["last.pt"]


def test_first_checkpoint_that_does_not_fit_does_not_claim_an_earlier_one(tmpfs_1m: Path) -> None:
    """Issue 21.9: with nothing saved before, "the previous checkpoint is intact" was the wrong comfort."""
    with pytest.raises(QuotaError) as e:
        save_checkpoint({"format": "shardship-checkpoint", "step": 1, "w": torch.ones(400_000)}, tmpfs_1m / "last.pt")
    assert "intact" not in str(e.value) and "no earlier checkpoint" in str(e.value), str(e.value)
    assert not list(tmpfs_1m.iterdir())


def test_bad_config_and_missing_data_are_one_line_errors(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text("[train]\nbatch_sise = 4\n")
    r = subprocess.run([PY, "-m", "train", "run", "--config", str(tmp_path / "bad.toml")], cwd=ROOT, env=_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "batch_sise" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([PY, "-m", "train", "run", "--data", str(tmp_path / "nope"), "--out", str(tmp_path / "o")],
                       cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "index.json" in r.stderr and "Traceback" not in r.stderr
    with pytest.raises(ShardshipError, match="time_limit"):
        TrainConfig.from_dict({"time_limit": "soon"})


def test_ctrl_c_inside_torch_save_stays_an_interrupt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second ctrl-C can land inside torch.save; its zip writer's cleanup then fails on the
    half-written file ("unexpected pos"). That RuntimeError must not replace the interrupt
    (it printed a traceback and exit 1 instead of the one-line exit 130), and no temp stays."""
    def interrupted_save(obj, f) -> None:
        try:
            raise KeyboardInterrupt
        finally:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1422464 vs 1422352")

    monkeypatch.setattr(torch, "save", interrupted_save)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint({"step": 1}, tmp_path / "last.pt")
    assert list(tmp_path.iterdir()) == []
