"""The trainer's decoded-frame cache ([train] cache, train.cachesize) in the job's memory request.

"host" keeps the training split's decoded frames in the node's shared memory, one copy
for all its ranks; "auto" does too on a node whose GPU cannot hold them (a smaller GPU
than expected), so both are counted: when the config gives no `mem`, the request is the
default plus the cache, per node (SGE's per-slot form divides the whole by the slots, as
every request: sge.mem_request). A `mem` the user wrote is taken as written, and a
warning says so when it cannot hold the cache beside the ranks and their workers. "gpu"
lives in GPU memory and "off" nowhere: the request is left alone (a CPU job's "gpu" is a
private copy in every rank's memory: counted once per rank).

Pure: sizes in, a spec, notes and findings out (submit.py reads the index and the node)."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from shardship.errors import ShardshipError
from shardship.units import human
from train.cachesize import HOST_MODES, CacheSize, for_train
from train.jobs import checks
from train.jobs.spec import JobSpec

GiB = 1024**3


def size_of(train: Mapping[str, Any], index: Mapping[str, Any] | None, source: str) -> tuple[CacheSize | None, str]:
    """(the cache of the job's training split, where its numbers came from); (None, why) when
    there is no index to size it from or the split cannot be made."""
    if index is None:
        return None, f"not sized: no index.json to count frames in ({source})"
    try:
        return for_train(index, train), source
    except ShardshipError as e:  # every session held out: the trainer refuses the same way
        return None, f"not sized: {e}"


def _said(spec: JobSpec, size: CacheSize) -> str:
    return f'{human(size.bytes)} ({size.describe()}; [train] cache = "{spec.cache}")'


def host_copies(spec: JobSpec) -> tuple[int, str]:
    """(copies of the cache in a node's host memory, where they are, for people): "host" and
    "auto" one in shared memory; "gpu" none, or on a CPU job one in every rank's own memory."""
    if spec.cache in HOST_MODES:
        return 1, "host shared memory, one copy per node"
    if spec.cache == "gpu" and not spec.gpus_per_node:
        n = spec.ranks_per_node
        return n, f"each rank's own memory (a CPU job), {n} cop{'y' if n == 1 else 'ies'} per node"
    return 0, ""


def count_cache(spec: JobSpec, size: CacheSize | None, source: str, node_mem: int | None = None,
                node_src: str = "") -> tuple[JobSpec, list[str]]:
    """(the spec with the host cache in its memory request, notes saying what was counted).
    The request grows only when the config gives no `mem`; under "auto" not past the biggest
    node (`node_mem`), where the trainer keeps the frames on the GPU or decodes them instead."""
    if spec.cache == "off":
        return spec, ['decoded-frame cache: off ([train] cache = "off"): nothing added to the memory request']
    if size is None:
        return spec, [f'decoded-frame cache ([train] cache = "{spec.cache}"): {source}; memory request as configured']
    copies, where = host_copies(spec)
    if not copies:  # "gpu": one copy per GPU, in its own memory
        return spec, [f"decoded-frame cache: {_said(spec, size)} per GPU, in GPU memory: not in the host memory "
                      f"request ({source})"]
    if not spec.mem_default:
        return spec, [f"decoded-frame cache: {_said(spec, size)}, {where}; mem = {spec.mem} is set in "
                      f"[cluster.{spec.cluster.name}] and taken as written ({source})"]
    total = spec.mem_bytes + copies * size.bytes
    mem = f"{math.ceil(total / GiB)}G"  # whole GiB: a readable request, at most 1 GiB more than needed
    if spec.cache == "auto" and node_mem is not None and math.ceil(total / GiB) * GiB > node_mem:
        return spec, [f"decoded-frame cache: {_said(spec, size)} not added to the memory request: {spec.mem} + "
                      f"{human(size.bytes)} is more than the biggest node's {human(node_mem)} ({node_src}); "
                      "the trainer keeps the frames on the GPU where they fit, else decodes them every step"]
    grown = dataclasses.replace(spec, mem=mem, mem_base=spec.mem, mem_cache=copies * size.bytes)
    slot = ""
    if spec.scheduler == "sge" and spec.cluster.mem_resource and (spec.cluster.mem_per or "").lower() == "slot":
        slot = f", {human(grown.mem_bytes / spec.cpus_per_node)} per slot ({spec.cluster.mem_resource})"
    return grown, [f"memory: {spec.mem} (the default mem) + decoded-frame cache {_said(spec, size)}, {where} = "
                   f"{mem} per node{slot} ({source})"]


def check_written_mem(spec: JobSpec, size: CacheSize | None, worker_rss: int) -> list[checks.Finding]:
    """A warning when a `mem` the user wrote cannot hold the host cache beside the ranks and
    their workers (the request is theirs: it is not changed, nor the job refused)."""
    copies, where = host_copies(spec)
    if size is None or not size.bytes or not copies or spec.mem_default:
        return []
    procs = checks.memory_needed(spec.ranks_per_node, spec.num_workers, worker_rss, checks.rank_rss(spec))
    need = copies * size.bytes + math.ceil(procs / (1 - checks.MEMORY_MARGIN))  # as check_memory counts it
    if need <= spec.mem_bytes:
        return []
    then = ("the job would be OOM-killed as the cache fills" if spec.cache != "auto" else
            'on a node whose GPU cannot hold the frames, cache = "auto" then finds no room for them in the '
            "job's memory and decodes them every step")
    return [checks.Finding(
        "warning", "memory",
        f"[cluster.{spec.cluster.name}] mem = {spec.mem} per node is less than the decoded-frame cache needs: "
        f"{_said(spec, size)}, {where}, + {human(procs)} for {spec.ranks_per_node} rank(s) and their "
        f"workers with a {checks.MEMORY_MARGIN:.0%} margin = {human(need)}; {then}: set "
        f'mem = "{math.ceil(need / GiB)}G" (or leave mem out: `train submit` adds the cache to the default) '
        'or [train] cache = "off"')]
