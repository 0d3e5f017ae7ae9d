"""The labelled CSV the noise examples train on, read as batchfit's CSV reader
reads it: numbers only, an optional header row, the label in the last column;
gzip-compressed when the file starts with gzip's magic bytes."""
import csv
import gzip
import io

import numpy as np


def read_csv(path):
    raw = open(path, "rb").read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    rows = []
    for i, rec in enumerate(csv.reader(io.StringIO(raw.decode("utf-8")))):
        if not rec:
            continue
        try:
            rows.append([float(f) for f in rec])
        except ValueError:
            if i == 0:
                continue  # a header
            raise SystemExit("%s: row %d: a field is not a number" % (path, i + 1))
    if not rows:
        raise SystemExit("%s: no data rows" % path)
    a = np.asarray(rows, dtype=np.float32)
    return a[:, :-1], a[:, -1].astype(np.int64)
