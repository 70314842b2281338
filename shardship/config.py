"""`shardship.toml`: every key optional, defaults that run the demo.

One loader for all three tools so `packer budget`, `transfer upload` and
`train submit` agree on the same cluster and the same quota."""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from shardship.errors import ShardshipError

DEFAULT_CONFIG = "shardship.toml"
MIN_SHARD_BYTES = 100 * 1024  # ~5 samples of 224x224 JPEG: smaller is a typo, not a choice


@dataclass
class PackOptions:
    size: int = 224
    crop: str = "squash"  # "squash" (as the reference) | "center"
    quality: int = 90
    stride: int = 1  # keep every Nth frame
    shard_bytes: int = 8 * 1024 * 1024  # ~90 shards for the reference 717 MB dataset
    horizon: int = 16  # action chunk length (steps)
    workers: int = 0  # 0 = os.cpu_count()
    # "none": one copy on disk (the .tar); "zstd" | "auto" (if a probe saves >10%) also write
    # a .tar.zst beside each .tar, which uploads send instead: two copies on disk
    compress: str = "none"

    def validate(self, where: str = "[pack]") -> None:
        """Values packing would accept and regret: a 0-byte shard target writes one sample per shard."""
        if int(self.shard_bytes) < MIN_SHARD_BYTES:
            raise ShardshipError(f"{where}: shard size {self.shard_bytes} bytes is too small: give at least "
                                 "100 KiB (--shard-mb 0.1; the default, 8 MiB, suits most file systems)")


class DefaultSize(str):
    """A size the config does not give: the built-in default, so a tool may add to it what it
    knows the job needs (`train submit` adds the decoded-frame cache to the memory it asks
    for); a size the user wrote, in the config or by hand, is taken as written."""


DEFAULT_MEM = DefaultSize("32G")


@dataclass
class ClusterConfig:
    name: str
    host: str = ""
    user: str | None = None
    port: int | None = None
    remote_dir: str = "shardship"
    quota: str = "10G"  # or "auto"
    scheduler: str = "slurm"  # "sge" | "slurm"
    nodes: int = 1
    gpus: int = 1
    cpus: int = 4
    mem: str = DEFAULT_MEM  # per node; the default is a DefaultSize (`train submit` may add to it)
    time: str = "12:00:00"
    gpu_c: str | None = None
    gpu_type: str | None = None
    gpu_memory: str | None = None
    gres: str | None = None
    constraint: str | None = None
    partition: str | None = None
    queue: str | None = None
    account: str | None = None
    project: str | None = None
    setup: list[str] = field(default_factory=list)
    python: str = "python3"
    # "auto": the OpenSSH client (one ControlMaster login a day) when `ssh` is installed,
    # else Fabric/paramiko; "openssh" or "paramiko" to choose
    transport: str = "auto"
    # `train submit` uploads shardship's source (named by content hash) and runs it with
    # PYTHONPATH on top of the cluster's python/torch; false: the cluster has it installed
    ship_code: bool = True
    # SGE: how the site takes memory. mem_free (default) is a per-host check of the job's whole
    # `mem`; BU SCC's form is mem_resource = "mem_per_core", mem_per = "slot" (mem / cpus per
    # slot); "" requests none. (SLURM always gets --mem per node.)
    mem_resource: str = "mem_free"
    mem_per: str = "job"  # "job" | "slot"

    # what these keys really take besides their annotation (check_fields): sizes and wall
    # clocks as numbers too, and scheduler values the job script writes with str()
    ACCEPTS: ClassVar[dict[str, str]] = {
        "quota": "str | int", "mem": "str | int", "time": "str | int",
        **{k: "str | int | float | None" for k in ("gpu_c", "gpu_type", "gpu_memory", "gres", "constraint",
                                                   "partition", "queue", "account", "project")}}

    @property
    def is_local(self) -> bool:
        return self.host.startswith("local:")


@dataclass
class Config:
    path: Path | None = None
    raw: Path = Path("data/raw")
    packed: Path = Path("data/packed")
    outputs: Path = Path("outputs")
    pack: PackOptions = field(default_factory=PackOptions)
    slam: dict[str, Any] = field(default_factory=dict)
    scale: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    budget: dict[str, Any] = field(default_factory=dict)
    clusters: dict[str, ClusterConfig] = field(default_factory=dict)

    def cluster(self, name: str | None) -> ClusterConfig:
        """The named cluster, or the only one configured."""
        if name:
            if name.startswith("local:"):
                if not name[len("local:"):].strip():  # it would upload into ./shardship
                    raise ShardshipError("--cluster local: needs a directory standing in for the remote home, "
                                         "e.g. --cluster local:/tmp/cluster")
                return ClusterConfig(name=name, host=name, quota="auto")
            if name not in self.clusters:
                known = ", ".join(sorted(self.clusters)) or "none"
                raise ShardshipError(
                    f"no [cluster.{name}] in {self.path or DEFAULT_CONFIG} (configured: {known})"
                )
            return self._reachable(self.clusters[name])
        if len(self.clusters) == 1:
            return self._reachable(next(iter(self.clusters.values())))
        if not self.clusters:
            raise ShardshipError(
                f"no cluster configured: add a [cluster.NAME] section to {self.path or DEFAULT_CONFIG} "
                "or pass --cluster local:PATH"
            )
        raise ShardshipError(
            f"{len(self.clusters)} clusters configured ({', '.join(sorted(self.clusters))}): "
            "pick one with --cluster NAME"
        )

    def _reachable(self, cl: ClusterConfig) -> ClusterConfig:
        """A cluster table without a host is a config error (exit 2), said before a
        command tries to connect: the connection layer said it as a remote failure (4)."""
        if not cl.host.strip():
            raise ShardshipError(f"{self.path or DEFAULT_CONFIG} [cluster.{cl.name}]: no host: set host = "
                                 "\"login.example.edu\" (or an ~/.ssh/config alias, or \"local:/a/directory\")")
        return cl


def _dataclass_from(cls: type, data: Any, where: str, **extra: Any) -> Any:
    if not isinstance(data, Mapping):
        raise ShardshipError(f"{where} is a {type(data).__name__}, but it is a table: write {where.split()[-1]} "
                             "with its keys below it")
    names = {f.name for f in dataclasses.fields(cls)}
    aliases = {"h_rt": "time"}
    given: dict[str, Any] = {}
    for k, v in data.items():
        k = aliases.get(k, k)
        if k not in names:
            raise ShardshipError(f"{where}: unknown key {k!r} (known: {', '.join(sorted(names))})")
        given[k] = v
    check_fields(cls, given, where)
    return cls(**{**extra, **given})


# ------------------------------------------------------------------ value types
# A value of the wrong type (`batch_size = "64"`) ran on into a TypeError traceback far from
# the file (`'<' not supported between 'str' and 'int'`), or worse, half-worked (int("64")
# in one place, "64" * 2 in another). Every table is checked here, by its dataclass's
# annotations, as it is read: one line naming the file, table, key, the type wanted and
# what to write. train.config checks [train] with the same function.
_KINDS: dict[str, tuple[tuple[type, ...], str]] = {
    "int": ((int,), "int (a whole number)"),
    "float": ((int, float), "float (a number)"),
    "bool": ((bool,), "bool (true or false)"),
    "str": ((str,), "str (text in quotes)"),
    "Path": ((str,), "str (a path in quotes)"),
}


def toml_text(value: Any) -> str:
    """`value` as it is written in shardship.toml."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_text(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k} = {toml_text(v)}" for k, v in value.items()) + "}"
    return json.dumps(value) if isinstance(value, str) else repr(value)


def _fits(value: Any, kind: str) -> bool:
    """Is `value` of one type of the annotation part `kind` ("int", "list[str]", "dict[...]")?"""
    if kind in ("Any", "object"):
        return True
    if kind == "None":
        return value is None
    if kind.startswith(("list", "tuple")):
        inner = kind.partition("[")[2].rstrip("]").strip()
        return isinstance(value, (list, tuple)) and (not inner or all(_fits(v, inner) for v in value))
    if kind.startswith(("dict", "Mapping")):
        return isinstance(value, Mapping)
    types, _ = _KINDS.get(kind, ((object,), kind))
    return isinstance(value, types) and not (isinstance(value, bool) and bool not in types)


def _said(kind: str) -> str:
    if kind.startswith(("list", "tuple")):
        inner = kind.partition("[")[2].rstrip("]").strip()
        return f"a list of {inner}" if inner in _KINDS else "a list"
    if kind.startswith(("dict", "Mapping")):
        return "a table"
    return _KINDS.get(kind, ((), kind))[1]


def _example(value: Any, kinds: list[str], default: Any) -> Any:
    """What to write instead: the quoted number unquoted, the single string in a list,
    else the default."""
    for kind in kinds:
        if isinstance(value, str) and kind in ("int", "float", "bool"):
            text = value.strip().lower()
            try:
                return {"int": int, "float": float}[kind](text) if kind != "bool" else {"true": True,
                                                                                          "false": False}[text]
            except (ValueError, KeyError):
                continue
        if kind == "list[str]" and isinstance(value, str):  # val_sessions = "a", setup = "module load x"
            return [value]
    return default


def check_value(key: str, value: Any, annotation: str, where: str, default: Any = None) -> None:
    """Raise one line when `value` (of `key` in `where`, e.g. "shardship.toml [train]") is
    not of the type `annotation` names ("int", "str | None", "list[str]")."""
    kinds = [k.strip() for k in str(annotation).split("|")]
    if any(_fits(value, k) for k in kinds):
        return
    wanted = [k for k in kinds if k != "None"]
    fix = _example(value, wanted, default)
    write = f"write {key} = {toml_text(fix)}" if fix is not None and not isinstance(fix, Mapping) else \
        f"write it as a [{key}] table"
    shown = toml_text(value) if isinstance(value, bool) else repr(value)  # '64': the quotes the user wrote
    raise ShardshipError(f"{where}: {key} = {shown} is a {type(value).__name__}, where shardship reads "
                         f"{' or '.join(_said(k) for k in wanted)}: {write}")


def check_fields(cls: type, values: Mapping[str, Any], where: str) -> None:
    """check_value for each of `values` that is a field of the dataclass `cls`, by its
    annotation (or the class's ACCEPTS, where a key takes more than it says)."""
    accepts: Mapping[str, str] = getattr(cls, "ACCEPTS", {})
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key, value in values.items():
        f = fields.get(key)
        if f is None:
            continue
        default = f.default if f.default is not dataclasses.MISSING else None
        check_value(key, value, accepts.get(key, str(f.type)), where, default)


TABLES = ("paths", "pack", "slam", "scale", "train", "budget", "cluster")
BUDGET_KEYS = ("env",)  # the rest of `packer budget` comes from [train] and the cluster


def _table(data: dict[str, Any], name: str, p: Path) -> dict[str, Any]:
    value = data.get(name, {})
    if not isinstance(value, dict):
        raise ShardshipError(f"{p}: {name} = {value!r} must be a table: write [{name}] with its keys below it")
    return value


def _known(d: dict[str, Any], known: tuple[str, ...], what: str, fmt: str = "'{}'") -> None:
    """A misspelt name is an error naming the close one: ignored, its settings silently
    would not apply ([trian] trains with every default)."""
    import difflib

    for k in d:
        if k not in known:
            close = difflib.get_close_matches(k, known, n=1)
            hint = f"did you mean {fmt.format(close[0])}?" if close else \
                f"known: {', '.join(fmt.format(x) for x in known)}"
            raise ShardshipError(f"{what} {fmt.format(k)} ({hint})")


def load_config(path: str | os.PathLike | None = None) -> Config:
    """Read the config; a missing default file means all defaults, a missing
    explicit file is an error."""
    explicit = path is not None
    p = Path(path if path is not None else os.environ.get("SHARDSHIP_CONFIG", DEFAULT_CONFIG))
    if not p.exists():
        if explicit:
            raise ShardshipError(f"config file {p} not found")
        return Config()
    try:
        data = tomllib.loads(p.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ShardshipError(f"{p}: not valid TOML: {e}") from None
    cfg = Config(path=p)
    _known(data, TABLES, f"{p}: unknown table", "[{}]")
    paths = _table(data, "paths", p)
    _known(paths, ("raw", "packed", "outputs"), f"{p} [paths]: unknown key")
    for key in ("raw", "packed", "outputs"):
        if key in paths:
            check_value(key, paths[key], "Path", f"{p} [paths]", str(getattr(cfg, key)))
            setattr(cfg, key, Path(paths[key]))
    if "pack" in data:
        cfg.pack = _dataclass_from(PackOptions, data["pack"], f"{p} [pack]")
        cfg.pack.validate(f"{p} [pack]")
    budget = _table(data, "budget", p)
    _known(budget, BUDGET_KEYS, f"{p} [budget]: unknown key")
    if "env" in budget:  # a size: "4G", or bytes
        check_value("env", budget["env"], "str | int", f"{p} [budget]", "4G")
    cfg.slam = dict(_table(data, "slam", p))
    cfg.scale = dict(_table(data, "scale", p))
    cfg.train = dict(_table(data, "train", p))
    cfg.budget = dict(budget)
    for name, section in _table(data, "cluster", p).items():
        cl = cfg.clusters[name] = _dataclass_from(ClusterConfig, section, f"{p} [cluster.{name}]", name=name)
        if cl.is_local and not cl.host[len("local:"):].strip():
            raise ShardshipError(f"{p} [cluster.{name}]: host = \"local:\" needs a directory after the colon, "
                                 "e.g. host = \"local:/tmp/cluster\"")
    return cfg
