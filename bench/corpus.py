#!/usr/bin/env python3
"""PyTorch side of bench/corpus.sh: the models people train, exported as they export them.

Usage:
  corpus.py list                      the model names, one per line
  corpus.py export NAME DIR           writes DIR/NAME.onnx; prints {"params": trainable count}
  corpus.py step NAME BATCH[,BATCH]   PyTorch's median seconds per training step, as JSON

Every model is exported with torch.onnx.export's TorchScript path (dynamo=False),
opset 17, a dynamic batch axis, in training mode without constant folding (so
BatchNorm and Dropout stay in the graph: docs/model-spec.md). A step is what
bench/pytorch_step.py times: zero_grad, forward, loss, backward, Adam (lr 1e-3)
and reading the loss, on one synthetic batch, fp32 on all cores; the loss is
cross-entropy over the model's classes (per token for a tagger or a language
model), as batchfit picks for these outputs.

torch and torchvision are NOT dependencies of batchfit: install them into a
throwaway venv, never in CI:
  python3 -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install torch torchvision onnx
"""
import json
import os
import sys

import torch
from torch import nn

# The timing loop of bench/compare.sh's PyTorch side (this script's directory is on sys.path).
from pytorch_step import median_step_seconds

MAX_STEPS = 100
CLASSES = 10
IMAGE = (3, 32, 32)
# Sequence models: tokens of a vocabulary, or feature vectors, over T steps.
VOCAB, T, FEATURES = 1000, 32, 16


def torchvision_model(name, image=IMAGE):
    def make():
        import torchvision

        return getattr(torchvision.models, name)(num_classes=CLASSES)

    return make, ("float", image)


class BnCnn(nn.Module):
    """A small BatchNorm CNN, as in a tutorial."""

    def __init__(self):
        super().__init__()
        layers, c = [], 3
        for width in (32, 64, 128):
            layers += [nn.Conv2d(c, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
                       nn.MaxPool2d(2)]
            c = width
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.3), nn.Linear(128 * 4 * 4, CLASSES))

    def forward(self, x):
        return self.head(self.features(x))


class RnnLast(nn.Module):
    """A GRU (or LSTM) classifier reading the last step: `y[:, -1]`."""

    def __init__(self, cell=nn.GRU):
        super().__init__()
        self.rnn = cell(FEATURES, 64, batch_first=True)
        self.fc = nn.Linear(64, CLASSES)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.fc(y[:, -1])


class RnnMeanPool(nn.Module):
    """An LSTM classifier averaging its outputs over time."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(FEATURES, 64, batch_first=True)
        self.fc = nn.Linear(64, CLASSES)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.fc(y.mean(dim=1))


class BiLstmTagger(nn.Module):
    """A 2-layer BiLSTM tagger over token embeddings (one class per token)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 64)
        self.rnn = nn.LSTM(64, 64, num_layers=2, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(128, CLASSES)

    def forward(self, tokens):
        y, _ = self.rnn(self.embed(tokens))
        return self.fc(y)


class EncoderClassifier(nn.Module):
    """nn.TransformerEncoder (2 layers, d 64, 4 heads) over feature vectors, CLS-style first token."""

    def __init__(self, batch_first=True):
        super().__init__()
        self.batch_first = batch_first
        self.proj = nn.Linear(FEATURES, 64)
        layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.1, batch_first=batch_first)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.fc = nn.Linear(64, CLASSES)

    def forward(self, x):
        h = self.proj(x)
        if not self.batch_first:
            h = h.transpose(0, 1)
        h = self.encoder(h)
        first = h[:, 0] if self.batch_first else h[0]
        return self.fc(first)


class EncoderDecoder(nn.Module):
    """nn.Transformer-style encoder-decoder over feature vectors: the decoder's
    cross-attention reads the encoder's output; one class per position."""

    def __init__(self, batch_first=True):
        super().__init__()
        self.batch_first = batch_first
        self.proj = nn.Linear(FEATURES, 64)
        enc = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.1, batch_first=batch_first)
        dec = nn.TransformerDecoderLayer(64, 4, 128, dropout=0.1, batch_first=batch_first)
        self.encoder = nn.TransformerEncoder(enc, 1, enable_nested_tensor=False)
        self.decoder = nn.TransformerDecoder(dec, 1)
        self.fc = nn.Linear(64, CLASSES)

    def forward(self, x):
        h = self.proj(x)
        if not self.batch_first:
            h = h.transpose(0, 1)
        y = self.decoder(h, self.encoder(h))
        if not self.batch_first:
            y = y.transpose(0, 1)
        return self.fc(y)


class Gpt(nn.Module):
    """A GPT-style decoder: token and position embeddings, causal self-attention, next-token logits."""

    def __init__(self, d=64, heads=4, layers=2):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d)
        self.pos = nn.Parameter(torch.zeros(1, T, d))
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.1, batch_first=True,
                                           activation="gelu", norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(T))

    def forward(self, tokens):
        h = self.tok(tokens) + self.pos
        h = self.blocks(h, mask=self.mask, is_causal=True)
        return self.head(self.norm(h))


def vit_tiny():
    """torchvision's VisionTransformer, small: a class token, learned positions,
    nn.MultiheadAttention blocks."""
    from torchvision.models.vision_transformer import VisionTransformer

    return VisionTransformer(image_size=32, patch_size=4, num_layers=2, num_heads=4,
                             hidden_dim=64, mlp_dim=128, num_classes=CLASSES)


def module(cls, *args, **kwargs):
    return lambda: cls(*args, **kwargs)


# name -> (constructor, (input kind, per-sample shape))
MODELS = {
    "resnet18": torchvision_model("resnet18"),
    "resnet50": torchvision_model("resnet50"),
    "mobilenet_v2": torchvision_model("mobilenet_v2"),
    "mobilenet_v3_small": torchvision_model("mobilenet_v3_small"),
    "efficientnet_b0": torchvision_model("efficientnet_b0"),
    "squeezenet1_1": torchvision_model("squeezenet1_1", (3, 64, 64)),
    "densenet121": torchvision_model("densenet121"),
    "vgg11": torchvision_model("vgg11", (3, 224, 224)),
    "googlenet": torchvision_model("googlenet", (3, 64, 64)),
    "bn-cnn": (module(BnCnn), ("float", IMAGE)),
    "gru-last": (module(RnnLast), ("float", (T, FEATURES))),
    "lstm-mean": (module(RnnMeanPool), ("float", (T, FEATURES))),
    "bilstm-tagger": (module(BiLstmTagger), ("tokens", (T,))),
    "encoder": (module(EncoderClassifier), ("float", (T, FEATURES))),
    "encoder-seq-first": (module(EncoderClassifier, batch_first=False), ("float", (T, FEATURES))),
    "encoder-decoder": (module(EncoderDecoder), ("float", (T, FEATURES))),
    "encoder-decoder-seq-first": (module(EncoderDecoder, batch_first=False),
                                  ("float", (T, FEATURES))),
    "gpt": (module(Gpt), ("tokens", (T,))),
    "vit-tiny": (vit_tiny, ("float", IMAGE)),
}


def build(name):
    make, (kind, shape) = MODELS[name]
    torch.manual_seed(0)
    net = make()
    if name == "googlenet":
        net.aux_logits, net.aux1, net.aux2 = False, None, None
    return net, kind, shape


def sample_input(kind, shape, b, generator=None):
    if kind == "tokens":
        return torch.randint(0, VOCAB, (b, *shape), generator=generator)
    return torch.randn(b, *shape, generator=generator)


def export(name, directory):
    net, kind, shape = build(name)
    net.train()
    x = sample_input(kind, shape, 2)
    path = os.path.join(directory, f"{name}.onnx")
    torch.onnx.export(
        net, (x,), path, dynamo=False, opset_version=17,
        input_names=["input"], output_names=["output"],
        dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
        training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
    )
    trainable = sum(p.numel() for p in net.parameters() if p.requires_grad)
    print(json.dumps({"params": trainable}))


def time_batch(name, b):
    net, kind, shape = build(name)
    net.train()
    g = torch.Generator().manual_seed(0)
    x = sample_input(kind, shape, b, g)
    with torch.no_grad():
        out = net(x)
    classes = out.shape[-1]
    target = torch.randint(0, classes, out.shape[:-1], generator=g)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, eps=1e-8)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad()
        loss = loss_fn(net(x).reshape(-1, classes), target.reshape(-1))
        loss.backward()
        opt.step()
        return loss.item()

    return median_step_seconds(step, max_steps=MAX_STEPS)


def main():
    args = sys.argv[1:]
    if args == ["list"]:
        print("\n".join(MODELS))
    elif len(args) == 3 and args[0] == "export" and args[1] in MODELS:
        export(args[1], args[2])
    elif len(args) == 3 and args[0] == "step" and args[1] in MODELS:
        torch.set_num_threads(os.cpu_count() or 1)
        batches = [int(s) for s in args[2].split(",")]
        print(json.dumps({b: time_batch(args[1], b) for b in batches}))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
