#!/usr/bin/env bash
# The generated corpus (bench/corpus_gen.py: whole libraries by rule) through `batchfit plan`:
# does each model load, and with PyTorch's trainable parameter count?
#
#   bench/corpus_gen.sh [NAME...]        (default: every name of `corpus_gen.py list`)
#
# Prints a markdown table per model (loads, or the refusal: node, op, reason; parameters,
# batchfit / PyTorch) and then one per family (exported, loaded, loaded with PyTorch's count).
# Exports are kept in CORPUS_DIR (default /tmp/batchfit-corpus) and reused when present, so a
# second run only re-plans. Every row also goes to RESULTS (default CORPUS_DIR/results.jsonl).
#
# torch and the model libraries are NOT dependencies of batchfit (see corpus_gen.py's header).
# Environment: BATCHFIT (default ./target/release/batchfit), TORCH_PYTHON (default
# /tmp/vt/bin/python), PLAN_TIMEOUT (seconds per plan, default 120), EXPORT (default 1; 0:
# plan only what CORPUS_DIR already holds, and list the rest as not exported in this run),
# PROBE (default 0; 1: `batchfit probe` each loaded model marked for probing at BATCHES,
# default 2,8, and add planned against measured peak to its row; PROBE_TIMEOUT seconds per
# model, default 900), STEP (default 0; 1: each loaded model marked for probing also gets
# its training step timed at STEP_BATCH, default 32, by `batchfit probe` (batchfit's engine)
# and by `corpus_gen.py step` (PyTorch, the same input and loss), and the ratio PyTorch /
# engine: above 1 the engine is faster).
set -euo pipefail
cd "$(dirname "$0")/.."

BATCHFIT=${BATCHFIT:-./target/release/batchfit}
PY=${TORCH_PYTHON:-/tmp/vt/bin/python}
DIR=${CORPUS_DIR:-/tmp/batchfit-corpus}
PLAN_TIMEOUT=${PLAN_TIMEOUT:-120}
[ -x "$BATCHFIT" ] || { echo "no $BATCHFIT; run cargo build --release first" >&2; exit 1; }
command -v jq >/dev/null || { echo "needs jq" >&2; exit 1; }
mkdir -p "$DIR"

models=("$@")
[ ${#models[@]} -gt 0 ] || mapfile -t models < <("$PY" bench/corpus_gen.py list)

results=${RESULTS:-$DIR/results.jsonl}
: >"$results"
for m in "${models[@]}"; do
    file="$DIR/${m//:/--}.onnx"
    meta="$file.json"
    if [ ! -s "$meta" ] && [ "${EXPORT:-1}" = 0 ]; then
        echo "{\"name\": \"$m\", \"family\": \"${m%%:*}\", \"export_error\": \"not exported in this run (EXPORT=0)\"}" >>"$results"
        continue
    fi
    if [ ! -s "$meta" ]; then
        timeout 900 "$PY" bench/corpus_gen.py export "$m" "$DIR" 2>"$DIR/export.err" | tail -n 1 >"$meta" \
            || echo "{\"name\": \"$m\", \"family\": \"${m%%:*}\", \"export_error\": \"export timed out or crashed\"}" >"$meta"
    fi
    if jq -e 'has("export_error")' "$meta" >/dev/null; then
        jq -c '. + {loads: null}' "$meta" >>"$results"
        continue
    fi
    if timeout "$PLAN_TIMEOUT" "$BATCHFIT" plan "$file" --json >"$DIR/plan.json" 2>"$DIR/plan.err"; then
        ours=$(jq .parameters "$DIR/plan.json")
        probed='null'
        if [ "${PROBE:-0}" = 1 ] && jq -e '.probe' "$meta" >/dev/null \
            && timeout "${PROBE_TIMEOUT:-900}" "$BATCHFIT" probe "$file" --batches "${BATCHES:-2,8}" \
                --json >"$DIR/probe.json" 2>"$DIR/probe.err"; then
            probed=$(jq -c '[.devices[0].points[] | {batch, planned_bytes, peak_bytes,
                plan_error_pct, step_time_s, failure}]' "$DIR/probe.json")
        elif [ "${PROBE:-0}" = 1 ] && jq -e '.probe' "$meta" >/dev/null; then
            probed=$(head -c 200 "$DIR/probe.err" | jq -Rs '{error: .}')
        fi
        step='null'
        if [ "${STEP:-0}" = 1 ] && jq -e '.probe' "$meta" >/dev/null; then
            sb=${STEP_BATCH:-32}
            engine=$(timeout "${PROBE_TIMEOUT:-900}" "$BATCHFIT" probe "$file" --batches "$sb" \
                --json 2>/dev/null | jq '.devices[0].points[0].step_time_s // null' || true)
            kind=$(jq -r '.input[0]' "$meta")
            shape=$(jq -r '.input[1] | map(tostring) | join(",")' "$meta")
            torch_s=$(timeout "${PROBE_TIMEOUT:-900}" "$PY" bench/corpus_gen.py step "$m" "$kind" \
                "$shape" "$sb" 2>/dev/null | jq '.seconds' || true)
            step=$(jq -nc --argjson b "$sb" --argjson e "${engine:-null}" --argjson t "${torch_s:-null}" \
                '{batch: $b, engine_s: $e, pytorch_s: $t}')
        fi
        jq -c --argjson ours "$ours" --argjson probed "$probed" --argjson step "$step" \
            '. + {loads: true, ours: $ours, probed: $probed, step: $step}' "$meta" >>"$results"
    else
        why=$(head -c 400 "$DIR/plan.err" | tr '\n' ' ')
        jq -c --arg why "$why" '. + {loads: false, refusal: $why}' "$meta" >>"$results"
    fi
done

echo "| model | loads | params (batchfit / PyTorch) | planned vs measured peak | step: engine / PyTorch (ratio) |"
echo "|---|---|---|---|---|"
jq -r '
    def mib: . / 1048576 | . * 10 | round / 10 | tostring;
    def ms: . * 1000 | if . >= 100 then round else . * 10 | round / 10 end | tostring + " ms";
    def side: if type == "number" then ms else "failed" end;
    def step: if .step == null then ""
        elif .step.engine_s == null or .step.pytorch_s == null then
            "\(.step.batch): \(.step.engine_s | side) / \(.step.pytorch_s | side)"
        else "\(.step.batch): \(.step.engine_s | ms) / \(.step.pytorch_s | ms) (\(.step.pytorch_s / .step.engine_s | . * 100 | round / 100)x)" end;
    def peaks: if .probed == null then ""
        elif (.probed | type) == "object" then "probe failed: \(.probed.error | gsub("\n|\\|"; " ") | .[0:120])"
        else [.probed[] | if .failure then "\(.batch): \(.failure | tostring | .[0:60])"
            else "\(.batch): \(.planned_bytes | mib) / \(.peak_bytes | mib) MiB (\(.plan_error_pct | . * 10 | round / 10) %)" end]
            | join(", ") end;
    if .loads == null then "| \(.name) | not exported: \(.export_error | .[0:160]) | – / \(.params // "–") | | |"
    elif .loads then "| \(.name) | yes\(if .ours == .params then "" else " (count differs)" end) | \(.ours) / \(.params) | \(peaks) | \(step) |"
    else "| \(.name) | no: \(.refusal | gsub("\\|"; "/") | .[0:200]) | – / \(.params) | | |" end
    ' "$results"
echo
echo "| family | models | exported | load | load with PyTorch's count |"
echo "|---|---:|---:|---:|---:|"
jq -rs '
    group_by(.family)[] as $f
    | ($f | map(select(.loads != null))) as $ex
    | ($ex | map(select(.loads))) as $ok
    | "| \($f[0].family) | \($f | length) | \($ex | length) | \($ok | length) | \($ok | map(select(.ours == .params)) | length) |"
    ' "$results"
jq -rs '
    map(select(.loads != null)) as $ex | ($ex | map(select(.loads))) as $ok
    | "| all | \(length) | \($ex | length) | \($ok | length) | \($ok | map(select(.ours == .params)) | length) |"
    ' "$results"
jq -rs '
    map(select((.probed | type) == "array")) as $p
    | ($p | map(select(all(.probed[]; .failure == null and (.plan_error_pct | fabs) <= 10)))) as $ok
    | if ($p | length) > 0 then
        "\nprobed: \($p | length) models; planned within 10 % of the measured peak at every batch: \($ok | length)"
      else empty end
    ' "$results"
jq -rs --arg batch "${STEP_BATCH:-32}" '
    map(select(.step != null and .step.engine_s != null and .step.pytorch_s != null)
        | .step.pytorch_s / .step.engine_s) | sort as $r
    | if ($r | length) > 0 then
        "step at \($batch): \($r | length) models timed on both; PyTorch / engine: median \($r[($r | length) / 2 | floor] | . * 100 | round / 100)x, lowest \($r[0] | . * 100 | round / 100)x, \($r | map(select(. < 0.5)) | length) below 0.5x"
      else empty end
    ' "$results"
