"""What the remote state file trusts instead of re-hashing: a file's signature.

Size + mtime alone is cheap to fool (`cp` of a same-size file, then `touch -r`
to put the mtime back, or a tool that preserves mtimes): the signature adds the
ctime and the inode, which no one can set from user space; any write, rename,
chmod or utime moves the ctime. SFTP does not report ctime or inode, so one
remote python3 stats the whole directory in one command. Without python3 the
answer is {}: nothing is trusted and every shard is re-hashed (slower, never wrong).
"""
from __future__ import annotations

import json

from transfer.remote import Remote

# Runs on the remote: argv[1] is the directory; prints {name: "size:mtime_ns:ctime_ns:inode"}.
PY_SIGNATURES = (
    "import json, os, sys\n"
    "out = {}\n"
    "try:\n"
    "    names = os.listdir(sys.argv[1])\n"
    "except OSError:\n"
    "    names = []\n"
    "for n in names:\n"
    "    try:\n"
    "        st = os.stat(os.path.join(sys.argv[1], n))\n"
    "    except OSError:\n"
    "        continue\n"
    "    out[n] = '%d:%d:%d:%d' % (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)\n"
    "sys.stdout.write(json.dumps(out))\n"
)


def signatures(remote: Remote, path: str = "") -> dict[str, str]:
    """{name: signature} of the entries of `path` (default: remote.root); {} when unknown."""
    res = remote.run(["python3", "-", remote.path(path) if path else remote.root], stdin=PY_SIGNATURES.encode())
    if not res.ok:
        return {}
    try:
        got = json.loads(res.stdout or "{}")
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in got.items()} if isinstance(got, dict) else {}


def trusted(known: dict | None, sig: str | None, sha256: str | None = None) -> bool:
    """Whether a state row still vouches for a file: same signature (and the expected sha256)."""
    if not known or not sig or known.get("sig") != sig:
        return False
    return sha256 is None or known.get("sha256") == sha256
