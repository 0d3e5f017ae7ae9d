#!/usr/bin/env bash
# `batchfit run` on a real PyTorch training, then `run --verify` of its
# prediction in PyTorch itself: examples/noise_pytorch.py (Adam, the rate of
# each trial from 1e-3 at batch 32 under square-root scaling, handed as {lr}).
#
#   TORCH_PYTHON=/path/to/venv/bin/python bench/run_verify.sh DATA.csv [mlp|cnn] [SEEDS]
#
# DATA: a CSV in MNIST's layout (784 pixels or the 64 of the 8x8 digits, label
# last); crates/data/data/digits.csv.gz is the shipped one, bench/verify_data.py
# writes MNIST raw and scaled. Trials at 32..1024, 200 steps each, then the
# noise trial; verify trains every one of those batches SEEDS times (default 3)
# to the run's target (at most 4,000 steps). Prints the noise scale (the noise
# trial's own and refitted to the other trials), the trials read as rate checks,
# the recommendation and the verify table. KEEP=DIR keeps the run's JSON there
# (DIR/run.json; else it goes with the temporary folder). Needs jq and torch in
# TORCH_PYTHON; never part of CI.
set -euo pipefail
cd "$(dirname "$0")/.."

BATCHFIT=${BATCHFIT:-./target/release/batchfit}
PY=${TORCH_PYTHON:-python3}
DATA=${1:?usage: bench/run_verify.sh DATA.csv [mlp|cnn] [SEEDS]}
MODEL=${2:-mlp}
SEEDS=${3:-3}
BATCHES=32,64,128,256,512,1024
[ -x "$BATCHFIT" ] || { echo "no $BATCHFIT; run cargo build --release first" >&2; exit 1; }
"$PY" -c "import torch" 2>/dev/null || { echo "$PY lacks torch" >&2; exit 1; }
command -v jq >/dev/null || { echo "needs jq" >&2; exit 1; }

# Waits while a build or another batchfit run loads the cores (bench/quiet.sh).
source bench/quiet.sh

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cmd=("$PY" examples/noise_pytorch.py --model "$MODEL" --data "$DATA" --batch-size '{batch}' --lr '{lr}' --seed '{seed}')
"$PY" -c "import torch; print('torch', torch.__version__)"
quiet
"$BATCHFIT" run --batches "$BATCHES" --ref-lr 1e-3 --ref-batch 32 --json -- "${cmd[@]}" --steps 200 \
    >"$dir/run.json" 2>/dev/null
if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp "$dir/run.json" "$KEEP/run.json"; fi
jq -r '
  "noise: B_noise \(.noise.b_noise | round) (90 % band \(.noise.b_noise_low | round) to \(.noise.b_noise_high // "unbounded" | if type == "number" then round else . end)); \(.noise.method), preconditioned \(.noise.preconditioned); the noise trial alone \(.noise.b_noise_run // .noise.b_noise | round); \(.noise.measurements) measurements at batch \(.noise.batch); target loss \(.target_loss)",
  (.noise.checks[] | "  check: batch \(.batch) steps to target \(.steps_to_target // "not reached" | if type == "number" then round else . end) (predicted \(.predicted_steps | round)): \(.verdict)"),
  "recommended: \(.recommendation.recommended_batch) at lr \(.recommendation.learning_rate)"
' "$dir/run.json"
quiet
"$BATCHFIT" run --verify "$dir/run.json" --batches "$BATCHES" --seeds "$SEEDS" -- "${cmd[@]}" --steps 4000 \
    2>/dev/null | sed -n '/^PREDICTED/,$p'
