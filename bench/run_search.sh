#!/usr/bin/env bash
# The largest batch of a user's PyTorch script under an address-space limit:
# `batchfit run --memory-limit` without and with `--model` (the plan's slope),
# beside PyTorch Lightning's in-process finder on the same network.
#
#   TORCH_PYTHON=/path/to/venv/bin/python bench/run_search.sh [ROUNDS]
#
# Every search starts at 64 under 4,000,000 KiB (RLIMIT_AS). batchfit runs
# examples/run_pytorch.py (5 steps a trial, a fresh process each) to a 2 %
# bracket; Lightning (bench/lightning_search.py) doubles and bisects to
# adjacency in one process. Prints one row per search: search trials, all
# trials (batchfit also samples the curve's gaps and refines the knee),
# seconds, the batch found and the trials in order (x = out of memory).
# Needs jq, and torch + lightning in TORCH_PYTHON; never part of CI.
set -euo pipefail
cd "$(dirname "$0")/.."

BATCHFIT=${BATCHFIT:-./target/release/batchfit}
PY=${TORCH_PYTHON:-python3}
ROUNDS=${1:-2}
LIMIT_KIB=4000000
[ -x "$BATCHFIT" ] || { echo "no $BATCHFIT; run cargo build --release first" >&2; exit 1; }
"$PY" -c "import torch, lightning" 2>/dev/null || { echo "$PY lacks torch or lightning" >&2; exit 1; }
command -v jq >/dev/null || { echo "needs jq" >&2; exit 1; }

printf '%-26s %7s %6s %8s %7s  %s\n' search search all seconds found "trials (x = out of memory)"
batchfit_row() {
    local name=$1
    shift
    "$BATCHFIT" run --memory-limit "${LIMIT_KIB}KiB" --start 64 "$@" --json -- \
        "$PY" examples/run_pytorch.py --batch-size '{batch}' --steps 5 --device cpu 2>/dev/null |
        jq -r --arg name "$name" '"\($name)\t\(.search_trials)\t\(.trials | length)\t\(.seconds * 10 | round / 10)\t\(.max_batch)\t\([.trials[] | "\(.batch)\(if .outcome == "ran" then "" else "x" end)"] | join(","))"' |
        awk -F'\t' '{ printf "%-26s %7s %6s %8s %7s  %s\n", $1, $2, $3, $4, $5, $6 }'
}
for round in $(seq 1 "$ROUNDS"); do
    batchfit_row "batchfit run" 
    batchfit_row "batchfit run --model" --model zoo:seed2-dual --runtime pytorch
    "$PY" bench/lightning_search.py --memory-limit-kib "$LIMIT_KIB" --init-val 64 2>/dev/null |
        jq -r '"Lightning binsearch\t\(.trials)\t\(.trials)\t\(.seconds)\t\(.batch_found)\t\(.sequence)"' |
        awk -F'\t' '{ printf "%-26s %7s %6s %8s %7s  %s\n", $1, $2, $3, $4, $5, $6 }'
done
