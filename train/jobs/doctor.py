"""`train doctor`: the checks a user does by hand on a login node before the
first job, over the same connection `train submit` uses, each as one line:
python and torch (through the config's own `setup` lines, as the job will run
them), what torch says about CUDA, the modules, the scheduler's commands,
quota and inodes, free space for the checkpoints.

Every answer comes from the cluster itself; where a login node cannot know
(whether the GPU nodes' CUDA works) the line says so instead of guessing."""
from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardship.config import ClusterConfig
from shardship.errors import RemoteError
from shardship.units import human
from train.jobs.common import q
from train.jobs.jobenv import JobEnv, needs_hub_weights, plan_weights, probe, python_problem

SCHEDULER_COMMANDS = {"slurm": ("sbatch", "squeue", "scontrol", "sinfo", "scancel", "srun"),
                      "sge": ("qsub", "qstat", "qacct", "qhost", "qdel")}
# what `python -m train run` imports on the cluster (train/jobs/ship.py sends only shardship itself)
NEEDED = ("torch", "numpy", "diffusers", "click", "tqdm", "matplotlib")
OPTIONAL = ("torchvision", "tensorboard", "tomli", "wandb")
MARK = "SHARDSHIP_DOCTOR "

_PROBE = f"""
import importlib, json, os, sys
out = {{"python": sys.version.split()[0], "version_info": list(sys.version_info[:3]), "executable": sys.executable,
       "modules": {{}}}}
for m in {NEEDED + OPTIONAL!r}:
    try:
        out["modules"][m] = getattr(importlib.import_module(m), "__version__", "installed")
    except Exception as e:
        out["modules"][m] = None
        out["modules"][m + ":error"] = (type(e).__name__ + ": " + str(e))[:160]
if out["modules"].get("torch"):
    import torch
    out["cuda"] = bool(torch.cuda.is_available()); out["cuda_devices"] = torch.cuda.device_count()
    out["torch_cuda"] = torch.version.cuda
try:
    import train
    out["shardship"] = os.path.dirname(os.path.dirname(os.path.abspath(train.__file__)))
except Exception:  # not installed, or (a python too old for it) a SyntaxError
    out["shardship"] = None
print({MARK!r} + json.dumps(out))
"""


@dataclass(frozen=True)
class Check:
    level: str  # "ok" | "warn" | "fail" | "info"
    what: str
    detail: str

    def __str__(self) -> str:
        return f"{self.level:>4}  {self.what:<11} {self.detail}"


def _login_shell(remote: Any, cluster: ClusterConfig, body: list[str], timeout: float = 300) -> Any:
    """`body` after the config's setup lines, in a login bash as the job runs them (bash -l
    defines `module`); the lines go to bash on stdin, nothing is pasted into a command line."""
    script = "\n".join(["set +e", *cluster.setup, *body]) + "\n"
    return remote.run(["bash", "-l", "-s"], stdin=script.encode(), timeout=timeout)


def python_checks(remote: Any, cluster: ClusterConfig) -> list[Check]:
    res = _login_shell(remote, cluster, [f"{q(cluster.python or 'python3')} - <<'SHARDSHIP_PY'", _PROBE,
                                         "SHARDSHIP_PY"])
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith(MARK)), None)
    if line is None:
        err = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
        return [Check("fail", "python", f"{cluster.python} after the setup lines did not run: {err[0][:200]}; "
                                        f"fix [cluster.{cluster.name}] python / setup")]
    doc: Mapping[str, Any] = json.loads(line[len(MARK):])
    mods = doc["modules"]
    env = JobEnv(str(doc["python"]), tuple(doc.get("version_info") or (0, 0)), str(doc["executable"]), "", None)
    too_old = python_problem(env, cluster)
    out = [Check("fail", "python", too_old) if too_old else
           Check("ok", "python", f"{doc['python']} ({doc['executable']})")]
    for m in NEEDED:
        if mods.get(m):
            out.append(Check("ok", m, str(mods[m])))
        else:
            out.append(Check("fail", m, f"not importable ({mods.get(m + ':error')}): load the module or "
                                        "activate the environment that has it in `setup`"))
    missing = [m for m in OPTIONAL if not mods.get(m)]
    if missing:
        out.append(Check("info", "optional", f"not installed: {', '.join(missing)} (the trainer works without)"))
    if mods.get("torch"):
        if doc.get("cuda"):
            out.append(Check("ok", "cuda", f"torch sees {doc['cuda_devices']} GPU(s) here (CUDA {doc['torch_cuda']})"))
        elif doc.get("torch_cuda"):
            out.append(Check("info", "cuda", f"torch is a CUDA {doc['torch_cuda']} build and sees no GPU here; a login "
                                             "node usually has none, so whether it sees one where a GPU job runs "
                                             "cannot be checked from here"))
        else:
            out.append(Check("warn", "cuda", f"torch {mods['torch']} is a CPU-only build: a GPU job would train on "
                                             "its CPUs; load a CUDA torch in `setup`"))
    where = doc.get("shardship")
    out.append(Check("info", "shardship", f"installed at {where}" if where else
                     "not installed on the cluster: `train submit` ships its source with each job (PYTHONPATH)"))
    return out


def scheduler_checks(remote: Any, cluster: ClusterConfig) -> list[Check]:
    sched = (cluster.scheduler or "slurm").lower()
    cmds = SCHEDULER_COMMANDS.get(sched, ())
    res = _login_shell(remote, cluster, [f"command -v {q(c)} || echo missing:{q(c)}" for c in cmds]
                       + ["type module >/dev/null 2>&1 && module list 2>&1 | tail -n +1 || echo 'module: none'"])
    text = res.stdout
    missing = [ln.split(":", 1)[1] for ln in text.splitlines() if ln.startswith("missing:")]
    out = [Check("fail", sched, f"missing on the login node: {', '.join(missing)}: is this the {sched} cluster?")
           if missing else Check("ok", sched, ", ".join(cmds) + " found")]
    mod_lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith(("/", "missing:"))]
    if mod_lines == ["module: none"]:
        out.append(Check("info", "modules", "no `module` command (environment modules / Lmod) here"))
    elif mod_lines:
        out.append(Check("info", "modules", "; ".join(mod_lines)[:300]))
    return out


def space_checks(remote: Any, root: str, checkpoint_bytes: int | None, files: int) -> list[Check]:
    """Quota (bytes and inodes) and the filesystem's free space, against the checkpoints a run keeps."""
    from transfer.quota import live_quota  # lazily, like every transfer import in train

    out: list[Check] = []
    try:
        quota = live_quota(remote, root)
    except (RemoteError, OSError) as e:
        return [Check("warn", "quota", f"no quota tool answered for {root}: {e}")]
    if quota is None:
        return [Check("warn", "quota", f"no quota tool answered for {root} (not even df)")]
    if quota.limit_bytes is not None:
        out.append(Check("ok", "quota", f"{human(quota.used_bytes or 0)} used of {human(quota.limit_bytes)} "
                                        f"({quota.source})"))
    if quota.inode_limit is not None:
        free = quota.inode_limit - (quota.inode_used or 0)
        out.append(Check("ok" if free > 10000 else "warn", "inodes",
                         f"{quota.inode_used} used of {quota.inode_limit} ({quota.source})"))
    head = quota.headroom_bytes
    need = None if checkpoint_bytes is None else files * checkpoint_bytes
    if head is None:
        out.append(Check("warn", "space", f"free space in {root} not known ({quota.source})"))
    elif need is not None and need > head:
        out.append(Check("fail", "space", f"{human(head)} free for {root}, the run keeps {files} checkpoints = "
                                          f"{human(need)}: free space or lower [train] keep"))
    else:
        extra = f", checkpoints need {human(need)}" if need is not None else ""
        out.append(Check("ok", "space", f"{human(head)} free for {posixpath.normpath(root)}{extra}"))
    return out


def weights_checks(remote: Any, cluster: ClusterConfig, model: Mapping[str, Any] | None) -> list[Check]:
    """The stack preset's ResNet18 file where the job looks (jobenv.py), or here to be shipped."""
    if model is None or not needs_hub_weights(model):
        return []
    env = probe(remote, cluster)
    if isinstance(env, str):
        return []  # python_checks said why the python does not run
    ship, err, note = plan_weights(env, remote.root)
    if err:
        return [Check("fail", "weights", err)]
    return [Check("info" if ship else "ok", "weights", note.removeprefix("ResNet18 weights: "))]


def run_doctor(remote: Any, cluster: ClusterConfig, checkpoint_bytes: int | None, files: int,
               model: Mapping[str, Any] | None = None) -> list[Check]:
    """Every check; none raises for a finding (a failed check is a line, the others still run).
    `model`: the job's model config, for the stack preset's weights."""
    return [*python_checks(remote, cluster), *weights_checks(remote, cluster, model),
            *scheduler_checks(remote, cluster), *space_checks(remote, remote.root, checkpoint_bytes, files)]
