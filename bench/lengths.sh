#!/usr/bin/env bash
# Variable-length sequences (docs/lengths.md), the figures of bench/README.md section 6:
#  1. question 1: rnn-tutorial on the shipped clips (1-15 s at 50 frames/s), planned for
#     the question's 6 GB card under PyTorch's rules;
#  2. the same clips on the engine under a memory limit: each bucket's largest batch,
#     planned vs measured peak, and each scheme's epoch timed beside its prediction;
#  3. planned vs measured peak at three lengths on a transformer encoder (T^2
#     attention) and a 1-d convolutional speech model.
# About 40 minutes on 2 cores, most of it step 2 (an LSTM step at 750 frames takes 15 s).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q
b=target/release/batchfit
clips=examples/clips-50fps.txt

echo "== 1. plan, question 1's 6 GB card"
$b plan zoo:rnn-tutorial --lengths "$clips" --frames-per-second 50 \
    --device-preset gtx1060-6gb --runtime pytorch

echo "== 2. the engine, longest bucket first"
$b probe zoo:rnn-tutorial --lengths "$clips" --frames-per-second 50 \
    --memory-limit 640MiB --buckets 4 --warmup 1 --time-cap 2 --measure-epochs 4

echo "== 3. three lengths, two more families"
short=$(mktemp)
trap 'rm -f "$short"' EXIT
# 300 lengths from 10 to 199 by a fixed rule (a long tail), in frames.
awk 'BEGIN { for (i = 1; i <= 300; i++) print 10 + (i * i * 7 + i * 13) % 190 }' > "$short"
for m in transformer-encoder conv1d-speech; do
    $b probe "bench/$m.toml" --lengths "$short" --buckets 3 --memory-limit 200MiB \
        --warmup 1 --time-cap 1 --measure-epochs 6
done
