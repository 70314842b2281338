"""python -m bench [--quick] [--only NAME ...]: run the benchmarks, write CSVs."""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

NAMES = ["pack", "pack_memory", "slam", "slam_hard", "slam_realtime", "slam_memory", "phone_drops", "upload", "loader",
         "feed", "report", "interrupt", "step"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="smaller inputs (minutes, not tens of minutes)")
    ap.add_argument("--only", nargs="*", default=None, choices=NAMES)
    ap.add_argument("--results", type=Path, default=Path("bench/results"))
    a = ap.parse_args()
    failed = []
    for name in a.only or NAMES:
        try:
            mod = importlib.import_module(f"bench.{name}")
        except ModuleNotFoundError as e:
            print(f"[{name}] not available: {e}")
            continue
        print(f"[{name}] running ...", flush=True)
        try:
            rows = mod.run(a.results, quick=a.quick)
        except Exception as e:  # one broken benchmark must not hide the others
            print(f"[{name}] FAILED: {type(e).__name__}: {e}")
            failed.append(name)
            continue
        for r in rows:
            print("   ", {k: v for k, v in r.items() if k not in ("machine", "command")})
        print(f"[{name}] -> {a.results / (name + '.csv')}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
