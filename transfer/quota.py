"""Live quota and usage on the cluster, from whatever tool the site has.

Clusters report quotas in four dialects: Linux `quota -s -w` (and sites'
wrappers of it, e.g. BU SCC's "Home Directory Usage and Quota" table),
Lustre `lfs quota -u $USER DIR`, GPFS `mmlsquota -Y`, and plain `df -P` when
there is no per-user quota. The parsers below are pure functions over the
tools' text (tested on real-format samples in tests/data/quota/);
`live_quota` runs all probes in ONE remote command (a round trip costs a
lot behind MFA/VPN) and picks the most specific answer.

Units: sizes use binary units (`10240M`, `9.537T`, `0k`; bare numbers are
KiB as the tools print them); inode counts use powers of 1000 (`352k` =
352000), as linuxquota's `-s` prints them.
"""
from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace

from shardship.units import human
from transfer.remote import Remote

_BIN = {"": 1024, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5, "E": 1024**6}
_DEC = {"": 1, "K": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4}


@dataclass(frozen=True)
class Quota:
    """Space and inodes for the directory we write to. None = not known / no limit."""

    limit_bytes: int | None
    used_bytes: int | None
    inode_limit: int | None
    inode_used: int | None
    source: str  # which tool answered: "quota -s -w", "lfs quota", "mmlsquota -Y", "df -P", ...
    avail_bytes: int | None = None  # free space on the filesystem (df), a second ceiling
    filesystem: str | None = None

    @property
    def headroom_bytes(self) -> int | None:
        """Bytes we may still add: min(limit - used, filesystem free)."""
        cands = []
        if self.limit_bytes is not None and self.used_bytes is not None:
            cands.append(self.limit_bytes - self.used_bytes)
        if self.avail_bytes is not None:
            cands.append(self.avail_bytes)
        return min(cands) if cands else None

    @property
    def inode_headroom(self) -> int | None:
        if self.inode_limit is None or self.inode_used is None:
            return None
        return self.inode_limit - self.inode_used

    def describe(self) -> str:
        """One line for people: used / limit (headroom), inodes, source."""
        parts = []
        if self.limit_bytes is not None:
            parts.append(f"{human(self.used_bytes or 0)} used of {human(self.limit_bytes)}")
        elif self.used_bytes is not None:
            parts.append(f"{human(self.used_bytes)} used, no limit")
        if self.headroom_bytes is not None:
            parts.append(f"{human(max(self.headroom_bytes, 0))} free")
        if self.inode_limit is not None:
            parts.append(f"{self.inode_used or 0:,} of {self.inode_limit:,} files")
        return ", ".join(parts) + f" ({self.source})"


# ---------------------------------------------------------------------------
# tokens
# ---------------------------------------------------------------------------

_SIZE_RE = re.compile(r"^\[?(\d+(?:\.\d+)?)([KMGTPE]?)(?:I?B)?\]?\*?$", re.IGNORECASE)
_COUNT_RE = re.compile(r"^\[?(\d[\d,]*(?:\.\d+)?)([KMGT]?)\]?\*?$", re.IGNORECASE)


def parse_size(token: str, bare_unit: int = 1024) -> int | None:
    """'10240M' / '9.537T' / '0k' / '[1041408]' / '4128M*' -> bytes; a bare number is
    `bare_unit` bytes (KiB for quota tools). None if the token is not a size."""
    m = _SIZE_RE.match(token.strip())
    if not m:
        return None
    num, unit = float(m.group(1)), m.group(2).upper()
    return int(round(num * (_BIN[unit] if unit else bare_unit)))


def parse_count(token: str) -> int | None:
    """'352k' -> 352000, '115,486' -> 115486, '40468*' -> 40468 (powers of 1000). None if not a count."""
    m = _COUNT_RE.match(token.strip())
    if not m:
        return None
    num = float(m.group(1).replace(",", ""))
    return int(round(num * _DEC[m.group(2).upper()]))


def _limit(soft: int | None, hard: int | None) -> int | None:
    """The limit to plan against: the soft quota when set (over it, writes stop after
    the grace period), else the hard limit; 0 means "no limit" in every tool."""
    for v in (soft, hard):
        if v:
            return v
    return None


def _unwrap(lines: list[str]) -> list[str]:
    """Join a row the tool wrapped because the filesystem name was long (name alone on a line)."""
    out: list[str] = []
    carry = ""
    for line in lines:
        if not line.strip():
            continue
        if carry:
            line = carry + " " + line.strip()
            carry = ""
        if len(line.split()) == 1:
            carry = line.strip()
            continue
        out.append(line)
    if carry:
        out.append(carry)
    return out


def _row_values(tokens: list[str], size_bare: int) -> tuple[list[int | None], list[int | None]] | None:
    """`used quota limit [grace] files quota limit [grace]` -> (sizes, counts); grace fields
    are anything that is not a number (`6days`, `13:30`, `none`, `-`)."""
    if len(tokens) < 6:
        return None
    sizes = [parse_size(t, size_bare) for t in tokens[:3]]
    if any(v is None for v in sizes):
        return None
    rest = tokens[3:]
    if rest and parse_count(rest[0]) is None:
        rest = rest[1:]
    counts = [parse_count(t) for t in rest[:3]]
    if len(counts) < 3 or any(v is None for v in counts):
        return None
    return sizes, counts


# ---------------------------------------------------------------------------
# parsers (pure)
# ---------------------------------------------------------------------------


def _table_rows(text: str) -> Iterator[tuple[str, list[int | None], list[int | None]]]:
    """(filesystem, sizes, counts) for each row under the `Filesystem` header of
    `quota -s -w` / `lfs quota` output (sizes in bytes; bare numbers are KiB)."""
    in_table = False
    for line in _unwrap(text.splitlines()):
        tokens = line.split()
        if tokens and tokens[0] == "Filesystem":
            in_table = True
            continue
        if not in_table or line.startswith("Disk quotas"):
            continue
        vals = _row_values(tokens[1:], 1024)
        if vals:
            yield tokens[0], *vals


def parse_quota_s(text: str, filesystem: tuple[str, ...] = ()) -> Quota | None:
    """Linux `quota -s -w` output (or a site wrapper's table, see `parse_scc_quota`).

    `filesystem`: names that identify our filesystem (df device, mount point);
    when given, only a matching row counts. None: no quota for us here."""
    scc = parse_scc_quota(text)
    if scc is not None:
        return scc
    rows = list(_table_rows(text))
    if filesystem:
        rows = [r for r in rows if r[0] in filesystem]
    rows = [r for r in rows if _limit(r[1][1], r[1][2]) is not None]
    if not rows:
        return None
    fs, sizes, counts = rows[0]
    return Quota(_limit(sizes[1], sizes[2]), sizes[0], _limit(counts[1], counts[2]), counts[0], "quota -s -w",
                 filesystem=fs)


def parse_scc_quota(text: str) -> Quota | None:
    """BU SCC's `quota -s` (a wrapper over GPFS quotas) prints GB columns:

        Home Directory Usage and Quota:
        Name           GB    quota    limit in_doubt    grace |    files    quota    limit in_doubt    grace
        ktrn      3.72791     10.0     11.0      0.0     none |  115,486  200,000  200,000        0     none

    GB here are GiB (GPFS counts KiB; the advertised 10 GB home is 10.0)."""
    if "Usage and Quota" not in text and not re.search(r"^\s*Name\s+GB\s", text, re.M):
        return None
    for line in text.splitlines():
        if "|" not in line or line.split()[0] == "Name":
            continue
        left, right = line.split("|", 1)
        lt, rt = left.split(), right.split()
        if len(lt) < 4 or len(rt) < 3:
            continue
        try:
            used, soft, hard = (float(x) for x in lt[1:4])
        except ValueError:
            continue
        files = [parse_count(x) for x in rt[:3]]
        gib = 1024**3
        return Quota(_limit(int(soft * gib), int(hard * gib)), int(used * gib), _limit(files[1], files[2]),
                     files[0], "quota -s (SCC)", filesystem="home")
    return None


def parse_lfs_quota(text: str) -> Quota | None:
    """Lustre `lfs quota -u USER DIR` (kbytes) or `lfs quota -h` (units) output."""
    for fs, sizes, counts in _table_rows(text):
        if _limit(sizes[1], sizes[2]) is None and _limit(counts[1], counts[2]) is None:
            return None  # Lustre says 0 = no limit: let df answer
        return Quota(_limit(sizes[1], sizes[2]), sizes[0], _limit(counts[1], counts[2]), counts[0], "lfs quota",
                     filesystem=fs)
    return None


def parse_mmlsquota_y(text: str, filesystem: tuple[str, ...] = ()) -> Quota | None:
    """GPFS `mmlsquota -Y`: colon-separated, a HEADER line names the fields; block
    values are KiB. Takes the user's (USR) row, on our filesystem when known."""
    header: list[str] | None = None
    rows: list[dict[str, str]] = []
    for line in text.splitlines():
        parts = line.strip().split(":")
        if len(parts) < 4 or not parts[0].startswith("mmlsquota"):
            continue
        if parts[2] == "HEADER":
            header = parts
            continue
        if header:
            rows.append(dict(zip(header, parts)))
    usr = [r for r in rows if r.get("quotaType", "USR").upper() == "USR"]
    if filesystem:
        mine = [r for r in usr if r.get("filesystemName") in filesystem
                or f"/dev/{r.get('filesystemName')}" in filesystem]
        usr = mine or usr
    best: Quota | None = None
    for r in usr:
        try:
            kib = [int(r.get(k) or 0) for k in ("blockUsage", "blockQuota", "blockLimit")]
            files = [int(r.get(k) or 0) for k in ("filesUsage", "filesQuota", "filesLimit")]
        except ValueError:
            continue
        q = Quota(
            _limit(kib[1] * 1024, kib[2] * 1024), kib[0] * 1024, _limit(files[1], files[2]), files[0],
            "mmlsquota -Y", filesystem=r.get("filesystemName"),
        )
        if q.limit_bytes is None:
            continue
        if best is None or (q.headroom_bytes or 0) < (best.headroom_bytes or 0):
            best = q  # several filesets: plan against the tightest
    return best


def parse_df(text: str, inode_text: str | None = None) -> Quota | None:
    """`df -P -k DIR` (+ optionally `df -P -i DIR`): the filesystem's size, used, free.
    Used when there is no per-user quota; `avail` (what we may still write, after
    root's reserve) is kept separately."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) < 2 or not lines[0].startswith("Filesystem"):
        return None
    m = re.search(r"(\d+)-blocks", lines[0])
    if not m:  # `df -P -i` or something else: not a space report
        return None
    block = int(m.group(1))
    tokens = lines[-1].split()
    if len(tokens) < 6:
        return None
    try:
        size, used, avail = (int(t) * block for t in tokens[1:4])
    except ValueError:
        return None
    mount = " ".join(tokens[5:])
    ilimit = iused = None
    if inode_text:
        il = [ln for ln in inode_text.splitlines() if ln.strip()]
        if len(il) >= 2 and il[0].startswith("Filesystem"):
            it = il[-1].split()
            try:
                ilimit, iused = int(it[1]), int(it[2])
            except (ValueError, IndexError):
                pass
            if ilimit == 0:  # filesystems without fixed inode tables report 0
                ilimit = iused = None
    return Quota(size, used, ilimit, iused, "df -P", avail_bytes=avail, filesystem=f"{tokens[0]} on {mount}")


# ---------------------------------------------------------------------------
# live
# ---------------------------------------------------------------------------

# One round trip for every probe. $1 = directory, $2 = user. Sections start with "@@name".
PROBE_SCRIPT = r"""
d=$1; u=$2
t=""; command -v timeout >/dev/null 2>&1 && t="timeout 30"
echo "@@df"; df -P -k -- "$d" 2>&1
echo "@@dfi"; df -P -i -- "$d" 2>&1
if command -v quota >/dev/null 2>&1; then
  echo "@@quota"; $t quota -s -w 2>&1
  echo "@@quota_s"; $t quota -s 2>&1
fi
if command -v lfs >/dev/null 2>&1; then echo "@@lfs"; $t lfs quota -u "$u" "$d" 2>&1; fi
if command -v mmlsquota >/dev/null 2>&1; then echo "@@mmlsquota"; $t mmlsquota -Y 2>&1; fi
echo "@@end"
"""


def split_sections(text: str) -> dict[str, str]:
    out: dict[str, list[str]] = {}
    cur: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("@@"):
            cur = out.setdefault(line[2:].strip(), [])
            continue
        if cur is not None:
            cur.append(line)
    return {k: "\n".join(v) for k, v in out.items()}


def choose(sections: dict[str, str], under_home: bool = True) -> Quota | None:
    """The most specific answer: a per-user quota on our filesystem, else df. The
    filesystem's free space from df stays as a second ceiling either way."""
    df = parse_df(sections.get("df", ""), sections.get("dfi"))
    names: tuple[str, ...] = ()
    if df and df.filesystem:
        dev, _, mount = df.filesystem.partition(" on ")
        names = (dev, mount)
    found: Quota | None = None
    for key in ("quota", "quota_s"):
        if found is None and key in sections:
            q = parse_quota_s(sections[key], names)
            if q is not None and (q.source != "quota -s (SCC)" or under_home):
                found = q
    if found is None and "lfs" in sections:
        found = parse_lfs_quota(sections["lfs"])
    if found is None and "mmlsquota" in sections:
        found = parse_mmlsquota_y(sections["mmlsquota"], names)
    if found is None:
        return df
    if df is not None:
        found = replace(found, avail_bytes=df.avail_bytes, filesystem=found.filesystem or df.filesystem)
    return found


def existing_ancestor(remote: Remote, path: str) -> str:
    """`path` or its nearest existing parent (df needs a path that exists)."""
    p = remote.path(path)
    while p not in ("/", "") and remote.stat(p) is None:
        p = posixpath.dirname(p)
    return p or "/"


def live_quota(remote: Remote, remote_dir: str | None = None) -> Quota | None:
    """Ask the remote: limit, used, inodes for `remote_dir` (default: remote.root).
    None only when no tool answered (not even df)."""
    target = existing_ancestor(remote, remote_dir or remote.root)
    user = _remote_user(remote)
    res = remote.sh(PROBE_SCRIPT, target, user, timeout=120)
    home = remote.home.rstrip("/") + "/"
    return choose(split_sections(res.stdout), under_home=(target + "/").startswith(home))


def free(remote: Remote, remote_dir: str | None = None) -> int | None:
    """Bytes that may still be written under `remote_dir` (default: remote.root), counting
    both the quota and the filesystem's free space; None when no tool answered."""
    q = live_quota(remote, remote_dir)
    return None if q is None else q.headroom_bytes


def _remote_user(remote: Remote) -> str:
    conn = getattr(remote, "conn", None)
    if conn is not None and getattr(conn, "user", None):
        return str(conn.user)
    user = getattr(remote, "user", None)  # OpenSSHRemote: the user `ssh -G` resolved
    if user:
        return str(user)
    import getpass

    return getpass.getuser()
