#!/usr/bin/env python3
"""A generated corpus: the models of whole libraries, chosen by rule, exported as users export them.

Usage:
  corpus_gen.py list                 every model name of the corpus, one per line
  corpus_gen.py export NAME DIR      writes DIR/NAME.onnx; prints one JSON line:
                                     {"name", "family", "params", "input", "probe"}
                                     or {"name", "family", "export_error"}
  corpus_gen.py step NAME KIND SHAPE BATCH
                                     PyTorch's median seconds of one training step of NAME
                                     at BATCH on the input its export used (KIND: float or
                                     tokens; SHAPE: the sample's shape, comma-separated):
                                     prints {"batch", "seconds"}. The loss is batchfit's
                                     default for the output's layout (docs/model-spec.md,
                                     "The loss"): cross-entropy over the last axis of a
                                     [B, C] or [B, T, C] output, over axis 1 of more axes.

The rules (nothing is picked by hand; a model that fails to export is listed as such):
  tv:NAME      every torchvision classification model (torchvision.models.list_models),
               10 classes, at 3x64x64, or at its weights' crop size where 64 is too small
  tvseg:NAME   every torchvision segmentation model, 10 classes, 3x64x64, no aux head
  tvvideo:NAME every torchvision video model, at 3x8x64x64, or 3x16x224x224 where that fails
  timm:NAME    every TIMM_EVERY-th name of timm.list_models() (sorted), 10 classes, at its
               default input size
  hf:NAME      small configurations of Hugging Face models (BERT, RoBERTa, DistilBERT, GPT-2,
               a LLaMA-style decoder, T5's encoder, ViT, a Whisper-style encoder), the
               task head's logits as output
  ta:NAME      torchaudio's DeepSpeech, Wav2Letter, Conformer and ConvTasNet
Models above PROBE_PARAMS trainable parameters are marked plan-only ("probe": false); above
EXPORT_PARAMS they are not exported (the ONNX protobuf's 2 GB limit), and say so.

Every model is exported with torch.onnx.export's TorchScript path (dynamo=False), opset 17,
a dynamic batch axis, in training mode without constant folding (docs/model-spec.md).

torch and the model libraries are NOT dependencies of batchfit, never part of CI:
  python3 -m venv /tmp/vt && /tmp/vt/bin/pip install torch torchvision timm transformers onnx
  /tmp/vt/bin/pip install --no-deps torchaudio
"""
import json
import os
import sys

import torch
from torch import nn

CLASSES = 10
TIMM_EVERY = 25
PROBE_PARAMS = 100_000_000
EXPORT_PARAMS = 400_000_000
SMALL_IMAGE = (3, 64, 64)
VOCAB, T = 1000, 32


class Logits(nn.Module):
    """Returns one tensor from a model whose forward returns a dict, a tuple or a ModelOutput."""

    def __init__(self, net, key):
        super().__init__()
        self.net, self.key = net, key

    def forward(self, x):
        out = self.net(x)
        if isinstance(out, (tuple, list)):
            return out[0]
        return out[self.key]


class WithLengths(nn.Module):
    """torchaudio's Conformer takes (input, lengths): every sample at full length."""

    def __init__(self, net, head):
        super().__init__()
        self.net, self.head = net, head

    def forward(self, x):
        lengths = torch.full((x.shape[0],), x.shape[1], dtype=torch.long)
        y, _ = self.net(x, lengths)
        return self.head(y)


def torchvision_names(module):
    import torchvision

    return sorted(torchvision.models.list_models(module=module))


def timm_names():
    import timm

    names = sorted(timm.list_models())
    return names[::TIMM_EVERY]


HF = ["bert", "roberta", "distilbert", "gpt2", "llama", "llama-gqa", "t5-encoder", "vit",
      "whisper-encoder"]
TA = ["deepspeech", "wav2letter", "conformer", "convtasnet"]


def names():
    import torchvision

    out = [f"tv:{n}" for n in torchvision_names(torchvision.models)]
    out += [f"tvseg:{n}" for n in torchvision_names(torchvision.models.segmentation)]
    out += [f"tvvideo:{n}" for n in torchvision_names(torchvision.models.video)]
    out += [f"timm:{n}" for n in timm_names()]
    out += [f"hf:{n}" for n in HF]
    out += [f"ta:{n}" for n in TA]
    return out


def hf_model(name):
    """A small configuration of each architecture: 2 layers, width 64, 4 heads."""
    import transformers as tf

    small = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=64)
    tokens = ("tokens", (T,))
    if name == "bert":
        cfg = tf.BertConfig(num_labels=CLASSES, **small)
        return Logits(tf.BertForSequenceClassification(cfg), "logits"), tokens
    if name == "roberta":
        cfg = tf.RobertaConfig(num_labels=CLASSES, **{**small, "max_position_embeddings": 66})
        return Logits(tf.RobertaForSequenceClassification(cfg), "logits"), tokens
    if name == "distilbert":
        cfg = tf.DistilBertConfig(dim=64, n_layers=2, n_heads=4, hidden_dim=128,
                                  vocab_size=VOCAB, max_position_embeddings=64,
                                  num_labels=CLASSES)
        return Logits(tf.DistilBertForSequenceClassification(cfg), "logits"), tokens
    if name == "gpt2":
        cfg = tf.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=64)
        return Logits(tf.GPT2LMHeadModel(cfg), "logits"), tokens
    if name == "llama":
        cfg = tf.LlamaConfig(**small, num_key_value_heads=4)
        return Logits(tf.LlamaForCausalLM(cfg), "logits"), tokens
    if name == "llama-gqa":
        # Grouped-query attention: two key/value heads shared by four query heads
        # (`repeat_kv` expands them), as LLaMA 2 70B, Mistral and Qwen2 train. Eager
        # attention: torch 2.15 cannot export `scaled_dot_product_attention` with
        # `enable_gqa`.
        cfg = tf.LlamaConfig(**small, num_key_value_heads=2, attn_implementation="eager")
        return Logits(tf.LlamaForCausalLM(cfg), "logits"), tokens
    if name == "t5-encoder":
        cfg = tf.T5Config(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                          vocab_size=VOCAB)
        return Logits(tf.T5EncoderModel(cfg), "last_hidden_state"), tokens
    if name == "vit":
        cfg = tf.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=128, image_size=32, patch_size=4,
                           num_labels=CLASSES)
        return Logits(tf.ViTForImageClassification(cfg), "logits"), ("float", (3, 32, 32))
    if name == "whisper-encoder":
        cfg = tf.WhisperConfig(d_model=64, encoder_layers=2, encoder_attention_heads=4,
                               encoder_ffn_dim=128, num_mel_bins=40, max_source_positions=50,
                               num_labels=CLASSES)
        net = tf.WhisperForAudioClassification(cfg)
        return Logits(net, "logits"), ("float", (40, 100))
    raise KeyError(name)


def torchaudio_model(name):
    import torchaudio.models as ta

    if name == "deepspeech":
        return ta.DeepSpeech(n_feature=40, n_hidden=256, n_class=CLASSES), ("float", (1, 50, 40))
    if name == "wav2letter":
        return ta.Wav2Letter(num_classes=CLASSES, input_type="mfcc", num_features=40), \
            ("float", (40, 100))
    if name == "conformer":
        net = ta.Conformer(input_dim=40, num_heads=4, ffn_dim=128, num_layers=2,
                           depthwise_conv_kernel_size=7)
        return WithLengths(net, nn.Linear(40, CLASSES)), ("float", (50, 40))
    if name == "convtasnet":
        net = ta.ConvTasNet(num_sources=2, enc_kernel_size=16, enc_num_feats=64,
                            msk_kernel_size=3, msk_num_feats=32, msk_num_hidden_feats=64,
                            msk_num_layers=2, msk_num_stacks=2)
        return net, ("float", (1, 800))
    raise KeyError(name)


def torchvision_model(module, name, **kwargs):
    import torchvision

    builder = torchvision.models.get_model_builder(name)
    if name in ("googlenet", "inception_v3"):
        kwargs["aux_logits"] = False
        kwargs["init_weights"] = True
    return builder(num_classes=CLASSES, **kwargs)


def crop_size(name):
    """The input side the model's published weights were trained at."""
    import torchvision

    weights = torchvision.models.get_model_weights(name)
    transforms = list(weights)[0].transforms()
    return int(getattr(transforms, "crop_size", [224])[0])


def candidates(name):
    """(family, model factory, [input shapes to try in order]) of one corpus name."""
    family, model = name.split(":", 1)
    if family == "tv":
        return family, lambda: torchvision_model(None, model), \
            [("float", SMALL_IMAGE), ("float", (3, crop_size(model), crop_size(model)))]
    if family == "tvseg":
        def seg():
            import torchvision

            net = torchvision.models.get_model(model, num_classes=CLASSES, aux_loss=False,
                                               weights=None, weights_backbone=None)
            return Logits(net, "out")
        return family, seg, [("float", SMALL_IMAGE)]
    if family == "tvvideo":
        def video():
            import torchvision

            return torchvision.models.get_model(model, num_classes=CLASSES, weights=None)
        return family, video, [("float", (3, 8, 64, 64)), ("float", (3, 16, 224, 224))]
    if family == "timm":
        def make():
            import timm

            return timm.create_model(model, pretrained=False, num_classes=CLASSES)

        def default_size():
            import timm

            cfg = timm.create_model(model, pretrained=False, num_classes=CLASSES,
                                    ).pretrained_cfg
            return tuple(cfg.get("input_size", (3, 224, 224)))
        return family, make, [("float", default_size())]
    if family == "hf":
        net, inp = hf_model(model)
        return family, lambda: net, [inp]
    if family == "ta":
        net, inp = torchaudio_model(model)
        return family, lambda: net, [inp]
    raise KeyError(name)


def sample(kind, shape, b, generator=None):
    if kind == "tokens":
        return torch.randint(0, VOCAB, (b, *shape), generator=generator)
    return torch.randn(b, *shape, generator=generator)


def export(name, directory):
    record = {"name": name, "family": name.split(":", 1)[0]}
    try:
        family, make, inputs = candidates(name)
        torch.manual_seed(0)
        net = make()
        net.train()
        params = sum(p.numel() for p in net.parameters() if p.requires_grad)
        record["params"] = params
        if params > EXPORT_PARAMS:
            record["export_error"] = f"not exported: {params} parameters, over the 2 GB protobuf"
            return record
        record["probe"] = params <= PROBE_PARAMS
        path = os.path.join(directory, file_name(name))
        last = None
        for kind, shape in inputs:
            x = sample(kind, shape, 2)
            try:
                with torch.no_grad():
                    net(x)
                torch.onnx.export(
                    net, (x,), path, dynamo=False, opset_version=17,
                    input_names=["input"], output_names=["output"],
                    dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
                    training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                )
            except Exception as e:  # this input does not suit the model: try the next
                last = e
                continue
            record["input"] = [kind, list(shape)]
            return record
        record["export_error"] = f"fails at every input size tried; the last: {last}"
    except Exception as e:
        record["export_error"] = f"{type(e).__name__}: {e}"
    record["export_error"] = " ".join(str(record["export_error"]).split())[:300]
    return record


def time_step(name, kind, shape, batch):
    """Median seconds of a training step of `name` at `batch`, as bench/corpus.py times
    the curated corpus: Adam, one batch generated once, `loss.item()` read each step."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from pytorch_step import median_step_seconds

    _, make, _ = candidates(name)
    torch.manual_seed(0)
    net = make()
    net.train()
    g = torch.Generator().manual_seed(0)
    x = sample(kind, shape, batch, g)
    with torch.no_grad():
        out = net(x)
    axis = -1 if out.dim() <= 3 else 1
    classes = out.shape[axis]
    logits_last = (lambda y: y) if axis == -1 else (lambda y: y.movedim(1, -1))
    target = torch.randint(0, classes, logits_last(out).shape[:-1], generator=g)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, eps=1e-8)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad()
        loss = loss_fn(logits_last(net(x)).reshape(-1, classes), target.reshape(-1))
        loss.backward()
        opt.step()
        return loss.item()

    return median_step_seconds(step)


def file_name(name):
    return name.replace(":", "--") + ".onnx"


def main():
    args = sys.argv[1:]
    if args == ["list"]:
        print("\n".join(names()))
    elif len(args) == 3 and args[0] == "export":
        print(json.dumps(export(args[1], args[2])))
    elif len(args) == 5 and args[0] == "step":
        torch.set_num_threads(os.cpu_count() or 1)
        shape = tuple(int(n) for n in args[3].split(","))
        batch = int(args[4])
        print(json.dumps({"batch": batch, "seconds": time_step(args[1], args[2], shape, batch)}))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
