//! ONNX import, end to end: each test writes an ONNX model with the proto
//! messages, parses it, and checks the IR's ops, shapes and parameter counts.
//! Here: convolutional and linear models, folding, shape arithmetic, embeddings.

use batchfit_graph::onnx::proto::{DataType, TensorProto};
use batchfit_graph::{Dim, LossKind, Op, Shape, onnx, zoo};

mod common;
use common::*;

#[test]
fn seed2_from_onnx_equals_the_zoo_model() {
    let g = onnx::parse(&seed2().bytes()).unwrap();
    let z = zoo::build("seed2-dual").unwrap();
    assert_eq!(g.param_count(), 87_229);
    assert_eq!(g.param_count(), z.param_count());
    assert_eq!(g.inputs, z.inputs);
    let shapes = |g: &batchfit_graph::Graph| -> Vec<(String, String)> {
        g.nodes
            .iter()
            .map(|n| (n.name.clone(), n.shape.to_string()))
            .collect()
    };
    assert_eq!(shapes(&g), shapes(&z));
    assert!(
        g.nodes
            .iter()
            .all(|n| n.weights.is_some() == (n.op.param_count() > 0)),
        "the initializers' values are attached to every layer"
    );
    let mut nodes = g.nodes.clone();
    nodes.iter_mut().for_each(|n| n.weights = None);
    assert_eq!(nodes, z.nodes, "same ops, attributes and inputs");
    assert_eq!(g.loss, z.loss);
    assert_eq!(g.name, "seed2-dual");
}

#[test]
fn cnn_with_batchnorm_plans_with_hand_computed_shapes() {
    let mut n = Net::new("small-cnn");
    n.input("x", "N,3,32,32");
    n.weight("c1.W", &[16, 3, 3, 3]);
    n.node(
        "Conv",
        "conv1",
        &["x", "c1.W"],
        &["a1"],
        vec![
            string("auto_pad", "SAME_UPPER"),
            ints("kernel_shape", &[3, 3]),
        ],
    );
    for (bn, c) in [("bn1", 16), ("bn2", 32)] {
        for p in ["scale", "B", "mean", "var"] {
            n.weight(&format!("{bn}.{p}"), &[c]);
        }
    }
    let bn_inputs = |x: &'static str, bn: &str| -> Vec<String> {
        let mut v = vec![x.to_string()];
        v.extend(["scale", "B", "mean", "var"].map(|p| format!("{bn}.{p}")));
        v
    };
    let i1 = bn_inputs("a1", "bn1");
    let i1: Vec<&str> = i1.iter().map(String::as_str).collect();
    n.node("BatchNormalization", "bn1", &i1, &["b1"], vec![]);
    n.node("Relu", "relu1", &["b1"], &["r1"], vec![]);
    n.node(
        "MaxPool",
        "pool1",
        &["r1"],
        &["p1"],
        vec![ints("kernel_shape", &[2, 2]), ints("strides", &[2, 2])],
    );
    n.weight("c2.W", &[32, 16, 3, 3]).weight("c2.B", &[32]);
    n.node(
        "Conv",
        "conv2",
        &["p1", "c2.W", "c2.B"],
        &["a2"],
        vec![ints("strides", &[2, 2]), ints("pads", &[1, 1, 1, 1])],
    );
    let i2 = bn_inputs("a2", "bn2");
    let i2: Vec<&str> = i2.iter().map(String::as_str).collect();
    n.node("BatchNormalization", "bn2", &i2, &["b2"], vec![]);
    n.node("Relu", "relu2", &["b2"], &["r2"], vec![]);
    n.node("GlobalAveragePool", "gap", &["r2"], &["g"], vec![]);
    n.node("Flatten", "flatten", &["g"], &["f"], vec![]);
    n.weight("fc.W", &[10, 32]).weight("fc.B", &[10]);
    n.node(
        "Gemm",
        "fc",
        &["f", "fc.W", "fc.B"],
        &["logits"],
        vec![int("transB", 1)],
    );
    n.node(
        "Softmax",
        "prob",
        &["logits"],
        &["probs"],
        vec![int("axis", -1)],
    );
    n.output("probs");

    let g = onnx::parse(&n.bytes()).unwrap();
    let shapes: Vec<(&str, String)> = g
        .nodes
        .iter()
        .map(|n| (n.name.as_str(), n.shape.to_string()))
        .collect();
    let expect = [
        ("conv1", "[B, 16, 32, 32]"),
        ("bn1", "[B, 16, 32, 32]"),
        ("relu1", "[B, 16, 32, 32]"),
        ("pool1", "[B, 16, 16, 16]"),
        ("conv2", "[B, 32, 8, 8]"),
        ("bn2", "[B, 32, 8, 8]"),
        ("relu2", "[B, 32, 8, 8]"),
        ("gap", "[B, 32, 1, 1]"),
        ("flatten", "[B, 32]"),
        ("fc", "[B, 10]"),
    ];
    let expect: Vec<(&str, String)> = expect.iter().map(|(a, b)| (*a, b.to_string())).collect();
    assert_eq!(
        shapes, expect,
        "the final softmax is removed for cross-entropy"
    );
    // conv1 3*16*9 (no bias); bn1 2*16; conv2 16*32*9 + 32; bn2 2*32; fc 32*10 + 10
    assert_eq!(g.param_count(), 432 + 32 + 4_640 + 64 + 330);
    assert_eq!(g.loss.kind, LossKind::CrossEntropy);
    assert_eq!(g.loss.input, "fc");
    match &g.nodes[0].op {
        Op::Conv { window, bias, .. } => {
            assert_eq!(window.padding, vec![[1, 1], [1, 1]]);
            assert!(!bias);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(g.nodes[1].op.buffer_elements(), 32);
    // BatchNorm kept (a training-mode export): no note.
    assert_eq!(g.export_note("small-cnn.onnx"), None);

    // With an MSE loss the softmax stays.
    let g = onnx::parse_with_loss(&n.bytes(), Some(LossKind::Mse)).unwrap();
    assert_eq!(g.output().name, "prob");
    assert_eq!(g.output().op, Op::Softmax { axis: -1 });
}

/// PyTorch style: Conv without bias plus a separate Add, ceil-mode pooling,
/// `view(-1, n)` as Reshape, and a linear layer as MatMul + Add.
#[test]
fn biases_fold_into_conv_and_matmul() {
    let mut n = Net::new("torch-cnn");
    n.input("x", "batch_size,1,28,28");
    n.weight("c.W", &[4, 1, 3, 3])
        .weight("c.bias", &[1, 4, 1, 1]);
    n.node("Conv", "/c/Conv", &["x", "c.W"], &["/c/Conv_out"], vec![]);
    n.node(
        "Add",
        "/c/Add",
        &["/c/Conv_out", "c.bias"],
        &["/c/Add_out"],
        vec![],
    );
    n.node("Relu", "/relu", &["/c/Add_out"], &["r"], vec![]);
    n.node(
        "MaxPool",
        "/pool",
        &["r"],
        &["p"],
        vec![
            ints("kernel_shape", &[3, 3]),
            ints("strides", &[2, 2]),
            int("ceil_mode", 1),
        ],
    );
    n.init(int64s("flat_shape", &[-1, 4 * 13 * 13]));
    n.node("Reshape", "/view", &["p", "flat_shape"], &["v"], vec![]);
    n.weight("fc.W", &[676, 10]).weight("fc.bias", &[10]);
    n.node("MatMul", "/fc/MatMul", &["v", "fc.W"], &["mm"], vec![]);
    n.node("Add", "/fc/Add", &["fc.bias", "mm"], &["logits"], vec![]);
    n.output("logits");

    let g = onnx::parse(&n.bytes()).unwrap();
    let names: Vec<&str> = g.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["/c/Conv", "/relu", "/pool", "/view", "/fc/MatMul"]);
    assert!(matches!(g.nodes[0].op, Op::Conv { bias: true, .. }));
    // 28 - 3 + 1 = 26; (26 - 3) / 2 + 1 = 12.5 rounds up to 13 in ceil mode
    assert_eq!(g.shape_of("/pool").unwrap().to_string(), "[B, 4, 13, 13]");
    assert_eq!(g.nodes[3].op, Op::Reshape { shape: vec![676] });
    assert_eq!(
        g.nodes[4].op,
        Op::Linear {
            in_features: 676,
            out_features: 10,
            bias: true
        }
    );
    assert_eq!(g.param_count(), 36 + 4 + 6_760 + 10);
    assert_eq!(g.loss.kind, LossKind::CrossEntropy);
    // Convolutions and no normalisation, from an ONNX file: perhaps an eval-mode
    // export with BatchNorm folded in, which plan and probe say.
    let note = g.export_note("/models/torch-cnn.ONNX").unwrap();
    assert!(note.contains("TrainingMode.TRAINING") && note.contains("do_constant_folding=False"));
    assert_eq!(g.export_note("zoo:mnist-cnn"), None);
}

/// `x.view(x.size(0), -1)` exported with a dynamic batch: the target shape is
/// computed from `Shape`, and its batch entry means "keep the batch".
#[test]
fn reshape_to_a_shape_computed_from_the_batch() {
    let mut n = Net::new("dynamic-view");
    n.input("x", "batch,8,3,3");
    n.node("Shape", "/Shape", &["x"], &["shape"], vec![]);
    n.init(TensorProto {
        dims: vec![],
        ..int64s("zero", &[0])
    });
    n.node(
        "Gather",
        "/Gather",
        &["shape", "zero"],
        &["b"],
        vec![int("axis", 0)],
    );
    n.init(int64s("axes", &[0]));
    n.node("Unsqueeze", "/Unsqueeze", &["b", "axes"], &["b1"], vec![]);
    n.init(int64s("minus_one", &[-1]));
    n.node(
        "Concat",
        "/Concat",
        &["b1", "minus_one"],
        &["target"],
        vec![int("axis", 0)],
    );
    n.node("Reshape", "/Reshape", &["x", "target"], &["flat"], vec![]);
    n.weight("fc.W", &[4, 72]).weight("fc.B", &[4]);
    n.node(
        "Gemm",
        "/fc/Gemm",
        &["flat", "fc.W", "fc.B"],
        &["y"],
        vec![int("transB", 1)],
    );
    n.output("y");

    let g = onnx::parse(&n.bytes()).unwrap();
    let names: Vec<&str> = g.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(
        names,
        ["/Reshape", "/fc/Gemm"],
        "shape arithmetic leaves no IR nodes"
    );
    assert_eq!(g.nodes[0].op, Op::Reshape { shape: vec![-1] });
    assert_eq!(g.nodes[0].shape, Shape::fixed(&[72]));
    assert_eq!(g.param_count(), 72 * 4 + 4);
}

/// Nodes out of order (ONNX forbids it, some files do it anyway) and a weight
/// transposed in the graph, as old PyTorch exports of `Linear(bias=False)` have.
#[test]
fn unordered_nodes_and_transposed_weights() {
    let mut n = Net::new("unordered");
    n.input("x", "batch,4");
    n.weight("W", &[3, 4]);
    n.node("Relu", "act", &["h"], &["out"], vec![]);
    n.node("MatMul", "fc", &["x", "Wt"], &["h"], vec![]);
    n.node(
        "Transpose",
        "t",
        &["W"],
        &["Wt"],
        vec![ints("perm", &[1, 0])],
    );
    n.output("out");

    let g = onnx::parse(&n.bytes()).unwrap();
    let names: Vec<&str> = g.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["fc", "act"]);
    assert_eq!(
        g.nodes[0].op,
        Op::Linear {
            in_features: 4,
            out_features: 3,
            bias: false
        }
    );

    // A cycle is no model.
    n.g.node[2].input = vec!["out".into()];
    let msg = onnx::parse(&n.bytes()).unwrap_err().to_string();
    assert!(
        msg.contains("not a valid ONNX model") && msg.contains("cycle"),
        "{msg}"
    );
}

#[test]
fn token_inputs_feed_embeddings() {
    let mut n = Net::new("tagger");
    n.input_of("ids", "batch,seq_len", DataType::Int64);
    n.weight("emb", &[1000, 32]);
    n.node("Gather", "embed", &["emb", "ids"], &["e"], vec![]);
    n.weight("W", &[1, 64, 32])
        .weight("R", &[1, 64, 16])
        .weight("B", &[1, 128]);
    n.node(
        "LSTM",
        "lstm",
        &["e", "W", "R", "B"],
        &["y"],
        vec![int("hidden_size", 16), int("layout", 1)],
    );
    n.init(int64s("axes", &[2]));
    n.node("Squeeze", "sq", &["y", "axes"], &["ys"], vec![]);
    n.weight("fc.W", &[16, 5]).weight("fc.B", &[5]);
    n.node("MatMul", "fc", &["ys", "fc.W"], &["mm"], vec![]);
    n.node("Add", "fc_add", &["mm", "fc.B"], &["tags"], vec![]);
    n.node(
        "LogSoftmax",
        "logp",
        &["tags"],
        &["out"],
        vec![int("axis", 2)],
    );
    n.output("out");

    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(
        g.inputs[0].kind,
        batchfit_graph::InputKind::Tokens { vocab: 1000 }
    );
    assert_eq!(g.inputs[0].shape, Shape(vec![Dim::Seq]));
    assert_eq!(
        g.nodes[0].op,
        Op::Embedding {
            vocab: 1000,
            dim: 32
        }
    );
    assert_eq!(g.loss.kind, LossKind::CrossEntropyPerFrame);
    assert_eq!(g.loss.input, "fc");
    assert_eq!(
        g.param_count(),
        32_000 + 4 * 16 * (32 + 16) + 128 + 16 * 5 + 5
    );
}
