#!/usr/bin/env bash
# The GPU check: a prebuilt batchfit (built here with `--features wgpu`, and
# `cuda` where it could be built) run on the machine with the GPU, which needs
# no network and no toolchain. For each zoo model: `probe` on the CPU and every
# GPU device side by side, at two batches, then the largest batch under a
# device memory limit; the tables carry measured step times, measured peak
# memory (on a GPU: what the runtime reserved) and the plan's error.
#
#   bench/gpu_check.sh [BATCHFIT] [DEVICES]
#
# BATCHFIT defaults to target/release/batchfit; DEVICES to cpu,wgpu:0 (add
# cuda:0 for a CUDA build). On Linux without a GPU, Mesa's lavapipe
# (`apt-get install mesa-vulkan-drivers libvulkan1`) gives wgpu a Vulkan device
# on the CPU: the path is real, the timings mean nothing. Budget: under 8 minutes
# on lavapipe with 2 cores (each probe is capped by --time-cap).
set -euo pipefail
bin="${1:-target/release/batchfit}"
devices="${2:-cpu,wgpu:0}"
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}" # Mesa warns without one
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
started=$(date +%s)
"$bin" --version
# rnn-tutorial at a shorter sequence and smaller batches: a step of its
# 100-step sequences at batch 32 takes 75 s on lavapipe.
for job in "zoo:digits-mlp 32,256" "zoo:mnist-mlp 32,256" "zoo:seed2-dual 32,256" \
    "zoo:mnist-cnn 32,256" "zoo:rnn-tutorial 8,32 --seq-len 20"; do
    read -r model batches extra <<< "$job"
    name="${model#zoo:}"
    echo "== $model on $devices, batches $batches ${extra:-}"
    # shellcheck disable=SC2086 # extra holds flags
    "$bin" probe "$model" --device "$devices" --batches "$batches" $extra \
        --warmup 2 --time-cap 2 2>/dev/null > "$out/$name.txt" || echo "probe failed: see $out/$name.txt"
    sed -n '/SIDE BY SIDE/,$p' "$out/$name.txt"
done
gpu="${devices##*,}"
if [ "$gpu" != cpu ]; then
    echo "== largest batch of zoo:mnist-mlp under 256 MiB on $gpu (measured by the search)"
    "$bin" probe zoo:mnist-mlp --device "$gpu" --batches 32 --memory-limit 256MiB \
        --warmup 1 --time-cap 0.5 | grep -E "largest batch|out of memory" || true
fi
echo "full tables: $out; $(($(date +%s) - started)) s in all"
