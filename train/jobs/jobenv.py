"""What the job will find on the cluster, asked before it queues: the Python its `setup`
lines give (the shipped source needs >= 3.10: `zip(strict=)`, `dataclass(kw_only=)`),
and for the `stack` preset the ResNet18 ImageNet weights where the job looks for them
(the torch hub cache: $TORCH_HOME, else $XDG_CACHE_HOME/torch, else ~/.cache/torch).

Without this a job fails at import, or at the model's first line, after its queue wait.
`train doctor` and `train submit` (dry run too) read the same probe. When the weights
are missing there but present here, submit ships them once, content-addressed like
the code (`<root>/weights/<sha16>/resnet18-...pth`), and points the job's
[train.model] backbone_weights at that copy; the bytes count against the quota.

Torch-free on purpose (submit runs where torch may not be installed): the hub path is
torch's own rule (torch.hub.get_dir), written out once and used here and remotely."""
from __future__ import annotations

import hashlib
import inspect
import json
import os
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardship.config import ClusterConfig
from shardship.errors import RemoteError
from train.config import HUB_FILE, HUB_URL
from train.jobs.common import q

MIN_PYTHON = (3, 10)
MARK = "SHARDSHIP_JOBENV "



def _hub(env: Mapping[str, str]) -> str:
    home = env.get("TORCH_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache", "torch")
    return os.path.join(os.path.expanduser(home), "hub")


# sent as text with _hub's own source (annotations dropped): it must answer on the old python it
# is meant to catch, so nothing newer than Python 3.0 in it
_PROBE = "import json, os, sys\n" + inspect.getsource(_hub).replace(": Mapping[str, str]) -> str:", "):") + f"""
w = os.path.join(_hub(os.environ), "checkpoints", {HUB_FILE!r})
print({MARK!r} + json.dumps({{"python": sys.version.split()[0], "version_info": list(sys.version_info[:3]),
      "executable": sys.executable, "weights": w, "weights_bytes": os.path.getsize(w) if os.path.isfile(w) else None}}))
"""

assert "Mapping" not in _PROBE, "jobenv._hub's signature changed: update the annotation strip above"


def local_hub_file(environ: Mapping[str, str] | None = None) -> Path:
    """Where torch hub keeps the ResNet18 file on this machine (the rule the probe runs there)."""
    return Path(_hub(os.environ if environ is None else environ)) / "checkpoints" / HUB_FILE


@dataclass(frozen=True)
class JobEnv:
    python: str  # "3.11.2"
    version_info: tuple[int, ...]
    executable: str
    weights: str  # where the job's torch hub looks for HUB_FILE
    weights_bytes: int | None  # None: not there

    @property
    def python_ok(self) -> bool:
        return tuple(self.version_info[:2]) >= MIN_PYTHON


def probe(remote: Any, cluster: ClusterConfig) -> JobEnv | str:
    """Run the probe with the cluster's python after its `setup` lines, in a login bash as the
    job does (the lines go to bash on stdin). A JobEnv, or the reason it did not answer."""
    script = "\n".join(["set +e", *cluster.setup, f"{q(cluster.python or 'python3')} - <<'SHARDSHIP_PY'",
                        _PROBE, "SHARDSHIP_PY"]) + "\n"
    try:
        res = remote.run(["bash", "-l", "-s"], stdin=script.encode(), timeout=300)
    except (RemoteError, OSError) as e:
        return str(e)
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith(MARK)), None)
    if line is None:
        err = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
        return f"{cluster.python} after the setup lines did not run: {err[0][:200]}"
    d = json.loads(line[len(MARK):])
    return JobEnv(str(d["python"]), tuple(int(x) for x in d["version_info"]), str(d["executable"]),
                  str(d["weights"]), d.get("weights_bytes"))


def python_problem(env: JobEnv, cluster: ClusterConfig) -> str | None:
    """The one line for a Python the shipped source cannot run on, else None."""
    if env.python_ok:
        return None
    need = ".".join(map(str, MIN_PYTHON))
    return (f"the job's python is {env.python} ({env.executable}), but shardship needs Python >= {need}: "
            f"load a newer one in [cluster.{cluster.name}] setup (e.g. \"module load python/3.11\" or a conda "
            f"activate) or set python = \"python3.11\" there; `train doctor` shows what the setup lines give")


def needs_hub_weights(model: Mapping[str, Any]) -> bool:
    """The `stack` architecture with backbone_weights = "hub" (the default) reads the hub file."""
    return model.get("arch") == "stack" and str(model.get("backbone_weights", "hub")) == "hub"


@dataclass(frozen=True)
class Weights:
    """ResNet18 weights to ship: the local file, and the content-addressed remote path."""

    local: Path
    remote: str
    size: int


def shipped_path(root: str, local: Path) -> str:
    digest = hashlib.sha256(local.read_bytes()).hexdigest()[:16]
    return posixpath.join(root, "weights", digest, HUB_FILE)


def plan_weights(env: JobEnv, root: str, local: Path | None = None) -> tuple[Weights | None, str | None, str]:
    """(what to ship, error, note) for a job that reads the hub file: nothing when the cluster
    has it; the local copy when this machine has it; else an error saying what to do."""
    if env.weights_bytes:
        return None, None, f"ResNet18 weights: {env.weights} on the cluster"
    local = local or local_hub_file()
    if local.is_file():
        w = Weights(local, shipped_path(root, local), local.stat().st_size)
        return w, None, f"ResNet18 weights: not in the cluster's hub cache ({env.weights}): {local} " \
                        f"({w.size / 2**20:.0f} MiB) is shipped once to {w.remote}"
    return None, (f"ResNet18 weights ({HUB_FILE}) are neither where the job looks ({env.weights} on the cluster) "
                  f"nor here ({local}): download {HUB_URL} to {local} (train submit then ships it), or put it at "
                  f"{env.weights} on the cluster, or set [train.model] backbone_weights = \"none\" (random "
                  "init)"), ""


def ship_weights(remote: Any, w: Weights) -> bool:
    """Upload the weights unless that content is already there (the name is its hash);
    written under a temporary name and renamed, so a half copy is never used."""
    size = remote.size(w.remote)
    if size == w.size:
        return False
    remote.mkdir(posixpath.dirname(w.remote))
    part = f"{w.remote}.part"
    remote.remove(part)
    remote.put(w.local, part)
    remote.rename(part, w.remote)
    return True
