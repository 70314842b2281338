"""One connection per command: the caller's Remote, or a new one from
`transfer.connect` (the same Fabric connection code as `transfer upload`)."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from shardship.config import ClusterConfig


@contextlib.contextmanager
def connected(cluster: ClusterConfig, remote: Any = None, accept_new_host_key: bool = False) -> Iterator[Any]:
    """The caller's Remote as is, or one new connection closed afterwards."""
    if remote is not None:
        yield remote
        return
    from transfer import connect

    with connect(cluster, accept_new_host_key) as r:
        yield r
