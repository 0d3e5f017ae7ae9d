#!/usr/bin/env bash
# `batchfit run` on a real Keras 3 / TensorFlow training: examples/noise_keras.py
# on the UCI digits the project ships, through the Python helper
# (python/batchfit/keras.py), each trial at the rule's rate for its batch.
#
#   TF_PYTHON=/path/to/venv/bin/python bench/keras_run.sh [BATCHES] [STEPS]
#
# Defaults: batches 32,64,128,256, 200 steps a trial, Adam 1e-3 at batch 32
# (square-root scaling). Prints the trials, the noise scale with its band,
# the recommendation (and any accumulation) and the predicted time-to-target
# table, from run's JSON; then `run --verify` trains the recommended batch and
# its neighbours in Keras to the run's target (SEEDS seeds, default 2) and
# prints predicted beside measured. TensorFlow is not a dependency of
# batchfit; never part of CI (CI tests the helper with numpy alone).
set -euo pipefail
cd "$(dirname "$0")/.."

BATCHFIT=${BATCHFIT:-./target/release/batchfit}
PY=${TF_PYTHON:-python3}
BATCHES=${1:-32,64,128,256}
STEPS=${2:-200}
SEEDS=${SEEDS:-2}
[ -x "$BATCHFIT" ] || { echo "no $BATCHFIT; run cargo build --release first" >&2; exit 1; }
"$PY" -c "import keras, tensorflow" 2>/dev/null || { echo "$PY lacks keras or tensorflow" >&2; exit 1; }
command -v jq >/dev/null || { echo "needs jq" >&2; exit 1; }

export TF_CPP_MIN_LOG_LEVEL=2 # TensorFlow: errors only
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
gzip -dc crates/data/data/digits.csv.gz >"$dir/digits.csv"
"$PY" -c "import keras, tensorflow as tf; print('keras', keras.__version__, 'tensorflow', tf.__version__)"
"$BATCHFIT" run --batches "$BATCHES" --ref-lr 1e-3 --ref-batch 32 --json -- \
    "$PY" examples/noise_keras.py --data "$dir/digits.csv" --batch-size '{batch}' --lr '{lr}' \
    --steps "$STEPS" >"$dir/run.json"
jq -r '
  "trials: " + ([.trials[] | "\(.batch) \(.outcome) lr \(.learning_rate) median step \(.steps.step_time.median // "-") s"] | join("; ")),
  "noise: B_noise \(.noise.b_noise | round) (90 % band \(.noise.b_noise_low | round) to \(.noise.b_noise_high // "unbounded" | if type == "number" then round else . end); \(.noise.method), preconditioned \(.noise.preconditioned); the noise trial alone \(.noise.b_noise_run // .noise.b_noise | round)), \(.noise.measurements) measurements at batch \(.noise.batch); end value B_simple \(.noise.b_simple | round)",
  (.noise.checks[] | "  check: batch \(.batch) steps to target \(.steps_to_target // "not reached" | if type == "number" then round else . end) (predicted \(.predicted_steps | round)): \(.verdict)"),
  "recommended: \(.recommendation.recommended_batch) at lr \(.recommendation.learning_rate); largest batch: \(.recommendation.max_batch) (\(.recommendation.max_batch_source)); accumulation: \(.recommendation.accumulation // "none")",
  "target loss \(.target_loss)",
  (.time_to_target[] | "  batch \(.micro_batch): \(.steps | round) updates, \(.seconds * 100 | round / 100) s, \(.vs_best * 100 | round / 100)x best (predicted)")
' "$dir/run.json"
"$BATCHFIT" run --verify "$dir/run.json" --seeds "$SEEDS" -- \
    "$PY" examples/noise_keras.py --data "$dir/digits.csv" --batch-size '{batch}' --lr '{lr}' \
    --steps 4000 --seed '{seed}' 2>/dev/null | sed -n '/^PREDICTED/,$p'
