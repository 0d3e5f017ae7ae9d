#!/usr/bin/env bash
# Training time with and without batchfit's noise helper (python/batchfit),
# zoo:mnist-mlp in PyTorch on this CPU. See bench/noise_overhead.py.
#
#   bench/noise_overhead.sh [noise_overhead.py flags]
#
# PyTorch is NOT a dependency of batchfit and this is never part of CI. The
# script makes a throwaway venv with torch from PyPI if TORCH_PYTHON (default
# /tmp/torchvenv/bin/python) has none:
#
#   python3 -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install torch
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${TORCH_PYTHON:-/tmp/torchvenv/bin/python}
if ! "$PY" -c 'import torch' 2>/dev/null; then
    venv=$(dirname "$(dirname "$PY")")
    echo "no torch at $PY; installing it into $venv (large: about 3 GB with its CUDA libraries)" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet torch
fi

# Waits while a build or another batchfit run loads the cores (bench/quiet.sh).
source bench/quiet.sh
flag=$(mktemp)
( while :; do busy && echo busy >"$flag"; sleep 1; done ) &
watcher=$!
trap 'kill "$watcher" 2>/dev/null; rm -f "$flag"' EXIT

quiet
echo "CPU: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1), $(nproc) threads; load $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" bench/noise_overhead.py "$@"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
[ -s "$flag" ] && echo "* a build or another batchfit run overlapped the timing: rerun on a quiet machine"
exit 0
