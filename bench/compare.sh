#!/usr/bin/env bash
# Engine step throughput vs PyTorch on this CPU: same model, same batches.
#
#   bench/compare.sh
#
# Prints: model, batch, batchfit ms/step, PyTorch ms/step, ratio (PyTorch time /
# batchfit time, so > 1 means batchfit is faster). Both sides time a full
# training step (forward, MSE loss, backward, Adam update) in fp32 on all cores,
# with a fixed synthetic batch, and report the median.
#
# PyTorch is NOT a dependency of batchfit and is never part of CI. Install it
# into a throwaway venv first:
#
#   python3 -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install torch
#
# Environment: BATCHFIT (default ./target/release/batchfit, built beforehand
# with `cargo build --release`), TORCH_PYTHON (default /tmp/torchvenv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."

BATCHFIT=${BATCHFIT:-./target/release/batchfit}
PY=${TORCH_PYTHON:-/tmp/torchvenv/bin/python}
[ -x "$BATCHFIT" ] || { echo "no $BATCHFIT; run cargo build --release first" >&2; exit 1; }
"$PY" -c 'import torch' 2>/dev/null || {
    echo "no torch at $PY; python3 -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install torch" >&2
    exit 1
}
command -v jq >/dev/null || { echo "needs jq" >&2; exit 1; }

# Waits while a build or another batchfit run loads the cores (bench/quiet.sh).
source bench/quiet.sh

out=$(mktemp -d)
# A watcher notes (in $out/busy) anything busy() sees while a side is timed.
( while :; do busy && touch "$out/busy"; sleep 1; done ) &
watcher=$!
trap 'kill "$watcher" 2>/dev/null; rm -rf "$out"' EXIT

# name | batchfit model | batches | extra batchfit flags
run_model() {
    local name=$1 model=$2 batches=$3 flag=""
    shift 3
    quiet
    rm -f "$out/busy"
    "$BATCHFIT" probe "$model" --batches "$batches" "$@" --json >"$out/$name.bf.json"
    [ -e "$out/busy" ] && flag="*"
    quiet
    rm -f "$out/busy"
    "$PY" bench/pytorch_step.py "$name" "$batches" >"$out/$name.pt.json"
    [ -e "$out/busy" ] && flag="*"
    jq -r --arg name "$name" --arg flag "$flag" --slurpfile pt "$out/$name.pt.json" '
        .devices[0].points[]
        | [$name, .batch,
           (if .failure then "failed" else .step_time_s * 1000 end),
           ($pt[0][(.batch | tostring)] * 1000), $flag]
        | @tsv' "$out/$name.bf.json"
}

{
    run_model seed2-dual zoo:seed2-dual 32,512,8192 --warmup 3 --time-cap 3
    run_model bilstm bench/bilstm.toml 32,128
} >"$out/rows.tsv"

echo "CPU: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1), $(nproc) threads; torch $("$PY" -c 'import torch; print(torch.__version__)')"
awk -F'\t' '
    BEGIN { printf "%-11s %6s %18s %17s %7s\n", "model", "batch", "batchfit ms/step", "PyTorch ms/step", "ratio" }
    {
        if ($3 == "failed") { printf "%-11s %6d %18s %17.2f %7s\n", $1, $2, "failed", $4, "-"; next }
        printf "%-11s %6d %18.2f %17.2f %7.2f %s\n", $1, $2, $3, $4, $4 / $3, $5
        if ($5 == "*") disturbed = 1
    }
    END { if (disturbed) print "* a build or another batchfit run overlapped the timing of the rows marked so: rerun" }' "$out/rows.tsv"
echo "ratio = PyTorch time / batchfit time (> 1: batchfit is faster)"
