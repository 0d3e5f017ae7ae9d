"""Reads bench/unseen_data.sh's results (OUT/NAME.{raw,standardized}.advise.json,
.verify.json and their .err files) and prints the slice's table, raw beside
standardised: how many sets advise refused, how many noise runs learned
nothing (sweep --verify then refuses, saying to scale the inputs), how many
checked advices held, how many had every batch within 20 % (the predicted
time relative to the best against the measured), how many of those over 20 %
were beyond the seeds' noise on the measured ratio, and how many batches'
predicted steps were within 20 %; then each error over 20 % and each advice
that did not hold.

  python3 bench/unseen_table.py OUT
"""

import glob
import os
import sys

from verify_table import TOLERANCE_PCT, load

HOWS = ("raw", "standardized")


def text(path):
    try:
        return open(path).read()
    except OSError:
        return ""


def summarize(out, how):
    s = {"refused": 0, "nothing": 0, "checked": 0, "held": 0, "within": 0, "over": 0,
         "beyond": 0, "steps_within": 0, "steps": 0, "notes": []}
    for adv in sorted(glob.glob(f"{out}/*.{how}.advise.json")):
        run = adv[: -len(".advise.json")]
        name = os.path.basename(run)
        if load(adv) is None:
            s["refused"] += 1
            s["notes"].append(f"{name}: advise refused: {text(run + '.advise.err').strip().splitlines()[-1:]}")
            continue
        v = (load(run + ".verify.json") or {}).get("verify")
        if v is None:
            if "learned nothing" in text(run + ".verify.err"):
                s["nothing"] += 1
            else:
                s["notes"].append(f"{name}: sweep --verify failed: {text(run + '.verify.err').strip().splitlines()[-1:]}")
            continue
        s["checked"] += 1
        if v["verdict"].get("held"):
            s["held"] += 1
        else:
            s["notes"].append(f"{name}: did not hold: {v['verdict']['line']}")
        misses = []
        for r in v["rows"]:
            e = r.get("vs_best_error_pct")
            if r["reached"] > 0 and e is not None and abs(e) > TOLERANCE_PCT:
                misses.append((r["batch"], e, r.get("vs_best_noise_pct")))
            if r.get("steps_mean"):
                s["steps"] += 1
                s["steps_within"] += abs(r["predicted_steps"] / r["steps_mean"] - 1) * 100 <= TOLERANCE_PCT
        if misses:
            s["over"] += 1
            s["beyond"] += any(n is not None and abs(e) > n for _, e, n in misses)
            s["notes"].append(f"{name}: " + ", ".join(
                f"{e:+.0f} % at {b}" + (f" (noise ±{n:.0f} %)" if n is not None else "") for b, e, n in misses))
        else:
            s["within"] += 1
    return s


def main(out):
    sums = {how: summarize(out, how) for how in HOWS}
    rows = [
        ("refused before measuring", lambda s: f"{s['refused']}"),
        ("learned nothing (refused with \"--standardize\")", lambda s: f"{s['nothing']}"),
        ("held", lambda s: f"{s['held']} of {s['checked']}"),
        ("every batch within 20 %", lambda s: f"{s['within']} of {s['checked']}"),
        ("errors over 20 %, beyond the seeds' noise", lambda s: f"{s['beyond']} of {s['over']}"),
        ("steps within 20 % (batches)", lambda s: f"{s['steps_within']} of {s['steps']}"),
    ]
    print("| | raw | standardised |")
    print("| --- | ---: | ---: |")
    for label, cell in rows:
        print(f"| {label} | {cell(sums['raw'])} | {cell(sums['standardized'])} |")
    for how in HOWS:
        for note in sums[how]["notes"]:
            print(f"- {how}: {note}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "target/unseen")
