"""A PyTorch training script that reports step times and gradient noise to batchfit.

    pip install ./python          # the batchfit helper (no dependencies)
    batchfit run -- python examples/noise_pytorch.py --data train.csv --batch-size {batch} --steps 200
    # each trial at the rate square-root scaling gives its batch, from 1e-3 at batch 32:
    batchfit run --ref-lr 1e-3 --ref-batch 32 -- python examples/noise_pytorch.py \
        --data train.csv --batch-size {batch} --lr {lr} --steps 200

The data: a CSV in MNIST's layout, one sample a row, the features in every
column but the last and the integer label (0-9) in the last; a header row is
optional (skipped when the first row does not parse as numbers); `.csv.gz` is
read too. The features are used **as written**, as batchfit's CSV reader
(`--data FILE.csv`) takes them: scale them in the file (0..1 pixels, say) if
your model wants that. (batchfit's `builtin:digits` is the exception: it
divides the 0..16 pixels by 16.)

The model is batchfit's `zoo:mnist-mlp` (784-512-512-10, ReLU, dropout 0.2
after each hidden layer) for 784 feature columns, or `zoo:digits-mlp`
(64-128-64-10, ReLU) for 64; with `--model cnn`, `zoo:mnist-cnn` (28x28) or
`examples/digits-cnn.toml` (8x8), the row's pixels read as one image; Adam,
lr 1e-3 (`--lr`), cross-entropy.

The three lines marked `# batchfit` are all a loop needs: `probe.step` does
zero_grad, forward, backward and optimizer.step(), and prints
`BATCHFIT {"step", "samples", "seconds", "loss"}`, with `"train_loss"` (the loss
on 1,024 fixed training rows in evaluation mode) every few steps and `"noise"` on measuring
steps (adaptive, about 3.5 % of the time, by default; every step in `batchfit run`'s
noise trial; `--every`).
"""
import argparse
import os
import sys

import numpy as np
import torch
from torch import nn

from labelled_csv import read_csv  # beside this script

try:
    from batchfit.torch import NoiseProbe  # batchfit
except ImportError:  # run from a checkout without `pip install ./python`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    from batchfit.torch import NoiseProbe


def make_cnn(features):
    if features == 784:  # zoo:mnist-cnn
        return nn.Sequential(
            nn.Unflatten(1, (1, 28, 28)),
            nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(),
            nn.MaxPool2d(2), nn.Dropout(0.25), nn.Flatten(),
            nn.Linear(9216, 128), nn.ReLU(), nn.Dropout(0.5), nn.Linear(128, 10))
    if features == 64:  # examples/digits-cnn.toml
        return nn.Sequential(
            nn.Unflatten(1, (1, 8, 8)),
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2), nn.Flatten(), nn.Linear(512, 64), nn.ReLU(), nn.Linear(64, 10))
    raise SystemExit("expected 784 (MNIST) or 64 (8x8 digits) feature columns, got %d" % features)


def make_model(features):
    if features == 784:  # zoo:mnist-mlp
        return nn.Sequential(
            nn.Linear(784, 512), nn.ReLU(), nn.Dropout(0.2),
            nn.Linear(512, 512), nn.ReLU(), nn.Dropout(0.2),
            nn.Linear(512, 10))
    if features == 64:  # zoo:digits-mlp
        return nn.Sequential(
            nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))
    raise SystemExit("expected 784 (MNIST) or 64 (8x8 digits) feature columns, got %d" % features)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="CSV: features then the label in the last column")
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate (batchfit run: {lr})")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   choices=["cpu", "cuda"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--every", type=int, default=None, help="measure every N steps (default adaptive; 0: never)")
    p.add_argument("--k", type=int, default=None, help="micro-batches per measurement (default 8)")
    p.add_argument("--b-small", type=int, default=None, help="samples per micro-batch (default batch / k)")
    a = p.parse_args()
    torch.manual_seed(a.seed)
    rng = np.random.default_rng(a.seed)
    dev = torch.device(a.device)

    x_np, y_np = read_csv(a.data)
    if a.batch_size > len(x_np):
        raise SystemExit("--batch-size %d exceeds the %d rows of %s" % (a.batch_size, len(x_np), a.data))
    x_all = torch.from_numpy(x_np).to(dev)
    y_all = torch.from_numpy(y_np).to(dev)
    model = (make_cnn if a.model == "cnn" else make_model)(x_np.shape[1]).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    loss_fn = nn.CrossEntropyLoss()
    # 1,024 training rows spread over the file, the same for every batch and
    # seed: the helper reports their loss in evaluation mode as `train_loss`.
    fixed = torch.from_numpy(np.linspace(0, len(x_np) - 1, min(len(x_np), 1024)).astype(np.int64)).to(dev)
    probe = NoiseProbe(model, opt, k=a.k, b_small=a.b_small, every=a.every,  # batchfit
                       fixed_rows=(x_all[fixed], y_all[fixed]), rows=len(x_np))

    order, pos = rng.permutation(len(x_np)), 0
    model.train()
    for _ in range(a.steps):
        if pos + a.batch_size > len(order):  # a new epoch: reshuffle, drop the tail
            order, pos = rng.permutation(len(x_np)), 0
        idx = torch.from_numpy(order[pos:pos + a.batch_size]).to(dev)
        pos += a.batch_size
        x, y = x_all[idx], y_all[idx]
        probe.step(lambda xb, yb: loss_fn(model(xb), yb), x, y)  # batchfit


if __name__ == "__main__":
    main()
