//! `Einsum` of two operands imports as the product it computes: the same IR as
//! the `Transpose`/`MatMul` an exporter could have written, a weight as a linear
//! layer, and refusals that name the node.

mod common;

use batchfit_graph::onnx::proto::{AttributeProto, AttributeType};
use batchfit_graph::{Graph, Op, onnx};
use common::*;

fn equation(eq: &str) -> AttributeProto {
    AttributeProto {
        name: "equation".into(),
        s: eq.as_bytes().to_vec(),
        r#type: AttributeType::String as i32,
        ..Default::default()
    }
}

fn ops(g: &Graph) -> Vec<&'static str> {
    g.nodes.iter().map(|n| n.op.name()).collect()
}

/// Scores of every position against every other, `[B, T, T]`, from `[B, T, D]`.
fn self_similarity(eq: &str, opset: i64) -> Vec<u8> {
    let mut n = Net::new("scores");
    n.input("x", "batch,5,8");
    n.node("Einsum", "/Einsum", &["x", "x"], &["s"], vec![equation(eq)]);
    n.output("s");
    model_bytes(n.g.clone(), opset)
}

#[test]
fn an_attention_product_is_a_transpose_and_a_matmul() {
    for opset in [12, 17] {
        let g = onnx::parse(&self_similarity("btd,bsd->bts", opset)).unwrap();
        assert_eq!(ops(&g), ["transpose", "matmul"], "opset {opset}");
        assert_eq!(g.shape_of(&g.loss.input).unwrap().to_string(), "[B, 5, 5]");
    }
    // The same written out by hand imports to the same IR.
    let mut n = Net::new("scores");
    n.input("x", "batch,5,8");
    n.node(
        "Transpose",
        "/Transpose",
        &["x"],
        &["xt"],
        vec![ints("perm", &[0, 2, 1])],
    );
    n.node("MatMul", "/MatMul", &["x", "xt"], &["s"], vec![]);
    n.output("s");
    let by_hand = onnx::parse(&n.bytes()).unwrap();
    let g = onnx::parse(&self_similarity("btd,bsd->bts", 17)).unwrap();
    let shapes =
        |g: &Graph| -> Vec<String> { g.nodes.iter().map(|n| n.shape.to_string()).collect() };
    assert_eq!(shapes(&g), shapes(&by_hand));
    // The output's order is the equation's: the scores transposed.
    let g = onnx::parse(&self_similarity("btd,bsd->bst", 17)).unwrap();
    assert_eq!(ops(&g), ["transpose", "matmul", "transpose"]);
}

#[test]
fn a_weight_operand_is_a_linear_layer_whichever_comes_first() {
    for (eq, w_dims, inputs) in [
        ("btd,dh->bth", [8, 16], ["x", "w"]),
        ("hd,btd->bth", [16, 8], ["w", "x"]),
    ] {
        let mut n = Net::new("projection");
        n.input("x", "batch,5,8");
        n.weight("w", &w_dims);
        n.node("Einsum", "/Einsum", &inputs, &["y"], vec![equation(eq)]);
        n.output("y");
        let g = onnx::parse(&n.bytes()).unwrap();
        assert_eq!(ops(&g), ["linear"], "{eq}");
        assert!(matches!(
            g.nodes[0].op,
            Op::Linear {
                in_features: 8,
                out_features: 16,
                ..
            }
        ));
        assert_eq!(g.param_count(), 8 * 16, "{eq}");
        assert_eq!(g.shape_of(&g.loss.input).unwrap().to_string(), "[B, 5, 16]");
    }
    // A weight first whose product fits either way is moved second.
    let mut n = Net::new("projection");
    n.input("x", "batch,8");
    n.weight("w", &[8, 16]);
    n.node(
        "Einsum",
        "/Einsum",
        &["w", "x"],
        &["y"],
        vec![equation("dh,bd->bh")],
    );
    n.output("y");
    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(ops(&g), ["linear"]);
    assert_eq!(g.shape_of(&g.loss.input).unwrap().to_string(), "[B, 16]");
}

#[test]
fn unsupported_equations_are_refused_by_node() {
    for (eq, says) in [
        ("...d,...d->...", "ellipsis"),
        ("btd,btd->b", "contracted"),
        ("btt,bsd->bts", "appears twice"),
    ] {
        let err = onnx::parse(&self_similarity(eq, 17))
            .unwrap_err()
            .to_string();
        assert!(err.contains("/Einsum") && err.contains(says), "{eq}: {err}");
    }
}

#[test]
fn an_absent_matrix_axis_is_an_axis_of_one_inserted_and_removed() {
    // An outer product (nothing contracted) and a matrix-vector product (no label
    // of the second operand alone), at both ways opsets write Unsqueeze's axes.
    for opset in [12, 17] {
        for (eq, x_dims, y_dims, out) in [
            ("bi,bj->bij", "batch,3", "batch,4", "[B, 3, 4]"),
            ("bij,bj->bi", "batch,3,4", "batch,4", "[B, 3]"),
        ] {
            let mut n = Net::new("products");
            n.input("x", x_dims).input("y", y_dims);
            n.node("Einsum", "/Einsum", &["x", "y"], &["z"], vec![equation(eq)]);
            n.output("z");
            let g = onnx::parse(&model_bytes(n.g.clone(), opset))
                .unwrap_or_else(|e| panic!("{eq} at opset {opset}: {e}"));
            assert_eq!(g.shape_of(&g.loss.input).unwrap().to_string(), out, "{eq}");
            assert!(ops(&g).contains(&"matmul"), "{eq}: {:?}", ops(&g));
        }
    }
}
