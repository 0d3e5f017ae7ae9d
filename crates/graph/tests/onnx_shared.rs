//! Tensors computed once per step from constants and parameters (`Node::shared`):
//! timm's relative-position MLP over a constant coordinate table, read at every
//! pair's index and added to each sample's attention scores.

use batchfit_graph::{Op, onnx};

mod common;
use common::*;

const HEADS: i64 = 2;
const N: i64 = 3;
const TABLE: i64 = 5;
const HIDDEN: i64 = 8;

/// `x + mlp(coords).reshape(-1, heads)[index].reshape(N, N, heads).permute(2, 0, 1)
/// .unsqueeze(0)` as torch.onnx writes timm's `RelPosMlp`; `scores` names the input
/// the bias is added to.
fn relpos(scores_dims: &str) -> Net {
    let mut n = Net::new("relpos-mlp");
    n.input("x", scores_dims);
    let coords: Vec<f32> = (0..TABLE * 2).map(|k| k as f32 * 0.25 - 1.0).collect();
    // A `Constant` node, as timm's table (a plain tensor attribute, not a buffer) is
    // written.
    n.node(
        "Constant",
        "/coords",
        &[],
        &["coords"],
        vec![tensor("value", floats("coords", &[TABLE, 1, 2], &coords))],
    );
    n.weight("fc1.weight", &[HIDDEN, 2])
        .weight("fc1.bias", &[HIDDEN])
        .weight("fc2.weight", &[HEADS, HIDDEN])
        .weight("fc2.bias", &[HEADS]);
    let index: Vec<i64> = (0..N * N)
        .map(|k| (k / N + N - 1 - k % N) % TABLE)
        .collect();
    n.init(int64_tensor("index", &[N * N], &index));
    n.init(int64s("rows", &[-1, HEADS]))
        .init(int64s("square", &[N, N, HEADS]))
        .init(int64s("first", &[0]));
    n.node(
        "Transpose",
        "/fc1/T",
        &["fc1.weight"],
        &["w1"],
        vec![ints("perm", &[1, 0])],
    );
    n.node("MatMul", "/fc1/MatMul", &["coords", "w1"], &["h0"], vec![]);
    n.node("Add", "/fc1/Add", &["fc1.bias", "h0"], &["h1"], vec![]);
    n.node("Relu", "/act", &["h1"], &["h2"], vec![]);
    n.node(
        "Transpose",
        "/fc2/T",
        &["fc2.weight"],
        &["w2"],
        vec![ints("perm", &[1, 0])],
    );
    n.node("MatMul", "/fc2/MatMul", &["h2", "w2"], &["h3"], vec![]);
    n.node("Add", "/fc2/Add", &["fc2.bias", "h3"], &["h4"], vec![]);
    n.node("Reshape", "/rows", &["h4", "rows"], &["t"], vec![]);
    n.node(
        "Gather",
        "/pairs",
        &["t", "index"],
        &["p"],
        vec![int("axis", 0)],
    );
    n.node("Reshape", "/square", &["p", "square"], &["sq"], vec![]);
    n.node(
        "Transpose",
        "/heads",
        &["sq"],
        &["hf"],
        vec![ints("perm", &[2, 0, 1])],
    );
    n.node("Unsqueeze", "/one", &["hf", "first"], &["bias"], vec![]);
    n.node("Add", "/add_bias", &["x", "bias"], &["out"], vec![]);
    n.output("out");
    n
}

#[test]
fn a_relative_position_mlp_is_computed_once_and_added_to_every_sample() {
    let g = onnx::parse(&relpos(&format!("batch,{HEADS},{N},{N}")).bytes()).unwrap();
    let mlp = (2 + 1) * HIDDEN + (HIDDEN + 1) * HEADS;
    assert_eq!(g.param_count(), mlp as u64);
    let node = |name: &str| g.nodes.iter().find(|x| x.name == name).unwrap();
    let coords = g.nodes.iter().find(|x| x.op.name() == "constant").unwrap();
    assert!(coords.shared);
    assert_eq!(coords.shape.to_string(), format!("[B, {TABLE}, 1, 2]"));
    for shared in ["/fc1/MatMul", "/fc2/MatMul", "/pairs", "/heads"] {
        assert!(node(shared).shared, "{shared}");
    }
    let Op::Take { axis, indices } = &node("/pairs").op else {
        panic!("{:?}", node("/pairs").op)
    };
    assert_eq!((*axis, indices.len()), (1, (N * N) as usize));
    let add = node("/add_bias");
    assert!(!add.shared);
    assert_eq!(add.op, Op::Add);
    assert_eq!(
        g.shape_of(&g.loss.input).unwrap().to_string(),
        format!("[B, {HEADS}, {N}, {N}]")
    );
}

/// The scores with the batch merged with windows (`[B·windows, heads, N, N]`, Swin's
/// and MaxViT's window attention): the table broadcasts over the windows too.
#[test]
fn a_shared_table_broadcasts_over_a_batch_merged_with_windows() {
    let mut n = relpos(&format!("batch,4,{HEADS},{N},{N}"));
    n.init(int64s("merge", &[-1, HEADS, N, N]))
        .init(int64s("split", &[-1, 4, HEADS, N, N]));
    let add = n.g.node.pop().unwrap();
    n.node("Reshape", "/merge", &["x", "merge"], &["xm"], vec![]);
    n.node("Add", "/add_bias", &["xm", "bias"], &["sum"], vec![]);
    n.node("Reshape", "/split", &["sum", "split"], &["out"], vec![]);
    assert_eq!(add.name, "/add_bias");
    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(
        g.shape_of(&g.loss.input).unwrap().to_string(),
        format!("[B, 4, {HEADS}, {N}, {N}]")
    );
}

/// A shared tensor multiplied by a batch in a product is refused by node.
#[test]
fn a_shared_tensor_in_a_product_with_the_batch_is_refused_by_node() {
    let mut n = relpos(&format!("batch,{HEADS},{N},{N}"));
    n.g.node.pop();
    n.node("MatMul", "/bad", &["x", "bias"], &["out"], vec![]);
    let e = onnx::parse(&n.bytes()).unwrap_err().to_string();
    assert!(e.contains("/bad") && e.contains("once per step"), "{e}");
}
