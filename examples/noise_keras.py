"""A Keras training script that reports step times and gradient noise to batchfit.

    pip install ./python          # the batchfit helper (no dependencies)
    batchfit run -- python examples/noise_keras.py --data train.csv --batch-size {batch} --steps 200

Keras 3 with the TensorFlow backend. The data: a CSV in MNIST's layout, one
sample a row, the features in every column but the last and the integer label
(0-9) in the last; a header row is optional; `.csv.gz` is read too. The
features are used **as written**, as batchfit's CSV reader (`--data FILE.csv`)
takes them: scale them in the file if your model wants that.

The model is batchfit's `zoo:mnist-mlp` (784-512-512-10, ReLU, dropout 0.2
after each hidden layer) for 784 feature columns, or `zoo:digits-mlp`
(64-128-64-10, ReLU) for 64; Adam (--lr, default 1e-3), cross-entropy on logits.

The lines marked `# batchfit` are all it takes: wrap the model in `NoiseModel`,
compile and fit the wrapper, and pass the `BatchfitLines` callback, which prints
`BATCHFIT {"step", "samples", "seconds", "loss"}` per step, with `"train_loss"`
(the loss on 1,024 fixed training rows in inference mode) every few steps and
`"noise"` on measuring steps (adaptive, about 3.5 % of the time, by default; `--every`).
"""
import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from labelled_csv import read_csv  # noqa: E402  (beside this script)

try:
    from batchfit.keras import BatchfitLines, NoiseModel  # batchfit
except ImportError:  # run from a checkout without `pip install ./python`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    from batchfit.keras import BatchfitLines, NoiseModel


def make_model(features):
    if features == 784:  # zoo:mnist-mlp
        return keras.Sequential([
            keras.Input((784,)),
            keras.layers.Dense(512, activation="relu"), keras.layers.Dropout(0.2),
            keras.layers.Dense(512, activation="relu"), keras.layers.Dropout(0.2),
            keras.layers.Dense(10),
        ])
    if features == 64:  # zoo:digits-mlp
        return keras.Sequential([
            keras.Input((64,)),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ])
    raise SystemExit("expected 784 (MNIST) or 64 (8x8 digits) feature columns, got %d" % features)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="CSV: features then the label in the last column")
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate ({lr} under batchfit run --ref-lr)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="cpu hides the GPUs from TensorFlow; cuda uses the first")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--every", type=int, default=None, help="measure every N steps (default adaptive; 0: never)")
    p.add_argument("--k", type=int, default=None, help="micro-batches per measurement (default 8)")
    p.add_argument("--b-small", type=int, default=None, help="samples per micro-batch (default batch / k)")
    a = p.parse_args()
    if a.device == "cpu":
        tf.config.set_visible_devices([], "GPU")
    keras.utils.set_random_seed(a.seed)

    x, y = read_csv(a.data)
    if a.batch_size > len(x):
        raise SystemExit("--batch-size %d exceeds the %d rows of %s" % (a.batch_size, len(x), a.data))
    data = (tf.data.Dataset.from_tensor_slices((x, y))
            .shuffle(len(x), seed=a.seed, reshuffle_each_iteration=True)
            .batch(a.batch_size, drop_remainder=True)
            .repeat())
    model = NoiseModel(make_model(x.shape[1]), k=a.k, b_small=a.b_small)  # batchfit
    model.compile(optimizer=keras.optimizers.Adam(a.lr),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    # 1,024 training rows spread over the file, the same for every batch and
    # seed: the callback reports their loss in inference mode as `train_loss`.
    fixed = np.linspace(0, len(x) - 1, min(len(x), 1024)).astype(np.int64)
    model.fit(data, epochs=1, steps_per_epoch=a.steps, verbose=0, shuffle=False,
              callbacks=[BatchfitLines(every=a.every, fixed_rows=(x[fixed], y[fixed]),  # batchfit
                                       rows=len(x))])


if __name__ == "__main__":
    main()
