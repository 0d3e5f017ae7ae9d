//! Trained weights from ONNX: constants, initializers in raw and typed data,
//! and linear layers' weights in the IR's `[out, in]` layout.

use batchfit_graph::onnx::proto::{DataType, TensorProto};
use batchfit_graph::{LossKind, Op, onnx};

mod common;
use common::*;

#[test]
fn weights_and_values_from_constant_nodes() {
    let mut n = Net::new("constants");
    n.input("x", "batch,4");
    n.node(
        "Constant",
        "w1c",
        &[],
        &["w1"],
        vec![tensor("value", zeros("", &[3, 4]))],
    );
    n.node(
        "Constant",
        "b1c",
        &[],
        &["b1"],
        vec![tensor("value", zeros("", &[3]))],
    );
    n.node(
        "Gemm",
        "fc1",
        &["x", "w1", "b1"],
        &["h"],
        vec![int("transB", 1)],
    );
    n.node(
        "Constant",
        "shape",
        &[],
        &["s"],
        vec![ints("value_ints", &[0, 3, 1])],
    );
    n.node("Reshape", "r", &["h", "s"], &["hr"], vec![]);
    n.node("Flatten", "f", &["hr"], &["hf"], vec![]);
    n.node(
        "Constant",
        "lo",
        &[],
        &["min"],
        vec![tensor("value", scalar("", 0.0))],
    );
    n.node(
        "Constant",
        "hi",
        &[],
        &["max"],
        vec![tensor("value", scalar("", 6.0))],
    );
    n.node("Clip", "relu6", &["hf", "min", "max"], &["c"], vec![]);
    n.node("Identity", "id", &["c"], &["c2"], vec![]);
    n.weight("fc2.W", &[1, 3]).weight("fc2.B", &[1]);
    n.node(
        "Gemm",
        "fc2",
        &["c2", "fc2.W", "fc2.B"],
        &["y"],
        vec![int("transB", 1)],
    );
    n.output("y");

    let g = onnx::parse(&n.bytes()).unwrap();
    let names: Vec<&str> = g.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["fc1", "r", "f", "relu6", "fc2"]);
    assert_eq!(g.nodes[1].op, Op::Reshape { shape: vec![3, 1] });
    assert_eq!(g.nodes[3].op, Op::Clamp { min: 0.0, max: 6.0 });
    assert_eq!(g.nodes[4].inputs, ["relu6"], "Identity is an alias");
    assert_eq!(g.param_count(), 12 + 3 + 3 + 1);
    assert_eq!(g.loss.kind, LossKind::Mse);
}

/// Gemm (both `transB`, `alpha`/`beta`, a broadcast bias), MatMul with a
/// double weight and a folded bias, a weight transposed in the graph: every
/// weight lands in the IR's `[out, in]` layout; an f16 weight is not read.
#[test]
fn linear_weights_land_in_ir_layout() {
    let mut n = Net::new("linear-weights");
    n.input("x", "batch,3");
    // B [in = 3, out = 2]
    n.init(raw_floats("g1.B", &[3, 2], &[1., 2., 3., 4., 5., 6.]))
        .init(floats("g1.C", &[2], &[0.5, -0.5]));
    n.node("Gemm", "g1", &["x", "g1.B", "g1.C"], &["h1"], vec![]);
    // B [out = 2, in = 2], scaled by alpha; scalar C scaled by beta
    n.init(floats("g2.B", &[2, 2], &[1., 2., 3., 4.]))
        .init(floats("g2.C", &[1], &[1.0]));
    n.node(
        "Gemm",
        "g2",
        &["h1", "g2.B", "g2.C"],
        &["h2"],
        vec![int("transB", 1), float("alpha", 2.0), float("beta", 3.0)],
    );
    n.init(TensorProto {
        name: "m.W".into(),
        dims: vec![2, 2],
        data_type: DataType::Double as i32,
        raw_data: [1f64, 2., 3., 4.]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        ..Default::default()
    })
    .init(floats("m.b", &[1, 2], &[7., 8.]));
    n.node("MatMul", "m", &["h2", "m.W"], &["h3"], vec![]);
    n.node("Add", "m_bias", &["h3", "m.b"], &["h4"], vec![]);
    // W [out = 3, in = 2] transposed in the graph to [in, out] for a MatMul.
    n.init(floats("t.W", &[3, 2], &[1., 2., 3., 4., 5., 6.]));
    n.node(
        "Transpose",
        "t_w",
        &["t.W"],
        &["t.Wt"],
        vec![ints("perm", &[1, 0])],
    );
    n.node("MatMul", "t", &["h4", "t.Wt"], &["h5"], vec![]);
    n.init(TensorProto {
        name: "half.B".into(),
        dims: vec![2, 3],
        data_type: DataType::Float16 as i32,
        int32_data: vec![0x3c00; 6], // 1.0
        ..Default::default()
    });
    n.node(
        "Gemm",
        "half",
        &["h5", "half.B"],
        &["y"],
        vec![int("transB", 1)],
    );
    n.output("y");

    let g = onnx::parse(&n.bytes()).unwrap();
    let names: Vec<&str> = g.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["g1", "g2", "m", "t", "half"]);
    let w = |k: usize| g.nodes[k].weights.clone();
    assert_eq!(
        w(0),
        Some(vec![vec![1., 3., 5., 2., 4., 6.], vec![0.5, -0.5]]),
        "transB = 0: B transposed"
    );
    assert_eq!(
        w(1),
        Some(vec![vec![2., 4., 6., 8.], vec![3., 3.]]),
        "transB = 1: B as is, times alpha; C broadcast, times beta"
    );
    assert_eq!(
        w(2),
        Some(vec![vec![1., 3., 2., 4.], vec![7., 8.]]),
        "MatMul weight transposed, double converted, folded bias"
    );
    assert_eq!(w(3), Some(vec![vec![1., 2., 3., 4., 5., 6.]]));
    assert_eq!(w(4), None, "f16 values are not read");
    for node in &g.nodes[..4] {
        let params = node.op.params();
        let weights = node.weights.as_ref().unwrap();
        for (p, v) in params.iter().zip(weights) {
            assert_eq!(p.elements() as usize, v.len(), "{}.{}", node.name, p.name);
        }
    }
}
