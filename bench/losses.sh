#!/usr/bin/env bash
# The loss a user names (--loss, docs/model-spec.md "The loss"), the figures of
# bench/README.md section 8: on a segmenter's [B, C, H, W] logits (per-pixel
# cross-entropy) and a speech head's raw [B, C, T] logits (CTC with the classes
# first), planned vs measured peak at two batches, beside the loss the output's
# shape alone would get. Models are written by rule: every pairing of the
# sizes below. About a minute on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q
b=target/release/batchfit
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

row() { # model, label, flags...
    local model=$1 label=$2
    shift 2
    "$b" probe "$model" "$@" --batches 4,32 --time-cap 0.3 --warmup 1 --json |
        python3 -c '
import json, sys
d = json.load(sys.stdin)
pts = d["devices"][0]["points"]
cells = []
for p in pts:
    batch, peak, failure = p["batch"], p["peak_bytes"], p["failure"]
    if failure:
        cells.append(f"{failure}")
    else:
        err = p["planned_bytes"] / peak - 1
        cells.append(f"{peak / 2**20:.1f} MiB measured, plan {err:+.1%}")
print(f"| {sys.argv[1]} | " + " | ".join(cells) + " |")
' "$label"
}

echo "| model, loss | batch 4 | batch 32 |"
echo "| --- | --- | --- |"
for side in 32 64; do
    for classes in 5 21; do
        m="$dir/seg-$side-$classes.toml"
        printf '[[input]]\nname = "x"\nshape = [3, %d, %d]\n[[layer]]\nname = "c1"\nop = "conv2d"\nout_channels = 16\nkernel = 3\npadding = "same"\n[[layer]]\nname = "r1"\nop = "relu"\n[[layer]]\nname = "logits"\nop = "conv2d"\nout_channels = %d\nkernel = 1\n' \
            "$side" "$side" "$classes" > "$m"
        row "$m" "segmenter ${side}x${side}, $classes classes, mse (by shape)"
        row "$m" "segmenter ${side}x${side}, $classes classes, --loss ce" --loss ce
    done
done
for frames in 200 400; do
    m="$dir/speech-$frames.toml"
    printf '[[input]]\nname = "x"\nshape = [8, %d]\n[[layer]]\nname = "logits"\nop = "conv1d"\nout_channels = 29\nkernel = 1\n' \
        "$frames" > "$m"
    row "$m" "speech head [B, 29, $frames], mse (by shape)"
    row "$m" "speech head [B, 29, $frames], --loss ctc --class-axis 1" --loss ctc --class-axis 1 --blank 28
done
