#!/bin/sh
# The bench's peer readers (litdata, mosaicml-streaming) into .bench-peers/, without
# their declared dependencies (they would replace torch and pillow-simd in the venv);
# bench/peers.py puts .bench-peers on sys.path for the bench only. Then check that
# pillow-simd is still the PIL in use.
set -eu
PY=${PY:-.venv/bin/python}
"$PY" -m pip install --quiet --no-deps --upgrade --target .bench-peers -r bench/peers.txt
"$PY" -m packer check --pil
