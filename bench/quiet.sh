# Sourced by the benchmark scripts (after they cd to the repository root).
# Timings are meaningless while something else loads the cores (a cargo build,
# another batchfit run): wait for it (at most 10 min) before each timed run,
# and flag runs that one overlapped. Our own processes share our process group.
ours=$(ps -o pgid= $$ | tr -d ' ')
busy() {
    pgrep -x rustc >/dev/null && return 0
    pgrep -x cargo >/dev/null && return 0
    local p g
    for p in $(pgrep -x batchfit); do
        # `run`'s reaper only waits for its trial's process group to go.
        ps -o args= "$p" | grep -q -- '__reaper' && continue
        g=$(ps -o pgid= "$p" | tr -d ' ')
        [ -n "$g" ] && [ "$g" != "$ours" ] && return 0
    done
    return 1
}
quiet() {
    local waited=0
    while busy && [ "$waited" -lt 600 ]; do
        [ "$waited" -eq 0 ] && echo "(a build or another batchfit run is using the CPU; waiting before timing)" >&2
        sleep 30
        waited=$((waited + 30))
    done
}
