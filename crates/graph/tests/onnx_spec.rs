//! ONNX import by the operator spec, for ops the families of the generated corpus
//! (bench/corpus_gen.py) export: 3-d convolutions and pools (torchvision's video
//! models), a learned layer scale (ConvNeXt, timm's `LayerScale`), `Split` (a fused
//! qkv, ShuffleNet's channel split) also of a transposed channel axis, integer `Div` in
//! shape arithmetic (PyTorch's `chunk`), a final log-softmax over the class axis of
//! `[B, C, T]` (Wav2Letter) read by a per-position loss, `Resize`, Hugging Face
//! embeddings (tables read at buffered ids), an expanded gate, `LeakyRelu` and the shape
//! of a constant.

use batchfit_graph::onnx::proto::DataType;
use batchfit_graph::onnx::proto::{AttributeProto, AttributeType};
use batchfit_graph::{Cell, LossKind, Op, ResizeMode, onnx};

mod common;
use common::*;

#[test]
fn a_3d_convolution_and_pool_load_with_their_windows() {
    let mut n = Net::new("r3d-stem");
    n.input("x", "batch,3,4,8,8");
    n.weight("stem.W", &[6, 3, 3, 3, 3]);
    n.node(
        "Conv",
        "/stem/Conv",
        &["x", "stem.W"],
        &["c"],
        vec![
            ints("kernel_shape", &[3, 3, 3]),
            ints("pads", &[1, 1, 1, 1, 1, 1]),
            ints("strides", &[1, 2, 2]),
        ],
    );
    n.node("Relu", "/stem/Relu", &["c"], &["r"], vec![]);
    n.node(
        "MaxPool",
        "/pool",
        &["r"],
        &["p"],
        vec![
            ints("kernel_shape", &[2, 2, 2]),
            ints("strides", &[2, 2, 2]),
        ],
    );
    classifier_head(&mut n, "p", 6, 5);

    let g = onnx::parse(&n.bytes()).unwrap();
    let node = |name: &str| g.nodes.iter().find(|x| x.name == name).unwrap();
    assert_eq!(node("/stem/Conv").op.name(), "conv3d");
    assert_eq!(
        g.shape_of("/stem/Conv").unwrap().to_string(),
        "[B, 6, 4, 4, 4]"
    );
    assert_eq!(g.shape_of("/pool").unwrap().to_string(), "[B, 6, 2, 2, 2]");
    assert_eq!(g.param_count(), 6 * 3 * 27 + 5 * 6 + 5);
}

#[test]
fn a_layer_scale_initializer_is_a_learned_factor() {
    let mut n = Net::new("convnext-block");
    n.input("x", "batch,4,5,5");
    n.weight("dw.W", &[4, 1, 3, 3]).weight("dw.B", &[4]);
    n.node(
        "Conv",
        "/dw",
        &["x", "dw.W", "dw.B"],
        &["d"],
        vec![
            ints("kernel_shape", &[3, 3]),
            ints("pads", &[1, 1, 1, 1]),
            int("group", 4),
        ],
    );
    n.weight("layer_scale", &[4, 1, 1]);
    n.node("Mul", "/Mul", &["layer_scale", "d"], &["s"], vec![]);
    n.node("Add", "/res", &["s", "x"], &["y"], vec![]);
    classifier_head(&mut n, "y", 4, 3);

    let g = onnx::parse(&n.bytes()).unwrap();
    let node = g.nodes.iter().find(|x| x.name == "/Mul").unwrap();
    assert_eq!(
        node.op,
        Op::MulParam {
            shape: vec![4, 1, 1]
        }
    );
    assert_eq!(g.param_count(), 4 * 9 + 4 + 4 + 3 * 4 + 3);
}

/// Global average pooling, flattened, and a `Gemm` to `classes` logits (the graph's output).
fn classifier_head(n: &mut Net, x: &str, channels: i64, classes: i64) {
    n.node("GlobalAveragePool", "/gap", &[x], &["g"], vec![]);
    n.node("Flatten", "/flat", &["g"], &["f"], vec![]);
    n.weight("fc.W", &[classes, channels])
        .weight("fc.B", &[classes]);
    let gemm = vec![int("transB", 1)];
    n.node("Gemm", "/fc", &["f", "fc.W", "fc.B"], &["logits"], gemm);
    n.output("logits");
}

/// `y = x Wᵀ` on a `[B, T, i]` input: MatMul by a constant `[i, o]`.
fn matmul(n: &mut Net, name: &str, x: &str, i: i64, o: i64, out: &str) {
    n.weight(&format!("{name}.W"), &[i, o]);
    n.node(
        "MatMul",
        &format!("{name}/MatMul"),
        &[x, &format!("{name}.W")],
        &[out],
        vec![],
    );
}

#[test]
fn split_gives_each_output_its_part() {
    let mut n = Net::new("fused-qkv");
    n.input("x", "batch,6,8");
    matmul(&mut n, "qkv", "x", 8, 24, "qkv");
    // Sizes from the `split` input, and equal parts without one.
    n.init(int64s("sizes", &[8, 8, 8]));
    n.node(
        "Split",
        "/Split",
        &["qkv", "sizes"],
        &["q", "k", "v"],
        vec![int("axis", -1)],
    );
    n.node(
        "Split",
        "/Split2",
        &["v"],
        &["v0", "v1"],
        vec![int("axis", 2)],
    );
    n.node("Add", "/qk", &["q", "k"], &["qk"], vec![]);
    n.node(
        "Concat",
        "/cat",
        &["qk", "v0", "v1"],
        &["y"],
        vec![int("axis", 2)],
    );
    n.output("y");

    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(g.shape_of("/qk").unwrap().to_string(), "[B, 6, 8]");
    assert_eq!(g.shape_of("/cat").unwrap().to_string(), "[B, 6, 16]");
    let slices: Vec<_> = g
        .nodes
        .iter()
        .filter_map(|x| match x.op {
            Op::Slice { start, end, .. } => Some((start, end)),
            _ => None,
        })
        .collect();
    assert_eq!(slices, vec![(0, 8), (8, 16), (16, 24), (0, 4), (4, 8)]);
}

#[test]
fn a_split_of_shuffled_channels_reads_the_materialised_tensor() {
    // ShuffleNet's channel shuffle, `view(B, 2, C/2, H, W).transpose(1, 2).view(B, C, H,
    // W)`, then `chunk(2, dim=1)` of the shuffled channels.
    let mut n = Net::new("shuffle");
    n.input("x", "batch,6,3,3");
    n.init(int64s("split5", &[0, 2, 3, 3, 3]));
    n.node("Reshape", "/r1", &["x", "split5"], &["r1"], vec![]);
    n.node(
        "Transpose",
        "/t",
        &["r1"],
        &["t"],
        vec![ints("perm", &[0, 2, 1, 3, 4])],
    );
    n.init(int64s("merge4", &[0, 6, 3, 3]));
    n.node("Reshape", "/r2", &["t", "merge4"], &["s"], vec![]);
    n.init(int64s("halves", &[3, 3]));
    n.node(
        "Split",
        "/chunk",
        &["s", "halves"],
        &["a", "b"],
        vec![int("axis", 1)],
    );
    n.node("Mul", "/ab", &["a", "b"], &["y"], vec![]);
    n.output("y");

    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(g.shape_of("/ab").unwrap().to_string(), "[B, 3, 3, 3]");
    // The shuffle became IR ops (a transpose among them) before the slices.
    assert!(g.nodes.iter().any(|x| matches!(x.op, Op::Transpose { .. })));
}

#[test]
fn integer_div_in_a_shape_computation_truncates() {
    // `chunk(2, dim=1)` of 5 channels: parts of (5 + 2 - 1) / 2 = 3 (and 2).
    let mut n = Net::new("chunk-size");
    n.input("x", "batch,5,4");
    n.node("Shape", "/Shape", &["x"], &["shape"], vec![]);
    n.init(int64s("one_axis", &[1]));
    n.node(
        "Gather",
        "/Gather",
        &["shape", "one_axis"],
        &["c"],
        vec![int("axis", 0)],
    );
    n.init(int64s("one", &[1]));
    n.node("Add", "/Add", &["c", "one"], &["c1"], vec![]);
    n.init(int64s("two", &[2]));
    n.node("Div", "/Div", &["c1", "two"], &["half"], vec![]);
    n.init(int64s("zero", &[0]));
    n.node(
        "Slice",
        "/Slice",
        &["x", "zero", "half", "one_axis"],
        &["y"],
        vec![],
    );
    n.node("Relu", "/Relu", &["y"], &["out"], vec![]);
    n.output("out");

    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(g.shape_of("/Relu").unwrap().to_string(), "[B, 3, 4]");
}

#[test]
fn a_final_log_softmax_over_the_class_axis_becomes_a_per_position_loss() {
    let mut n = Net::new("wav2letter-head");
    n.input("x", "batch,4,7");
    n.weight("conv.W", &[3, 4, 1]).weight("conv.B", &[3]);
    n.node(
        "Conv",
        "/Conv",
        &["x", "conv.W", "conv.B"],
        &["c"],
        vec![ints("kernel_shape", &[1])],
    );
    n.node(
        "LogSoftmax",
        "/LogSoftmax",
        &["c"],
        &["y"],
        vec![int("axis", 1)],
    );
    n.output("y");

    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(g.loss.kind, LossKind::CrossEntropyPerFrame);
    // Positions become rows, classes last.
    assert_eq!(g.shape_of(&g.loss.input).unwrap().to_string(), "[B, 7, 3]");
    assert_eq!(g.param_count(), 3 * 4 + 3);
}

#[test]
fn resize_to_sizes_or_by_scales_keeps_batch_and_channels() {
    // torchvision's FCN head: `interpolate(x, size=input_shape, mode="bilinear")`, the
    // sizes a shape value (the batch and the channels from `Shape`), then an upsample by
    // constant scales.
    let mut n = Net::new("fcn-head");
    n.input("x", "batch,3,8,8");
    n.weight("conv.W", &[4, 3, 3, 3]).weight("conv.B", &[4]);
    n.node(
        "Conv",
        "/Conv",
        &["x", "conv.W", "conv.B"],
        &["c"],
        vec![ints("kernel_shape", &[3, 3]), ints("strides", &[2, 2])],
    );
    n.node("Shape", "/Shape", &["c"], &["shape"], vec![]);
    n.init(int64s("zero", &[0]));
    n.init(int64s("two", &[2]));
    n.node(
        "Slice",
        "/Slice",
        &["shape", "zero", "two"],
        &["bc"],
        vec![],
    );
    n.init(int64s("hw", &[8, 8]));
    n.node(
        "Concat",
        "/Concat",
        &["bc", "hw"],
        &["sizes"],
        vec![int("axis", 0)],
    );
    n.init(floats("roi", &[0], &[]));
    n.init(floats("no_scales", &[0], &[]));
    n.node(
        "Resize",
        "/Resize",
        &["c", "roi", "no_scales", "sizes"],
        &["up"],
        vec![string("mode", "linear")],
    );
    n.init(floats("scales", &[4], &[1.0, 1.0, 2.0, 2.0]));
    n.node(
        "Resize",
        "/Resize2",
        &["up", "roi", "scales"],
        &["y"],
        vec![string("mode", "nearest")],
    );
    n.output("y");

    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(g.shape_of("/Conv").unwrap().to_string(), "[B, 4, 3, 3]");
    assert_eq!(g.shape_of("/Resize").unwrap().to_string(), "[B, 4, 8, 8]");
    assert_eq!(
        g.shape_of("/Resize2").unwrap().to_string(),
        "[B, 4, 16, 16]"
    );
    let node = g.nodes.iter().find(|x| x.name == "/Resize").unwrap();
    assert!(matches!(
        node.op,
        Op::Resize {
            mode: ResizeMode::Linear,
            align_corners: false,
            ..
        }
    ));
}

/// An int64 constant of any rank (a registered buffer of ids).
#[test]
fn bert_style_embeddings_read_their_tables_at_buffered_ids() {
    // Hugging Face's embeddings: a token lookup, `input_ids.view(-1, T)` first (GPT-2),
    // position ids sliced from a `[1, max]` buffer, token type ids (zeros) expanded over
    // the batch; each table a parameter of PyTorch's size.
    const T: i64 = 4;
    const MAX: i64 = 6;
    const D: i64 = 3;
    let mut n = Net::new("hf-embeddings");
    n.input_of("ids", &format!("batch,{T}"), DataType::Int64);
    n.init(int64s("view", &[-1, T]));
    n.node("Reshape", "/view", &["ids", "view"], &["ids2"], vec![]);
    n.weight("word", &[10, D]);
    n.node("Gather", "/word", &["word", "ids2"], &["w"], vec![]);
    n.init(int64_tensor("position_ids", &[1, MAX], &[0, 1, 2, 3, 4, 5]));
    n.init(int64s("zero", &[0]));
    n.init(int64s("t", &[T]));
    n.init(int64s("one", &[1]));
    n.node(
        "Slice",
        "/pos_slice",
        &["position_ids", "zero", "t", "one"],
        &["pos_ids"],
        vec![],
    );
    n.weight("position", &[MAX, D]);
    n.node(
        "Gather",
        "/position",
        &["position", "pos_ids"],
        &["p"],
        vec![],
    );
    n.init(int64_tensor("token_type_ids", &[1, T], &[0; T as usize]));
    n.node("Shape", "/Shape", &["ids"], &["shape"], vec![]);
    n.node(
        "Expand",
        "/tt_expand",
        &["token_type_ids", "shape"],
        &["tt_ids"],
        vec![],
    );
    n.weight("token_type", &[2, D]);
    n.node(
        "Gather",
        "/token_type",
        &["token_type", "tt_ids"],
        &["tt"],
        vec![],
    );
    n.node("Add", "/add_tt", &["w", "tt"], &["e1"], vec![]);
    n.node("Add", "/add_pos", &["e1", "p"], &["e"], vec![]);
    n.output("e");

    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(g.param_count(), (10 + MAX + 2) as u64 * D as u64);
    let node = |name: &str| &g.nodes.iter().find(|x| x.name == name).unwrap().op;
    let Op::AddTable { table, index, .. } = node("/add_pos") else {
        panic!("{:?}", node("/add_pos"))
    };
    assert_eq!(*table, (MAX * D) as usize);
    assert_eq!(index.len(), (T * D) as usize);
    // Position ids 0..T: the first T rows.
    assert_eq!(index[..], (0..(T * D) as usize).collect::<Vec<_>>()[..]);
    // Token type 0 at every position: row 0, T times.
    let Op::AddTable { index, .. } = node("/add_tt") else {
        panic!("{:?}", node("/add_tt"))
    };
    assert_eq!(index[..], [0, 1, 2].repeat(T as usize)[..]);
}

#[test]
fn an_activation_expanded_before_a_product_is_broadcast_and_sub_negates() {
    // timm's ECA / squeeze-excite gate: `x * y.expand_as(x)`.
    let mut n = Net::new("eca-gate");
    n.input("x", "batch,4,3,3");
    n.node("GlobalAveragePool", "/gap", &["x"], &["g"], vec![]);
    n.node("Sigmoid", "/gate", &["g"], &["s"], vec![]);
    n.node("Shape", "/Shape", &["x"], &["shape"], vec![]);
    n.node("Expand", "/expand", &["s", "shape"], &["e"], vec![]);
    n.node("Mul", "/Mul", &["x", "e"], &["y"], vec![]);
    // FastViT's `x - mixer(x)`.
    n.node("Sub", "/Sub", &["y", "x"], &["d"], vec![]);
    n.node(
        "LeakyRelu",
        "/act",
        &["d"],
        &["z"],
        vec![float("alpha", 0.1)],
    );
    n.output("z");

    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(g.shape_of("/Mul").unwrap().to_string(), "[B, 4, 3, 3]");
    let op = |name: &str| &g.nodes.iter().find(|x| x.name == name).unwrap().op;
    assert_eq!(op("/act"), &Op::LeakyRelu { alpha: 0.1 });
    assert_eq!(op("/Sub"), &Op::Scale { factor: -1.0 });
    assert_eq!(op("/Sub_2"), &Op::Add);
}

#[test]
fn the_shape_of_a_constant_is_its_dims_and_no_parameter() {
    // A buffer read only for its shape (timm's `pos_embed` sizes) is not a parameter.
    let mut n = Net::new("shape-of-buffer");
    n.input("x", "batch,6");
    n.weight("table", &[2, 3]);
    n.node("Shape", "/Shape", &["table"], &["ts"], vec![]);
    n.init(int64s("keep", &[0]));
    n.node(
        "Concat",
        "/Concat",
        &["keep", "ts"],
        &["target"],
        vec![int("axis", 0)],
    );
    n.node("Reshape", "/Reshape", &["x", "target"], &["y"], vec![]);
    n.node("Relu", "/Relu", &["y"], &["z"], vec![]);
    n.output("z");

    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(g.shape_of("/Relu").unwrap().to_string(), "[B, 2, 3]");
    assert_eq!(g.param_count(), 0);
}

#[test]
fn gpt2_style_positions_from_range_a_merged_batch_and_a_tanh_gelu() {
    // GPT-2: `arange(T)[None]` position ids, a Conv1D as `x.view(-1, d) @ W` (the batch
    // merged with the positions and split back) and `gelu_new` written out.
    const T: i64 = 4;
    const D: i64 = 3;
    let mut n = Net::new("gpt2-block");
    n.input_of("ids", &format!("batch,{T}"), DataType::Int64);
    n.weight("wte", &[10, D]);
    n.node("Gather", "/wte", &["wte", "ids"], &["tok"], vec![]);
    n.node("Shape", "/Shape", &["ids"], &["shape"], vec![]);
    n.init(int64s("last", &[1]));
    n.node(
        "Gather",
        "/len",
        &["shape", "last"],
        &["len"],
        vec![int("axis", 0)],
    );
    n.init(int64s("zero", &[0]));
    n.init(int64s("step", &[1]));
    n.node(
        "Range",
        "/Range",
        &["zero", "len", "step"],
        &["pos"],
        vec![],
    );
    n.node(
        "Unsqueeze",
        "/Unsqueeze",
        &["pos", "zero"],
        &["pos2"],
        vec![],
    );
    n.weight("wpe", &[8, D]);
    n.node("Gather", "/wpe", &["wpe", "pos2"], &["p"], vec![]);
    n.node("Add", "/add_pos", &["tok", "p"], &["h"], vec![]);
    n.init(int64s("rows", &[-1, D]));
    n.node("Reshape", "/view", &["h", "rows"], &["flat"], vec![]);
    n.weight("fc.W", &[D, D]).weight("fc.B", &[D]);
    n.node("Gemm", "/fc", &["flat", "fc.W", "fc.B"], &["y"], vec![]);
    n.init(int64s("back", &[-1, T, D]));
    n.node("Reshape", "/unview", &["y", "back"], &["z"], vec![]);
    // 0.5 z (1 + tanh(sqrt(2 / pi) (z + 0.044715 z^3)))
    n.init(scalar("half", 0.5))
        .init(scalar("three", 3.0))
        .init(scalar("k", 0.044715))
        .init(scalar("c", (2.0 / std::f32::consts::PI).sqrt()))
        .init(scalar("one", 1.0));
    n.node("Mul", "/g/half", &["z", "half"], &["g0"], vec![]);
    n.node("Pow", "/g/pow", &["z", "three"], &["g1"], vec![]);
    n.node("Mul", "/g/k", &["k", "g1"], &["g2"], vec![]);
    n.node("Add", "/g/sum", &["z", "g2"], &["g3"], vec![]);
    n.node("Mul", "/g/c", &["c", "g3"], &["g4"], vec![]);
    n.node("Tanh", "/g/tanh", &["g4"], &["g5"], vec![]);
    n.node("Add", "/g/one", &["one", "g5"], &["g6"], vec![]);
    n.node("Mul", "/g/out", &["g0", "g6"], &["out"], vec![]);
    n.output("out");

    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(g.param_count(), (10 * D + 8 * D + D * D + D) as u64);
    let ops: Vec<&str> = g.nodes.iter().map(|x| x.op.name()).collect();
    assert!(ops.contains(&"gelu"), "{ops:?}");
    assert!(!ops.contains(&"tanh"), "{ops:?}");
    assert_eq!(g.shape_of(&g.loss.input).unwrap().to_string(), "[B, 4, 3]");
    let add = g.nodes.iter().find(|x| x.name == "/add_pos").unwrap();
    let Op::AddTable { table, index, .. } = &add.op else {
        panic!("{:?}", add.op)
    };
    assert_eq!((*table, index.len()), ((8 * D) as usize, (T * D) as usize));
}

#[test]
fn pads_computed_in_the_graph_as_torch_writes_f_pad() {
    // `F.pad(x, (0, 0, 0, pad_w, 0, pad_h))` of a channels-last `[B, H, W, C]` as
    // torch.onnx writes it: the pads a shape value, reshaped to pairs, reversed,
    // transposed and flattened, then `Pad`.
    let mut n = Net::new("swin-pad");
    n.input("x", "batch,5,6,4");
    n.init(int64s("torch_pads", &[0, 0, 0, 2, 0, 3]));
    n.init(int64s("zeros", &[0, 0]));
    n.node(
        "Concat",
        "/Concat",
        &["torch_pads", "zeros"],
        &["p8"],
        vec![int("axis", 0)],
    );
    n.init(int64s("pairs", &[-1, 2]));
    n.node("Reshape", "/pairs", &["p8", "pairs"], &["p42"], vec![]);
    n.init(int64s("m1", &[-1]));
    n.init(int64s("big", &[-9223372036854775807]));
    n.init(int64s("zero", &[0]));
    n.node(
        "Slice",
        "/reverse",
        &["p42", "m1", "big", "zero", "m1"],
        &["rev"],
        vec![],
    );
    n.node(
        "Transpose",
        "/T",
        &["rev"],
        &["t"],
        vec![ints("perm", &[1, 0])],
    );
    n.node("Reshape", "/flat", &["t", "m1"], &["onnx_pads"], vec![]);
    n.node("Pad", "/Pad", &["x", "onnx_pads"], &["y"], vec![]);
    n.node("Relu", "/Relu", &["y"], &["z"], vec![]);
    n.output("z");

    let g = onnx::parse(&n.bytes()).unwrap();
    // H padded by 3 at the end, W by 2 at the end.
    assert_eq!(g.shape_of("/Pad").unwrap().to_string(), "[B, 8, 8, 4]");
    let pad = g.nodes.iter().find(|x| x.name == "/Pad").unwrap();
    assert_eq!(
        pad.op,
        Op::Pad {
            pads: vec![[0, 3], [0, 2], [0, 0]],
            value: 0.0
        }
    );
}

#[test]
fn group_norm_as_torch_exports_it_is_an_instance_norm_and_its_own_scale_and_shift() {
    // `nn.GroupNorm(2, 4)`: reshape to `[B, 2, -1]`, InstanceNormalization with
    // constant ones and zeros, reshape back to the input's shape, then the learned
    // per-channel scale and shift.
    let mut n = Net::new("group-norm");
    n.input("x", "batch,4,3,3");
    n.init(int64s("groups", &[0, 2, -1]));
    n.node("Reshape", "/gn/Reshape", &["x", "groups"], &["r"], vec![]);
    let ones = tensor("value", floats("ones", &[2], &[1.0, 1.0]));
    let zeros = tensor("value", floats("zeros", &[2], &[0.0, 0.0]));
    n.node("Constant", "/gn/ones", &[], &["one"], vec![ones]);
    n.node("Constant", "/gn/zeros", &[], &["zero"], vec![zeros]);
    n.node(
        "InstanceNormalization",
        "/gn/InstanceNormalization",
        &["r", "one", "zero"],
        &["i"],
        vec![float("epsilon", 1e-5)],
    );
    n.node("Shape", "/gn/Shape", &["x"], &["s"], vec![]);
    n.node("Reshape", "/gn/Reshape_1", &["i", "s"], &["u"], vec![]);
    n.weight("gn.weight", &[4, 1, 1])
        .weight("gn.bias", &[4, 1, 1]);
    n.node("Mul", "/gn/Mul", &["u", "gn.weight"], &["m"], vec![]);
    n.node("Add", "/gn/Add", &["m", "gn.bias"], &["y"], vec![]);
    classifier_head(&mut n, "y", 4, 3);

    let g = onnx::parse(&n.bytes()).unwrap();
    let node = |name: &str| g.nodes.iter().find(|x| x.name == name).unwrap();
    assert_eq!(
        node("/gn/InstanceNormalization").op,
        Op::InstanceNorm {
            channels: 2,
            affine: false
        }
    );
    assert_eq!(
        g.shape_of("/gn/InstanceNormalization").unwrap().to_string(),
        "[B, 2, 18]"
    );
    assert_eq!(g.shape_of("/gn/Add").unwrap().to_string(), "[B, 4, 3, 3]");
    // GroupNorm's 4 + 4, none for the constant ones and zeros.
    assert_eq!(g.param_count(), 4 + 4 + 3 * 4 + 3);
}

#[test]
fn an_affine_instance_norm_learns_its_scale_and_shift() {
    let mut n = Net::new("instance-norm");
    n.input("x", "batch,3,4,4");
    n.weight("in.weight", &[3]).weight("in.bias", &[3]);
    n.node(
        "InstanceNormalization",
        "/in",
        &["x", "in.weight", "in.bias"],
        &["y"],
        vec![],
    );
    classifier_head(&mut n, "y", 3, 2);
    let g = onnx::parse(&n.bytes()).unwrap();
    let node = g.nodes.iter().find(|x| x.name == "/in").unwrap();
    assert_eq!(
        node.op,
        Op::InstanceNorm {
            channels: 3,
            affine: true
        }
    );
    assert_eq!(g.param_count(), 3 + 3 + 2 * 3 + 2);

    // Constant scales other than ones are refused, naming the node.
    let mut n = Net::new("scaled-instance-norm");
    n.input("x", "batch,3,4,4");
    let twos = tensor("value", floats("twos", &[3], &[2.0; 3]));
    let zeros = tensor("value", floats("zeros", &[3], &[0.0; 3]));
    n.node("Constant", "/twos", &[], &["two"], vec![twos]);
    n.node("Constant", "/zeros", &[], &["zero"], vec![zeros]);
    n.node(
        "InstanceNormalization",
        "/in",
        &["x", "two", "zero"],
        &["y"],
        vec![],
    );
    classifier_head(&mut n, "y", 3, 2);
    let err = onnx::parse(&n.bytes()).unwrap_err().to_string();
    assert!(
        err.contains("/in") && err.contains("ones and zeros"),
        "{err}"
    );
}

#[test]
fn prelu_learns_one_slope_or_one_per_channel() {
    for (dims, shape) in [(vec![1], vec![1]), (vec![4, 1, 1], vec![4, 1, 1])] {
        let mut n = Net::new("prelu");
        n.input("x", "batch,4,3,3");
        n.weight("act.weight", &dims);
        n.node("PRelu", "/act/PRelu", &["x", "act.weight"], &["y"], vec![]);
        classifier_head(&mut n, "y", 4, 2);
        let g = onnx::parse(&n.bytes()).unwrap();
        let node = g.nodes.iter().find(|x| x.name == "/act/PRelu").unwrap();
        assert_eq!(node.op, Op::PRelu { shape });
        assert_eq!(
            g.param_count(),
            dims.iter().product::<i64>() as u64 + 2 * 4 + 2
        );
    }
    // A slope that does not broadcast is refused, naming the node.
    let mut n = Net::new("bad-prelu");
    n.input("x", "batch,4,3,3");
    n.weight("act.weight", &[3, 1, 1]);
    n.node("PRelu", "/act/PRelu", &["x", "act.weight"], &["y"], vec![]);
    classifier_head(&mut n, "y", 4, 2);
    let err = onnx::parse(&n.bytes()).unwrap_err().to_string();
    assert!(
        err.contains("/act/PRelu") && err.contains("broadcast"),
        "{err}"
    );
}

#[test]
fn a_plain_rnn_loads_with_its_activation_and_pytorch_s_count() {
    // `nn.RNN(5, 4, nonlinearity="relu", bidirectional=True, batch_first=True)` as
    // torch.onnx writes it: Transpose to [T, B, I], RNN, Y [T, 2, B, H] back to
    // batch-first and the directions merged.
    let mut n = Net::new("deepspeech-rnn");
    time_major_rnn(&mut n, "/rnn/RNN", &[b"Relu", b"Relu"], true);
    n.node(
        "Transpose",
        "/tout",
        &["y"],
        &["yt"],
        vec![ints("perm", &[0, 2, 1, 3])],
    );
    n.init(int64s("merged", &[0, 0, -1]));
    n.node(
        "Transpose",
        "/tb",
        &["yt"],
        &["yb"],
        vec![ints("perm", &[1, 0, 2, 3])],
    );
    n.node("Reshape", "/merge", &["yb", "merged"], &["h"], vec![]);
    matmul(&mut n, "/fc", "h", 8, 3, "logits");
    n.output("logits");

    let g = onnx::parse(&n.bytes()).unwrap();
    let rnn = g.nodes.iter().find(|x| x.op.name() == "rnn").unwrap();
    assert!(
        matches!(
            rnn.op,
            Op::Rnn {
                cell: Cell::RnnRelu,
                hidden: 4,
                bidirectional: true,
                ..
            }
        ),
        "{:?}",
        rnn.op
    );
    assert_eq!(g.param_count(), 2 * (4 * 5 + 4 * 4 + 2 * 4) + 8 * 3);

    // An activation pair the cell does not have is refused, naming the node.
    let mut n = Net::new("mixed-rnn");
    time_major_rnn(&mut n, "/rnn/RNN", &[b"Relu", b"Tanh"], false);
    n.output("y");
    let err = onnx::parse(&n.bytes()).unwrap_err().to_string();
    assert!(
        err.contains("/rnn/RNN") && err.contains("same activation"),
        "{err}"
    );
}

#[test]
fn swin_style_strided_slices_and_a_mask_scattered_from_constants() {
    // Patch merging: `x[:, 0::2, 0::2]` and `x[:, 1::2, 1::2]` of `[B, 4, 4, C]`,
    // concatenated on the channels; then a shifted-window mask written by `ScatterND`
    // into zeros, added to the merged tensor.
    let mut n = Net::new("swin-merge");
    n.input("x", "batch,4,4,2");
    for (k, start) in [0i64, 1].into_iter().enumerate() {
        let (s, e, ax, st) = (
            format!("s{k}"),
            format!("e{k}"),
            format!("ax{k}"),
            format!("st{k}"),
        );
        n.init(int64s(&s, &[start, start]))
            .init(int64s(&e, &[i64::MAX, i64::MAX]))
            .init(int64s(&ax, &[1, 2]))
            .init(int64s(&st, &[2, 2]));
        n.node(
            "Slice",
            &format!("/merge/Slice_{k}"),
            &["x", &s, &e, &ax, &st],
            &[&format!("x{k}")],
            vec![],
        );
    }
    n.node(
        "Concat",
        "/merge/Concat",
        &["x0", "x1"],
        &["m"],
        vec![int("axis", -1)],
    );
    n.init(zeros("mask0", &[2, 2, 1]));
    n.init(int64_tensor("where", &[2, 2], &[0, 1, 1, 0]));
    n.init(floats("count", &[2, 1], &[-100.0, -50.0]));
    n.node(
        "ScatterND",
        "/mask/ScatterND",
        &["mask0", "where", "count"],
        &["mask"],
        vec![],
    );
    n.node("Add", "/attn/Add", &["m", "mask"], &["y"], vec![]);
    n.node(
        "Transpose",
        "/nchw",
        &["y"],
        &["t"],
        vec![ints("perm", &[0, 3, 1, 2])],
    );
    classifier_head(&mut n, "t", 4, 3);

    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(
        g.shape_of("/merge/Concat").unwrap().to_string(),
        "[B, 2, 2, 4]"
    );
    let add = g.nodes.iter().find(|x| x.name == "/attn/Add").unwrap();
    assert_eq!(
        add.op,
        Op::AddConst {
            shape: vec![2, 2, 1],
            values: vec![0.0, -100.0, -50.0, 0.0],
        }
    );
    // The mask is no parameter.
    assert_eq!(g.param_count(), 3 * 4 + 3);

    // A step that does not divide its axis is refused, naming the node.
    let mut n = Net::new("odd-step");
    n.input("x", "batch,5,4");
    n.init(int64s("s", &[0]))
        .init(int64s("e", &[5]))
        .init(int64s("ax", &[1]))
        .init(int64s("st", &[2]));
    n.node(
        "Slice",
        "/odd",
        &["x", "s", "e", "ax", "st"],
        &["y"],
        vec![],
    );
    n.output("y");
    let err = onnx::parse(&n.bytes()).unwrap_err().to_string();
    assert!(err.contains("/odd") && err.contains("step 2"), "{err}");
}

#[test]
fn a_roll_by_zero_concatenates_an_empty_slice_and_a_token_expands_both_ways() {
    // `torch.roll(x, 0, 1)` as Swin3D exports it for a window as large as the input:
    // `Concat(x[:, -0:], x[:, :-0])`, one side empty.
    let mut n = Net::new("roll-zero");
    n.input("x", "batch,4,3");
    n.init(int64s("zero", &[0]))
        .init(int64s("end", &[0]))
        .init(int64s("ax", &[1]));
    n.node(
        "Slice",
        "/empty",
        &["x", "zero", "end", "ax"],
        &["e"],
        vec![],
    );
    n.node("Concat", "/roll", &["x", "e"], &["r"], vec![int("axis", 1)]);
    // MViT's class token: a `[C]` initializer expanded to `[B, 1]` is `[B, C]` (numpy
    // broadcasting both ways), then concatenated before the positions.
    n.weight("cls", &[3]);
    n.init(int64s("bshape", &[2, 1]));
    n.node("Shape", "/shape", &["x"], &["xs"], vec![]);
    n.init(int64s("i0", &[0]));
    n.node("Gather", "/b", &["xs", "i0"], &["b"], vec![int("axis", 0)]);
    n.init(int64s("one", &[1]));
    n.node(
        "Concat",
        "/target",
        &["b", "one"],
        &["target"],
        vec![int("axis", 0)],
    );
    n.node("Expand", "/Expand", &["cls", "target"], &["c"], vec![]);
    n.init(int64s("unsq", &[1]));
    n.node("Unsqueeze", "/Unsqueeze", &["c", "unsq"], &["c3"], vec![]);
    n.node("Concat", "/cat", &["c3", "r"], &["y"], vec![int("axis", 1)]);
    n.node("Flatten", "/flat", &["y"], &["logits"], vec![]);
    n.output("logits");
    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(g.shape_of("/cat").unwrap().to_string(), "[B, 5, 3]");
    assert_eq!(g.param_count(), 3);

    // An empty slice read by anything but Concat is refused, naming the reader.
    let mut n = Net::new("empty-read");
    n.input("x", "batch,4,3");
    n.init(int64s("zero", &[0]))
        .init(int64s("end", &[0]))
        .init(int64s("ax", &[1]));
    n.node(
        "Slice",
        "/empty",
        &["x", "zero", "end", "ax"],
        &["e"],
        vec![],
    );
    n.node("Relu", "/relu", &["e"], &["logits"], vec![]);
    n.output("logits");
    let err = onnx::parse(&n.bytes()).unwrap_err().to_string();
    assert!(
        err.contains("/relu") && err.contains("no elements"),
        "{err}"
    );
}

#[test]
fn deepspeech_sums_its_directions_by_slicing_the_merged_axis() {
    // torchaudio's DeepSpeech: `y[:, :, :H] + y[:, :, H:]` of the time-major `[T, B, 2H]`
    // output of a bidirectional ReLU RNN; each slice is one direction.
    let mut n = Net::new("deepspeech-sum");
    time_major_rnn(&mut n, "/rnn", &[b"Relu", b"Relu"], true);
    n.node(
        "Transpose",
        "/tdir",
        &["y"],
        &["yd"],
        vec![ints("perm", &[0, 2, 1, 3])],
    );
    n.init(int64s("merged", &[0, 0, -1]));
    n.node("Reshape", "/merge", &["yd", "merged"], &["m"], vec![]);
    for (k, (s, e)) in [(0i64, 4i64), (4, 8)].into_iter().enumerate() {
        n.init(int64s(&format!("s{k}"), &[s]))
            .init(int64s(&format!("e{k}"), &[e]))
            .init(int64s(&format!("a{k}"), &[2]));
        n.node(
            "Slice",
            &format!("/dir{k}"),
            &["m", &format!("s{k}"), &format!("e{k}"), &format!("a{k}")],
            &[&format!("d{k}")],
            vec![],
        );
    }
    n.node("Add", "/sum", &["d0", "d1"], &["h"], vec![]);
    n.node(
        "Transpose",
        "/bt",
        &["h"],
        &["hb"],
        vec![ints("perm", &[1, 0, 2])],
    );
    matmul(&mut n, "/fc", "hb", 4, 3, "logits");
    n.output("logits");
    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(g.shape_of("/sum").unwrap().to_string(), "[B, 7, 4]");
    assert_eq!(g.param_count(), 2 * (4 * 5 + 4 * 4 + 2 * 4) + 4 * 3);
}

/// `x` `[B, 7, 5]` transposed to time-major and a bidirectional `RNN` (hidden 4, these
/// `activations`, with or without its bias) named `name`, writing `y` `[T, 2, B, 4]`.
fn time_major_rnn(n: &mut Net, name: &str, activations: &[&[u8]], bias: bool) {
    n.input("x", "batch,7,5");
    n.node(
        "Transpose",
        "/tin",
        &["x"],
        &["xt"],
        vec![ints("perm", &[1, 0, 2])],
    );
    n.weight("W", &[2, 4, 5]).weight("R", &[2, 4, 4]);
    let mut inputs = vec!["xt", "W", "R"];
    if bias {
        n.weight("B", &[2, 8]);
        inputs.push("B");
    }
    let activations = AttributeProto {
        name: "activations".into(),
        r#type: AttributeType::Strings as i32,
        strings: activations.iter().map(|a| a.to_vec()).collect(),
        ..Default::default()
    };
    let attrs = vec![
        int("hidden_size", 4),
        string("direction", "bidirectional"),
        activations,
    ];
    n.node("RNN", name, &inputs, &["y"], attrs);
}

#[test]
fn a_pad_with_ones_whose_size_is_clipped_from_shapes_in_the_graph() {
    // timm's `pad_same`: `max((ceil(W / s) - 1) * s + k - W, 0)` in floats from the
    // input's width (`Ceil`, `Clip` folded), then `F.pad(x, (0, pad), value=1)` as
    // EfficientViT's linear attention pads its values with ones.
    let mut n = Net::new("pad-same-ones");
    n.input("x", "batch,5,6");
    n.node("Shape", "/Shape", &["x"], &["shape"], vec![]);
    // A scalar index, as torch.onnx writes `x.size(2)`.
    n.init(int64_tensor("two", &[], &[2]));
    n.node(
        "Gather",
        "/W",
        &["shape", "two"],
        &["w"],
        vec![int("axis", 0)],
    );
    n.node("Cast", "/Wf", &["w"], &["wf"], vec![int("to", 1)]);
    n.init(scalar("s", 4.0))
        .init(scalar("k", 3.0))
        .init(scalar("one", 1.0));
    n.init(scalar("zero_f", 0.0));
    n.node("Div", "/div", &["wf", "s"], &["q"], vec![]);
    n.node("Ceil", "/ceil", &["q"], &["c"], vec![]);
    n.node("Sub", "/sub1", &["c", "one"], &["c1"], vec![]);
    n.node("Mul", "/mul", &["c1", "s"], &["m"], vec![]);
    n.node("Add", "/addk", &["m", "k"], &["mk"], vec![]);
    n.node("Sub", "/subw", &["mk", "wf"], &["raw"], vec![]);
    n.node("Clip", "/clip", &["raw", "zero_f", ""], &["pad"], vec![]);
    n.node("Cast", "/padi", &["pad"], &["padi"], vec![int("to", 7)]);
    n.init(int64s("axis0", &[0]));
    n.node("Unsqueeze", "/unsq", &["padi", "axis0"], &["p1"], vec![]);
    n.init(int64s("four_zeros", &[0, 0, 0, 0, 0]));
    n.node(
        "Concat",
        "/pads",
        &["four_zeros", "p1"],
        &["pads"],
        vec![int("axis", 0)],
    );
    n.init(scalar("ones", 1.0));
    n.node("Pad", "/Pad", &["x", "pads", "ones"], &["y"], vec![]);
    n.output("y");

    let g = onnx::parse(&n.bytes()).unwrap();
    // (ceil(6 / 4) - 1) * 4 + 3 - 6 = 1 column of ones after W.
    assert_eq!(g.shape_of("/Pad").unwrap().to_string(), "[B, 5, 7]");
    let pad = g.nodes.iter().find(|x| x.name == "/Pad").unwrap();
    assert_eq!(
        pad.op,
        Op::Pad {
            pads: vec![[0, 0], [0, 1]],
            value: 1.0
        }
    );
}

#[test]
fn convnext_v2_global_response_norm_divides_activations() {
    // timm's GRN on channels-last `[B, H, W, C]`: `Gx = torch.norm(x, p=2, dim=(1, 2))`,
    // `Nx = Gx / (Gx.mean(-1) + 1e-6)`, then `gamma * (x * Nx) + beta + x`.
    const C: i64 = 6;
    let mut n = Net::new("grn");
    n.input("x", &format!("batch,3,3,{C}"));
    n.node(
        "ReduceL2",
        "/grn/ReduceL2",
        &["x"],
        &["gx"],
        vec![ints("axes", &[1, 2]), int("keepdims", 1)],
    );
    n.node(
        "ReduceMean",
        "/grn/ReduceMean",
        &["gx"],
        &["mean"],
        vec![ints("axes", &[-1]), int("keepdims", 1)],
    );
    n.init(scalar("eps", 1e-6));
    n.node("Add", "/grn/Add", &["mean", "eps"], &["denom"], vec![]);
    n.node("Div", "/grn/Div", &["gx", "denom"], &["nx"], vec![]);
    n.node("Mul", "/grn/Mul", &["x", "nx"], &["xn"], vec![]);
    n.weight("gamma", &[1, 1, 1, C])
        .weight("beta", &[1, 1, 1, C]);
    n.node("Mul", "/grn/Scale", &["gamma", "xn"], &["scaled"], vec![]);
    n.node(
        "Add",
        "/grn/Shift",
        &["scaled", "beta"],
        &["shifted"],
        vec![],
    );
    n.node("Add", "/grn/Residual", &["shifted", "x"], &["y"], vec![]);
    n.output("y");

    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(g.param_count(), 2 * C as u64);
    let op = |name: &str| &g.nodes.iter().find(|x| x.name == name).unwrap().op;
    assert_eq!(
        *op("/grn/ReduceL2"),
        Op::Reduce {
            reduce: batchfit_graph::ReduceKind::L2,
            axes: vec![1, 2],
            keep_dims: true
        }
    );
    assert_eq!(*op("/grn/Div"), Op::Div);
    assert_eq!(g.shape_of("/grn/Div").unwrap().to_string(), "[B, 1, 1, 6]");
    assert_eq!(
        g.shape_of(&g.loss.input).unwrap().to_string(),
        "[B, 3, 3, 6]"
    );
}

#[test]
fn a_transposed_convolution_upsamples_by_its_stride_with_pytorch_s_weight_layout() {
    // `nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1)` on 5 x 7,
    // then a 1-d one with groups: out = (in - 1) s - 2p + d (k - 1) + output_padding + 1.
    let mut n = Net::new("upsample");
    n.input("x", "batch,4,5,7");
    n.weight("W", &[4, 6, 3, 3]).weight("B", &[6]);
    n.node(
        "ConvTranspose",
        "/up",
        &["x", "W", "B"],
        &["y"],
        vec![
            ints("strides", &[2, 2]),
            ints("pads", &[1, 1, 1, 1]),
            ints("output_padding", &[1, 1]),
        ],
    );
    n.init(int64s("rows", &[0, 6, -1]));
    n.node("Reshape", "/rows", &["y", "rows"], &["r"], vec![]);
    n.weight("W1", &[6, 2, 4]);
    n.node(
        "ConvTranspose",
        "/up1d",
        &["r", "W1"],
        &["z"],
        vec![ints("strides", &[4]), int("group", 2)],
    );
    n.output("z");

    let g = onnx::parse(&n.bytes()).unwrap();
    // (5 - 1) 2 - 2 + 2 + 1 + 1 = 10, (7 - 1) 2 - 2 + 2 + 1 + 1 = 14.
    assert_eq!(g.shape_of("/up").unwrap().to_string(), "[B, 6, 10, 14]");
    // (140 - 1) 4 + 3 + 1 = 560 positions, 2 groups of 2 output channels.
    assert_eq!(g.shape_of("/up1d").unwrap().to_string(), "[B, 4, 560]");
    assert_eq!(g.param_count(), 4 * 6 * 9 + 6 + 6 * 2 * 4);
    let up = &g.nodes.iter().find(|x| x.name == "/up1d").unwrap().op;
    assert_eq!(up.params()[0].shape, [6, 2, 4]);
    assert_eq!(up.name(), "conv_transpose");
}

/// ConvTasNet's decoder: a transposed convolution over the batch merged with the
/// separated sources (`[B·sources, C, L]`), reshaped back to `[B, sources, L']`: the
/// sources are more batch, each sample's planned as its own rows.
#[test]
fn a_transposed_convolution_over_a_batch_merged_with_sources() {
    let mut n = Net::new("decoder");
    n.input("x", "batch,2,4,5");
    n.init(int64s("merge", &[-1, 4, 5]))
        .init(int64s("split", &[-1, 2, 12]));
    n.node("Reshape", "/merge", &["x", "merge"], &["m"], vec![]);
    n.weight("W", &[4, 1, 4]);
    n.node(
        "ConvTranspose",
        "/decode",
        &["m", "W"],
        &["y"],
        vec![ints("strides", &[2])],
    );
    n.node("Reshape", "/split", &["y", "split"], &["z"], vec![]);
    n.output("z");
    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(g.param_count(), 4 * 4);
    // (5 - 1) 2 + 3 + 1 = 12 positions, for each of the two sources.
    assert_eq!(g.shape_of("/decode").unwrap().to_string(), "[B, 2, 1, 12]");
    assert_eq!(g.shape_of(&g.loss.input).unwrap().to_string(), "[B, 2, 12]");
}

/// TNT's `F.unfold` as torch.onnx writes it: the windows' positions computed from the
/// input's length (`arange(0, L, 4)[None] + arange(4)[:, None]`, integers throughout)
/// and the activation gathered at that table: every position read, the table's shape
/// in the axis's place.
#[test]
fn a_gather_at_a_table_of_positions_computed_from_shapes() {
    let mut n = Net::new("unfold");
    n.input("x", "batch,3,8");
    n.init(int64s("two", &[2]))
        .init(int64s("start", &[0]))
        .init(int64s("step", &[4]))
        .init(int64s("first", &[0]))
        .init(int64s("column", &[-1, 1]))
        .init(int64_tensor("taps", &[1, 4], &[0, 1, 2, 3]));
    n.node("Shape", "/shape", &["x"], &["s"], vec![]);
    n.node(
        "Gather",
        "/len",
        &["s", "two"],
        &["len"],
        vec![int("axis", 0)],
    );
    n.node("Squeeze", "/len0", &["len"], &["l"], vec![]);
    n.node(
        "Range",
        "/starts",
        &["start", "l", "step"],
        &["starts"],
        vec![],
    );
    n.node("Unsqueeze", "/row", &["starts", "first"], &["row"], vec![]);
    n.node("Reshape", "/col", &["taps", "column"], &["col"], vec![]);
    n.node("Add", "/positions", &["row", "col"], &["idx"], vec![]);
    n.node(
        "Gather",
        "/unfold",
        &["x", "idx"],
        &["y"],
        vec![int("axis", 2)],
    );
    n.output("y");
    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(
        g.shape_of(&g.loss.input).unwrap().to_string(),
        "[B, 3, 4, 2]"
    );
    let take = g.nodes.iter().find_map(|x| match &x.op {
        Op::Take { axis, indices } => Some((*axis, indices.clone())),
        _ => None,
    });
    assert_eq!(take, Some((2, vec![0, 4, 1, 5, 2, 6, 3, 7])));
}
