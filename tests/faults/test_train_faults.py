"""Faults in `train run`, the shard reader and the job scripts, each reproduced
for real (a full tmpfs, real signals, a hand-damaged index.json or shard) and
answered with one line and the exit code of shardship.errors.Exit."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardship.errors import Exit
from tests.datasets import copy_tree, make_packed
from tests.test_trainer import MODEL_TOML, _env

ROOT = Path(__file__).resolve().parent.parent.parent
PY = sys.executable

TINY = """
[train]
batch_size = 8
num_workers = {workers}
lr = 3e-3
warmup = 2
steps = {steps}
checkpoint_every = {ckpt}
keep = 0
val_every = 0
log_every = {log}
seed = 3

""" + MODEL_TOML


def _config(tmp: Path, steps: int = 20, ckpt: int = 1000, log: int = 1, workers: int = 0) -> Path:
    p = tmp / "shardship.toml"
    p.write_text(TINY.format(steps=steps, ckpt=ckpt, log=log, workers=workers))
    return p


def _cmd(data: Path, out: Path, cfg: Path, *extra: str) -> list[str]:
    return [PY, "-m", "train", "run", "--data", str(data), "--out", str(out), "--config", str(cfg), *extra]


def _run(cmd: list[str], timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)


def _one_line_error(r: subprocess.CompletedProcess[str], code: int) -> str:
    """The run failed with `code` and said why in one `error:` line, no traceback."""
    assert r.returncode == code, (r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, r.stderr[-3000:]
    return errors[0]


def _jsonl(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        with contextlib.suppress(json.JSONDecodeError):
            out.append(json.loads(line))
    return out


@contextlib.contextmanager
def _tmpfs(where: Path, size: str) -> Iterator[Path]:
    where.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_packed(tmp_path_factory.mktemp("faults"), sessions=3, frames=60, seed=0)


def _edit_index(data: Path, edit) -> None:
    doc = json.loads((data / "index.json").read_text())
    edit(doc)
    (data / "index.json").write_text(json.dumps(doc))


# ---------------------------------------------------------------- 6: a full disk
@pytest.mark.slow
def test_full_disk_at_loss_png_warns_once_and_the_run_goes_on(packed: Path, tmp_path: Path) -> None:
    """A tmpfs with room for the checkpoint but not for loss.png: the run ends
    normally (exit 0) with one warning; the checkpoint is complete."""
    from train.checkpoint import load_checkpoint

    probe = tmp_path / "probe"
    cfg = _config(tmp_path, steps=4, ckpt=2, log=1)
    r = _run(_cmd(packed, probe, cfg, "--max-steps", "2"))
    assert r.returncode == 0, r.stderr[-2000:]
    ck_bytes = (probe / "last.pt").stat().st_size
    png_bytes = (probe / "loss.png").stat().st_size
    assert png_bytes > 12 * 1024, "the test needs a plot larger than its slack"
    assert sorted(p.name for p in probe.glob("*.pt")) == ["best.pt", "last.pt"]
    size_k = 2 * ((ck_bytes + 4095) // 4096 * 4) + 12  # both checkpoints, metrics.jsonl, .lock, a page to spare
    with _tmpfs(tmp_path / "small", f"{size_k}k") as out:
        r = _run(_cmd(packed, out, cfg, "--max-steps", "2"))
        assert r.returncode == 0, r.stderr[-3000:]
        assert "Traceback" not in r.stderr
        warns = [ln for ln in r.stderr.splitlines() if "loss.png" in ln]
        assert len(warns) == 1 and "warning" in warns[0], r.stderr[-3000:]
        assert load_checkpoint(out / "last.pt")["step"] == 2
        # the next checkpoint does not fit: the space exit code and one line
        r = _run(_cmd(packed, out, cfg))
        line = _one_line_error(r, Exit.QUOTA)
        assert ("cannot write checkpoint" in line and "intact" in line) or "resume from" in line, line
        assert load_checkpoint(out / "last.pt")["step"] == 2


@pytest.mark.slow
def test_full_disk_at_metrics_jsonl_is_the_space_exit_code(packed: Path, tmp_path: Path) -> None:
    """ENOSPC outside the checkpoint writer (metrics.jsonl fills an 8 KiB tmpfs
    before any checkpoint): exit 3 with one line, not a traceback."""
    cfg = _config(tmp_path, steps=200, ckpt=1000, log=1)
    with _tmpfs(tmp_path / "small", "8k") as out:
        r = _run(_cmd(packed, out, cfg))
        line = _one_line_error(r, Exit.QUOTA)
        assert "no space" in line.lower() and str(out) in line, line


# ---------------------------------------------------------------- 21: ctrl-C
def _start(cmd: list[str]) -> subprocess.Popen[str]:
    """A run in its own process group, as a terminal's foreground job is: ctrl-C
    reaches it and its DataLoader workers alike."""
    return subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _wait_for_step(proc: subprocess.Popen[str], out: Path, step: int, timeout: float = 200) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if any(r.get("step", 0) >= step for r in _jsonl(out / "metrics.jsonl")):
            return
        time.sleep(0.05)
    raise AssertionError(f"the run never reached step {step}: {proc.communicate()[1][-2000:]}")


def _finish(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.slow
def test_ctrl_c_checkpoints_then_resumes(packed: Path, tmp_path: Path) -> None:
    """SIGINT to the whole foreground group at step 3 (no checkpoint yet): the
    step finishes, a checkpoint is written, and the message's promise holds."""
    from train.checkpoint import load_checkpoint

    cfg = _config(tmp_path, steps=400, ckpt=1000, log=1, workers=1)
    out = tmp_path / "out"
    proc = _start(_cmd(packed, out, cfg))
    _wait_for_step(proc, out, 3)
    os.killpg(proc.pid, signal.SIGINT)
    text, err = _finish(proc)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    ck = load_checkpoint(out / "last.pt")
    assert 3 <= ck["step"] < 400
    assert f"stopped at step {ck['step']}/400 (SIGINT)" in text + err
    r = _run(_cmd(packed, out, cfg, "--max-steps", str(ck["step"] + 1)))
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"resuming from {out / 'last.pt'} at step {ck['step']}," in r.stdout + r.stderr


@pytest.mark.slow
def test_second_ctrl_c_says_honestly_whether_a_checkpoint_exists(packed: Path, tmp_path: Path) -> None:
    """A second ctrl-C while the first one's checkpoint is on its way stops at
    once; what the run then promises matches what is on disk."""
    cfg = _config(tmp_path, steps=400, ckpt=1000, log=1, workers=0)
    out = tmp_path / "out"
    proc = _start(_cmd(packed, out, cfg))
    _wait_for_step(proc, out, 2)
    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(0.2)  # two signals at once would be delivered as one
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    text, err = _finish(proc)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    said = [ln for ln in (text + err).splitlines() if ln.startswith(("interrupted", "stopped at step"))]
    assert len(said) == 1, text + err[-3000:]
    if (out / "last.pt").exists():
        assert "resume" in said[0] and str(out / "last.pt") in said[0], said
    else:
        assert "no checkpoint" in said[0] and "resume" not in said[0], said


def test_interrupted_message_promises_only_what_exists(tmp_path: Path) -> None:
    from train.cli import _interrupted

    assert "no checkpoint" in _interrupted(tmp_path) and "resume" not in _interrupted(tmp_path)
    (tmp_path / "last.pt").write_bytes(b"x")
    assert f"resume from {tmp_path / 'last.pt'}" in _interrupted(tmp_path)


# ---------------------------------------------------------------- 16: NaN
def _poison_actions(data: Path, every: int = 2) -> list[str]:
    """Write NaN into the first action value of every `every`-th sample, in place
    (same length: the offsets hold), and re-hash the shards in index.json, as a
    packer fed bad poses would have. Returns the poisoned sample keys."""
    doc = json.loads((data / "index.json").read_text())
    fields = doc["sample_fields"]
    k, mo, ms = fields.index("key"), fields.index("json_offset"), fields.index("json_size")
    keys = []
    for shard in doc["shards"]:
        path = data / shard["name"]
        raw = bytearray(path.read_bytes())
        for row in shard["samples"][::every]:
            js = bytes(raw[row[mo]:row[mo] + row[ms]])
            m = re.search(rb'"action":\[\[(-?[0-9.eE+-]+)', js)
            if m is None:
                continue
            num = m.group(1)
            start = row[mo] + m.start(1)
            raw[start:start + len(num)] = b"NaN".ljust(len(num))
            keys.append(row[k])
        path.write_bytes(bytes(raw))
        shard["sha256"] = hashlib.sha256(raw).hexdigest()
        shard.pop("compressed", None)
        (data / (shard["name"] + ".zst")).unlink(missing_ok=True)
    (data / "index.json").write_text(json.dumps(doc))
    return keys


def _finite_checkpoint(path: Path) -> bool:
    import torch

    from train.checkpoint import load_checkpoint

    ck = load_checkpoint(path)
    return all(bool(torch.isfinite(v).all()) for part in (ck["model"], ck["ema"]["module"])
               for v in part.values() if torch.is_tensor(v) and v.is_floating_point())


@pytest.mark.slow
def test_nan_actions_name_the_sample_and_never_reach_a_checkpoint(packed: Path, tmp_path: Path) -> None:
    """checkpoint_every 3, log_every 4: the checkpoint comes before the loss is
    looked at. The reader refuses the sample by its key; no checkpoint holds NaN."""
    data = copy_tree(packed, tmp_path / "packed")
    keys = _poison_actions(data)
    assert keys
    cfg = _config(tmp_path, steps=20, ckpt=3, log=4)
    out = tmp_path / "out"
    for _ in range(2):  # the rerun fails the same way, from a clean state
        r = _run(_cmd(data, out, cfg))
        line = _one_line_error(r, Exit.USAGE)
        named = [key for key in keys if key in line]
        assert named and "NaN" in line and ".tar" in line, line
        assert not (out / "last.pt").exists() or _finite_checkpoint(out / "last.pt")


@pytest.mark.slow
def test_diverged_weights_are_never_checkpointed(packed: Path, tmp_path: Path) -> None:
    """Clean data, an absurd learning rate: the weights go non-finite between two
    logged steps; the checkpoint on the way is refused, the last good one stays."""
    cfg = _config(tmp_path, steps=40, ckpt=3, log=4)
    cfg.write_text(cfg.read_text().replace("lr = 3e-3", "lr = 1e12"))
    out = tmp_path / "out"
    r = _run(_cmd(packed, out, cfg))
    line = _one_line_error(r, Exit.USAGE)
    assert "not finite" in line or "loss is nan" in line.lower(), line
    assert "lr" in line, line
    if (out / "last.pt").exists():
        assert _finite_checkpoint(out / "last.pt")
        assert "last.pt" in line
    else:
        assert "no checkpoint" in line


# ---------------------------------------------------------------- 17: NaN in index.json stats
@pytest.mark.parametrize("value, said", [(float("nan"), "is NaN"), (float("inf"), "is infinite"),
                                         (-1.0, "negative"), ("x", "not a number")])
def test_bad_stats_std_is_refused_naming_the_field(packed: Path, tmp_path: Path, value: object, said: str) -> None:
    from shardship.errors import ShardshipError
    from train.data import load_index

    data = copy_tree(packed, tmp_path / "packed")
    _edit_index(data, lambda d: d["stats"]["action"]["std"].__setitem__(3, value))
    with pytest.raises(ShardshipError, match=re.escape("stats.action.std[3] ") + f".*{said}.*packer pack"):
        load_index(data)


def test_nan_in_stats_std_stops_train_run_with_one_line(packed: Path, tmp_path: Path) -> None:
    data = copy_tree(packed, tmp_path / "packed")
    _edit_index(data, lambda d: d["stats"]["action"]["std"].__setitem__(3, float("nan")))
    r = _run(_cmd(data, tmp_path / "out", _config(tmp_path)))
    line = _one_line_error(r, Exit.USAGE)
    assert "index.json: stats.action.std[3] is NaN; re-run `packer pack`" in line, line


def test_set_normaliser_refuses_non_finite_stats() -> None:
    from shardship.errors import ShardshipError
    from train.model import DiffusionPolicy, model_config

    m = DiffusionPolicy(model_config({"preset": "tiny"}, action_dim=4, proprio_dim=0, horizon=4, image_size=32))
    with pytest.raises(ShardshipError, match=re.escape("stats.action.mean[1] is nan")):
        m.set_normaliser({"action": {"mean": [0.0, float("nan"), 0.0, 0.0], "std": [1.0] * 4}})


# ---------------------------------------------------------------- 11: two runs, one output dir
@pytest.mark.slow
def test_second_train_run_into_the_same_out_is_refused(packed: Path, tmp_path: Path) -> None:
    """While one `train run` writes OUT, a second one exits 2 naming the first
    (pid, host); once the first is SIGKILLed the lock is gone with it."""
    import socket

    cfg = _config(tmp_path, steps=400, ckpt=1000, log=1)
    out = tmp_path / "out"
    first = _start(_cmd(packed, out, cfg))
    try:
        _wait_for_step(first, out, 1)
        r = _run(_cmd(packed, out, cfg, "--max-steps", "2"))
        line = _one_line_error(r, Exit.USAGE)
        assert f"another `train run` (pid {first.pid}, host {socket.gethostname()}) is writing {out}" in line, line
        assert first.poll() is None, "the first run must go on untouched"
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    r = _run(_cmd(packed, out, cfg, "--max-steps", "2"))
    assert r.returncode == 0, r.stderr[-2000:]


def test_output_lock_is_per_directory_and_released_on_close(tmp_path: Path) -> None:
    from train.runtime import OutputLock

    def other_process_takes(d: Path) -> subprocess.CompletedProcess[str]:
        code = f"from pathlib import Path; from train.runtime import OutputLock; OutputLock.take(Path({str(d)!r}))"
        return subprocess.run([PY, "-c", code], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)

    a = OutputLock.take(tmp_path / "a")
    b = OutputLock.take(tmp_path / "b")  # another directory: no conflict
    r = other_process_takes(tmp_path / "a")
    assert r.returncode != 0 and f"another `train run` (pid {os.getpid()}," in r.stderr
    a.release()
    b.release()
    assert other_process_takes(tmp_path / "a").returncode == 0


def test_output_lock_dies_with_its_holder_even_when_a_forked_child_lives_on(tmp_path: Path) -> None:
    """A DataLoader worker forked just as rank 0 is SIGKILLed outlives it for a few
    seconds; it must not hold the lock, or the restart is refused (seen once in a
    full test run here: the torchrun kill-and-resume test's restart found it held)."""
    from train.runtime import OutputLock

    code = ("import os, sys, time; from pathlib import Path; from train.runtime import OutputLock\n"
            f"lock = OutputLock.take(Path({str(tmp_path / 'out')!r}))\n"
            "child = os.fork()\n"
            "if child == 0:\n    time.sleep(60); os._exit(0)\n"
            "print(child, flush=True); time.sleep(60)\n")
    holder = subprocess.Popen([PY, "-c", code], cwd=ROOT, env=_env(), stdout=subprocess.PIPE, text=True)
    child = int(holder.stdout.readline()) if holder.stdout else 0
    try:
        holder.kill()  # SIGKILL the holder; its forked child lives on
        holder.wait(timeout=30)
        os.kill(child, 0)  # still alive
        taken = OutputLock.take(tmp_path / "out")
        assert taken is not None
        taken.release()
    finally:
        os.kill(child, signal.SIGKILL)


# ---------------------------------------------------------------- 15/14: offsets in index.json
def _set_row(data: Path, shard: int, row: int, column: str, value: int) -> str:
    """Set one sample's column in index.json; returns the shard's name."""
    def edit(doc: dict) -> None:
        doc["shards"][shard]["samples"][row][doc["sample_fields"].index(column)] = value
    _edit_index(data, edit)
    return json.loads((data / "index.json").read_text())["shards"][shard]["name"]


@pytest.mark.parametrize("column, value, said", [
    ("json_offset", 10**12, "beyond the shard's"),  # 15: huge offset
    ("jpg_offset", -512, "negative"),  # 14: negative offset
    ("json_size", -5, "negative"),  # 14: negative size
])
def test_bad_offsets_in_index_json_blame_index_json_in_one_line(packed: Path, tmp_path: Path, column: str,
                                                                 value: int, said: str) -> None:
    """The shard is fine, index.json is wrong: `train run` says so before any
    DataLoader worker seeks (no "re-upload", no traceback) and names the shard."""
    data = copy_tree(packed, tmp_path / "packed")
    name = _set_row(data, 0, 5, column, value)
    r = _run(_cmd(data, tmp_path / "out", _config(tmp_path)))
    line = _one_line_error(r, Exit.USAGE)
    assert "index.json" in line and name in line and "samples[5]" in line and said in line, line
    assert "packer pack" in line and "re-upload" not in line, line


def _reader(data: Path):
    from train.data import ShardDataset, load_index

    ix = load_index(data)
    return ix, ShardDataset(ix, batch_size=4, verify=False)


def test_reader_blames_the_shard_when_the_file_is_shorter_than_index_json_says(packed: Path, tmp_path: Path) -> None:
    from shardship.errors import ShardshipError

    data = copy_tree(packed, tmp_path / "packed")
    ix, ds = _reader(data)
    path = ix.shard_path(0)
    os.truncate(path, path.stat().st_size // 2)
    last = int(ix.starts[0] + ix.counts[0] - 1)
    with pytest.raises(ShardshipError) as e:
        ds._read(last)
    msg = str(e.value)
    assert ix.shard_names[0] in msg and "index.json says" in msg and "re-upload the shard" in msg, msg
    ds.close()


def test_reader_blames_index_json_when_the_shard_is_whole(packed: Path, tmp_path: Path) -> None:
    """The shard has the size index.json gives it, yet a sample reaches past its
    end (an index that slipped past validation): re-pack, not re-upload."""
    from shardship.errors import ShardshipError

    ix, ds = _reader(packed)
    ix.json_offset = ix.json_offset.copy()
    ix.json_offset[0] = int(ix.shard_bytes[int(ix.shard[0])]) + 10
    with pytest.raises(ShardshipError) as e:
        ds._read(0)
    msg = str(e.value)
    assert "index.json" in msg and "packer pack" in msg and "re-upload" not in msg, msg
    ds.close()
