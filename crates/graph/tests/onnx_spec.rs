//! ONNX import by the operator spec, for ops the families of the generated corpus
//! (bench/corpus_gen.py) export: 3-d convolutions and pools (torchvision's video
//! models), a learned layer scale (ConvNeXt, timm's `LayerScale`), `Split` (a fused
//! qkv, ShuffleNet's channel split) also of a transposed channel axis, integer `Div` in
//! shape arithmetic (PyTorch's `chunk`), and a final log-softmax over the class axis of
//! `[B, C, T]` (Wav2Letter) read by a per-position loss.

use batchfit_graph::{LossKind, Op, ResizeMode, onnx};

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
    n.node("GlobalAveragePool", "/gap", &["p"], &["g"], vec![]);
    n.node("Flatten", "/flat", &["g"], &["f"], vec![]);
    n.weight("fc.W", &[5, 6]).weight("fc.B", &[5]);
    n.node(
        "Gemm",
        "/fc",
        &["f", "fc.W", "fc.B"],
        &["logits"],
        vec![int("transB", 1)],
    );
    n.output("logits");

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
    n.node("GlobalAveragePool", "/gap", &["y"], &["g"], vec![]);
    n.node("Flatten", "/flat", &["g"], &["f"], vec![]);
    n.weight("fc.W", &[3, 4]).weight("fc.B", &[3]);
    n.node(
        "Gemm",
        "/fc",
        &["f", "fc.W", "fc.B"],
        &["logits"],
        vec![int("transB", 1)],
    );
    n.output("logits");

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
