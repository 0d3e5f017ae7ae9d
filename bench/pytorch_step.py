#!/usr/bin/env python3
"""PyTorch side of bench/compare.sh: median seconds per full training step.

Usage: pytorch_step.py MODEL BATCH[,BATCH...]
  MODEL: seed2-dual | bilstm

Same networks as batchfit's `zoo:seed2-dual` and `bench/bilstm.toml`, fp32 on
the CPU, Adam (lr 1e-3, eps 1e-8), MSE loss, one synthetic batch generated once
and reused (as batchfit does). A step is zero_grad, forward, loss, backward,
optimizer.step and reading the loss value (batchfit reads it too). 3 warm-up
steps, then timed steps until at least 2 s or 200 steps. Prints one JSON
object {batch: median_seconds}.

torch is NOT a dependency of batchfit: install it into a throwaway venv,
  python3 -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install torch
and never in CI.
"""
import json
import os
import statistics
import sys
import time

import torch
from torch import nn

WARMUP = 3
MIN_TIME_S = 2.0
MAX_STEPS = 200


class Seed2Dual(nn.Module):
    """The small dual-input regressor of `zoo:seed2-dual` (87,229 parameters)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(26, 26, 3, padding=1)
        self.pool = nn.AvgPool2d(3, stride=3)
        self.fc = nn.Linear(234, 26)
        self.fc_1 = nn.Linear(34, 256)
        self.fc_2 = nn.Linear(256, 256)
        self.fc_3 = nn.Linear(256, 1)

    def forward(self, image, features):
        x = self.pool(torch.relu(self.conv(image))).flatten(1)
        x = torch.relu(self.fc(x))
        x = torch.cat([x, features], dim=1)
        x = torch.relu(self.fc_1(x))
        x = torch.relu(self.fc_2(x))
        return self.fc_3(x)


class BiLstm(nn.Module):
    """bench/bilstm.toml: BiLSTM 64 -> 2x128 over T=50, then linear 256 -> 8."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(64, 128, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(256, 8)

    def forward(self, x):
        y, _ = self.lstm(x)
        return self.fc(y)


def make(model, b):
    g = torch.Generator().manual_seed(0)
    if model == "seed2-dual":
        net = Seed2Dual()
        inputs = (torch.randn(b, 26, 9, 9, generator=g), torch.randn(b, 8, generator=g))
        target = torch.randn(b, 1, generator=g)
    elif model == "bilstm":
        net = BiLstm()
        inputs = (torch.randn(b, 50, 64, generator=g),)
        target = torch.randn(b, 50, 8, generator=g)
    else:
        sys.exit(f"unknown model {model!r}; use seed2-dual or bilstm")
    return net, inputs, target


def median_step_seconds(step, max_steps=MAX_STEPS):
    """WARMUP calls of `step`, then timed calls until MIN_TIME_S or `max_steps`: the median."""
    for _ in range(WARMUP):
        step()
    times = []
    start = time.perf_counter()
    while time.perf_counter() - start < MIN_TIME_S and len(times) < max_steps:
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_batch(model, b):
    torch.manual_seed(0)
    net, inputs, target = make(model, b)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, eps=1e-8)
    loss_fn = nn.MSELoss()

    def step():
        opt.zero_grad()
        loss = loss_fn(net(*inputs), target)
        loss.backward()
        opt.step()
        return loss.item()

    return median_step_seconds(step)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    model = sys.argv[1]
    batches = [int(s) for s in sys.argv[2].split(",")]
    torch.set_num_threads(os.cpu_count() or 1)
    print(json.dumps({b: time_batch(model, b) for b in batches}))


if __name__ == "__main__":
    main()
