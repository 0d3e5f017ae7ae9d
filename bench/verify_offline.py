"""Offline readings of bench/verify_suite.sh's results (OUT/NAME.advise1.json,
OUT/NAME.verify.json) and bench/unseen_data.sh's (OUT/NAME.advise.json): how
the suite's criterion (time relative to the best within 20 % at every batch)
would have come out had `advise` read its own measurements another way. Nothing is rerun; each reading rebuilds the
predicted time at the verified batches from the first advice's files.

  python3 bench/verify_offline.py OUT [OUT ...]           # the suite's or unseen_data.sh's OUT
  python3 bench/verify_offline.py --steps [-v] OUT [OUT ...]

With --steps: predicted over measured updates at every verified batch, the
advice's S(B) against each refitted reading below (gated, refit_linear,
refit_adam), on the runs each changes (-v: run by run; the spread, largest
over smallest ratio, is what time relative to the best rests on).

Readings of one update's step (gathering the batch, read from the advice's
own prediction, is kept as it was):
  global    the 10th-percentile step x the geometric mean over the device's
            batches of mean / 10th percentile (what `advise` does)
  global_iso  the same, made non-decreasing in the batch by a least-squares
            (isotonic) fit in log instead of each batch taking the least time
            of any larger one
  regress   that ratio fitted against the step's length (log-log line)
  local5    that ratio averaged over the batch and two neighbours each side
  own_mean  each batch's own mean
Readings of the steps:
  model     the advice's S(B) (what `advise` does)
  checked   S(B) times the rate checks' misses (log measured / predicted at
            each checked batch), shrunk by the checks' seed noise against
            their spread and interpolated in log batch between them
            (flat beyond the outermost checks)
  checked_inner  the same, with no correction outside the checked batches
  refit_linear  B_noise refitted to every check through the reference, S(B) as `advise` has it
  refit_adam    the same with Adam's finite-data term, (B_noise / B) sqrt(1 - B/N)
  capped    B_noise refitted to the checks up to the rate's cap alone (S(B)
            through the reference check), and past the cap S(B) times the
            geometric mean of the capped checks' measured / predicted
  held      B_noise refitted to every check, S(B) up to the cap and past it
            SGD's updates at a fixed rate (McCandlish et al. 2018, eq. 2.6-2.7:
            S_min / (2x - x^2 (1 + B_noise / B)), x the cap's rate over the
            best rate, 1 / (1 + B_noise / B_cap))
  free      S_min and B_noise both fitted to every check, the reference
            included (none drawn through the reference)
  gated     the model's S(B) where its misses at the checks are within the
            checks' seed noise (chi-square at 95 %, each check's variance the
            seeds' pooled log variance over its seeds, plus the reference's)
            or the checks span less than MIN_SPAN (8), else the free fit
            (the rule of commit 7dae890, reverted: bench/README.md)
Prints, per reading, the runs within 20 % at every batch and each run's worst
error."""

import glob
import json
import math
import os
import sys

TOLERANCE_PCT = 20.0
# The B_noise values a refit tries: 1 to about 3.3e6, 0.5 % apart in log.
B_NOISE_GRID = [math.exp(0.005 * i) for i in range(1, 3000)]


def non_decreasing(times):
    """`non_decreasing_in_batch` of crates/tune/src/probe.rs, on times in batch order."""
    out, least = list(times), float("inf")
    for i in range(len(out) - 1, -1, -1):
        least = min(least, out[i])
        out[i] = least
    return out


def isotonic(times):
    """The least-squares non-decreasing fit in log (pool adjacent violators), on times in batch order."""
    blocks = []  # [mean log, count]
    for t in times:
        blocks.append([math.log(t), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, n2), (m1, n1) = blocks[-2], blocks[-1]
            blocks[-2:] = [[(m2 * n2 + m1 * n1) / (n1 + n2), n1 + n2]]
    return [math.exp(m) for m, n in blocks for _ in range(n)]


def step_readings(points):
    """Batches in order, and each reading's step time there (without gathering)."""
    pts = sorted(
        (p for p in points if p.get("failure") is None and p.get("step_time_p10_s") and p.get("step_time_mean_s")),
        key=lambda p: p["batch"],
    )
    batches = [p["batch"] for p in pts]
    p10 = [p["step_time_p10_s"] for p in pts]
    ratio = [math.log(max(p["step_time_mean_s"] / p["step_time_p10_s"], 1.0)) for p in pts]
    mean_ratio = sum(ratio) / len(ratio)
    xs = [math.log(q) for q in p10]
    mx = sum(xs) / len(xs)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - mean_ratio) for x, y in zip(xs, ratio)) / sxx if sxx > 0 else 0.0
    local = [sum(ratio[max(0, i - 2) : i + 3]) / len(ratio[max(0, i - 2) : i + 3]) for i in range(len(pts))]
    readings = {
        "global": [q * math.exp(max(mean_ratio, 0.0)) for q in p10],
        "regress": [q * math.exp(max(0.0, mean_ratio + slope * (x - mx))) for q, x in zip(p10, xs)],
        "local5": [q * math.exp(r) for q, r in zip(p10, local)],
        "own_mean": [p["step_time_mean_s"] for p in pts],
    }
    monotone = {k: non_decreasing(v) for k, v in readings.items()}
    monotone["global_iso"] = isotonic(readings["global"])
    return batches, monotone


def checked_correction(advice, extrapolate=True):
    """log(measured / predicted) of the rate checks, shrunk and interpolated: a function of the batch.
    Without `extrapolate`, none outside the checked batches' range."""
    table = {r["micro_batch"]: r["steps"] for r in advice["time_to_target"] if r.get("accumulation", 1) == 1}
    seen, misses = set(), []
    for c in advice.get("rate_checks", []):
        b = c["batch"]
        if b in seen or not c.get("rule_rate") or c.get("steps_to_target") is None or b not in table:
            continue
        if c["verdict"] not in ("trains", "no_gain"):
            continue
        seen.add(b)
        n, m = c.get("seeds", 1), c["steps_to_target"]
        noise = (c.get("steps_sd") or 0.0) / math.sqrt(n) / m if n > 1 else 0.5
        misses.append((math.log(b), math.log(m / table[b]), noise**2))
    if len(misses) < 2:
        return lambda b: 0.0
    misses.sort()
    spread = max(0.0, sum(r * r for _, r, _ in misses) / len(misses) - sum(v for *_, v in misses) / len(misses))
    xs = [x for x, _, _ in misses]
    ys = [r * spread / (spread + v) if spread + v > 0 else 0.0 for _, r, v in misses]

    def at(b):
        x = math.log(b)
        if not extrapolate and (x < xs[0] or x > xs[-1]):
            return 0.0
        if x <= xs[0]:
            return ys[0]
        if x >= xs[-1]:
            return ys[-1]
        i = max(j for j in range(len(xs) - 1) if xs[j] <= x)
        return ys[i] + (x - xs[i]) / (xs[i + 1] - xs[i]) * (ys[i + 1] - ys[i])

    return at


def refit_parts(advice):
    """What a refit of S(B) needs from the advice, or None: the run's batch, the
    reference's updates, the cap, the finite data's noise batch, S(B)'s shape
    (1 + B_noise / B) and each checked batch's updates at its advised rate
    (else the first rate that trained there)."""
    pred = advice["prediction"]
    curve, lr = pred.get("curve"), pred["lr"]
    if not curve:
        return None
    rows, run, cap = curve["rows"], pred["run_batch"], lr.get("cap_batch")

    def noise_batch(b):
        return b * rows / (rows - b) if b < rows else float("inf")

    def optimal(b, b_noise):
        return 1.0 + b_noise / noise_batch(b)

    s_ref = pred.get("reference_updates") or curve["s_min"] * optimal(run, curve["b_noise"])
    scale = {"sqrt": lambda b: math.sqrt(b / lr["ref_batch"]), "linear": lambda b: b / lr["ref_batch"]}
    rate_at = scale.get(lr["rule"], lambda b: 1.0)
    measured = {}
    for c in advice.get("rate_checks", []):
        b = c["batch"]
        if b == run or c["verdict"] != "trains" or c.get("steps_to_target") is None:
            continue
        rate = lr["ref_lr"] * rate_at(min(b, cap) if cap else b)
        if abs(c["lr"] - rate) <= 1e-6 * rate or b not in measured:
            measured[b] = c["steps_to_target"]
    return run, s_ref, cap, noise_batch, optimal, measured


def refit(points, run, s_ref, shape):
    """S(B) through the reference with the B_noise (a log grid) whose `shape` fits `points` best in log."""

    def curve(b_noise):
        return lambda b: s_ref * shape(b, b_noise) / shape(run, b_noise)

    b_noise = min(B_NOISE_GRID, key=lambda bn: sum((math.log(m) - math.log(curve(bn)(b))) ** 2 for b, m in points))
    return curve(b_noise)


def held_curve(advice):
    """S(B) up to the cap and the fixed-rate updates past it, B_noise refitted to every check."""
    parts = refit_parts(advice)
    if not parts or not parts[2] or not parts[5]:
        return None
    run, s_ref, cap, noise_batch, optimal, measured = parts

    def held(b, b_noise):
        if b <= cap:
            return optimal(b, b_noise)
        x = 1.0 / optimal(cap, b_noise)
        return 1.0 / (2.0 * x - x * x * optimal(b, b_noise))

    return refit(list(measured.items()), run, s_ref, held)


def capped_curve(advice):
    """S(B) with B_noise refitted to the checks up to the cap, times the capped checks' mean miss past it."""
    parts = refit_parts(advice)
    if not parts or not parts[2]:
        return None
    run, s_ref, cap, _, optimal, measured = parts
    below = [(b, m) for b, m in measured.items() if b <= cap]
    above = [(b, m) for b, m in measured.items() if b > cap]
    if not below:
        return None
    fitted = refit(below, run, s_ref, optimal)
    miss = math.exp(sum(math.log(m / fitted(b)) for b, m in above) / len(above)) if above else 1.0
    return lambda b: fitted(b) * (miss if b > cap else 1.0)


def free_curve(advice):
    """S(B) with S_min and B_noise both fitted to every check, the reference included, where
    three batches or more reached the target."""
    parts = refit_parts(advice)
    if not parts:
        return None
    run, s_ref, _, _, optimal, measured = parts
    points = list(measured.items()) + [(run, s_ref)]
    if len(points) < 3:
        return None

    def misfit(b_noise):
        logs = [math.log(m / optimal(b, b_noise)) for b, m in points]
        mean = sum(logs) / len(logs)
        return sum((x - mean) ** 2 for x in logs), math.exp(mean)

    b_noise = min(B_NOISE_GRID, key=lambda bn: misfit(bn)[0])
    s_min = misfit(b_noise)[1]
    return lambda b: s_min * optimal(b, b_noise)


def fpc_curve(advice, adaptive):
    """S(B) refitted to every check through the reference, the finite data's noise term
    B_noise (1/B - 1/N) (`adaptive` False, as `advise` has it) or, for Adam's step, whose
    noise enters through its standard deviation, (B_noise / B) sqrt(1 - B/N)."""
    parts = refit_parts(advice)
    if not parts or not parts[5]:
        return None
    run, s_ref, _, noise_batch, optimal, measured = parts
    rows = advice["prediction"]["curve"]["rows"]

    def shape(b, b_noise):
        if not adaptive or not rows:
            return optimal(b, b_noise)
        return 1.0 + b_noise / b * math.sqrt(max(0.0, 1.0 - b / rows))

    return refit(list(measured.items()), run, s_ref, shape)


MIN_SPAN = 8.0


def chi_square_95(dof):
    """The 95th percentile of chi-square (Wilson and Hilferty's cube-root normal approximation)."""
    a = 2.0 / (9.0 * dof)
    return dof * (1.0 - a + 1.644854 * math.sqrt(a)) ** 3


def gated_curve(advice):
    """The free fit where the model's S(B) misses its checks by more than their seeds' noise
    and the checks span MIN_SPAN, else None (the rule of commit 7dae890, reverted)."""
    parts = refit_parts(advice)
    if not parts:
        return None
    run, measured = parts[0], parts[5]
    table = {r["micro_batch"]: r["steps"] for r in advice["time_to_target"] if r.get("accumulation", 1) == 1}
    checks = advice.get("rate_checks", [])
    spread = [c for c in checks if c.get("seeds", 1) > 1 and c.get("steps_sd") is not None and c.get("steps_to_target")]
    dof = sum(c["seeds"] - 1 for c in spread)
    pooled = sum((c["seeds"] - 1) * (c["steps_sd"] / c["steps_to_target"]) ** 2 for c in spread) / dof if dof else 0.0
    ref = next((c for c in checks if c["batch"] == run and c.get("rule_rate") and c.get("steps_to_target")), None)
    batches = list(measured) + [run]
    if pooled <= 0.0 or not ref or len(measured) < 3 or max(batches) / min(batches) < MIN_SPAN:
        return None
    chi2 = 0.0
    for b, m in measured.items():
        seeds = next(c.get("seeds", 1) for c in checks if c["batch"] == b and c.get("steps_to_target") == m)
        chi2 += math.log(m / table[b]) ** 2 / (pooled / seeds + pooled / ref.get("seeds", 1))
    return free_curve(advice) if chi2 > chi_square_95(len(measured) - 1) else None


def runs_of(out):
    """(label, advice, verify) of every run under OUT: the suite's NAME.advise1.json
    and unseen_data.sh's NAME.advise.json, each beside its NAME.verify.json."""
    found = []
    for path in sorted(glob.glob(f"{out}/*.advise1.json")) + sorted(glob.glob(f"{out}/*.advise.json")):
        stem = path.rsplit(".advise", 1)[0]
        try:
            advice = json.load(open(path))
            verify = json.load(open(f"{stem}.verify.json"))["verify"]
        except (OSError, json.JSONDecodeError, KeyError, TypeError):
            continue
        found.append((f"{os.path.basename(out)}/{os.path.basename(stem)}", advice, verify))
    return found


STEPS_READINGS = {
    "gated": gated_curve,
    "refit_linear": lambda a: fpc_curve(a, False),
    "refit_adam": lambda a: fpc_curve(a, True),
}


def steps_report(outs):
    """Predicted over measured updates at every verified batch that reached the target, the
    advice's S(B) against each refitted reading, on the runs that reading changes."""
    runs = [r for out in outs for r in runs_of(out)]
    for name, build in STEPS_READINGS.items():
        within = {"model": 0, name: 0}
        changed, better, worse, batches = 0, 0, 0, 0
        totals = {"model": 0.0, name: 0.0}
        for label, advice, verify in runs:
            rows = [r for r in verify["rows"] if r.get("predicted_steps") and r.get("steps_mean") and r.get("reached") == r.get("runs")]
            if not rows:
                continue
            curve = build(advice)
            ratios = {
                "model": [r["predicted_steps"] / r["steps_mean"] for r in rows],
                name: [(curve(r["batch"]) if curve else r["predicted_steps"]) / r["steps_mean"] for r in rows],
            }
            batches += len(rows)
            for k, xs in ratios.items():
                within[k] += sum(abs(x - 1.0) <= TOLERANCE_PCT / 100.0 for x in xs)
            if not curve:
                continue
            changed += 1
            worst = {k: 100.0 * max(abs(x - 1.0) for x in xs) for k, xs in ratios.items()}
            shape = {k: 100.0 * (max(xs) / min(xs) - 1.0) for k, xs in ratios.items()}
            for k in totals:
                totals[k] += shape[k]
            better += worst[name] < worst["model"] - 1.0
            worse += worst[name] > worst["model"] + 1.0
            if "-v" in sys.argv:
                print(
                    f"  {label}: worst steps error {worst['model']:.0f} -> {worst[name]:.0f} %, "
                    f"spread of predicted / measured {shape['model']:.0f} -> {shape[name]:.0f} %"
                )
        print(f"{name}: batches with steps within {TOLERANCE_PCT:.0f} %: model {within['model']}, {name} {within[name]}, of {batches}")
        if changed:
            print(
                f"  runs it changes: {changed}; worst steps error better on {better}, worse on {worse}; "
                f"mean spread model {totals['model'] / changed:.1f} %, {name} {totals[name] / changed:.1f} %"
            )


def worst_error(advice, verify, step_reading, steps_reading):
    """The run's worst error of time relative to the best (percent) and its batch, or None."""
    if not advice.get("devices") or not advice.get("prediction"):
        return None
    batches, steps_at = step_readings(advice["devices"][0]["points"])
    correct = {
        "checked": lambda: checked_correction(advice),
        "checked_inner": lambda: checked_correction(advice, extrapolate=False),
    }.get(steps_reading, lambda: (lambda b: 0.0))()
    capped = {
        "capped": capped_curve,
        "held": held_curve,
        "free": free_curve,
        "gated": gated_curve,
        "refit_linear": lambda a: fpc_curve(a, False),
        "refit_adam": lambda a: fpc_curve(a, True),
    }.get(steps_reading, lambda a: None)(advice)
    predicted, measured = {}, {}
    for r in verify["rows"]:
        if not r.get("predicted_steps"):
            continue
        b = r["batch"]
        step = r["predicted_seconds"] / r["predicted_steps"]
        if b in batches:
            i = batches.index(b)
            step += steps_at[step_reading][i] - steps_at["global"][i]
        steps = capped(b) if capped else r["predicted_steps"] * math.exp(correct(b))
        predicted[b] = steps * step
        if r.get("seconds_mean") and r.get("reached") == r.get("runs"):
            measured[b] = r["seconds_mean"]
    if not measured:
        return None
    best_p, best_m = min(predicted[b] for b in measured), min(measured.values())
    errors = {b: 100.0 * ((predicted[b] / best_p) / (measured[b] / best_m) - 1.0) for b in measured}
    b = max(errors, key=lambda k: abs(errors[k]))
    return errors[b], b


def main(outs):
    runs = [r for out in outs for r in runs_of(out)]
    for steps_reading in ("model", "checked", "checked_inner", "refit_linear", "refit_adam", "capped", "held", "free", "gated"):
        for step_reading in ("global", "global_iso", "regress", "local5", "own_mean"):
            if steps_reading != "model" and step_reading != "global":
                continue
            results = [(label, worst_error(advice, verify, step_reading, steps_reading)) for label, advice, verify in runs]
            results = [(n, w) for n, w in results if w]
            within = sum(abs(w[0]) <= TOLERANCE_PCT for _, w in results)
            print(f"steps {steps_reading}, step {step_reading}: {within} of {len(results)} within {TOLERANCE_PCT:.0f} %")
            print("  " + "; ".join(f"{n} {w[0]:+.0f} % at {w[1]}" for n, w in results))


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1:] == ["--steps"]:
        sys.exit(__doc__)
    if sys.argv[1] == "--steps":
        steps_report([a for a in sys.argv[2:] if a != "-v"])
    else:
        main(sys.argv[1:])
