"""The small python programs the OpenSSH backend runs on the remote, one per channel.

Each is started as `python3 -u -c BOOT` and receives its real source as the first
stdin line (JSON-encoded): the command line stays one short fixed line (a csh login
shell never sees a newline in it) and nothing from a path is ever pasted into code.
They run on any python3 the cluster has (no f-strings, standard library only).
"""
from __future__ import annotations

BOOT_TEXT = "import sys, json; exec(json.loads(sys.stdin.readline()))"
#: the receiver reads binary data after its source: it must read through the same
#: buffered reader that read the first line, or bytes buffered there would be lost
BOOT_BINARY = "import sys, json; exec(json.loads(sys.stdin.buffer.readline()))"

#: stat / listdir / rename / remove / mkdir / home: one JSON request per line,
#: one JSON answer per line ({"r": result} or {"e": strerror, "n": errno}).
FS_SERVICE = r'''
import json, os, stat, sys
def st(s):
    return [s.st_size, s.st_mtime, stat.S_ISDIR(s.st_mode)]
def do(r):
    op, p = r["op"], r.get("p")
    if op == "stat":
        try:
            return st(os.stat(p))
        except (IOError, OSError) as e:
            if e.errno in (2, 20):
                return None
            raise
    if op == "list":
        out = {}
        try:
            names = os.listdir(p)
        except (IOError, OSError) as e:
            if e.errno in (2, 20):
                return out
            raise
        for n in names:
            try:
                out[n] = st(os.stat(os.path.join(p, n)))
            except (IOError, OSError):
                pass
        return out
    if op == "rename":
        os.rename(p, r["d"])
    elif op == "remove":
        try:
            os.unlink(p)
        except (IOError, OSError) as e:
            if e.errno != 2 or not r["ok"]:
                raise
    elif op == "mkdir":
        if r["parents"]:
            try:
                os.makedirs(p)
            except (IOError, OSError):
                if not os.path.isdir(p):
                    raise
        elif not os.path.isdir(p):
            os.mkdir(p)
    elif op == "home":
        return os.path.expanduser("~")
    return True
for line in iter(sys.stdin.readline, ""):
    try:
        out = {"r": do(json.loads(line))}
    except (IOError, OSError) as e:
        out = {"e": e.strerror or str(e), "n": e.errno or 0}
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
'''


#: Files into place over one channel, one after another, and their sha256.
#: Request line {"p": path, "o": offset, "n": bytes} then exactly `n` raw bytes: written
#: at `offset` (0: create/truncate; else truncated to offset first), answered with
#: {"n": n} or {"e": strerror, "n": errno} AFTER all n bytes were read (the stream stays
#: in step after an error such as ENOSPC). {"h": path}: sha256 of the file as it is on
#: disk, answered {"h": hex, "s": size}. A short stream (the client went away) ends it,
#: leaving what was written: the next upload resumes from there.
RECEIVER = r'''
import hashlib, json, os, sys
b = sys.stdin.buffer
buf = bytearray(1 << 20)
mv = memoryview(buf)
def answer(d):
    sys.stdout.write(json.dumps(d) + "\n")
    sys.stdout.flush()
def receive(p, off, n):
    err, fd = None, None
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | (0 if off else os.O_TRUNC), 0o666)
        if off:
            os.ftruncate(fd, off)
            os.lseek(fd, off, 0)
    except (IOError, OSError) as e:
        err = e
    left = n
    while left:
        k = b.readinto(mv[:min(left, len(buf))])
        if not k:
            sys.exit(1)
        left -= k
        view = mv[:k]
        while err is None and len(view):
            try:
                view = view[os.write(fd, view):]
            except (IOError, OSError) as e:
                err = e
    if fd is not None:
        try:
            os.close(fd)
        except (IOError, OSError) as e:
            err = err or e
    answer({"n": n} if err is None else {"e": err.strerror or str(err), "n": err.errno or 0})
def digest(p):
    h, s = hashlib.sha256(), 0
    try:
        with open(p, "rb") as f:
            for blk in iter(lambda: f.read(1 << 20), b""):
                h.update(blk)
                s += len(blk)
    except (IOError, OSError) as e:
        return answer({"e": e.strerror or str(e), "n": e.errno or 0})
    answer({"h": h.hexdigest(), "s": s})
for line in iter(b.readline, b""):
    r = json.loads(line.decode("utf-8", "surrogateescape"))
    if "h" in r:
        digest(r["h"])
    else:
        receive(r["p"], r["o"], r["n"])
'''
