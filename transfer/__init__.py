"""transfer: quota-aware, resumable, verified upload of packed shards over SSH (the OpenSSH
client's one master connection per cluster, or one Fabric connection per command).

Public API (also used by `packer budget --remote` and the job submitter):

    remote = transfer.connect(cluster, accept_new_host_key=False)   # a context manager
    remote.run(["sbatch", "job.sh"], cwd="jobs").check()             # argv, quoted for you
    remote.write_file("jobs/job.sh", data)  /  remote.put(local, "path")
    transfer.remote_quota(cluster) -> Quota | None                   # live limit / usage / inodes
    transfer.pull.pull(remote, ["outputs/best.pt"], Path("outputs"))
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from transfer.connection import connect
from transfer.quota import Quota, live_quota
from transfer.remote import FileStat, LocalRemote, OpenSSHRemote, Remote, RunResult, SSHRemote

if TYPE_CHECKING:
    from shardship.config import ClusterConfig


def remote_quota(cluster: ClusterConfig, accept_new_host_key: bool = False) -> Quota | None:
    """Live quota of `cluster.remote_dir` over one connection (for `packer budget --remote`)."""
    with connect(cluster, accept_new_host_key) as remote:
        return live_quota(remote, remote.root)


__all__ = ["connect", "remote_quota", "live_quota", "Quota", "Remote", "RunResult", "FileStat", "SSHRemote",
           "OpenSSHRemote", "LocalRemote"]
