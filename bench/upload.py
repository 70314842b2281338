"""Benchmark: `transfer upload` vs OpenSSH `scp` and `rsync`, same shards, same sshd, same run.

Two networks, one real sshd (tests/sshd.py: non-root user, tmpfs home):
- loopback: straight to 127.0.0.1;
- relay: through bench/relay.py, a TCP relay on 127.0.0.1 that delays each
  direction by RELAY_DELAY_MS (a ~40 ms round trip, as to a cluster across the
  country; netem is not available here).
Every method is timed end to end as a user runs it (a new process, its own
login, the transfer): `transfer upload` also verifies every shard by sha256 ON
THE REMOTE and writes index.json, which scp/rsync do not; after every run the
bench hashes the copies itself (`verified`). Methods run REPEATS times per
network, interleaved in rotating order (new, scp, rsync, ..., then scp, rsync,
..., new), so no method always meets a cold or warm cache or a quiet moment of
this shared machine. The CSV gives per method the median, min and max seconds,
MB/s from the median, ratios to scp and to the better of scp/rsync in the same
network (and per repetition), the client's CPU seconds (for the OpenSSH
transport including the master process, which is not our child), and the
1-minute load average seen before each run.

`transfer upload (OpenSSH, cold)` disconnects first, so it pays the login like
scp does; `(OpenSSH, warm master)` runs over a master opened beforehand by
`transfer connect`, as every command after the first of the day does.
"""
from __future__ import annotations

import csv
import os
import platform
import re
import resource
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from transfer.remote.openssh import STREAMS  # noqa: E402

REPEATS = 5  # per method and network, interleaved; median reported, every run in seconds_all
RELAY_DELAY_MS = 20.0  # each direction: ~40 ms round trip
OURS_COLD, OURS_WARM, PARAMIKO = ("transfer upload (OpenSSH, cold)", "transfer upload (OpenSSH, warm master)",
                                  "transfer upload (paramiko)")
METHODS = [OURS_COLD, "scp", "rsync", OURS_WARM, PARAMIKO]
NOTES = {
    OURS_COLD: "CLI: python start, login (master), plan, 6 shards in flight on channels of the master, sha256 on "
               "the remote per shard, index.json",
    OURS_WARM: "same, the master opened before by `transfer connect` (every command after the day's first)",
    PARAMIKO: "CLI on the Fabric/paramiko transport (the fallback; one SFTP session)",
    "scp": "scp -q -F CONFIG FILES host:dir/ (OpenSSH 9 scp speaks SFTP); no verification",
    "rsync": "rsync -a -e 'ssh -F CONFIG' FILES host:dir/; rsync's own whole-file checksum",
}
FIELDS = ["network", "method", "files", "bytes", "runs", "seconds", "seconds_min", "seconds_max", "seconds_all",
          "mb_per_s", "mb_per_s_min", "mb_per_s_max", "ratio_vs_scp", "ratio_vs_best_baseline",
          "ratio_vs_best_baseline_per_run", "client_cpu_s", "verified", "streams", "openssh", "paramiko", "python",
          "machine", "load_avg", "note", "command"]
COMMAND = "make bench (python -m bench --only upload)"


def _openssh_version() -> str:
    try:
        return subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip().split(",")[0]
    except OSError:
        return ""


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _proc_cpu(pid: int | None) -> float:
    """CPU seconds of a process that is not our child (the daemonised ssh master)."""
    if not pid:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _master_pid(master) -> int | None:
    res = master.control("check")
    m = re.search(r"pid=(\d+)", res.stderr + res.stdout)
    return int(m.group(1)) if m else None


def _timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds incl. children such as scp's ssh) of a client command."""
    c0 = _children_cpu()
    t0 = time.perf_counter()
    res = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True)
    dt = time.perf_counter() - t0
    if res.returncode != 0:
        raise RuntimeError(f"{argv[:4]} failed ({res.returncode}): {res.stderr.decode()[-800:]}")
    return dt, _children_cpu() - c0


def _verify_copies(d: Path, index: dict) -> bool:
    import hashlib

    return all(hashlib.sha256((d / x["name"]).read_bytes()).hexdigest() == x["sha256"] for x in index["shards"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_relay(target: int) -> tuple[subprocess.Popen, int]:
    port = _free_port()
    p = subprocess.Popen([sys.executable, "-m", "bench.relay", str(port), str(target), str(RELAY_DELAY_MS)],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    if p.stdout is None or p.stdout.readline().strip() != b"ready":
        p.kill()
        raise RuntimeError("bench/relay.py did not start")
    return p, port


def _add_relay_alias(s, port: int) -> str:
    """An ~/.ssh/config alias through the relay, its host key known under the relay's port."""
    alias = "shardship-relay"
    with open(s.ssh_config, "a") as f:
        f.write(f"\nHost {alias}\n  HostName 127.0.0.1\n  Port {port}\n  User {s.user}\n  IdentityFile {s.key}\n"
                f"  UserKnownHostsFile {s.known_hosts}\n  StrictHostKeyChecking yes\n  BatchMode yes\n")
    kind, b64 = s.host_key_line.split()[1:3]
    with open(s.known_hosts, "a") as f:
        f.write(f"[127.0.0.1]:{port} {kind} {b64}\n")
    return alias


class _Network:
    """One network's configs and the runs of every method on it."""

    def __init__(self, name: str, s, alias: str, work: Path, out: Path, files: list[Path]):
        from shardship.config import ClusterConfig
        from transfer.connection import master_for

        self.name, self.s, self.alias, self.out, self.files = name, s, alias, out, files
        self.cfg: dict[str, Path] = {}
        for transport in ("openssh", "paramiko"):
            p = work / f"{name}-{transport}.toml"
            p.write_text(f"[cluster.bench]\nhost = \"{alias}\"\nremote_dir = \"bench_transfer\"\nquota = \"auto\"\n"
                         f"transport = \"{transport}\"\n")
            self.cfg[transport] = p
        self.master = master_for(ClusterConfig(name="bench", host=alias, transport="openssh"))
        self.runs: dict[str, list[tuple[float, float, float]]] = {m: [] for m in METHODS}  # (s, cpu, load)
        self.ok: dict[str, bool] = {m: True for m in METHODS}

    def ours(self, transport: str) -> list[str]:
        return [sys.executable, "-m", "transfer", "upload", "--config", str(self.cfg[transport]), "--out",
                str(self.out), "--quiet", "--margin", "0"]

    def run(self, method: str, env: dict[str, str], index: dict) -> None:
        s = self.s
        s.wipe_home()
        load = os.getloadavg()[0]
        extra = 0.0
        if method == OURS_COLD:
            self.master.stop()
            secs, cpu = _timed(self.ours("openssh"), env)
            extra = _proc_cpu(_master_pid(self.master))  # the login and every byte went through it
            self.master.stop()
            target = "bench_transfer"
        elif method == OURS_WARM:
            if not self.master.alive():
                subprocess.run([sys.executable, "-m", "transfer", "connect", "--config", str(self.cfg["openssh"])],
                               env=env, cwd=ROOT, check=True, capture_output=True)
            before = _proc_cpu(pid := _master_pid(self.master))
            secs, cpu = _timed(self.ours("openssh"), env)
            extra = _proc_cpu(pid) - before
            target = "bench_transfer"
        elif method == PARAMIKO:
            secs, cpu = _timed(self.ours("paramiko"), env)
            target = "bench_transfer"
        else:
            target = f"bench_{method}"
            d = s.home / target
            d.mkdir()
            os.chown(d, s.uid, -1)
            files = [str(f) for f in self.files]
            argv = (["scp", "-q", "-F", str(s.ssh_config), *files, f"{self.alias}:{target}/"] if method == "scp" else
                    ["rsync", "-a", "-e", shlex.join(["ssh", "-F", str(s.ssh_config)]), *files,
                     f"{self.alias}:{target}/"])
            secs, cpu = _timed(argv, env)
        self.runs[method].append((secs, cpu + extra, load))
        self.ok[method] &= _verify_copies(s.home / target, index)


def _rows(net: _Network, total: int, n_files: int, common: dict) -> list[dict]:
    secs = {m: [r[0] for r in net.runs[m]] for m in METHODS}
    med = {m: statistics.median(v) for m, v in secs.items() if v}
    scp_rate = total / med["scp"]
    best_rate = max(total / med["scp"], total / med["rsync"])
    rows = []
    for m in METHODS:
        if not secs[m]:
            continue
        runs = secs[m]
        per_run = [min(runs_b) / t for t, runs_b in zip(runs, zip(secs["scp"], secs["rsync"]))]
        loads = [r[2] for r in net.runs[m]]
        rows.append({
            **common, "network": net.name, "method": m, "files": n_files, "bytes": total, "runs": len(runs),
            "seconds": round(med[m], 3), "seconds_min": round(min(runs), 3), "seconds_max": round(max(runs), 3),
            "seconds_all": " ".join(f"{t:.3f}" for t in runs), "mb_per_s": round(total / med[m] / 1e6, 1),
            "mb_per_s_min": round(total / max(runs) / 1e6, 1), "mb_per_s_max": round(total / min(runs) / 1e6, 1),
            "ratio_vs_scp": round(total / med[m] / scp_rate, 2),
            "ratio_vs_best_baseline": round(total / med[m] / best_rate, 2),
            "ratio_vs_best_baseline_per_run": " ".join(f"{r:.2f}" for r in per_run),
            "client_cpu_s": round(statistics.median(r[1] for r in net.runs[m]), 3),
            "verified": ("yes" if net.ok[m] else "COPY MISMATCH"), "streams": STREAMS if "OpenSSH" in m else 1,
            "load_avg": f"{min(loads):.2f}-{max(loads):.2f}", "note": NOTES[m], "command": COMMAND,
        })
    return rows


def run(results_dir: Path, quick: bool = False) -> list[dict]:
    import paramiko

    from bench.common import machine
    from tests.sshd import make_packed, skip_reason, start_sshd

    results_dir = Path(results_dir)
    common = {"openssh": _openssh_version(), "paramiko": paramiko.__version__, "python": platform.python_version(),
              "machine": machine()}
    reason = skip_reason() or (None if shutil.which("rsync") and shutil.which("scp") else "scp/rsync not installed")
    if reason:
        rows = [{**common, "method": "skipped", "note": reason}]
        _write(results_dir, rows)
        return rows

    # shards of the packer's default size (8 MiB); the full run is ~400 MB (the reference dataset is 717 MB)
    n_shards, frames = (6, 32) if quick else (48, 32)
    work_parent = ROOT / "bench" / "work"
    work_parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="upload-", dir=work_parent))
    rows: list[dict] = []
    relay = None
    try:
        out = work / "packed"
        index = make_packed(out, {f"bench-{i:06d}-0000.tar": frames for i in range(n_shards)},
                            frame_bytes=256 * 1024, seed=7)
        files = [out / x["name"] for x in index["shards"]]
        total = sum(x["bytes"] for x in index["shards"])
        with start_sshd(quota_bytes=total * 2 + 256 * 1024 * 1024) as s:
            env = s.env()
            relay, port = _start_relay(s.port)
            nets = [_Network("loopback", s, s.alias, work, out, files),
                    _Network(f"relay {2 * RELAY_DELAY_MS:g} ms RTT", s, _add_relay_alias(s, port), work, out, files)]
            old_home = os.environ.get("HOME")
            os.environ["HOME"] = str(s.client_home)  # master_for() reads ~/.ssh through $HOME, as the CLI does
            try:
                for net in nets:
                    for rep in range(1 if quick else REPEATS):
                        k = rep % len(METHODS)  # rotate the order
                        for method in METHODS[k:] + METHODS[:k]:
                            net.run(method, env, index)
                    net.master.stop()
                    rows += _rows(net, total, len(files), common)
            finally:
                for net in nets:
                    net.master.stop()
                if old_home is None:
                    os.environ.pop("HOME", None)
                else:
                    os.environ["HOME"] = old_home
                s.wipe_home()
    finally:
        if relay is not None:
            relay.terminate()
            relay.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)
    _write(results_dir, rows)
    return rows


def _write(results_dir: Path, rows: list[dict]) -> None:
    results_dir.mkdir(parents=True, exist_ok=True)
    with open(results_dir / "upload.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)


if __name__ == "__main__":
    for r in run(ROOT / "bench" / "results", quick="--quick" in sys.argv):
        print(f"{r.get('network', ''):<18} {r['method']:<40} {r.get('mb_per_s', '')!s:>7} MB/s "
              f"x{r.get('ratio_vs_scp', '')} scp, x{r.get('ratio_vs_best_baseline', '')} best  {r.get('load_avg')}")
