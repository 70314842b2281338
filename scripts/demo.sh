#!/bin/sh
# make demo: the whole road on built-in synthetic sessions, with a local-directory
# "cluster". Everything lands under data/demo/ and outputs/demo/.
set -eu
PY=${PY:-.venv/bin/python}
DEMO=${DEMO:-data/demo}
FRAMES=${FRAMES:-180}
echo "== 1/5 synthetic sessions -> $DEMO/raw"
[ -d "$DEMO/raw" ] || $PY -m packer synth --out "$DEMO/raw" --sessions 3 --frames "$FRAMES" --seed 0
$PY -m packer check --raw "$DEMO/raw"
echo "== 2/5 pack -> $DEMO/packed"
$PY -m packer pack --raw "$DEMO/raw" --out "$DEMO/packed" --shard-mb 1  # small shards: many ranks x workers
echo "== 3/5 budget against a 10G quota"
$PY -m packer budget --out "$DEMO/packed" --quota 10G
echo "== 4/5 upload to the local-directory cluster local:$DEMO/cluster (verified, resumable)"
$PY -m transfer upload --cluster "local:$DEMO/cluster" --out "$DEMO/packed"
$PY -m transfer status --cluster "local:$DEMO/cluster" --out "$DEMO/packed"
echo
echo "demo done: raw sessions in $DEMO/raw, shards + index.json in $DEMO/packed,"
echo "           uploaded copy in $DEMO/cluster/shardship"
