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
        ds.files.read(last)
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
        ds.files.read(0)
    msg = str(e.value)
    assert "index.json" in msg and "packer pack" in msg and "re-upload" not in msg, msg
    ds.close()


# ---------------------------------------------------------------- 39.7.1: a damaged last.pt, a restart
def _keeping_config(tmp: Path, keep: int = 2, ckpt: int = 3) -> Path:
    """Checkpoints every `ckpt` steps, `keep` step files, validation every 3 steps."""
    p = _config(tmp, steps=12, ckpt=ckpt, log=1)
    p.write_text(p.read_text().replace("keep = 0", f"keep = {keep}").replace("val_every = 0", "val_every = 3"))
    return p


def _best(out: Path) -> float:
    from train.checkpoint import load_checkpoint

    return float(load_checkpoint(out / "best.pt")["best_val"])


def _cut_short(path: Path, in_place: bool) -> None:
    """A checkpoint cut to a third: in place (its hard links with it: a disk that filled),
    or as a new file over it (a copy that stopped, the other names untouched)."""
    size = path.stat().st_size
    if in_place:
        os.truncate(path, size // 3)
        return
    part = path.with_name(path.name + ".copy")
    part.write_bytes(path.read_bytes()[:size // 3])
    os.replace(part, path)


def test_a_cut_last_pt_resumes_from_the_newest_checkpoint_that_reads_back(packed: Path, tmp_path: Path) -> None:
    """It said "move it away to start over", and the run that did started at step 0
    beside an intact step_N.pt. Now the run goes on from the newest checkpoint that reads
    back and says in one line which, and which did not; best.pt and metrics.jsonl
    survive every restart."""
    from train.checkpoint import load_checkpoint
    from train.metrics import current_run, read_metrics

    cfg, out = _keeping_config(tmp_path), tmp_path / "out"
    assert _run(_cmd(packed, out, cfg, "--max-steps", "6")).returncode == 0
    first = (out / "metrics.jsonl").read_text()
    _cut_short(out / "last.pt", in_place=False)  # step_6.pt, its former hard link, stays whole
    r = _run(_cmd(packed, out, cfg, "--max-steps", "9"))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    (warn,) = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
    assert f"{out / 'last.pt'} is unreadable (" in warn and "step_6.pt is" not in warn, warn
    assert f"resuming from {out / 'step_6.pt'}, the newest checkpoint that reads back" in warn, warn
    assert f"resuming from {out / 'step_6.pt'} at step 6," in r.stdout + r.stderr
    assert load_checkpoint(out / "last.pt")["step"] == 9
    assert sorted(p.name for p in out.glob("step_*.pt")) == ["step_6.pt", "step_9.pt"]

    # now last.pt is cut in place, and step_9.pt (the same file) with it: the next newest goes on
    _cut_short(out / "last.pt", in_place=True)
    intact = sorted([out / "step_6.pt", out / "best.pt"], key=lambda p: p.stat().st_mtime_ns)[-1]
    r = _run(_cmd(packed, out, cfg, "--max-steps", "10"))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    (warn,) = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
    assert f"{out / 'last.pt'}, {out / 'step_9.pt'} are unreadable (" in warn, warn
    assert f"resuming from {intact}, the newest checkpoint" in warn, warn
    assert load_checkpoint(out / "last.pt")["step"] == 10

    # metrics.jsonl was only appended to, each run marked; as read, every step once
    text = (out / "metrics.jsonl").read_text()
    assert text.startswith(first), "a restart must not rewrite what was logged"
    recs = read_metrics(out / "metrics.jsonl")
    marks = [(r["event"], r.get("from")) for r in recs if r.get("event") in ("start", "resume")]
    assert marks == [("start", None), ("resume", "step_6.pt"), ("resume", intact.name)], marks
    steps = [r["step"] for r in current_run(recs) if "loss" in r]
    assert steps == list(range(1, 11)), steps
    # best.pt holds the lowest validation loss ever logged, however often the run restarted
    assert _best(out) == pytest.approx(min(r["val_loss"] for r in recs if "val_loss" in r), rel=1e-9)


def test_no_checkpoint_that_reads_back_is_one_line_naming_each(packed: Path, tmp_path: Path) -> None:
    cfg, out = _keeping_config(tmp_path, keep=1), tmp_path / "out"
    assert _run(_cmd(packed, out, cfg, "--max-steps", "3")).returncode == 0
    for p in out.glob("*.pt"):
        if p.name != "last.pt":  # last.pt is a hard link of step_3.pt: cut with it
            _cut_short(p, in_place=True)
    line = _one_line_error(_run(_cmd(packed, out, cfg)), Exit.USAGE)
    assert f"no checkpoint in {out} reads back: " in line and "--no-resume" in line, line
    for name in ("last.pt", "step_3.pt", "best.pt"):
        assert str(out / name) in line, line


def test_a_restart_keeps_best_pt_metrics_and_the_other_runs_checkpoints(packed: Path, tmp_path: Path) -> None:
    """A run that starts over in the same OUT (--no-resume, or last.pt moved away as the
    old message said): its first, worse validation overwrote best.pt, metrics.jsonl was
    deleted, and `keep` removed the old run's intact step_6.pt once the new run passed
    step 6. Now best.pt's value is the bar, metrics.jsonl is appended to, and the old
    step file stays (the run says so)."""
    cfg, out = _keeping_config(tmp_path, keep=1), tmp_path / "out"
    assert _run(_cmd(packed, out, cfg, "--max-steps", "6")).returncode == 0
    best_bytes, best = (out / "best.pt").read_bytes(), _best(out)
    first = (out / "metrics.jsonl").read_text()
    (tmp_path / "again").mkdir()
    again = _keeping_config(tmp_path / "again", keep=1, ckpt=4)  # step_4, step_8: past the old step_6
    r = _run(_cmd(packed, out, again, "--no-resume", "--max-steps", "8", "--lr", "1e-9"))  # learns nothing
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    (note,) = [ln for ln in r.stderr.splitlines() if ln.startswith("note:")]
    assert "step_6.pt" in note and "retention leaves them" in note, note
    text = (out / "metrics.jsonl").read_text()
    assert text.startswith(first), "the first run's metrics must survive a restart"
    later = [json.loads(ln) for ln in text[len(first):].splitlines()]
    assert later[0] == {"step": 0, "event": "start"}
    vals = [x["val_loss"] for x in later if "val_loss" in x]
    assert vals and min(vals) > best, (vals, best)  # worse: best.pt must stay the first run's
    assert (out / "best.pt").read_bytes() == best_bytes
    assert sorted(p.name for p in out.glob("step_*.pt")) == ["step_6.pt", "step_8.pt"]


def test_retention_counts_only_intact_files_and_never_removes_a_foreign_or_newer_one(tmp_path: Path) -> None:
    """write_checkpoint on real files: a damaged older step file is removed and not counted
    among those kept; one past the step being written, or another run's, stays."""
    import torch

    from train.checkpoint import looks_intact, write_checkpoint

    def state(step: int) -> dict:
        return {"format": "shardship-checkpoint", "step": step, "w": torch.full((64,), float(step))}

    for step in (3, 6):
        write_checkpoint(state(step), tmp_path, "periodic", keep=3)
    _cut_short(tmp_path / "step_6.pt", in_place=False)
    assert looks_intact(tmp_path / "step_3.pt") and not looks_intact(tmp_path / "step_6.pt")
    write_checkpoint(state(9), tmp_path, "periodic", keep=2)  # by number alone: step_6 (damaged) and step_9
    assert sorted(p.name for p in tmp_path.glob("step_*.pt")) == ["step_3.pt", "step_9.pt"]
    write_checkpoint(state(12), tmp_path, "periodic", keep=1, protect={"step_3.pt"})
    assert sorted(p.name for p in tmp_path.glob("step_*.pt")) == ["step_12.pt", "step_3.pt"]
    write_checkpoint(state(50), tmp_path, "periodic", keep=1)
    write_checkpoint(state(15), tmp_path, "periodic", keep=1)  # a run that went back: step_50 is not older
    assert sorted(p.name for p in tmp_path.glob("step_*.pt")) == ["step_15.pt", "step_50.pt"]


def test_a_line_cut_by_a_kill_stays_one_bad_line_and_the_mark_starts_its_own(tmp_path: Path) -> None:
    """SIGKILL mid-write leaves metrics.jsonl without its last newline; the next run's
    start mark must not be glued to it (both lines lost), and readers skip the cut one."""
    from train.metrics import current_run, read_metrics, run_mark

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n{"step": 3, "lo')
    with open(path, "a") as f:
        f.write(run_mark(tmp_path, 2, "step_2.pt"))
        f.write('{"step": 3, "loss": 1.25}\n')
    recs = read_metrics(path)
    assert recs[2] == {"step": 2, "event": "resume", "from": "step_2.pt"}
    assert [(r["step"], r.get("loss")) for r in current_run(recs) if "loss" in r] == [(1, 2.0), (2, 1.5), (3, 1.25)]
    assert run_mark(tmp_path / "nowhere", 0, None) == '{"step": 0, "event": "start"}\n'
