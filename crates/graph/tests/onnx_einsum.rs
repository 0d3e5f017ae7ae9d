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

/// TensorFlow's MaxViT (timm's `RelPosBiasTf`) reads a relative-position table
/// `[heads, 2W-1, 2W-1]` through two `Einsum`s with one-hot lookups `[W, W, 2W-1]`
/// (`nhw,ixh->nixw`, then `nixw,jyw->nijxy`) and adds the result to the scores.
/// No input reaches those products: they are evaluated at import, and the sum is a
/// parameter table read at the indices the lookups pick.
fn one_hot_lookups(lookup: &[f32]) -> Vec<u8> {
    let (heads, w) = (2i64, 2i64);
    let r = 2 * w - 1;
    let mut n = Net::new("rel-pos-tf");
    n.input("scores", &format!("batch,{heads},{},{}", w * w, w * w));
    n.weight("table", &[heads, r, r]);
    n.init(floats("lookup", &[w, w, r], lookup));
    n.init(int64s("flat", &[heads, w * w, w * w]));
    n.node(
        "Einsum",
        "/rows",
        &["table", "lookup"],
        &["t1"],
        vec![equation("nhw,ixh->nixw")],
    );
    n.node(
        "Einsum",
        "/cols",
        &["t1", "lookup"],
        &["t2"],
        vec![equation("nixw,jyw->nijxy")],
    );
    n.node("Reshape", "/bias", &["t2", "flat"], &["bias"], vec![]);
    n.node("Add", "/add_bias", &["scores", "bias"], &["out"], vec![]);
    n.output("out");
    n.bytes()
}

/// `lookup[i, x, h] = 1` where `h = i - x + W - 1`: the relative offset of
/// positions `i` and `x` along one axis, as timm builds it.
fn offsets_one_hot(w: usize) -> Vec<f32> {
    let r = 2 * w - 1;
    let mut v = vec![0.0; w * w * r];
    for i in 0..w {
        for x in 0..w {
            v[(i * w + x) * r + (i + w - 1 - x)] = 1.0;
        }
    }
    v
}

#[test]
fn one_hot_lookups_of_a_parameter_read_it_at_the_picked_indices() {
    let (heads, w, r) = (2usize, 2usize, 3usize);
    let g = onnx::parse(&one_hot_lookups(&offsets_one_hot(w))).unwrap();
    assert_eq!(g.param_count(), (heads * r * r) as u64);
    let add = g.nodes.iter().find(|x| x.name == "/add_bias").unwrap();
    let Op::AddTable { table, index, .. } = &add.op else {
        panic!("{:?}", add.op)
    };
    assert_eq!(*table, heads * r * r);
    // bias[n, i, j, x, y] = table[n, i - x + W - 1, j - y + W - 1].
    let mut want = Vec::new();
    for n in 0..heads {
        for i in 0..w {
            for j in 0..w {
                for x in 0..w {
                    for y in 0..w {
                        want.push((n * r + (i + w - 1 - x)) * r + (j + w - 1 - y));
                    }
                }
            }
        }
    }
    assert_eq!(index, &want);
}

/// A lookup that sums two elements computes on the parameter: refused by node.
#[test]
fn a_lookup_that_sums_parameter_elements_is_refused_by_node() {
    let mut lookup = offsets_one_hot(2);
    lookup[0] = 1.0; // (i, x) = (0, 0) already picks h = 1
    let e = onnx::parse(&one_hot_lookups(&lookup))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("/rows") && e.contains("computes on parameter `table`"),
        "{e}"
    );
}
