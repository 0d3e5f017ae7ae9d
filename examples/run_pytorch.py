"""A PyTorch training script that speaks batchfit's step protocol.

    batchfit run -- python examples/run_pytorch.py --batch-size {batch} --steps 30

The model is a small dual-input regressor (26x9x9 image + 8 features -> 1, the
network of batchfit's `zoo:seed2-dual`) on random data; replace `make_model` and
the random tensors with your own model and data. The three lines marked
`# batchfit` are all a training loop needs.
"""
import argparse
import json
import time

import torch
from torch import nn


def make_model():
    class Dual(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Sequential(
                nn.Conv2d(26, 26, 3, padding=1), nn.ReLU(), nn.AvgPool2d(3), nn.Flatten(),
                nn.Linear(234, 26), nn.ReLU())
            self.head = nn.Sequential(
                nn.Linear(34, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))

        def forward(self, image, features):
            return self.head(torch.cat([self.conv(image), features], dim=1))

    return Dual()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args()
    dev = torch.device(a.device)
    model = make_model().to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    image = torch.randn(a.batch_size, 26, 9, 9, device=dev)
    features = torch.randn(a.batch_size, 8, device=dev)
    target = torch.randn(a.batch_size, 1, device=dev)
    for step in range(1, a.steps + 1):
        t0 = time.perf_counter()  # batchfit
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(image, features), target)
        loss.backward()
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize()  # time the GPU's work, not the launch
        seconds = time.perf_counter() - t0  # batchfit
        print("BATCHFIT " + json.dumps(
            {"step": step, "samples": a.batch_size, "seconds": seconds}), flush=True)  # batchfit


if __name__ == "__main__":
    main()
