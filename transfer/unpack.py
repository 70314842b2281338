"""Unpack a `.tar.zst` shard on the cluster, refusing unsafe tar members.

This file is also the program that runs ON THE REMOTE: its source is sent on
stdin to `python3 - unpack SRC DST SHA256` (see `remote_call`), so it must stay
standalone (stdlib + optional `zstandard`, else the `zstd` CLI) and run on an
old cluster python3 (3.6+: no walrus, no `from __future__ import annotations`).

"Unpack" = decompress to the `.tar` the trainer streams, never extract: the
members are checked while the stream passes (absolute names, `..`
components, links pointing outside the shard, device files are refused),
hashed, written to a temp file, and only a matching sha256 is renamed into
place; the `.tar.zst` is removed after. Exit codes: 0 ok (prints JSON
{"sha256", "bytes"}), 3 unsafe member, 4 no zstd decoder, 5 sha256 mismatch,
6 other error (message on stderr).
"""
import hashlib
import json
import os
import posixpath
import subprocess
import sys
import tarfile

EXIT_UNSAFE, EXIT_NO_ZSTD, EXIT_MISMATCH, EXIT_ERROR = 3, 4, 5, 6


def unsafe_member(name, kind, linkname=""):
    """Why a tar member must not be in a shard, or None. `kind`: 'file', 'dir', 'symlink',
    'hardlink' or 'other' (devices, fifos)."""
    if not name or name.startswith("/") or name.startswith("\\"):
        return "absolute path"
    if "\\" in name and ".." in name:
        return "path with '..' component"
    parts = name.replace("\\", "/").split("/")
    if ".." in parts:
        return "path with '..' component"
    if kind == "other":
        return "device or fifo member"
    if kind in ("symlink", "hardlink"):
        if not linkname or linkname.startswith("/"):
            return "link to an absolute path"
        base = posixpath.dirname(name) if kind == "symlink" else ""
        target = posixpath.normpath(posixpath.join(base, linkname))
        if target == ".." or target.startswith("../"):
            return "link pointing outside the shard"
    return None


def member_kind(ti):
    if ti.isreg():
        return "file"
    if ti.isdir():
        return "dir"
    if ti.issym():
        return "symlink"
    if ti.islnk():
        return "hardlink"
    return "other"


def check_members(fileobj):
    """Iterate a tar stream; return (name, reason) of the first unsafe member or None."""
    with tarfile.open(fileobj=fileobj, mode="r|") as tf:
        for ti in tf:
            why = unsafe_member(ti.name, member_kind(ti), ti.linkname)
            if why:
                return ti.name, why
    return None


def check_tar_file(path):
    """Check a plain .tar shard (same rules as on the remote); seeks over member data."""
    with tarfile.open(path, mode="r:") as tf:
        for ti in tf:
            why = unsafe_member(ti.name, member_kind(ti), ti.linkname)
            if why:
                return ti.name, why
    return None


class _Tee:
    """File-like reader that hashes and copies everything tarfile reads."""

    def __init__(self, src, out):
        self.src, self.out = src, out
        self.sha = hashlib.sha256()
        self.n = 0

    def read(self, size=-1):
        b = self.src.read(size if size and size > 0 else 1 << 20)
        if b:
            self.sha.update(b)
            self.out.write(b)
            self.n += len(b)
        return b

    def drain(self):
        while self.read(1 << 20):
            pass


def _open_decoder(src):
    """(stream, cleanup) decoding the zstd file: zstandard module, else the zstd CLI."""
    try:
        import zstandard  # noqa: F401
    except ImportError:
        zstandard = None
    if zstandard is not None:
        f = open(src, "rb")
        reader = zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True)
        return reader, lambda: (reader.close(), f.close())
    for exe in ("zstd", "unzstd"):
        for d in os.environ.get("PATH", "").split(os.pathsep):
            if d and os.access(os.path.join(d, exe), os.X_OK):
                flags = "-dcq" if exe == "zstd" else "-cq"
                args = [os.path.join(d, exe), flags, "--", src]
                p = subprocess.Popen(args, stdout=subprocess.PIPE)

                def done(p=p):
                    p.stdout.close()
                    if p.wait() != 0:
                        raise OSError("zstd exited with %d" % p.returncode)
                return p.stdout, done
    return None, None


def unpack(src, dst, expected):
    tmp = posixpath.join(posixpath.dirname(dst), "." + posixpath.basename(dst) + ".unpack.tmp")
    stream, cleanup = _open_decoder(src)
    if stream is None:
        sys.stderr.write("no zstd decoder here (python zstandard module or zstd command)\n")
        return EXIT_NO_ZSTD
    try:
        with open(tmp, "wb") as out:
            tee = _Tee(stream, out)
            bad = check_members(tee)
            if bad is None:
                tee.drain()  # tar end padding
            out.flush()
            os.fsync(out.fileno())
        cleanup()
        cleanup = None
        if bad is not None:
            os.unlink(tmp)
            sys.stderr.write("unsafe tar member %r: %s\n" % bad)
            return EXIT_UNSAFE
        digest = tee.sha.hexdigest()
        if digest != expected:
            os.unlink(tmp)
            sys.stderr.write("sha256 of unpacked tar is %s, index.json says %s\n" % (digest, expected))
            return EXIT_MISMATCH
        os.rename(tmp, dst)
        os.unlink(src)
        sys.stdout.write(json.dumps({"sha256": digest, "bytes": tee.n}))
        return 0
    except (OSError, tarfile.TarError, EOFError) as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        sys.stderr.write("%s: %s\n" % (type(e).__name__, e))
        return EXIT_ERROR
    finally:
        if cleanup is not None:
            try:
                cleanup()
            except Exception:
                pass


def probe():
    """What this python can do: {"python": "3.x.y", "zstd": bool}."""
    ok = False
    try:
        import zstandard  # noqa: F401
        ok = True
    except ImportError:
        for d in os.environ.get("PATH", "").split(os.pathsep):
            if d and (os.access(os.path.join(d, "zstd"), os.X_OK) or os.access(os.path.join(d, "unzstd"), os.X_OK)):
                ok = True
    sys.stdout.write(json.dumps({"python": "%d.%d.%d" % sys.version_info[:3], "zstd": ok}))
    return 0


def main(argv):
    if len(argv) >= 1 and argv[0] == "probe":
        return probe()
    if len(argv) == 4 and argv[0] == "unpack":
        return unpack(argv[1], argv[2], argv[3])
    sys.stderr.write("usage: unpack SRC.tar.zst DST.tar SHA256 | probe\n")
    return 2


def source():
    """This module's source, to run remotely with `python3 -c`."""
    with open(os.path.abspath(__file__.replace(".pyc", ".py"))) as f:
        return f.read()


def remote_call(*args):
    """(argv, stdin) that run this file's main(args) on the remote: the program travels on
    stdin (`python3 - ARGS`), so no shell ever sees its newlines or quotes."""
    return ["python3", "-"] + [str(a) for a in args], source().encode()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
