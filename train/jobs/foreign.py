"""`train submit --command "python train.py ..."`: someone else's training (a plain
torch DDP script, a Lightning script) with shardship's guard rails: the same
RAM / CPU checks, the same launch for N nodes x R ranks, the same requeue,
status, logs and where.

The two launch contracts differ, and mixing them up is the classic hang:
- torchrun (plain torch, and Lightning too when it sees torchrun's variables):
  ONE task per node, `srun` starting one `torchrun --nnodes N --nproc_per_node R`
  per node, rendezvous on the first node; the script reads RANK / LOCAL_RANK /
  WORLD_SIZE.
- Lightning's own SLURM contract: R tasks per node (`--ntasks-per-node=R`), each
  started by `srun python train.py`, and `Trainer(devices=R, num_nodes=N)` must
  say the same numbers, else Lightning waits for ranks that never come.
The command is given as for one process (`python train.py --epochs 3`); the job
adds the launcher. Relative paths are relative to the remote root (where
`transfer upload` puts the data); the script finds the run's directories in
SHARDSHIP_DATA / SHARDSHIP_OUT and its deadline in SHARDSHIP_TIME_LIMIT (seconds
after SHARDSHIP_JOB_START)."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

from shardship.errors import ShardshipError
from train.jobs.checks import Finding
from train.jobs.spec import JobSpec

LAUNCHERS = ("auto", "torchrun", "lightning")
_LIGHTNING = re.compile(r"^\s*(?:import|from)\s+(?:lightning|pytorch_lightning)\b", re.M)


def parse_command(text: str) -> tuple[str, ...]:
    """`python train.py --x 1` -> ("train.py", "--x", "1"); `python -m pkg.train` -> ("-m", "pkg.train").
    The interpreter is the cluster's `python`; launchers are added by the job."""
    try:
        words = shlex.split(text)
    except ValueError as e:
        raise ShardshipError(f"--command {text!r}: {e}") from None
    if not words:
        raise ShardshipError("--command is empty: give it as for one process, e.g. --command \"python train.py\"")
    first = Path(words[0]).name
    if first in ("bash", "sh") or first.endswith(".sh"):
        raise ShardshipError(_wrapper_message(text, words))
    if first in ("torchrun", "srun", "mpirun", "accelerate") or words[:3] == ["python", "-m", "torch.distributed.run"]:
        raise ShardshipError(f"--command {text!r}: give the command for ONE process (python train.py ...); the job "
                             f"adds {first} itself for the nodes and ranks of the cluster config")
    if not first.startswith("python"):
        raise ShardshipError(f"--command {text!r}: start it with python (python train.py ... or python -m module ...); "
                             "the interpreter is the cluster's `python` from the config")
    rest = tuple(words[1:])
    if not rest or (rest[0] == "-m" and len(rest) < 2):
        raise ShardshipError(f"--command {text!r}: name the script or module to run")
    return rest


def _wrapper_message(text: str, words: list[str]) -> str:
    """A shell wrapper (NAVSIM's run_training.sh style) runs python itself: inside a job that is
    one process without srun, so of N ranks only rank 0 starts and waits for the rest forever
    ("MEMBER: 1/N"). Point at the python line to give instead, when the wrapper is readable here."""
    path = Path(words[1] if Path(words[0]).name in ("bash", "sh") and len(words) > 1 else words[0])
    lines = path.read_text(errors="replace").splitlines() if path.is_file() else []
    hit = next(((n, ln.strip()) for n, ln in enumerate(lines, 1) if re.match(r"\s*(exec\s+)?python\S*\s", ln)), None)
    if hit is None:
        return (f"--command {text!r}: start it with python (python train.py ... or python -m module ...); the "
                "interpreter is the cluster's `python` from the config")
    n, line = hit
    return (f"--command {text!r}: {path} starts python itself (line {n}: {line[:80]!r}), which in the job runs once "
            "without srun: only rank 0 would join and the others never start; give that python line as --command "
            "and the job adds srun / torchrun for every rank")


def overrides(command: tuple[str, ...]) -> dict[str, str]:
    """Hydra-style `group.key=value` words of the command (a `+` prefix adds a key), by full key."""
    out = {}
    for w in command[1:]:
        key, sep, value = w.partition("=")
        if sep and not key.startswith("-") and re.fullmatch(r"\+?[A-Za-z_][\w.]*", key):
            out[key.lstrip("+")] = value
    return out


def override_int(command: tuple[str, ...], leaf: str) -> tuple[str, int] | None:
    """(key, value) of the last `...<leaf>=N` override (trainer.devices=1, dataloader.params.num_workers=8)."""
    hit = None
    for key, value in overrides(command).items():
        if (key == leaf or key.endswith("." + leaf)) and value.strip().isdigit():
            hit = (key, int(value))
    return hit


def script_file(command: tuple[str, ...], local_dir: Path = Path(".")) -> Path | None:
    """The local copy of the command's script, when there is one to read (for the checks)."""
    if command[0] == "-m":
        return None
    p = local_dir / command[0]
    return p if p.is_file() else None


def pick_launcher(choice: str, script_text: str | None) -> str:
    if choice not in LAUNCHERS:
        raise ShardshipError(f"--launcher {choice!r}: use one of {', '.join(LAUNCHERS)}")
    if choice != "auto":
        return choice
    return "lightning" if script_text and _LIGHTNING.search(script_text) else "torchrun"


def _literal(script_text: str, key: str) -> int | None:
    m = re.search(rf"\b{key}\s*=\s*(\d+)\b", script_text)
    return int(m.group(1)) if m else None


def check_command(spec: JobSpec, script_text: str | None) -> list[Finding]:
    """What the script says against how the job launches it."""
    out: list[Finding] = []
    if script_text is None and spec.launcher == "lightning":
        out += _lightning_counts(spec, "")
    if script_text is None:
        out.append(Finding("warning", "command", f"{spec.command[0]!r} is not readable here: its ranks / devices "
                                                 "are not checked against the job (run from the script's folder)"))
        return out
    if spec.launcher == "lightning":
        out += _lightning_counts(spec, script_text)
    elif spec.ranks > 1 and not re.search(r"init_process_group|LOCAL_RANK|lightning|accelerate", script_text):
        out.append(Finding("warning", "command", f"the script never calls init_process_group nor reads LOCAL_RANK: "
                                                 f"torchrun would start {spec.ranks} copies that each train alone"))
    return out


def _lightning_counts(spec: JobSpec, script_text: str) -> list[Finding]:
    """Trainer(devices=, num_nodes=) against the job: a command-line override wins over the
    script's literal. devices=1 on 2 tasks per node: Lightning 2.x stops at start ("does not
    match"), older ones hung at "MEMBER: 1/N"; with num_nodes=1 too, every task trains alone."""
    out: list[Finding] = []
    for leaf, want in (("devices", spec.ranks_per_node), ("num_nodes", spec.nodes)):
        hit = override_int(spec.command, leaf)
        lit = _literal(script_text, leaf)
        where, got, fix = ((f"the command sets {hit[0]}={hit[1]}", hit[1], f"{hit[0]}={want}") if hit else
                           (f"the script sets Trainer({leaf}={lit})", lit, f"{leaf}={want}"))
        if got is not None and got != want:
            out.append(Finding("error", "command", f"{where} but the job runs {spec.nodes} node(s) x "
                                                   f"{spec.ranks_per_node} rank(s), one srun task per rank: "
                                                   f"Lightning would refuse to start or the ranks would not "
                                                   f"meet; set {fix} (or change the cluster config)"))
    reads_env = "SLURM_NTASKS_PER_NODE" in script_text
    if spec.ranks > 1 and not reads_env and override_int(spec.command, "devices") is None \
            and _literal(script_text, "devices") is None:
        out.append(Finding("warning", "command", f"no Trainer(devices=...) found in the script or the command: "
                                                 f"it must be {spec.ranks_per_node}, with num_nodes={spec.nodes}"))
    return out
