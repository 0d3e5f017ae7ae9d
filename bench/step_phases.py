#!/usr/bin/env python3
"""How far one batch's step time moves between processes, by timing window.

Runs the probe's own worker (`batchfit __measure-worker`) PROCS times at one
batch, each timing STEPS steps, and prints each process's mean step time over
its first 0.25, 0.5, 1 and 2 s of timed steps, with their coefficient of
variation between processes: what `--min-time` buys on this machine
(docs/time-to-target.md, "Why one batch's time moves on a shared VM").

    python3 bench/step_phases.py [MODEL] [BATCH] [STEPS] [PROCS]
    python3 bench/step_phases.py zoo:digits-mlp 256 6000 8

Needs a release build (target/release/batchfit, or BATCHFIT=...).
"""
import json
import os
import statistics
import subprocess
import sys

WINDOWS_S = (0.25, 0.5, 1.0, 2.0)


def main():
    model = sys.argv[1] if len(sys.argv) > 1 else "zoo:digits-mlp"
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 256
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 6000
    procs = int(sys.argv[4]) if len(sys.argv) > 4 else 8
    binary = os.environ.get("BATCHFIT", "target/release/batchfit")
    request = {
        "model": model, "loss": None, "device": "cpu", "batch": batch,
        "optimizer": "adam", "lr": 1e-3, "seq_len": 1, "seed": 0, "warmup": 3,
        "min_steps": steps, "min_time_s": 0.0, "max_steps": steps,
        "time_cap_s": 1e9, "target_rel_err": 0.0, "memory_limit": None,
        "threads": None,
    }
    means = {w: [] for w in WINDOWS_S}
    for _ in range(procs):
        out = subprocess.run([binary, "__measure-worker", json.dumps(request)],
                             capture_output=True, text=True, check=False)
        answer = [l for l in out.stdout.splitlines() if l.startswith("BATCHFIT_WORKER ")]
        if not answer:
            sys.exit(f"the worker gave no answer: {out.stderr.strip()[-500:]}")
        times = json.loads(answer[0].split(" ", 1)[1])["Measured"]["step_times_s"]
        for w in WINDOWS_S:
            total, n = 0.0, 0
            for t in times:
                total, n = total + t, n + 1
                if total >= w:
                    break
            means[w].append(total / n)
    for w, m in means.items():
        cv = 100 * statistics.pstdev(m) / statistics.mean(m)
        shown = " ".join(f"{1e6 * x:.0f}" for x in m)
        print(f"first {w:.2f} s: per-process mean step (us) {shown}; spread {cv:.1f} %")


if __name__ == "__main__":
    main()
