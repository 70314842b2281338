"""One CLI, not three (issue 21.8 / 21.7): every command of packer, transfer and train
answers -h and --help, every tool --version, every option says what it does, the
commands that reach a cluster take --cluster NAME, and bad values are one line and
exit 2, never a traceback (real processes, as a user types them)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from packer.cli import main as packer_main
from train.cli import main as train_main
from transfer.cli import main as transfer_main

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[1]
TOOLS = {"packer": packer_main, "transfer": transfer_main, "train": train_main}
# the commands that talk to a cluster (or local:PATH), by tool
REMOTE = {"packer": {"budget"}, "transfer": {"quota", "upload", "status", "pull", "connect", "disconnect"},
          "train": {"submit", "status", "fetch", "logs", "doctor", "where"}}


def commands() -> list[tuple[str, str, click.Command]]:
    return [(tool, name, cmd) for tool, grp in TOOLS.items() for name, cmd in sorted(grp.commands.items())]


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_every_tool_has_version_and_short_help(tool: str) -> None:
    for args in (["--version"], ["-h"], ["--help"]):
        r = subprocess.run([str(BIN / tool), *args], capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert r.returncode == 0, (args, r.stderr)
        assert (r.stdout.startswith(f"{tool} ") if args == ["--version"] else "Commands:" in r.stdout), r.stdout


@pytest.mark.parametrize("tool, name, cmd", commands(), ids=lambda x: x if isinstance(x, str) else "")
def test_every_command_has_help_and_every_option_a_text(tool: str, name: str, cmd: click.Command) -> None:
    for flag in ("-h", "--help"):
        r = CliRunner().invoke(TOOLS[tool], [name, flag], prog_name=tool)
        assert r.exit_code == 0 and f"Usage: {tool} {name}" in r.output, (flag, r.output)
    assert (cmd.help or "").strip(), f"{tool} {name}: no docstring"
    bare = [p.opts[0] for p in cmd.params
            if isinstance(p, click.Option) and not p.hidden and not (p.help or "").strip()]
    assert not bare, f"{tool} {name}: options without help text: {bare}"
    has_cluster = any("--cluster" in p.opts for p in cmd.params)
    assert has_cluster == (name in REMOTE[tool]), f"{tool} {name}: --cluster {'missing' if not has_cluster else 'odd'}"


def test_budget_takes_cluster_and_remote_is_a_hidden_alias(tmp_path: Path) -> None:
    opts = {o for p in packer_main.commands["budget"].params for o in getattr(p, "opts", [])}
    assert "--cluster" in opts and "--remote" in opts
    r = CliRunner().invoke(packer_main, ["budget", "-h"])
    assert "--remote" not in r.output and "--cluster" in r.output
    for cmd in ("connect", "quota", "pull"):  # they never read the local packed directory
        assert "--out" not in CliRunner().invoke(transfer_main, [cmd, "-h"]).output
    assert "job id" not in CliRunner().invoke(train_main, ["fetch", "-h"]).output


def _bad_values(tmp: Path) -> list[tuple[list[str], str]]:
    (tmp / "packed").mkdir(exist_ok=True)
    (tmp / "packed" / "index.json").write_text("{}")
    (tmp / "raw" / "session_20250101_000000").mkdir(parents=True, exist_ok=True)
    (tmp / "raw" / "session_20250101_000000" / "metadata.json").write_text("{}")
    tables = {"trian": "[trian]\nlr = 1e-4\n", "paths": "[paths]\npacked_dir = 'x'\n",
              "budget": "[budget]\nenvv = '1G'\n", "lr0": "[train]\nlr = 0\n", "clip": "[train]\ngrad_clip = -1\n",
              "wd": "[train]\nweight_decay = -1\n", "minlr": "[train]\nmin_lr_ratio = 5\n",
              "val": "[train]\nval_fraction = 1.5\n", "local": "[cluster.x]\nhost = 'local:'\n"}
    for name, text in tables.items():
        (tmp / f"{name}.toml").write_text(text)
    ix = str(tmp / "packed" / "index.json")
    out = ["--out", str(tmp / "out")]
    return [
        (["train", "run", "--lr", "-1", "--data", str(tmp / "packed"), *out], "lr must be > 0"),
        (["train", "run", "--data", ix, *out], "give the folder"),
        (["train", "eval", "--data", ix, *out], "give the folder"),
        (["train", "run", "--config", str(tmp / "lr0.toml"), *out], "lr must be > 0"),
        (["train", "run", "--config", str(tmp / "clip.toml"), *out], "grad_clip must be > 0"),
        (["train", "run", "--config", str(tmp / "wd.toml"), *out], "weight_decay must be >= 0"),
        (["train", "run", "--config", str(tmp / "minlr.toml"), *out], "min_lr_ratio must be in [0, 1]"),
        (["train", "run", "--config", str(tmp / "val.toml"), *out], "val_fraction must be in [0, 1)"),
        (["train", "run", "--config", str(tmp / "trian.toml"), *out], "did you mean [train]?"),
        (["train", "submit", "--dry-run", "--config", str(tmp / "local.toml")], "needs a directory"),
        (["packer", "pack", "--config", str(tmp / "paths.toml")], "did you mean 'packed'?"),
        (["packer", "budget", "--config", str(tmp / "budget.toml")], "did you mean 'env'?"),
        (["packer", "pack", "--shard-mb", "0", "--raw", str(tmp / "raw"), "--out", str(tmp / "p")], "too small"),
        (["packer", "check", "--raw", str(tmp / "raw" / "session_20250101_000000")], "give its parent"),
        (["train", "eval", "--max-samples", "-3", *out], "--max-samples"),
        (["transfer", "upload", "--cluster", "local:"], "needs a directory"),
        (["transfer", "quota", "--out", str(tmp)], "No such option"),
        (["train", "run", "--lr", "fast"], "--lr"),
        (["packer", "synth", "--sessions", "0"], "--sessions"),
        (["train", "nope"], "No such command"),
    ]


def test_bad_values_are_one_line_and_exit_2(tmp_path: Path) -> None:
    for argv, said in _bad_values(tmp_path):
        r = subprocess.run([str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=300,
                           cwd=tmp_path)
        err = r.stderr.strip()
        assert r.returncode == 2, (argv, r.returncode, r.stdout, err)
        assert "Traceback" not in err and said in err, (argv, err)
        assert len(err.splitlines()) == 1, (argv, err)
        assert not list(tmp_path.rglob(".lock")) and not list(tmp_path.rglob(".packer.lock")), argv


def _one_line_exit_2(argv: list[str], cwd: Path) -> str:
    """Run a tool as the user types it: exit 2 and one `error:` line, no traceback."""
    r = subprocess.run([str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=300, cwd=cwd)
    err = r.stderr.strip()
    assert r.returncode == 2, (argv, r.returncode, r.stdout, err)
    assert "Traceback" not in err and len(err.splitlines()) == 1 and err.startswith("error: "), (argv, err)
    return err


SUBMIT = ["train", "submit", "--dry-run", "--offline", "--cluster", "local:{tmp}/home"]
# (the table's text, the commands that read it, what the line must say): issue 39.7.2
WRONG_TYPES = [
    ('[train]\nbatch_size = "64"\n', [["train", "run"], SUBMIT],
     ["[train]: batch_size = '64' is a str", "reads int", "write batch_size = 64"]),
    ('[train]\nkeep = "2"\n', [["packer", "budget"], ["train", "run"]],
     ["[train]: keep = '2' is a str", "reads int", "write keep = 2"]),
    ('[train]\nlr = "3e-4"\n', [["train", "run"]], ["[train]: lr = '3e-4' is a str", "reads float", "lr = 0.0003"]),
    ("[train.model]\nunet_dims = 64\n", [["train", "run"], SUBMIT],
     ["[train.model]: unet_dims = 64 is a int", "reads a list of int"]),
    ('[pack]\nquality = "90"\n', [["packer", "pack"]], ["[pack]: quality = '90' is a str", "reads int"]),
    ('[cluster.hpc]\nhost = "local:{tmp}/home"\nnodes = "2"\n', [["transfer", "status"], ["train", "doctor"]],
     ["[cluster.hpc]: nodes = '2' is a str", "reads int", "write nodes = 2"]),
    ('[cluster.hpc]\nhost = "local:{tmp}/home"\nsetup = "module load torch"\n', [["transfer", "upload"]],
     ["setup = 'module load torch' is a str", "reads a list of str", 'write setup = ["module load torch"]']),
    ("[paths]\npacked = 5\n", [["transfer", "status", "--cluster", "local:{tmp}/home"], ["train", "eval"]],
     ["[paths]: packed = 5 is a int", "reads str", 'write packed = "data/packed"']),
]


def test_a_wrong_typed_value_is_one_line_naming_file_key_and_type_in_every_tool(tmp_path: Path) -> None:
    """`batch_size = "64"` was a TypeError traceback from `train run` (only `train submit`
    caught it); the same for [pack], [cluster.*] and [paths] in packer and transfer. Now
    every table is checked where shardship.toml is read: exit 2, one line naming the
    file, the key, the type shardship reads and what to write."""
    for i, (text, commands, said) in enumerate(WRONG_TYPES):
        cfg = tmp_path / f"wrong{i}.toml"
        cfg.write_text(text.replace("{tmp}", str(tmp_path)))
        for argv in commands:
            argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
            err = _one_line_exit_2([*argv, "--config", str(cfg)], tmp_path)
            assert str(cfg) in err and all(s in err for s in said), (argv, err)


def test_a_cluster_without_host_is_a_config_error_exit_2(tmp_path: Path) -> None:
    """Issue 39.7.3: the README's table says 2 for a config error; a [cluster.NAME]
    without `host` exited 4 (a remote failure) from every command that connects, and
    `train submit --dry-run` rendered a script for it without a word."""
    cfg = tmp_path / "nohost.toml"
    cfg.write_text('[cluster.hpc]\nremote_dir = "data"\n')
    for argv in (["transfer", "upload"], ["transfer", "status"], ["transfer", "connect"], ["transfer", "pull", "x"],
                 ["train", "doctor"], ["train", "submit", "--dry-run", "--offline"]):
        err = _one_line_exit_2([*argv, "--config", str(cfg), "--cluster", "hpc"], tmp_path)
        assert f"{cfg} [cluster.hpc]: no host: set host = " in err, (argv, err)
    from shardship.config import ClusterConfig
    from shardship.errors import Exit, ShardshipError
    from transfer import connect

    with pytest.raises(ShardshipError) as e:  # the connection layer, for callers without a config file
        connect(ClusterConfig(name="hpc"))
    assert e.value.code == Exit.USAGE and "has no host" in str(e.value)
    with pytest.raises(ShardshipError) as e:
        connect(ClusterConfig(name="hpc", host="login.example.edu", transport="telnet"))
    assert e.value.code == Exit.USAGE and "transport = 'telnet'" in str(e.value)
