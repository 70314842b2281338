#!/usr/bin/env bash
# The stack preset on a GPU, fed each way, one CSV row per combination
# (bench/gpu_check.py): streaming with 3 workers, host cache, GPU cache, GPU
# decode; bf16 and fp32; torch.compile off and on (compile on bf16 only: the
# combinations a user would run). Target (issue 40): >= 5,000 samples/s and
# data-wait < 5% on one H200 with 4 CPU cores.
#
#   bash bench/gpu_check.sh [DATA] [SECONDS]     (run on the GPU machine, from the repository root)
#
# DATA: a packed dir (default: renders and packs 6 sessions of 600 frames into
# /tmp/gpu_check, a few minutes on 4 cores). Writes bench/results/gpu_check.csv
# (GPU_CHECK_CSV to change), one row per line below, and prints each.
# GPU_CHECK_DEVICE=cpu GPU_CHECK_MODEL=tiny runs the same rows on a CPU (the test does);
# GPU_CHECK_MODES and GPU_CHECK_COMBOS ("bf16:off fp32:off bf16:on") pick rows, GPU_CHECK_BATCH the batch (64).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PY:-}" ]; then PY=python; [ -x .venv/bin/python ] && PY=.venv/bin/python; fi
DATA=${1:-}
SECONDS_EACH=${2:-20}
CSV=${GPU_CHECK_CSV:-bench/results/gpu_check.csv}
DEVICE=${GPU_CHECK_DEVICE:-auto}
MODEL=${GPU_CHECK_MODEL:-stack}
BATCH=${GPU_CHECK_BATCH:-64}
MODES=${GPU_CHECK_MODES:-"streaming host gpu gpu_decode"}
COMBOS=${GPU_CHECK_COMBOS:-"bf16:off fp32:off bf16:on"}  # precision:compile
if [ -z "$DATA" ]; then
  DATA=/tmp/gpu_check/packed
  [ -f "$DATA/index.json" ] || "$PY" -c "from pathlib import Path; from tests.datasets import make_packed; \
make_packed(Path('/tmp/gpu_check'), sessions=6, frames=600, seed=1)"
fi
rm -f "$CSV"
for mode in $MODES; do
  for combo in $COMBOS; do
    "$PY" -m bench.gpu_check --data "$DATA" --mode "$mode" --precision "${combo%:*}" --compile "${combo#*:}" \
      --model "$MODEL" --device "$DEVICE" --seconds "$SECONDS_EACH" --workers 3 --batch-size "$BATCH" \
      --csv "$CSV" || true
  done
done
echo "rows: $CSV"
