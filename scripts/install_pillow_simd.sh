#!/bin/sh
# Make pillow-simd the active PIL. Anything that depends on `pillow`
# (matplotlib) installs stock Pillow first; we replace it here, last.
# Needs the libjpeg/zlib headers (Debian: libjpeg62-turbo-dev zlib1g-dev).
set -u
PY=${PY:-.venv/bin/python}
if $PY -c "import PIL, sys; sys.exit(0 if '.post' in PIL.__version__ else 1)" 2>/dev/null; then
    echo "pillow-simd already active"; exit 0
fi
$PY -m pip uninstall -q -y pillow pillow-simd >/dev/null 2>&1
CCFLAGS=""
grep -q avx2 /proc/cpuinfo 2>/dev/null && CCFLAGS="-mavx2"
if CC="cc $CCFLAGS" $PY -m pip install -q --no-cache-dir --no-deps pillow-simd; then
    echo "pillow-simd installed"
else
    echo "WARNING: pillow-simd could not build (missing libjpeg/zlib headers or a compiler?);" >&2
    echo "WARNING: falling back to stock Pillow: packing will be slower." >&2
    $PY -m pip install -q pillow
fi
