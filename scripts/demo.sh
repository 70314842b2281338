#!/bin/sh
# make demo: the whole road on built-in synthetic sessions, with a local-directory
# "cluster". Everything lands under data/demo/ and outputs/demo/.
set -eu
PY=${PY:-.venv/bin/python}
BIN=${BIN:-$(dirname "$PY")}  # console scripts: immune to a train.py of your own here
DEMO=${DEMO:-data/demo}
FRAMES=${FRAMES:-180}
T0=$(date +%s)
stage() { echo "== $1 (at $(( $(date +%s) - T0 )) s)"; }
stage "1/7 synthetic sessions, zipped as the app exports them -> $DEMO/raw"
[ -d "$DEMO/raw" ] || "$BIN/packer" synth --out "$DEMO/raw" --sessions 3 --frames "$FRAMES" --seed 0 --export zip --workers 2
"$BIN/packer" check --raw "$DEMO/raw"
stage "2/7 pack -> $DEMO/packed"
"$BIN/packer" pack --raw "$DEMO/raw" --out "$DEMO/packed" --shard-mb 1  # small shards: many ranks x workers
stage "3/7 budget against a 10G quota"
"$BIN/packer" budget --out "$DEMO/packed" --quota 10G
stage "4/7 one HTML page to look at every session -> $DEMO/packed/report.html"
"$BIN/packer" report --raw "$DEMO/raw" --out "$DEMO/packed" --quota 10G
stage "5/7 upload to the local-directory cluster local:$DEMO/cluster (verified, resumable)"
"$BIN/transfer" upload --cluster "local:$DEMO/cluster" --out "$DEMO/packed"
"$BIN/transfer" status --cluster "local:$DEMO/cluster" --out "$DEMO/packed"
stage "6/7 train a small diffusion policy on the uploaded shards (CPU, ${STEPS:=300} steps; resumes if run again)"
"$BIN/train" run --data "$DEMO/cluster/shardship" --out outputs/demo --model tiny --steps "$STEPS" \
    --warmup 20 --lr 1e-3 --checkpoint-every 100 --val-every 100
stage "7/7 evaluate the EMA policy on the validation sessions"
"$BIN/train" eval --data "$DEMO/cluster/shardship" --out outputs/demo
echo
echo "demo done in $(( $(date +%s) - T0 )) s: raw sessions in $DEMO/raw, shards + index.json in $DEMO/packed,"
echo "           the dataset report $DEMO/packed/report.html (open it in a browser),"
echo "           uploaded copy in $DEMO/cluster/shardship,"
echo "           checkpoints, metrics.jsonl, loss curve and eval plot in outputs/demo"
