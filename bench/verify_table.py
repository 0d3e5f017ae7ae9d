"""Reads bench/verify_suite.sh's results (OUT/NAME.advise*.json,
OUT/NAME.verify.json) and prints, per data set, the batch each advise run
named, the verify table and verdict, and whether the suite's criteria hold:
the advice held, predicted time relative to the best within 20 % at every
batch that reached the target, the same batch (or the same stated tie:
the batches the recommendation says cannot be told apart, compared by their range)
named every run,
and the recommended batch reached the target in every seed."""

import glob
import json
import os
import sys

TOLERANCE_PCT = 20.0


def load(path):
    """A command's JSON, or None where it failed (an empty file)."""
    try:
        return json.load(open(path))
    except (OSError, json.JSONDecodeError):
        return None


def recommended(advice):
    return [r["recommended_batch"] for r in advice["recommendations"]]


def stated_tie(advice):
    """Each recommendation's tie, ascending (the named batch alone where none)."""
    return [tuple(sorted(r.get("tied_batches") or [r["recommended_batch"]])) for r in advice["recommendations"]]


def tie_range(tie):
    """A tie as the range it states, (smallest, largest): the batches a table holds
    between them vary from run to run (those refined between the powers of two), so two
    runs that both say "anything from 256 to 512" state the same tie whichever of 323 and
    406 their tables happened to hold."""
    return [(t[0], t[-1]) for t in tie]


def steal_pct(out, name):
    """The share of the host's CPU other virtual machines took during the case
    (bench/verify_suite.sh's two /proc/stat readings), or None."""
    try:
        (s0, t0), (s1, t1) = [tuple(map(int, l.split())) for l in open(f"{out}/{name}.steal")][:2]
    except (OSError, ValueError):
        return None
    return 100.0 * (s1 - s0) / (t1 - t0) if t1 > t0 else None


def ratio_noise_pct(row, best):
    """Two standard errors of the measured time relative to the best, from the
    seeds' spread of both (the means of `runs` trainings each), in percent; None
    where a spread is missing. A miss inside it is as much the measurement's as
    the prediction's: the criterion counts it all the same."""
    rel = []
    for r in (row, best):
        if not r or not r.get("seconds_mean") or r.get("seconds_std") is None or not r.get("reached"):
            return None
        rel.append(r["seconds_std"] / r["seconds_mean"] / r["reached"] ** 0.5)
    if row is best:
        return None
    return 200.0 * (rel[0] ** 2 + rel[1] ** 2) ** 0.5


def named_text(batches, tie):
    """`128`, or `128 of {64, 128}` where the recommendation states a tie."""
    return "; ".join(f"{b}" if len(t) <= 1 else f"{b} of {{{', '.join(map(str, t))}}}" for b, t in zip(batches, tie))


def main(out):
    names = sorted({os.path.basename(p).split(".advise")[0] for p in glob.glob(f"{out}/*.advise1.json")})
    failures = []
    for name in names:
        advices = [load(p) for p in sorted(glob.glob(f"{out}/{name}.advise*.json"))]
        advices = [a for a in advices if a]
        if not advices:
            failures.append(f"{name}: advise failed")
            continue
        named = [recommended(a) for a in advices]
        ties = [stated_tie(a) for a in advices]
        first = advices[0]
        basis = first.get("prediction") or {}
        print(f"\n### {name}\n")
        print(f"`advise` named, run by run: {', '.join(named_text(n, t) for n, t in zip(named, ties))}; "
              f"B_noise {basis.get('curve', {}).get('b_noise', float('nan')):.0f}"
              + (f" (refitted by the rate checks; the noise run's {basis['b_noise_run']:.0f})" if basis.get("b_noise_run") else "")
              + f"; data findings: {', '.join(f['code'] for f in (first.get('data_profile') or {}).get('findings', [])) or 'none'}"
              + (f"; steal time during the case {steal:.1f} % of the CPU" if (steal := steal_pct(out, name)) is not None else "")
              + "\n")
        vpath = f"{out}/{name}.verify.json"
        v = (load(vpath) or {}).get("verify")
        if not v:
            failures.append(f"{name}: sweep --verify failed")
            continue
        print("| batch | steps predicted | steps measured | reached | seconds predicted | seconds measured | vs best predicted | vs best measured | error |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        rec = v["verdict"]["recommended"]
        for r in v["rows"]:
            b = f"**{r['batch']}**" if r["batch"] == rec else str(r["batch"])
            steps = f"{r['steps_mean']:.0f} ± {r['steps_std']:.0f}" if r.get("steps_mean") is not None else "-"
            secs = f"{r['seconds_mean']:.3g}" if r.get("seconds_mean") is not None else "-"
            vb = f"{r['vs_best']:.2f}" if r.get("vs_best") is not None else "-"
            err = f"{r['vs_best_error_pct']:+.0f} %" if r.get("vs_best_error_pct") is not None else "-"
            print(f"| {b} | {r['predicted_steps']:.0f} | {steps} | {r['reached']}/{r['runs']} | "
                  f"{r['predicted_seconds']:.3g} | {secs} | {r['predicted_vs_best']:.2f} | {vb} | {err} |")
        print(f"\n{v['verdict']['line']}")
        if not v["verdict"].get("held"):
            failures.append(f"{name}: the advice did not hold ({v['verdict'].get('line_code')})")
        best = min((r for r in v["rows"] if r.get("seconds_mean")), key=lambda r: r["seconds_mean"], default=None)
        for r in v["rows"]:
            e = r.get("vs_best_error_pct")
            if r["reached"] > 0 and e is not None and abs(e) > TOLERANCE_PCT:
                # sweep --verify states it since it computes it; older files: here.
                noise = r["vs_best_noise_pct"] if "vs_best_noise_pct" in r else ratio_noise_pct(r, best)
                failures.append(f"{name}: batch {r['batch']} predicted time relative to the best off by {e:+.0f} %"
                                + (f" (the seeds' noise on the measured ratio: ±{noise:.0f} %, two standard errors)" if noise else ""))
            if r["batch"] == rec and r["reached"] < r["runs"]:
                failures.append(f"{name}: the recommended batch {rec} reached the target in {r['reached']} of {r['runs']} seeds")
        if any(n != named[0] for n in named) and any(tie_range(t) != tie_range(ties[0]) for t in ties):
            failures.append(f"{name}: advise named {named} (ties {ties}) over {len(named)} runs")
    print("\n### Criteria\n")
    print("\n".join(f"- {f}" for f in failures) if failures else "- every criterion held")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "target/verify")
