"""Training time with and without batchfit's noise helper (batchfit.torch.NoiseProbe).

    python bench/noise_overhead.py [--batches 32,128,512] [--steps 400] [--rounds 3] [--every N] [--threads N]

Model: zoo:mnist-mlp (784-512-512-10, ReLU, dropout 0.2), Adam lr 1e-3,
cross-entropy, fp32, on CPU with all cores; random 0..1 features and labels
(a pool of 8 batches, cycled). Three loops, run back to back in alternating
order for `--rounds` rounds at each batch size:

* plain: zero_grad, forward, loss, backward, optimizer.step(), loss.item(), and
  the basic `BATCHFIT` line (docs/run.md) printed to /dev/null;
* helper, every=0: NoiseProbe.step, never measuring (the helper's own cost);
* helper at the default rate: adaptive, measurements spaced to cost at most
  about 3.5 % (batchfit.core.DEFAULT_BUDGET, batchfit.core.Schedule); `--every N` times a fixed rate instead.

Prints per batch: median ms per step of each loop, the overhead of the helper
at the default rate over plain (median over rounds of the paired ratio), and
the number of measuring steps, and the cost of one measuring step in plain
steps (`c`, from the helper's own timings of measuring and ordinary steps), from
which the overhead at a fixed rate 1/every would be (c - 1) / every. PyTorch is not a dependency of batchfit; see
bench/noise_overhead.sh.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from batchfit import core  # noqa: E402
from batchfit.torch import NoiseProbe  # noqa: E402


class Lines(object):
    """Collects the helper's lines (parsing them is not timed in the loop)."""

    def __init__(self):
        self.lines = []

    def write(self, s):
        if s.strip():
            self.lines.append(s)

    def flush(self):
        pass


def make():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(784, 512), nn.ReLU(), nn.Dropout(0.2),
        nn.Linear(512, 512), nn.ReLU(), nn.Dropout(0.2),
        nn.Linear(512, 10))
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def pool(batch):
    g = torch.Generator().manual_seed(batch)
    return [(torch.rand(batch, 784, generator=g), torch.randint(0, 10, (batch,), generator=g))
            for _ in range(8)]


def run_plain(data, steps, devnull):
    model, opt = make()
    loss_fn = nn.CrossEntropyLoss()
    t_start = time.perf_counter()
    for s in range(steps):
        t0 = time.perf_counter()
        x, y = data[s % len(data)]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        loss_f = loss.item()
        devnull.write("BATCHFIT " + json.dumps(
            {"step": s + 1, "samples": len(x), "seconds": time.perf_counter() - t0, "loss": loss_f}) + "\n")
        devnull.flush()
    return time.perf_counter() - t_start, None


def run_helper(data, steps, every):
    model, opt = make()
    loss_fn = nn.CrossEntropyLoss()
    out = Lines()
    probe = NoiseProbe(model, opt, every=every, file=out)
    t_start = time.perf_counter()
    for s in range(steps):
        x, y = data[s % len(data)]
        probe.step(lambda xb, yb: loss_fn(model(xb), yb), x, y)
    total = time.perf_counter() - t_start
    recs = [json.loads(t[len(core.PREFIX):]) for t in out.lines]
    return total, recs


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batches", default="32,128,512")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--every", type=int, default=None, help="fixed rate (default: adaptive)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    devnull = open(os.devnull, "w")
    rate = "adaptive (budget %g %%)" % (100 * core.DEFAULT_BUDGET) if a.every is None else "every=%d" % a.every
    print("torch %s, %d threads, rate %s, k=%d, %d steps x %d rounds"
          % (torch.__version__, torch.get_num_threads(), rate, core.DEFAULT_K, a.steps, a.rounds))
    print("%6s %10s %12s %12s %10s %9s %8s" % (
        "batch", "plain ms", "every=0 ms", "default ms", "overhead", "measured", "c"))
    for batch in [int(b) for b in a.batches.split(",")]:
        data = pool(batch)
        run_plain(data, 10, devnull)  # warm-up (allocator, threads)
        run_helper(data, 10, a.every)
        plain, off, on, ratios, costs, counts = [], [], [], [], [], []
        for r in range(a.rounds):
            order = ["plain", "off", "on"] if r % 2 == 0 else ["on", "off", "plain"]
            t = {}
            for which in order:
                if which == "plain":
                    t[which], _ = run_plain(data, a.steps, devnull)
                elif which == "off":
                    t[which], _ = run_helper(data, a.steps, 0)
                else:
                    t[which], recs = run_helper(data, a.steps, a.every)
                    meas = [x["seconds"] for x in recs if "noise" in x]
                    counts.append(len(meas))
                    ordinary = [x["seconds"] for x in recs[5:] if "noise" not in x]
                    costs.append(statistics.median(meas) / statistics.median(ordinary))
            plain.append(t["plain"])
            off.append(t["off"])
            on.append(t["on"])
            ratios.append(t["on"] / t["plain"] - 1.0)
        c = statistics.median(costs)
        ms = lambda ts: 1000.0 * statistics.median(ts) / a.steps  # noqa: E731
        print("%6d %10.2f %12.2f %12.2f %9.1f%% %9s %8.2f" % (
            batch, ms(plain), ms(off), ms(on), 100.0 * statistics.median(ratios),
            "/".join(str(n) for n in counts), c), flush=True)
    print("overhead: median over rounds of (time with the helper at the default rate) / (plain time) - 1;")
    print("measured: measuring steps per run, each round; c: a measuring step's median time over an ordinary step's")


if __name__ == "__main__":
    main()
