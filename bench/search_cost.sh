#!/usr/bin/env bash
# Search cost: trials and seconds to find the largest batch of zoo:mnist-cnn
# that fits --memory-limit 512MiB on the CPU.
#
#   bench/search_cost.sh
#
# 1. batchfit's own search (plan -> two calibration steps -> one step at the
#    calibrated prediction -> step up / bisect to a 10 % tolerance).
# 2. The baseline of PyTorch Lightning's BatchSizeFinder, mode "binsearch"
#    (lightning/pytorch/tuner/batch_size_scaling.py, _run_binary_scaling):
#    start at 2, double while it fits, then bisect arithmetically,
#    (low + high) // 2, between the last fit and the smallest failure.
#    Two stopping rules: batchfit's 10 % tolerance (stop once
#    ceil(low x 1.1) >= high), and Lightning's own (stop once high - low <= 1).
#
# Every trial, on both sides, is the same thing: one fresh worker process
# (`batchfit __measure-worker`, the hidden subcommand batchfit's search itself
# starts) running 1 warm-up step and 1 timed step at batch B under the 512 MiB
# allocator limit. Out of memory aborts the worker ("memory allocation of ..."
# on stderr). Seconds are wall-clock over all trials, process starts included
# (as batchfit's search.seconds counts them).
#
# Environment: BATCHFIT (default ./target/release/batchfit). Needs jq.
set -euo pipefail
cd "$(dirname "$0")/.."

BATCHFIT=${BATCHFIT:-./target/release/batchfit}
MODEL=zoo:mnist-cnn
LIMIT=536870912 # 512 MiB
[ -x "$BATCHFIT" ] || { echo "no $BATCHFIT; run cargo build --release first" >&2; exit 1; }
command -v jq >/dev/null || { echo "needs jq" >&2; exit 1; }

# Waits while a build or another batchfit run loads the cores (bench/quiet.sh).
source bench/quiet.sh
now() { date +%s.%N; }
log=$(mktemp)
flag=$(mktemp -u)
# A watcher notes (in $flag) anything busy() sees while the searches run.
( while :; do busy && touch "$flag"; sleep 1; done ) &
watcher=$!
trap 'kill "$watcher" 2>/dev/null; rm -f "$log" "$flag"' EXIT

# One trial: 0 if batch $1 fits, 1 if it ran out of memory; anything else stops the script.
trial() {
    local req
    req=$(jq -cn --arg model "$MODEL" --argjson b "$1" --argjson limit "$LIMIT" '{
        model: $model, device: "Cpu", batch: $b, optimizer: "adam", lr: 0.001,
        seq_len: 1, seed: 0, warmup: 1, min_steps: 1, min_time_s: 0.0,
        max_steps: 1, time_cap_s: 0.2, target_rel_err: 0.02,
        memory_limit: $limit, threads: null}')
    local so se
    so=$(mktemp)
    se=$(mktemp)
    "$BATCHFIT" __measure-worker "$req" >"$so" 2>"$se" || true
    if grep -q '^BATCHFIT_WORKER {"Measured"' "$so"; then
        rm -f "$so" "$se"
        echo "$1 fits" >>"$log"
        return 0
    elif grep -q 'memory allocation of' "$se"; then
        rm -f "$so" "$se"
        echo "$1 oom" >>"$log"
        return 1
    fi
    echo "trial at batch $1 neither fitted nor ran out of memory:" >&2
    tail -5 "$so" "$se" >&2
    exit 1
}

# Lightning's binsearch; $1 = "tol" (stop within 10 %) or "exact" (stop when adjacent).
# Prints: trials seconds batch_found trial_sequence
binsearch() {
    local mode=$1 low=1 high=0 b=2 n=0 t0
    : >"$log"
    done_yet() {
        [ "$high" -gt 0 ] || return 1
        if [ "$mode" = tol ]; then
            [ $(((low * 11 + 9) / 10)) -ge "$high" ] # ceil(low x 1.1) >= high
        else
            [ $((high - low)) -le 1 ]
        fi
    }
    t0=$(now)
    while :; do
        n=$((n + 1))
        if trial "$b"; then
            low=$b
            done_yet && break
            if [ "$high" -gt 0 ]; then b=$(((low + high) / 2)); else b=$((b * 2)); fi
        else
            high=$b
            b=$(((low + high) / 2))
            done_yet && break
        fi
        [ "$n" -ge 25 ] && break # Lightning's default max_trials
    done
    echo "$n $(echo "$(now) - $t0" | bc) $low $(awk '{printf "%s%s%s", sep, $1, ($2 == "oom" ? "x" : ""); sep = ","}' "$log")"
}

disturbed=0
settle() { quiet; rm -f "$flag"; }
checked() { [ -e "$flag" ] && disturbed=1; return 0; }

settle
bf=$("$BATCHFIT" probe "$MODEL" --memory-limit 512MiB --batches 8 --time-cap 0.2 --warmup 1 --json)
checked
bf_row=$(jq -r '.devices[0].search
    | "\(.trials | length) \(.seconds) \(.max_batch) \([.trials[] | "\(.batch)\(if .outcome == "out_of_memory" then "x" else "" end)"] | join(","))"' <<<"$bf")
settle
tol_row=$(binsearch tol)
checked
settle
exact_row=$(binsearch exact)
checked

printf '%-34s %6s %8s %12s  %s\n' method trials seconds "batch found" "trials (x = out of memory)"
print_row() {
    local name=$1 n s b seq
    read -r n s b seq <<<"$2"
    printf '%-34s %6d %8.1f %12d  %s\n' "$name" "$n" "$s" "$b" "$seq"
}
print_row "batchfit (plan + calibration)" "$bf_row"
print_row "Lightning binsearch, 10 % tol." "$tol_row"
print_row "Lightning binsearch, adjacent" "$exact_row"
[ "$disturbed" = 1 ] && echo "(a build or another batchfit run overlapped these searches: the seconds are inflated; rerun)"
exit 0
