//! What the op-family tests share: one small model per op family, and the
//! lock that keeps the backend's global generator to one test at a time.

use batchfit_engine::{DeviceSpec, TrainConfig, Trainer};
use batchfit_graph::{
    Cell, Graph, GraphBuilder, InputKind, LossKind, Op, PoolKind, ReduceKind, ResizeMode, RnnBias,
    Shape, Standardize, Window,
};
use batchfit_plan::Optimizer;
use std::sync::Mutex;

/// One small model per op family.
pub fn families() -> Vec<Graph> {
    let mut out = Vec::new();
    let mut g = GraphBuilder::new("linear-relu-mse");
    g.input("x", Shape::fixed(&[6])).unwrap();
    g.linear("fc1", "x", 8).unwrap();
    g.push("act", Op::Relu, &["fc1"]).unwrap();
    g.linear("fc2", "act", 3).unwrap();
    out.push(g.finish(LossKind::Mse, "fc2").unwrap());

    let mut g = GraphBuilder::new("conv2d-pools-ce");
    g.input("x", Shape::fixed(&[2, 6, 6])).unwrap();
    g.conv("c", "x", 3, 2, 3, 1, None).unwrap();
    g.push("t", Op::Tanh, &["c"]).unwrap();
    g.pool("mp", "t", PoolKind::Max, 2, 2, 2, Some(0)).unwrap();
    g.pool("ap", "mp", PoolKind::Avg, 2, 3, 1, None).unwrap();
    g.push(
        "gp",
        Op::GlobalPool {
            pool: PoolKind::Avg,
        },
        &["ap"],
    )
    .unwrap();
    g.push("f", Op::Flatten, &["gp"]).unwrap();
    g.linear("out", "f", 4).unwrap();
    out.push(g.finish(LossKind::CrossEntropy, "out").unwrap());

    let mut g = GraphBuilder::new("conv1d-norms");
    g.input("x", Shape::fixed(&[3, 10])).unwrap();
    g.push(
        "c",
        Op::Conv {
            in_channels: 3,
            out_channels: 4,
            window: Window {
                kernel: vec![3],
                stride: vec![2],
                padding: vec![[1, 2]],
                dilation: vec![1],
            },
            groups: 1,
            bias: true,
            standardize: None,
        },
        &["x"],
    )
    .unwrap();
    g.batch_norm("bn", "c").unwrap();
    g.push("s", Op::Sigmoid, &["bn"]).unwrap();
    g.layer_norm("ln", "s").unwrap();
    g.push(
        "gm",
        Op::GlobalPool {
            pool: PoolKind::Max,
        },
        &["ln"],
    )
    .unwrap();
    g.push("f", Op::Flatten, &["gm"]).unwrap();
    g.linear("out", "f", 2).unwrap();
    out.push(g.finish(LossKind::Mse, "out").unwrap());

    let mut g = GraphBuilder::new("branches");
    g.input("a", Shape::fixed(&[4])).unwrap();
    g.input("b", Shape::fixed(&[4])).unwrap();
    g.linear("la", "a", 4).unwrap();
    g.push("ga", Op::Gelu, &["la"]).unwrap();
    g.push("sum", Op::Add, &["ga", "b"]).unwrap();
    g.push("prod", Op::Mul, &["sum", "a"]).unwrap();
    g.push("cat", Op::Concat { axis: 1 }, &["prod", "b"])
        .unwrap();
    g.push("r", Op::Reshape { shape: vec![2, 4] }, &["cat"])
        .unwrap();
    g.push("rt", Op::Reshape { shape: vec![4, 2] }, &["cat"])
        .unwrap();
    g.push("mm", Op::MatMul, &["r", "rt"]).unwrap();
    g.push("sm", Op::Softmax { axis: -1 }, &["mm"]).unwrap();
    g.push("cl", Op::Clamp { min: 0.0, max: 0.8 }, &["sm"])
        .unwrap();
    g.push("d", Op::Dropout { p: 0.1 }, &["cl"]).unwrap();
    g.push("f", Op::Flatten, &["d"]).unwrap();
    g.linear("out", "f", 3).unwrap();
    out.push(g.finish(LossKind::CrossEntropy, "out").unwrap());

    let mut g = GraphBuilder::new("bilstm-ctc");
    g.input(
        "x",
        Shape(vec![
            batchfit_graph::Dim::Seq,
            batchfit_graph::Dim::Fixed(5),
        ]),
    )
    .unwrap();
    g.seq_len(8);
    g.rnn("rnn", "x", Cell::Lstm, 6, true, RnnBias::Single)
        .unwrap();
    g.linear("out", "rnn", 5).unwrap();
    out.push(g.finish(LossKind::Ctc { blank: 4 }, "out").unwrap());

    // DeepSpeech's recurrence: plain cells, ReLU both ways, then tanh one way.
    let mut g = GraphBuilder::new("plain-rnn-ctc");
    g.input(
        "x",
        Shape(vec![
            batchfit_graph::Dim::Seq,
            batchfit_graph::Dim::Fixed(5),
        ]),
    )
    .unwrap();
    g.seq_len(6);
    g.rnn("relu", "x", Cell::RnnRelu, 4, true, RnnBias::Double)
        .unwrap();
    g.rnn("tanh", "relu", Cell::RnnTanh, 3, false, RnnBias::Double)
        .unwrap();
    g.linear("out", "tanh", 5).unwrap();
    out.push(g.finish(LossKind::Ctc { blank: 4 }, "out").unwrap());

    // Question 2's path: the conv's own row layout through ReLU, a conv of a tracked
    // input, the pool's window matrix, then NCHW; and a one-direction LSTM with
    // PyTorch's two biases.
    let mut g = GraphBuilder::new("conv-relu-avgpool-lstm");
    g.input("x", Shape::fixed(&[3, 6, 6])).unwrap();
    g.conv("c", "x", 4, 2, 3, 1, None).unwrap();
    g.push("r", Op::Relu, &["c"]).unwrap();
    // A conv of a tracked input: the transposed matrix and col2im, stride 2.
    g.push(
        "c2",
        Op::Conv {
            in_channels: 4,
            out_channels: 4,
            window: Window {
                kernel: vec![3, 2],
                stride: vec![1, 2],
                padding: vec![[1, 1], [0, 1]],
                dilation: vec![1, 1],
            },
            groups: 1,
            bias: true,
            standardize: None,
        },
        &["r"],
    )
    .unwrap();
    g.pool("ap", "c2", PoolKind::Avg, 2, 3, 3, None).unwrap();
    g.push("f", Op::Flatten, &["ap"]).unwrap();
    g.linear("fc", "f", 6).unwrap();
    g.push("seq", Op::Reshape { shape: vec![3, 2] }, &["fc"])
        .unwrap();
    g.rnn("lstm", "seq", Cell::Lstm, 4, false, RnnBias::Double)
        .unwrap();
    g.push("flat", Op::Flatten, &["lstm"]).unwrap();
    g.linear("out", "flat", 2).unwrap();
    out.push(g.finish(LossKind::Mse, "out").unwrap());

    let mut g = GraphBuilder::new("embedding-gru-frames");
    g.input_of(
        "tok",
        Shape(vec![batchfit_graph::Dim::Seq]),
        InputKind::Tokens { vocab: 7 },
    )
    .unwrap();
    g.seq_len(6);
    g.push("emb", Op::Embedding { vocab: 7, dim: 4 }, &["tok"])
        .unwrap();
    g.rnn("gru", "emb", Cell::Gru, 5, false, RnnBias::Double)
        .unwrap();
    g.linear("out", "gru", 3).unwrap();
    out.push(g.finish(LossKind::CrossEntropyPerFrame, "out").unwrap());

    // The ops of exported CNN families and RNN heads: hard swish and a hard-sigmoid
    // gate (MobileNetV3), LRN (GoogLeNet v1), stochastic depth (EfficientNet), a slice
    // and reductions of sample axes, a constant scale.
    let mut g = GraphBuilder::new("mobile-classic-heads");
    g.input("x", Shape::fixed(&[3, 6, 6])).unwrap();
    g.conv("c", "x", 4, 2, 3, 1, Some(1)).unwrap();
    g.push("hs", Op::HardSwish, &["c"]).unwrap();
    let lrn = Op::Lrn {
        size: 3,
        alpha: 0.05,
        beta: 0.75,
        bias: 1.0,
    };
    g.push("lrn", lrn, &["hs"]).unwrap();
    let gate = Op::HardSigmoid {
        alpha: 0.2,
        beta: 0.5,
    };
    g.push("gate", gate, &["lrn"]).unwrap();
    g.push("m", Op::Mul, &["lrn", "gate"]).unwrap();
    g.push("dp", Op::DropPath { p: 0.2 }, &["m"]).unwrap();
    let slice = Op::Slice {
        axis: 2,
        start: 1,
        end: 5,
    };
    g.push("sl", slice, &["dp"]).unwrap();
    let reduce = |reduce, axes: &[i64], keep_dims| Op::Reduce {
        reduce,
        axes: axes.to_vec(),
        keep_dims,
    };
    g.push("mean", reduce(ReduceKind::Mean, &[3], false), &["sl"])
        .unwrap();
    g.push("sum", reduce(ReduceKind::Sum, &[-1], true), &["mean"])
        .unwrap();
    g.push("max", reduce(ReduceKind::Max, &[1], false), &["mean"])
        .unwrap();
    g.push("sumf", Op::Flatten, &["sum"]).unwrap();
    g.push("both", Op::Add, &["sumf", "max"]).unwrap();
    g.push("half", Op::Scale { factor: 0.5 }, &["both"])
        .unwrap();
    g.linear("out", "half", 3).unwrap();
    out.push(g.finish(LossKind::CrossEntropy, "out").unwrap());

    // A segmentation head as ONNX exports reach the IR: a leaky ReLU, a learned layer scale, a nearest
    // upsample, a bilinear resize and zero padding, classes per position.
    let mut g = GraphBuilder::new("layer-scale-resize");
    g.input("x", Shape::fixed(&[2, 6, 6])).unwrap();
    g.conv("c", "x", 8, 2, 3, 3, Some(0)).unwrap();
    g.push("leaky", Op::LeakyRelu { alpha: 0.1 }, &["c"])
        .unwrap();
    let scale = Op::MulParam {
        shape: vec![8, 1, 1],
    };
    let inorm = Op::InstanceNorm {
        channels: 8,
        affine: true,
    };
    g.push("inorm", inorm, &["leaky"]).unwrap();
    let prelu = Op::PRelu {
        shape: vec![8, 1, 1],
    };
    g.push("prelu", prelu, &["inorm"]).unwrap();
    g.push("scaled", scale, &["prelu"]).unwrap();
    let resize = |size: usize, mode| Op::Resize {
        size: vec![size, size],
        mode,
        align_corners: false,
    };
    g.push("up", resize(4, ResizeMode::Nearest), &["scaled"])
        .unwrap();
    g.push("down", resize(2, ResizeMode::Linear), &["up"])
        .unwrap();
    // Padded with ones, as EfficientViT's linear attention pads its values.
    let pad = Op::Pad {
        pads: vec![[0, 0], [1, 0], [0, 1]],
        value: 1.0,
    };
    g.push("padded", pad, &["down"]).unwrap();
    // A constant mask broadcast over channels, as Swin's shifted windows add one.
    let mask = Op::AddConst {
        shape: vec![1, 3, 3],
        values: vec![0.0, -1.0, 0.5, 0.0, 0.0, -2.0, 1.0, 0.0, 0.0],
    };
    g.push("masked", mask, &["padded"]).unwrap();
    // The channel mean repeated over four channels beside them (an `expand` a
    // concatenation reads, as BoTNet's relative logits are repeated).
    g.push(
        "channel_mean",
        reduce(ReduceKind::Mean, &[1], true),
        &["masked"],
    )
    .unwrap();
    let repeat = Op::Expand {
        shape: vec![4, 1, 1],
    };
    g.push("repeated", repeat, &["channel_mean"]).unwrap();
    g.push("with_mean", Op::Concat { axis: 1 }, &["masked", "repeated"])
        .unwrap();
    g.conv("head", "with_mean", 3, 2, 1, 1, Some(0)).unwrap();
    let classes_last = Op::Transpose {
        perm: vec![1, 2, 0],
    };
    g.push("classes_last", classes_last, &["head"]).unwrap();
    let rows = Op::Reshape { shape: vec![-1, 3] };
    g.push("rows", rows, &["classes_last"]).unwrap();
    out.push(g.finish(LossKind::CrossEntropyPerFrame, "rows").unwrap());

    // Causal self-attention as ONNX exports reach the IR: a class token, a learned positional addend,
    // heads split by reshape and transpose, a causal mask, heads merged back.
    let (t, e, h) = (5, 8, 2);
    let d = e / h;
    let mut g = GraphBuilder::new("attention-ops");
    // T - 1 patches and a class token.
    g.input("x", Shape::fixed(&[t - 1, e])).unwrap();
    let cls = Op::ConcatParam {
        axis: 1,
        shape: vec![1, e],
        first: true,
    };
    g.push("cls", cls, &["x"]).unwrap();
    g.push("pos", Op::AddParam { shape: vec![t, e] }, &["cls"])
        .unwrap();
    g.linear("qkv", "pos", 3 * e).unwrap();
    let split = |v: &[usize]| Op::Reshape {
        shape: v.iter().map(|&k| k as i64).collect(),
    };
    g.push("split", split(&[t, 3, h, d]), &["qkv"]).unwrap();
    // [T, 3, H, d] -> [3, H, T, d], then one slice per projection.
    g.push(
        "heads",
        Op::Transpose {
            perm: vec![1, 2, 0, 3],
        },
        &["split"],
    )
    .unwrap();
    for (k, name) in ["q", "k", "v"].into_iter().enumerate() {
        let slice = Op::Slice {
            axis: 1,
            start: k,
            end: k + 1,
        };
        g.push(&format!("{name}1"), slice, &["heads"]).unwrap();
        g.push(name, split(&[h, t, d]), &[&format!("{name}1")])
            .unwrap();
    }
    g.push(
        "kt",
        Op::Transpose {
            perm: vec![0, 2, 1],
        },
        &["k"],
    )
    .unwrap();
    g.push("scores", Op::MatMul, &["q", "kt"]).unwrap();
    g.push("scaled", Op::Scale { factor: 0.5 }, &["scores"])
        .unwrap();
    g.push("masked", Op::CausalMask, &["scaled"]).unwrap();
    g.push("attn", Op::Softmax { axis: -1 }, &["masked"])
        .unwrap();
    g.push("ctx", Op::MatMul, &["attn", "v"]).unwrap();
    g.push(
        "merged",
        Op::Transpose {
            perm: vec![1, 0, 2],
        },
        &["ctx"],
    )
    .unwrap();
    g.push("flat", split(&[t, e]), &["merged"]).unwrap();
    g.push("res", Op::Add, &["flat", "pos"]).unwrap();
    g.push("norm", Op::LayerNorm { features: e }, &["res"])
        .unwrap();
    g.linear("out", "norm", 3).unwrap();
    out.push(g.finish(LossKind::CrossEntropyPerFrame, "out").unwrap());
    // A decoder's normalisation and rotary embedding: RMSNorm, then `x * cos` plus the
    // negated `x * sin` (constants broadcast over the positions' features), then each
    // position divided by its L2 norm.
    let mut g = GraphBuilder::new("rms-norm-rotary");
    g.input("x", Shape::fixed(&[4, 6])).unwrap();
    g.linear("proj", "x", 6).unwrap();
    g.rms_norm("norm", "proj").unwrap();
    let table = |f: fn(f32) -> f32| (0..24).map(|k| f(k as f32 * 0.3)).collect::<Vec<f32>>();
    let cos = Op::MulConst {
        shape: vec![4, 6],
        values: table(f32::cos),
    };
    let sin = Op::MulConst {
        shape: vec![1, 6],
        values: table(f32::sin)[..6].to_vec(),
    };
    g.push("cos", cos, &["norm"]).unwrap();
    g.push("sin", sin, &["norm"]).unwrap();
    g.push("neg", Op::Scale { factor: -1.0 }, &["sin"]).unwrap();
    g.push("rope", Op::Add, &["cos", "neg"]).unwrap();
    // Each position scaled to unit length: an L2 norm and a quotient of activations.
    let l2 = Op::Reduce {
        reduce: ReduceKind::L2,
        axes: vec![-1],
        keep_dims: true,
    };
    g.push("length", l2, &["rope"]).unwrap();
    g.push("unit", Op::Div, &["rope", "length"]).unwrap();
    g.linear("head", "unit", 3).unwrap();
    out.push(g.finish(LossKind::Mse, "head").unwrap());
    // An attention pool (SigLIP's MAP head): a learned query, the same for every
    // sample, attends over the positions.
    let (t, e) = (4, 6);
    let mut g = GraphBuilder::new("attention-pool");
    g.input("x", Shape::fixed(&[t, e])).unwrap();
    let latent = Op::BroadcastParam { shape: vec![1, e] };
    g.push("latent", latent, &["x"]).unwrap();
    g.linear("q", "latent", e).unwrap();
    g.linear("k", "x", e).unwrap();
    g.linear("v", "x", e).unwrap();
    g.push("kt", Op::Transpose { perm: vec![1, 0] }, &["k"])
        .unwrap();
    g.push("scores", Op::MatMul, &["q", "kt"]).unwrap();
    g.push("attn", Op::Softmax { axis: -1 }, &["scores"])
        .unwrap();
    g.push("pooled", Op::MatMul, &["attn", "v"]).unwrap();
    let flat = Op::Reshape {
        shape: vec![e as i64],
    };
    g.push("flat", flat, &["pooled"]).unwrap();
    g.linear("head", "flat", 3).unwrap();
    out.push(g.finish(LossKind::CrossEntropy, "head").unwrap());
    // A relative-position MLP (timm's ViT-relpos): two linear layers over a constant
    // table of coordinates, computed once per step (shared), read at every pair's index
    // and added to each sample's scores.
    let (n, heads, table) = (3, 2, 5);
    let mut g = GraphBuilder::new("relative-position-mlp");
    g.input("x", Shape::fixed(&[heads, n, n])).unwrap();
    let coords = Op::Constant {
        shape: vec![table, 2],
        values: (0..2 * table).map(|k| k as f32 * 0.25 - 1.0).collect(),
    };
    g.push("coords", coords, &["x"]).unwrap();
    g.linear("fc1", "coords", 8).unwrap();
    g.push("act", Op::Relu, &["fc1"]).unwrap();
    g.linear("fc2", "act", heads).unwrap();
    let pairs: Vec<usize> = (0..n * n)
        .map(|k| (k / n + n - 1 - k % n) % table)
        .collect();
    let take = Op::Take {
        axis: 1,
        indices: pairs,
    };
    g.push("pairs", take, &["fc2"]).unwrap();
    let square = Op::Reshape {
        shape: vec![n as i64, n as i64, heads as i64],
    };
    g.push("square", square, &["pairs"]).unwrap();
    let heads_first = Op::Transpose {
        perm: vec![2, 0, 1],
    };
    g.push("bias", heads_first, &["square"]).unwrap();
    g.push("scores", Op::Add, &["x", "bias"]).unwrap();
    g.push("flat", Op::Flatten, &["scores"]).unwrap();
    g.linear("head", "flat", 3).unwrap();
    out.push(g.finish(LossKind::CrossEntropy, "head").unwrap());
    // Swin V2's cosine attention: each key scaled to unit length (`F.normalize`: an L2
    // norm floored at 1e-12), the keys of a padded row zero (a window past the feature
    // map's edge, projected without a bias: the norm's gradient there is 0, not NaN),
    // then a learned per-head log-scale, capped and made positive once per step
    // (`logit_scale.clamp(max).exp()`).
    let (heads, n) = (2, 3);
    let mut g = GraphBuilder::new("cosine-attention-scale");
    g.input("x", Shape::fixed(&[heads, n, n])).unwrap();
    let zero_row = Op::Pad {
        pads: vec![[0, 0], [0, 1], [0, 0]],
        value: 0.0,
    };
    g.push("padded", zero_row, &["x"]).unwrap();
    let key = Op::Linear {
        in_features: n,
        out_features: n,
        bias: false,
    };
    g.push("key", key, &["padded"]).unwrap();
    let l2 = Op::Reduce {
        reduce: ReduceKind::L2,
        axes: vec![-1],
        keep_dims: true,
    };
    g.push("length", l2, &["key"]).unwrap();
    let floor = Op::Clamp {
        min: 1e-12,
        max: f32::MAX,
    };
    g.push("floored", floor, &["length"]).unwrap();
    g.push("unit", Op::Div, &["key", "floored"]).unwrap();
    let logit = Op::Parameter {
        shape: vec![heads, 1, 1],
    };
    g.push("logit", logit, &["x"]).unwrap();
    let cap = Op::Clamp {
        min: f32::MIN,
        max: 1.5,
    };
    g.push("capped", cap, &["logit"]).unwrap();
    g.push("scale", Op::Exp, &["capped"]).unwrap();
    g.push("scaled", Op::Mul, &["unit", "scale"]).unwrap();
    g.push("flat", Op::Flatten, &["scaled"]).unwrap();
    g.linear("head", "flat", 3).unwrap();
    out.push(g.finish(LossKind::CrossEntropy, "head").unwrap());
    // Positions computed once per step and mixed into each sample: a constant grid
    // convolved (XCiT's Fourier positions), a softmax over a constant table's linear
    // layer (ConViT's positional scores), and a learned gate between them and the
    // sample (`(1 - sigmoid(g)) * x + sigmoid(g) * positions`).
    let (c, side) = (2, 3);
    let mut g = GraphBuilder::new("positions-once-per-step");
    g.input("x", Shape::fixed(&[c, side, side])).unwrap();
    let grid = Op::Constant {
        shape: vec![2, side, side],
        values: (0..2 * side * side).map(|k| (k % 4) as f32 * 0.5).collect(),
    };
    g.push("grid", grid, &["x"]).unwrap();
    g.conv("fourier", "grid", c, 2, 1, 1, Some(0)).unwrap();
    g.linear("table", "fourier", side).unwrap();
    g.push("scores", Op::Softmax { axis: -1 }, &["table"])
        .unwrap();
    let gate = Op::Parameter {
        shape: vec![c, 1, 1],
    };
    g.push("gate", gate, &["x"]).unwrap();
    g.push("open", Op::Sigmoid, &["gate"]).unwrap();
    g.push("negated", Op::Scale { factor: -1.0 }, &["open"])
        .unwrap();
    let one_minus = Op::AddConst {
        shape: vec![],
        values: vec![1.0],
    };
    g.push("closed", one_minus, &["negated"]).unwrap();
    g.push("kept", Op::Mul, &["x", "closed"]).unwrap();
    g.push("placed", Op::Mul, &["scores", "open"]).unwrap();
    g.push("mixed", Op::Add, &["kept", "placed"]).unwrap();
    // A bias joined from a learned part and a constant one (timm's Swin V2 qkv bias).
    let learned = Op::Parameter {
        shape: vec![side - 1],
    };
    g.push("learned", learned, &["x"]).unwrap();
    let fixed = Op::Constant {
        shape: vec![1],
        values: vec![0.0],
    };
    g.push("fixed", fixed, &["x"]).unwrap();
    g.push("bias", Op::Concat { axis: 1 }, &["learned", "fixed"])
        .unwrap();
    g.push("biased", Op::Add, &["mixed", "bias"]).unwrap();
    g.push("flat", Op::Flatten, &["biased"]).unwrap();
    g.linear("head", "flat", 3).unwrap();
    out.push(g.finish(LossKind::CrossEntropy, "head").unwrap());
    // Transposed convolutions: a 2-d one with padding and output padding (a decoder's
    // upsampling), then a grouped 1-d one over rows as more batch (ConvTasNet's decoder
    // over `[B·sources, C, L]`).
    let mut g = GraphBuilder::new("transposed-convolutions");
    g.input("x", Shape::fixed(&[2, 3, 3])).unwrap();
    let up = Op::ConvTranspose {
        in_channels: 2,
        out_channels: 4,
        window: Window {
            kernel: vec![3, 2],
            stride: vec![2, 1],
            padding: vec![[1, 1], [0, 0]],
            dilation: vec![1, 1],
        },
        output_padding: vec![1, 0],
        groups: 1,
        bias: true,
    };
    g.push("up", up, &["x"]).unwrap();
    let rows = Op::Reshape {
        shape: vec![2, 2, 24],
    };
    g.push("rows", rows, &["up"]).unwrap();
    let decode = Op::ConvTranspose {
        in_channels: 2,
        out_channels: 2,
        window: Window {
            kernel: vec![3],
            stride: vec![2],
            padding: vec![[0, 0]],
            dilation: vec![2],
        },
        output_padding: vec![0],
        groups: 2,
        bias: false,
    };
    g.push("decode", decode, &["rows"]).unwrap();
    g.push("flat", Op::Flatten, &["decode"]).unwrap();
    g.linear("head", "flat", 3).unwrap();
    out.push(g.finish(LossKind::CrossEntropy, "head").unwrap());
    // Six sample axes transposed, two pairs moving together (MaxViT's partitions):
    // four axes once the pairs are merged.
    let mut g = GraphBuilder::new("six-axis-transpose");
    g.input("x", Shape::fixed(&[2, 2, 2, 3, 2, 2])).unwrap();
    let swap = Op::Transpose {
        perm: vec![0, 1, 3, 2, 4, 5],
    };
    g.push("swap", swap, &["x"]).unwrap();
    g.linear("mix", "swap", 3).unwrap();
    g.push("flat", Op::Flatten, &["mix"]).unwrap();
    g.linear("head", "flat", 3).unwrap();
    out.push(g.finish(LossKind::CrossEntropy, "head").unwrap());
    // A recurrent layer over several sequences per sample (a batch merged with rows,
    // timm's Sequencer): `[rows, T, features]`, each row its own sequence.
    let mut g = GraphBuilder::new("lstm-over-rows");
    g.input("x", Shape::fixed(&[2, 3, 4])).unwrap();
    g.rnn("rows", "x", Cell::Lstm, 5, true, RnnBias::Double)
        .unwrap();
    g.push("flat", Op::Flatten, &["rows"]).unwrap();
    g.linear("head", "flat", 3).unwrap();
    out.push(g.finish(LossKind::CrossEntropy, "head").unwrap());
    // Standardised weights (BiT's and NFNet's convolutions): one over the batch (the
    // im2col product) with NFNet's learned gain and constant scale, one over a
    // tracked input (the CPU's own convolution) without a gain, and a 1-d one.
    let mut g = GraphBuilder::new("standardized-convolutions");
    g.input("x", Shape::fixed(&[2, 5, 5])).unwrap();
    let standardized = |in_channels, out_channels, spatial, gain: bool| Op::Conv {
        in_channels,
        out_channels,
        window: Window::square(spatial, 3, 1, 1),
        groups: 1,
        bias: !gain,
        standardize: Some(Standardize {
            eps: 1e-5,
            gain,
            scale: if gain { 0.6 } else { 1.0 },
        }),
    };
    g.push("stem", standardized(2, 3, 2, true), &["x"]).unwrap();
    g.push("a1", Op::Tanh, &["stem"]).unwrap();
    g.push("block", standardized(3, 4, 2, false), &["a1"])
        .unwrap();
    g.push("a2", Op::Tanh, &["block"]).unwrap();
    let rows = Op::Reshape { shape: vec![4, 25] };
    g.push("rows", rows, &["a2"]).unwrap();
    g.push("line", standardized(4, 2, 1, true), &["rows"])
        .unwrap();
    g.push("flat", Op::Flatten, &["line"]).unwrap();
    g.linear("head", "flat", 3).unwrap();
    out.push(g.finish(LossKind::CrossEntropy, "head").unwrap());
    out
}

/// The backend's random generator is global: tests that seed it and draw
/// initial weights take turns, so each one's weights are the same every run.
pub static SEEDED: Mutex<()> = Mutex::new(());

/// Adam at `lr` on `device`, weights drawn from seed 7.
pub fn trainer(g: &Graph, lr: f64, device: DeviceSpec) -> Trainer {
    Trainer::new(
        g,
        TrainConfig {
            optimizer: Optimizer::Adam,
            lr,
            seq_len: g.default_seq_len.unwrap_or(1),
            seed: 7,
            device,
            init_random: false,
        },
    )
    .unwrap()
}
