"""A Keras training script that speaks batchfit's step protocol through a callback.

    batchfit run -- python examples/run_keras.py --batch-size {batch} --steps 30

Keras' own mnist_mlp (784-512-512-10) on random data; replace the model and
data with yours and keep `BatchfitSteps` in `callbacks=`. TensorFlow's
out-of-memory (ResourceExhaustedError) is recognised by batchfit.
"""
import argparse
import json
import time

import numpy as np
import keras


class BatchfitSteps(keras.callbacks.Callback):
    """Prints one `BATCHFIT {...}` line per training step."""

    def __init__(self, batch_size):
        super().__init__()
        self.batch_size = batch_size

    def on_train_batch_begin(self, batch, logs=None):
        self.t0 = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        # Keras has finished the step (and read the loss back) here.
        seconds = time.perf_counter() - self.t0
        print("BATCHFIT " + json.dumps(
            {"step": batch + 1, "samples": self.batch_size, "seconds": seconds}), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--steps", type=int, default=30)
    a = p.parse_args()
    model = keras.Sequential([
        keras.Input((784,)),
        keras.layers.Dense(512, activation="relu"), keras.layers.Dropout(0.2),
        keras.layers.Dense(512, activation="relu"), keras.layers.Dropout(0.2),
        keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(optimizer="rmsprop", loss="sparse_categorical_crossentropy")
    n = a.batch_size * a.steps
    x = np.random.rand(n, 784).astype("float32")
    y = np.random.randint(0, 10, size=n)
    model.fit(x, y, batch_size=a.batch_size, epochs=1, verbose=0,
              callbacks=[BatchfitSteps(a.batch_size)])


if __name__ == "__main__":
    main()
