#!/usr/bin/env bash
# The models people train, side by side: bench/corpus.py exports each one from
# PyTorch (training mode, no constant folding, a dynamic batch axis), then batchfit
# loads, plans and probes it, and PyTorch times the same training step.
#
#   bench/corpus.sh [MODEL...]        (default: every model of `corpus.py list`)
#
# Prints one markdown table: model | loads | params (batchfit / PyTorch's trainable
# count) | planned / measured peak and the plan's error at two batches | step time,
# batchfit / PyTorch, and the ratio (PyTorch time / batchfit time: > 1 means batchfit
# is faster). A model that does not load shows batchfit's error (the node and the op).
# Both sides train with Adam and cross-entropy in fp32 on all cores.
#
# torch and torchvision are NOT dependencies of batchfit and are never part of CI:
#   python3 -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install torch torchvision onnx
#
# Environment: BATCHFIT (default ./target/release/batchfit, built beforehand with
# `cargo build --release`), TORCH_PYTHON (default /tmp/torchvenv/bin/python),
# BATCHES (default 8,32), CORPUS_DIR (where the exports go; default a temporary one),
# REPS (default 1): times each side is timed per model, batchfit and PyTorch in turn;
# the table shows each side's median step. On a VM whose speed drifts, one run's ratio
# moves by +-0.2; interleaved repetitions expose both sides to the same drift.
set -euo pipefail
cd "$(dirname "$0")/.."

BATCHFIT=${BATCHFIT:-./target/release/batchfit}
PY=${TORCH_PYTHON:-/tmp/torchvenv/bin/python}
BATCHES=${BATCHES:-8,32}
REPS=${REPS:-1}
[ -x "$BATCHFIT" ] || { echo "no $BATCHFIT; run cargo build --release first" >&2; exit 1; }
"$PY" -c 'import torch, torchvision, onnx' 2>/dev/null || {
    echo "no torch/torchvision/onnx at $PY; see the header of $0" >&2
    exit 1
}
command -v jq >/dev/null || { echo "needs jq" >&2; exit 1; }

source bench/quiet.sh

work=$(mktemp -d)
dir=${CORPUS_DIR:-$work}
mkdir -p "$dir"
trap 'rm -rf "$work"' EXIT

models=("$@")
[ ${#models[@]} -gt 0 ] || mapfile -t models < <("$PY" bench/corpus.py list)

IFS=, read -r b1 b2 <<<"$BATCHES"
echo "| model | loads | params (batchfit / PyTorch) | peak at $b1: planned / measured (error) | peak at $b2: planned / measured (error) | step at $b1: batchfit / PyTorch (ratio) | step at $b2: batchfit / PyTorch (ratio) |"
echo "|---|---|---|---|---|---|---|"
for m in "${models[@]}"; do
    torch_params=$("$PY" bench/corpus.py export "$m" "$dir" 2>/dev/null | jq -r .params)
    model="$dir/$m.onnx"
    if ! "$BATCHFIT" plan "$model" --json >"$work/$m.plan.json" 2>"$work/$m.err"; then
        why=$(head -c 300 "$work/$m.err" | tr '\n|' '  ')
        echo "| $m | no: $why | – / $torch_params | | | | |"
        continue
    fi
    ours=$(jq -r .parameters "$work/$m.plan.json")
    for r in $(seq "$REPS"); do
        quiet
        "$BATCHFIT" probe "$model" --batches "$BATCHES" --json >"$work/$m.probe.$r.json" 2>/dev/null
        quiet
        "$PY" bench/corpus.py step "$m" "$BATCHES" >"$work/$m.pt.$r.json"
    done
    # Each side's median step per batch over the repetitions (the plan and the peaks are
    # the first probe's: they do not depend on timing).
    median='def median: sort | if length % 2 == 1 then .[length / 2 | floor]
        else (.[length / 2 - 1] + .[length / 2]) / 2 end;'
    jq -s "$median"'
        [.[] | .devices[0].points] as $all
        | .[0] | .devices[0].points |= [range(0; length) as $i | .[$i]
            | if .failure then . else
                .step_time_s = ([$all[][$i].step_time_s | select(. != null)] | median) end]
        ' "$work/$m".probe.*.json >"$work/$m.probe.json"
    jq -s "$median"'
        . as $all | $all[0] | keys | map({key: ., value: ([$all[][.]] | median)}) | from_entries
        ' "$work/$m".pt.*.json >"$work/$m.pt.json"
    jq -r --arg m "$m" --arg ours "$ours" --arg theirs "$torch_params" \
        --slurpfile pt "$work/$m.pt.json" '
        def mib: . / 1048576 | . * 10 | round / 10 | tostring + " MiB";
        def ms: . * 1000 | . * 10 | round / 10 | tostring + " ms";
        def cell($p): if $p.failure then "failed: \($p.failure | tostring | .[0:60])"
            else "\($p.planned_bytes | mib) / \($p.peak_bytes | mib) (\($p.plan_error_pct | . * 10 | round / 10)%)" end;
        def step($p): if $p.failure then "–"
            else ($pt[0][($p.batch | tostring)]) as $t
            | "\($p.step_time_s | ms) / \($t | ms) (\($t / $p.step_time_s | . * 100 | round / 100)x)" end;
        .devices[0].points as $pts
        | "| \($m) | yes | \($ours) / \($theirs) | \(cell($pts[0])) | \(cell($pts[1])) | \(step($pts[0])) | \(step($pts[1])) |"
        ' "$work/$m.probe.json"
done
