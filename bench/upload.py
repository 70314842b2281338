"""Benchmark: `transfer upload` vs OpenSSH `scp` and `rsync`, same shards, same loopback sshd.

Writes `<results_dir>/upload.csv`, one row per method, all measured in one run
against one real sshd (tests/sshd.py: non-root user, tmpfs home). Each method
starts from an empty remote directory and is timed end to end as a user runs
it (process start, connection, transfer; transfer also verifies every shard by
sha256 on the remote and writes index.json, which scp/rsync do not). The
ratio column is MB/s relative to scp measured in the same run (target >= 0.7).
`transfer (shards phase)` is the in-process upload from the first shard's
start to the last shard verified. `client_cpu_s` is the client side's CPU
(user+sys; for scp/rsync incl. their ssh child): on a loaded machine wall time
follows CPU, and this column shows the cost per method independent of load.
Each method runs REPEATS times, interleaved in rotating order; the CSV gives
the median (`seconds_all` lists every run). Window / packet settings: our SFTP channel's receive window and max
packet (paramiko `window_size` / `max_packet_size`), the server's window and
max packet for our writes, and the SFTP write request size.

Needs root (to create the test user and its tmpfs) and openssh-server + rsync;
otherwise it writes one row saying why it was skipped.
"""
from __future__ import annotations

import csv
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

REPEATS = 3  # per method, interleaved; the CSV reports the median (all runs in seconds_all)
METHODS = ["transfer upload (CLI)", "transfer upload (in-process)", "scp", "rsync"]
DESCRIPTION = {
    "transfer upload (CLI)": ("yes: sha256 on the remote per shard",
                              "end to end: python start, connect, plan, send, verify, index.json"),
    "transfer upload (in-process)": ("yes: sha256 on the remote per shard", "connect + upload(); no interpreter start"),
    "transfer (shards phase)": ("yes", "first shard start to last shard verified+renamed (upload events)"),
    "scp": ("no", "scp -q -F CONFIG FILES host:dir/ (OpenSSH 9 scp speaks SFTP)"),
    "rsync": ("rsync's own whole-file checksum", "rsync -a -e 'ssh -F CONFIG' FILES host:dir/"),
}
FIELDS = ["method", "files", "bytes", "runs", "seconds", "seconds_all", "mb_per_s", "ratio_vs_scp", "client_cpu_s",
          "verified", "cipher",
          "window_size", "max_packet_size", "sftp_write_request", "server_window", "server_max_packet",
          "openssh", "paramiko", "python", "machine", "load_avg", "note"]


def _openssh_version() -> str:
    try:
        return subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip().split(",")[0]
    except OSError:
        return ""


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _timed(argv: list[str], env: dict[str, str], cpu: list[float]) -> float:
    """Wall seconds of a client command; its CPU seconds (user+sys, with its children
    such as scp's ssh) are appended to `cpu`."""
    c0 = _children_cpu()
    t0 = time.perf_counter()
    res = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True)
    dt = time.perf_counter() - t0
    cpu.append(_children_cpu() - c0)
    if res.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed ({res.returncode}): {res.stderr.decode()[-500:]}")
    return dt


def _prepare_dir(s, name: str) -> Path:
    d = s.home / name
    d.mkdir()
    os.chown(d, s.uid, -1)
    return d


def _verify_copies(d: Path, index: dict) -> bool:
    import hashlib

    return all(hashlib.sha256((d / x["name"]).read_bytes()).hexdigest() == x["sha256"] for x in index["shards"])


def _in_process(s, out: Path, connect, upload) -> tuple[float, float, dict]:
    """connect + upload() in this process: (total seconds, shards-phase seconds, settings)."""
    marks: list[float] = []

    def clock(kind: str, **kw) -> None:
        if kind in ("shard_start", "shard_done"):
            marks.append(time.perf_counter())

    old_home = os.environ.get("HOME")
    os.environ["HOME"] = str(s.client_home)  # Fabric reads ~/.ssh/config through $HOME
    try:
        t0 = time.perf_counter()
        with connect(s.cluster("bench_transfer")) as remote:
            upload(remote, out, progress=False, margin=0, on_event=clock)
            chan = remote.sftp.get_channel()
            settings = {"cipher": remote.transport.local_cipher, "sftp_write_request": remote.write_request_size,
                        "server_window": chan.out_window_size, "server_max_packet": chan.out_max_packet_size}
        total = time.perf_counter() - t0
    finally:
        if old_home is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = old_home
    return total, marks[-1] - marks[0], settings


def run(results_dir: Path, quick: bool = False) -> list[dict]:
    import paramiko

    from bench.common import machine
    from tests.sshd import make_packed, skip_reason, start_sshd
    from transfer import connect
    from transfer.remote import SFTP_MAX_PACKET_SIZE, SFTP_WINDOW_SIZE
    from transfer.upload import upload

    results_dir = Path(results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    common = {"openssh": _openssh_version(), "paramiko": paramiko.__version__, "python": platform.python_version(),
              "machine": machine(), "window_size": SFTP_WINDOW_SIZE, "max_packet_size": SFTP_MAX_PACKET_SIZE}
    reason = skip_reason() or (None if shutil.which("rsync") and shutil.which("scp") else "scp/rsync not installed")
    rows: list[dict] = []
    if reason:
        rows.append({**common, "method": "skipped", "note": reason})
        _write(results_dir, rows)
        return rows

    # shards of the packer's default size (8 MiB); the full run is ~400 MB (the reference dataset is 717 MB)
    n_shards, frames = (6, 32) if quick else (48, 32)
    work_parent = ROOT / "bench" / "work"
    work_parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="upload-", dir=work_parent))
    try:
        out = work / "packed"
        index = make_packed(out, {f"bench-{i:06d}-0000.tar": frames for i in range(n_shards)},
                            frame_bytes=256 * 1024, seed=7)
        files = [out / x["name"] for x in index["shards"]]
        total = sum(x["bytes"] for x in index["shards"])
        with start_sshd(quota_bytes=total * 2 + 256 * 1024 * 1024) as s:
            env = s.env()
            cfg = work / "shardship.toml"
            cfg.write_text(s.toml("bench_transfer"))
            load = f"{os.getloadavg()[0]:.2f}"
            times: dict[str, list[float]] = {m: [] for m in METHODS + ["transfer (shards phase)"]}
            cpu: dict[str, list[float]] = {m: [] for m in METHODS + ["transfer (shards phase)"]}
            ok: dict[str, bool] = {m: True for m in METHODS}
            settings: dict = {}
            for rep in range(1 if quick else REPEATS):
                # rotate the order so no method always runs on a cold (or warm) cache
                order = METHODS[rep % len(METHODS):] + METHODS[:rep % len(METHODS)]
                for method in order:
                    s.wipe_home()
                    if method == "transfer upload (CLI)":
                        times[method].append(_timed(
                            [sys.executable, "-m", "transfer", "upload", "--config", str(cfg), "--out", str(out),
                             "--no-progress", "--margin", "0"], env, cpu[method]))
                        ok[method] &= _verify_copies(s.home / "bench_transfer", index)
                    elif method == "transfer upload (in-process)":
                        c0 = time.process_time()
                        secs, phase, settings = _in_process(s, out, connect, upload)
                        cpu[method].append(time.process_time() - c0)
                        times[method].append(secs)
                        times["transfer (shards phase)"].append(phase)
                        ok[method] &= _verify_copies(s.home / "bench_transfer", index)
                    elif method == "scp":
                        _prepare_dir(s, "bench_scp")
                        times[method].append(_timed(
                            ["scp", "-q", "-F", str(s.ssh_config), *map(str, files), f"{s.alias}:bench_scp/"],
                            env, cpu[method]))
                        ok[method] &= _verify_copies(s.home / "bench_scp", index)
                    elif method == "rsync":
                        _prepare_dir(s, "bench_rsync")
                        times[method].append(_timed(
                            ["rsync", "-a", "-e", f"ssh -F {s.ssh_config}", *map(str, files),
                             f"{s.alias}:bench_rsync/"], env, cpu[method]))
                        ok[method] &= _verify_copies(s.home / "bench_rsync", index)
            s.wipe_home()
        ok["transfer (shards phase)"] = ok["transfer upload (in-process)"]

        scp_rate = total / statistics.median(times["scp"]) / 1e6
        for method in METHODS + ["transfer (shards phase)"]:
            secs = statistics.median(times[method])
            rate = total / secs / 1e6 if secs > 0 else 0.0
            verified, note = DESCRIPTION[method]
            row = {**common, **(settings if method.startswith("transfer") else {"cipher": "OpenSSH default"}),
                   "method": method, "files": len(files), "bytes": total, "runs": len(times[method]),
                   "seconds": round(secs, 3), "seconds_all": " ".join(f"{t:.3f}" for t in times[method]),
                   "mb_per_s": round(rate, 1), "ratio_vs_scp": round(rate / scp_rate, 2),
                   "client_cpu_s": round(statistics.median(cpu[method]), 3) if cpu[method] else "",
                   "verified": verified if ok[method] else f"COPY MISMATCH ({verified})", "load_avg": load,
                   "note": note}
            if not method.startswith("transfer"):
                for k in ("window_size", "max_packet_size"):
                    row[k] = ""
            rows.append(row)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _write(results_dir, rows)
    return rows


def _write(results_dir: Path, rows: list[dict]) -> None:
    with open(results_dir / "upload.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)


if __name__ == "__main__":
    quick = "--quick" in sys.argv
    for r in run(ROOT / "bench" / "results", quick=quick):
        print(f"{r['method']:<30} {r.get('mb_per_s', '')!s:>8} MB/s  x{r.get('ratio_vs_scp', '')}  {r.get('note', '')}")
