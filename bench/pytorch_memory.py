#!/usr/bin/env python3
"""`plan --runtime pytorch` held against PyTorch's own account of the same training step.

Usage:
  pytorch_memory.py [--batches 8,32] [--every K] [--models A,B] [--max-params N]
                    [--batchfit PATH] [--layers] [--json FILE]

For every model of the corpus (below), at each batch:

* exports it as docs/model-spec.md says (TorchScript path, training mode, no constant
  folding, a dynamic batch axis) and runs `batchfit plan MODEL.onnx --runtime pytorch
  --json`; the planned peak at B is the largest moment's line plus the rounding
  (docs/json.md);
* trains it in PyTorch on the CPU for three steps (zero_grad(set_to_none), forward,
  cross-entropy, backward, Adam's default `foreach` step) under
  `torch.distributed._tools.mem_tracker.MemTracker`: the peak of live tensors, the
  batch included, and where it falls (forward, backward or the optimizer's step). On
  a GPU this is what `torch.cuda.max_memory_allocated` counts, before the caching
  allocator's rounding;
* walks the autograd graph of one forward pass and sums, by autograd node (the
  derivative formula of `tools/autograd/derivatives.yaml` that saved it), the bytes
  of every tensor it saved for backward: each storage once, at the first node in
  forward order, parameters and the batch left out. `--layers` prints that table
  beside the plan's `saved_bytes_per_sample` by op.

The corpus, by rule: every model of bench/corpus.py, question 1's kinds of network
(below), and every classification model of torchvision (`list_models`) with at most
`--max-params` parameters (default 30 M), each `--every`-th (default 1) in name order.
A model PyTorch cannot build or run at its input size is skipped with its error; one
batchfit does not load is listed as refused.

Prints one markdown table per run, then the median and worst error. With --json, also
the per-model rows as JSON (the plan's measured error, docs/plan.md, is taken from it).

torch, torchvision and onnx are NOT dependencies of batchfit; install them into a
throwaway venv, never in CI:
  python3 -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install torch torchvision onnx
"""
import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import warnings
from collections import defaultdict

import torch
from torch import nn

import corpus

STEPS = 3
SMALL_IMAGE = (3, 64, 64)
# Question 1's networks: speech features over frames.
FRAMES, MEL = 50, 40


class BiLstmFrames(nn.Module):
    """A 2-layer BiLSTM tagger over 50 frames of 40 features, a class per frame."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(MEL, 128, num_layers=2, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(256, corpus.CLASSES)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.fc(y)


class GruFrames(nn.Module):
    """A 1-layer GRU tagger over frames."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(MEL, 96, batch_first=True)
        self.fc = nn.Linear(96, corpus.CLASSES)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.fc(y)


class Conv1dBn(nn.Module):
    """A 1-d convolutional speech classifier: conv/BatchNorm/ReLU blocks over frames."""

    def __init__(self):
        super().__init__()
        layers, c = [], MEL
        for width in (64, 128, 128):
            layers += [nn.Conv1d(c, width, 5, padding=2), nn.BatchNorm1d(width), nn.ReLU()]
            c = width
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool1d(1), nn.Flatten())
        self.fc = nn.Linear(c, corpus.CLASSES)

    def forward(self, x):
        return self.fc(self.features(x))


QUESTION_1 = {
    "bilstm-frames": (corpus.module(BiLstmFrames), ("float", (FRAMES, MEL))),
    "gru-frames": (corpus.module(GruFrames), ("float", (FRAMES, MEL))),
    "conv1d-bn": (corpus.module(Conv1dBn), ("float", (MEL, FRAMES))),
}

# The smallest input torchvision's models run at, where 64 px is too small.
IMAGE_SIZE = {"inception_v3": (3, 96, 96)}


def torchvision_corpus(every, max_params):
    import torchvision

    names = sorted(torchvision.models.list_models(module=torchvision.models))
    picked = {}
    for name in names[::every]:
        kwargs = {"num_classes": corpus.CLASSES}
        if name.startswith("vit_"):
            kwargs["image_size"] = 64
        if name == "inception_v3":
            kwargs["aux_logits"] = False
            kwargs["init_weights"] = False

        def make(name=name, kwargs=kwargs):
            return torchvision.models.get_model(name, weights=None, **kwargs)

        try:
            try:
                with torch.device("meta"):
                    params = sum(p.numel() for p in make().parameters())
            except NotImplementedError:  # an initialiser that copies data: build it for real
                params = sum(p.numel() for p in make().parameters())
        except Exception as e:  # noqa: BLE001 (a builder's own error, reported)
            print(f"skipped {name}: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        if params > max_params:
            continue
        picked[name] = (make, ("float", IMAGE_SIZE.get(name, SMALL_IMAGE)))
    return picked


def corpus_models(args):
    models = dict(corpus.MODELS)
    # corpus.py's torchvision models at its own 32 px stay; the rule adds the rest at 64.
    models.update(QUESTION_1)
    for name, entry in torchvision_corpus(args.every, args.max_params).items():
        models.setdefault(name, entry)
    if args.models:
        wanted = args.models.split(",")
        missing = [m for m in wanted if m not in models]
        if missing:
            sys.exit(f"unknown models: {', '.join(missing)}")
        models = {m: models[m] for m in wanted}
    return models


def build(name, models):
    make, (kind, shape) = models[name]
    torch.manual_seed(0)
    net = make()
    if name == "googlenet":
        net.aux_logits, net.aux1, net.aux2 = False, None, None
    net.train()
    return net, kind, shape


def export(net, kind, shape, path):
    x = corpus.sample_input(kind, shape, 2)
    torch.onnx.export(
        net, (x,), path, dynamo=False, opset_version=17,
        input_names=["input"], output_names=["output"],
        dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
        training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
    )


def planned_peak(plan, b):
    """docs/json.md: the largest moment's line at b, plus the rounding and buffers."""
    m = plan["memory"]
    peak = max([m["fixed_bytes"] + m["per_sample_bytes"] * b]
               + [x["fixed_bytes"] + x["per_sample_bytes"] * b for x in m["moments"]])
    peak += m["rounding_bytes"]
    if b < m["gemm_buffer_from_batch"]:
        peak -= m["gemm_buffer_bytes"]
    if b < m["gemm_pool_from_batch"]:
        peak -= m["gemm_pool_bytes"]
    return peak


class Step(nn.Module):
    """The model and its loss as one module, so MemTracker's forward and backward
    phases cover the loss too."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x, target):
        out = self.net(x)
        return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))


def batch(net, kind, shape, b):
    g = torch.Generator().manual_seed(0)
    x = corpus.sample_input(kind, shape, b, g)
    with torch.no_grad():
        out = net(x)
    target = torch.randint(0, out.shape[-1], out.shape[:-1], generator=g)
    return x, target


def measured_peak(net, kind, shape, b):
    """MemTracker's peak over three Adam steps, and the phase it falls in."""
    from torch.distributed._tools.mem_tracker import MemTracker, _ModState

    x, target = batch(net, kind, shape, b)
    step = Step(net)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    tracker = MemTracker()
    tracker.track_external(step, opt, x, target)
    cpu = torch.device("cpu")
    forward = backward = 0
    with tracker:
        for _ in range(STEPS):
            opt.zero_grad(set_to_none=True)
            loss = step(x, target)
            loss.backward()
            opt.step()
            del loss
            # MemTracker keeps one step's per-module peaks: read them, then clear.
            per_phase = tracker.memory_tracking[step].snapshots
            forward = max([forward] + [s[cpu]["Total"] for s in per_phase[_ModState.PEAK_FW]])
            backward = max([backward] + [s[cpu]["Total"] for s in per_phase[_ModState.PEAK_BW]])
            tracker.reset_mod_stats()
    peak = tracker.get_tracker_snapshot("peak")[cpu]["Total"]
    phase = "forward" if peak == forward else "backward" if peak == backward else "optimizer"
    return peak, phase


def storage_key(t):
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


def saved_by_node(net, kind, shape, b):
    """Bytes each autograd node saved for backward in one forward pass, by node type."""
    x, target = batch(net, kind, shape, b)
    skip = {storage_key(t)[0] for t in list(net.parameters()) + list(net.buffers())}
    skip.add(storage_key(x)[0])
    loss = Step(net)(x, target)
    nodes, seen, stack = [], set(), [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        nodes.append(node)
        stack.extend(f for f, _ in node.next_functions)
    nodes.sort(key=lambda n: n._sequence_nr())
    counted, by_type = set(), defaultdict(int)
    for node in nodes:
        for attr in dir(node):
            if not attr.startswith("_saved_"):
                continue
            try:
                value = getattr(node, attr)
            except Exception:  # noqa: BLE001 (a freed or undefined saved value)
                continue
            for t in value if isinstance(value, (tuple, list)) else [value]:
                if not isinstance(t, torch.Tensor):
                    continue
                ptr, nbytes = storage_key(t)
                if ptr == 0 or ptr in skip or ptr in counted:
                    continue
                counted.add(ptr)
                by_type[type(node).__name__] += nbytes
    loss.backward()
    net.zero_grad(set_to_none=True)
    return dict(by_type)


def plan_model(batchfit, path):
    out = subprocess.run([batchfit, "plan", path, "--runtime", "pytorch", "--json"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        return None, out.stderr.strip().splitlines()[0] if out.stderr.strip() else "failed"
    return json.loads(out.stdout), None


def mib(n):
    return f"{n / 2**20:.1f}"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="8,32")
    ap.add_argument("--every", type=int, default=1)
    ap.add_argument("--models", default="")
    ap.add_argument("--max-params", type=float, default=30e6)
    ap.add_argument("--batchfit", default=os.path.join(here, "..", "target", "release", "batchfit"))
    ap.add_argument("--layers", action="store_true")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    torch.set_num_threads(os.cpu_count() or 1)
    # The exporter's notes on BatchNorm's counters and the like, for every model.
    warnings.filterwarnings("ignore")
    models = corpus_models(args)

    rows = []
    head = " | ".join(f"B={b}: plan / PyTorch MiB (error, peak in)" for b in batches)
    print(f"| model | params | {head} |")
    print("|---|---:|" + "---|" * len(batches))
    with tempfile.TemporaryDirectory() as tmp:
        for name in models:
            try:
                net, kind, shape = build(name, models)
                path = os.path.join(tmp, f"{name}.onnx")
                export(net, kind, shape, path)
            except Exception as e:  # noqa: BLE001 (PyTorch's own failure, reported)
                print(f"skipped {name}: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
                continue
            params = sum(p.numel() for p in net.parameters())
            plan, refused = plan_model(args.batchfit, path)
            if plan is None:
                print(f"| {name} | {params} | refused: {refused[:150]} |", flush=True)
                rows.append({"model": name, "params": params, "refused": refused})
            else:
                row = measure(name, models, plan, params, batches)
                if row is not None:
                    rows.append(row)
                    if args.layers:
                        print_saved(row, batches)
            if args.json:  # after every model, so that a long run stopped early keeps its rows
                with open(args.json, "w") as f:
                    json.dump(rows, f, indent=1)
    summarise(rows, batches)


def measure(name, models, plan, params, batches):
    """The model's row: planned and measured peaks and saved bytes at each batch, or None
    where PyTorch failed (reported)."""
    row = {"model": name, "params": params, "batches": {}}
    cells = []
    for b in batches:
        net, kind, shape = build(name, models)
        try:
            peak, phase = measured_peak(net, kind, shape, b)
            saved = saved_by_node(net, kind, shape, b)
        except Exception as e:  # noqa: BLE001 (PyTorch's own failure, reported)
            print(f"skipped {name} at {b}: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
            return None
        planned = planned_peak(plan, b)
        row["batches"][b] = {"planned": planned, "measured": peak, "phase": phase,
                             "plan_peak_at": plan["peak_at"], "saved_by_node": saved,
                             "planned_saved_by_op": planned_saved(plan, b)}
        cells.append(f"{mib(planned)} / {mib(peak)} ({planned / peak - 1:+.1%}, {phase})")
        del net
        gc.collect()
    print(f"| {name} | {params} | " + " | ".join(cells) + " |", flush=True)
    return row


def planned_saved(plan, b):
    by_op = defaultdict(int)
    for layer in plan["layers"]:
        by_op[layer["op"]] += layer["saved_bytes_per_sample"] * b
    return dict(by_op)


def print_saved(row, batches):
    for b in batches:
        cell = row["batches"][b]
        torch_side = ", ".join(f"{k} {mib(v)}" for k, v in sorted(cell["saved_by_node"].items()))
        plan_side = ", ".join(f"{k} {mib(v)}" for k, v in sorted(cell["planned_saved_by_op"].items()))
        print(f"|  B={b} saved | | PyTorch: {torch_side} | plan: {plan_side} |")


# Op families, each named by the plan's ops and the autograd nodes that implement them.
# Products share one family: PyTorch runs a linear layer on a 3-d input as `mm`, attention's
# products as `bmm`, and a product keeping a view keeps its storage, first counted at one or
# the other. A GRU on a CPU is composed of sigmoid, tanh, mul and addmm nodes, and SiLU
# (exported as x * sigmoid(x)) is one node: the rest family holds what is left.
FAMILIES = {
    "conv": ({"conv1d", "conv2d"}, {"ConvolutionBackward0"}),
    "products": ({"linear", "matmul"}, {"AddmmBackward0", "MmBackward0", "BmmBackward0"}),
    "batchnorm": ({"batchnorm"}, {"NativeBatchNormBackward0"}),
    "layernorm": ({"layernorm"}, {"NativeLayerNormBackward0"}),
    "relu": ({"relu"}, {"ReluBackward0", "ThresholdBackward0"}),
    "clipped relu": ({"clipped_relu"}, {"HardtanhBackward0"}),
    "gelu": ({"gelu"}, {"GeluBackward0"}),
    "hardswish": ({"hardswish"}, {"HardswishBackward0"}),
    "hardsigmoid": ({"hardsigmoid"}, {"HardsigmoidBackward0"}),
    "softmax": ({"softmax"}, {"SoftmaxBackward0", "SafeSoftmaxBackward0"}),
    "max pool": ({"maxpool", "global_maxpool"}, {"MaxPool2DWithIndicesBackward0"}),
    "lstm": ({"lstm"}, {"MkldnnRnnLayerBackward0"}),
    "embedding": ({"embedding"}, {"EmbeddingBackward0"}),
}
LOSS_NODES = {"LogSoftmaxBackward0", "NllLossBackward0", "MseLossBackward0"}


def family_table(rows, batches):
    """Saved bytes by op family over the corpus at the last batch: plan vs PyTorch."""
    b = batches[-1]
    totals = defaultdict(lambda: [0, 0, 0, 0])  # planned, PyTorch, models, models off by > 1 %
    for r in rows:
        cell = r.get("batches", {}).get(b)
        if not cell:
            continue
        plan_left = dict(cell["planned_saved_by_op"])
        torch_left = {k: v for k, v in cell["saved_by_node"].items() if k not in LOSS_NODES}
        for family, (ops, nodes) in list(FAMILIES.items()) + [("rest", (None, None))]:
            if ops is None:
                planned, measured = sum(plan_left.values()), sum(torch_left.values())
            else:
                planned = sum(plan_left.pop(op, 0) for op in ops)
                measured = sum(torch_left.pop(n, 0) for n in nodes)
            if planned == 0 and measured == 0:
                continue
            t = totals[family]
            t[0] += planned
            t[1] += measured
            t[2] += 1
            t[3] += abs(planned - measured) > 0.01 * max(planned, measured)
    print(f"\nSaved for backward by op family, batch {b}, summed over the corpus:\n")
    print("| family | plan MiB | PyTorch MiB | models | models off by more than 1 % |")
    print("|---|---:|---:|---:|---:|")
    for family, (planned, measured, models, off) in totals.items():
        print(f"| {family} | {mib(planned)} | {mib(measured)} | {models} | {off} |")


def summarise(rows, batches):
    family_table(rows, batches)
    errors = [c["planned"] / c["measured"] - 1 for r in rows for c in r.get("batches", {}).values()]
    if not errors:
        return
    within = sum(-0.03 <= e <= 0.05 for e in errors)
    print(f"\n{len([r for r in rows if 'batches' in r])} models planned, "
          f"{len([r for r in rows if 'refused' in r])} refused; "
          f"error over {len(errors)} (model, batch) pairs: median {statistics.median(errors):+.1%}, "
          f"|worst| {max(errors, key=abs):+.1%}, under by more than 3 %: "
          f"{sum(e < -0.03 for e in errors)}, within -3 %..+5 %: {within}/{len(errors)}")
    small = [(r["model"], b, c["planned"] - c["measured"]) for r in rows
             for b, c in r.get("batches", {}).items() if c["measured"] < 10 * 2**20]
    if small:
        worst = max(small, key=lambda x: abs(x[2]))
        print(f"models under 10 MiB: {len(small)} (model, batch) pairs, largest difference "
              f"{worst[2] / 2**20:+.2f} MiB ({worst[0]} at {worst[1]})")


if __name__ == "__main__":
    main()
