"""The one answer to "is this packed directory consistent?", for the local out dir
(`packer verify`) and for the cluster copy (`transfer status --verify`) alike:
every file index.json names is there, with its size, and (when asked) its sha256.
The caller says how to list and hash files, so this knows nothing of SSH."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from shardship.format.index import FileRef, Index


@dataclass(frozen=True)
class Problem:
    """One way the directory differs from what index.json promises."""

    name: str  # the file
    kind: str  # "missing" | "size" | "sha256"
    detail: str

    def __str__(self) -> str:
        return f"{self.name}: {self.detail}"


def check_files(index: Index, sizes: Mapping[str, int], sha256: Callable[[str], str] | None = None, *,
                compressed: bool = False) -> list[Problem]:
    """Problems of the files next to `index` given their sizes (`sizes`: name -> bytes
    of the files present). `sha256(name)` hashes a file whose size is right (skip it
    for a quick check). `compressed`: the `.tar.zst` copies must be there too (the
    local out dir keeps them; the cluster unpacks them to `.tar`)."""
    refs: list[FileRef] = []
    for sh in index.shards:
        refs.append(sh.ref)
        if compressed and sh.compressed is not None:
            refs.append(sh.compressed)
    out: list[Problem] = []
    for ref in refs:
        size = sizes.get(ref.name)
        if size is None:
            out.append(Problem(ref.name, "missing", "missing"))
        elif size != ref.bytes:
            out.append(Problem(ref.name, "size", f"{size} bytes, index.json says {ref.bytes}"))
        elif sha256 is not None:
            digest = sha256(ref.name)
            if digest != ref.sha256:
                out.append(Problem(ref.name, "sha256",
                                   f"sha256 {digest[:12]}..., index.json says {ref.sha256[:12]}..."))
    return out
