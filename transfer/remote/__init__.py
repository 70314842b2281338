"""Where the shards go: one interface, three backends.

`Remote` (base.py) is the small set of operations upload, pull, status and
the job submitter need; `OpenSSHRemote` (openssh.py) does them as channels of
one OpenSSH ControlMaster (master.py: one login per cluster per day),
`SSHRemote` (ssh.py) over ONE Fabric connection (the fallback), `LocalRemote`
(local.py) on a local directory (`local:PATH`), so the demo and the fast
tests run the same code without SSH. Hashing and quota are functions over
a Remote (transfer.hashing, transfer.quota), not methods, so nothing here
imports them.

Everything is re-exported here: `from transfer.remote import Remote,
LocalRemote, SSHRemote, ...` is the import to use outside this package.
"""
from __future__ import annotations

from transfer.remote.base import CHUNK, Callback, FileStat, Process, Remote, RunResult
from transfer.remote.local import LocalRemote, local_home
from transfer.remote.master import Master, ssh_binary
from transfer.remote.openssh import OpenSSHRemote
from transfer.remote.ssh import (
    SFTP_MAX_PACKET_SIZE,
    SFTP_WINDOW_SIZE,
    SFTP_WRITE_DEFAULT,
    SFTP_WRITE_OPENSSH,
    SSHRemote,
)

__all__ = ["CHUNK", "Callback", "FileStat", "Process", "Remote", "RunResult", "LocalRemote", "local_home",
           "Master", "OpenSSHRemote", "ssh_binary",
           "SSHRemote", "SFTP_MAX_PACKET_SIZE", "SFTP_WINDOW_SIZE", "SFTP_WRITE_DEFAULT", "SFTP_WRITE_OPENSSH"]
