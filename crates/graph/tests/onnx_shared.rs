//! Tensors computed once per step from constants and parameters (`Node::shared`):
//! timm's relative-position MLP over a constant coordinate table, read at every
//! pair's index and added to each sample's attention scores.

use batchfit_graph::onnx::proto::TensorProto;
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

/// The coordinate table as torchvision's Swin V2 registers it: a buffer (an
/// initializer) read on the left of the MLP's `MatMul`. It is the table, not a
/// parameter: the count is the MLP's.
#[test]
fn an_initializer_table_read_by_a_linear_layer_is_a_buffer() {
    let mut n = relpos(&format!("batch,{HEADS},{N},{N}"));
    let node = n.g.node.iter().position(|x| x.name == "/coords").unwrap();
    let table = n.g.node.remove(node).attribute.remove(0).t.unwrap();
    n.init(TensorProto {
        name: "coords".into(),
        ..table
    });
    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(
        g.param_count(),
        ((2 + 1) * HIDDEN + (HIDDEN + 1) * HEADS) as u64
    );
    assert!(
        g.nodes
            .iter()
            .any(|x| x.op.name() == "constant" && x.shared)
    );
}

const D: i64 = 4;

/// Swin V2's cosine attention on windows merged with the batch: keys scaled to unit
/// length (`F.normalize`: `ReduceL2`, `Clip` with a minimum only, `Expand` to the
/// keys' shape, `Div`), times a learned per-head log-scale capped and made positive
/// (`logit_scale.clamp(max=log 100).exp()`, computed once per step, counted).
fn cosine_attention() -> Net {
    let mut n = Net::new("cosine-attention");
    n.input("x", &format!("batch,4,{HEADS},{N},{D}"));
    n.init(int64s("merge", &[-1, HEADS, N, D]))
        .init(int64s("split", &[-1, 4, HEADS, N, D]))
        .init(scalar("eps", 1e-12))
        .init(scalar("cap", 100f32.ln()))
        .init(floats(
            "logit_scale",
            &[HEADS, 1, 1],
            &[10f32.ln(); HEADS as usize],
        ));
    n.node("Reshape", "/merge", &["x", "merge"], &["k"], vec![]);
    let keep = vec![ints("axes", &[-1]), int("keepdims", 1)];
    n.node("ReduceL2", "/norm", &["k"], &["len"], keep);
    n.node("Clip", "/floor", &["len", "eps"], &["floored"], vec![]);
    n.node("Shape", "/shape", &["k"], &["k_shape"], vec![]);
    n.node(
        "Expand",
        "/expand",
        &["floored", "k_shape"],
        &["den"],
        vec![],
    );
    n.node("Div", "/unit", &["k", "den"], &["unit"], vec![]);
    n.node(
        "Clip",
        "/cap",
        &["logit_scale", "", "cap"],
        &["capped"],
        vec![],
    );
    n.node("Exp", "/exp", &["capped"], &["scale"], vec![]);
    n.node("Mul", "/scaled", &["unit", "scale"], &["scaled"], vec![]);
    n.node("Reshape", "/split", &["scaled", "split"], &["out"], vec![]);
    n.output("out");
    n
}

#[test]
fn a_learned_scale_computed_on_is_a_parameter_once_per_step() {
    let g = onnx::parse(&cosine_attention().bytes()).unwrap();
    assert_eq!(g.param_count(), HEADS as u64);
    let op_of = |name: &str| g.nodes.iter().find(|x| x.name == name).unwrap();
    let learned = g.nodes.iter().find(|x| x.op.name() == "parameter").unwrap();
    assert!(learned.shared);
    assert_eq!(learned.shape.to_string(), format!("[B, {HEADS}, 1, 1]"));
    let cap = op_of("/cap");
    assert!(cap.shared && op_of("/exp").shared && !op_of("/scaled").shared);
    assert_eq!(
        cap.op,
        Op::Clamp {
            min: f32::MIN,
            max: 100f32.ln()
        }
    );
    assert_eq!(
        op_of("/floor").op,
        Op::Clamp {
            min: 1e-12,
            max: f32::MAX
        }
    );
    assert_eq!(
        g.shape_of(&g.loss.input).unwrap().to_string(),
        format!("[B, 4, {HEADS}, {N}, {D}]")
    );
}

/// ConViT's gated positional attention: a constant table of relative positions
/// expanded over the batch (`rel_indices.expand(B, -1, -1, -1)`, written `[B, 1, 1,
/// 1]`), a linear layer and a softmax over it (once per step), mixed with each sample's
/// scores by a learned gate: `(1 - sigmoid(g)) * scores + sigmoid(g) * positions`.
#[test]
fn a_gated_positional_attention_computes_its_table_once_per_step() {
    let mut n = Net::new("gated-positional-attention");
    n.input("x", &format!("batch,{HEADS},{N},{N}"));
    let rel: Vec<f32> = (0..N * N * 3).map(|k| (k % 5) as f32 - 2.0).collect();
    n.node(
        "Constant",
        "/rel",
        &[],
        &["rel"],
        vec![tensor("value", floats("rel", &[1, N, N, 3], &rel))],
    );
    n.node(
        "Constant",
        "/one",
        &[],
        &["one"],
        vec![tensor("value", scalar("one", 1.0))],
    );
    batch_and(&mut n, "x", &[1, 1, 1], "rel_sizes");
    n.node(
        "Expand",
        "/expand",
        &["rel", "rel_sizes"],
        &["rel_b"],
        vec![],
    );
    n.weight("pos.weight", &[HEADS, 3])
        .weight("pos.bias", &[HEADS]);
    n.init(floats("gating", &[HEADS], &[1.0; HEADS as usize]))
        .init(int64s("gate_dims", &[1, -1, 1, 1]));
    n.node(
        "Transpose",
        "/pos/T",
        &["pos.weight"],
        &["pos_w"],
        vec![ints("perm", &[1, 0])],
    );
    n.node(
        "MatMul",
        "/pos/MatMul",
        &["rel_b", "pos_w"],
        &["p0"],
        vec![],
    );
    n.node("Add", "/pos/Add", &["pos.bias", "p0"], &["p1"], vec![]);
    n.node(
        "Transpose",
        "/heads",
        &["p1"],
        &["p2"],
        vec![ints("perm", &[0, 3, 1, 2])],
    );
    n.node(
        "Softmax",
        "/softmax",
        &["p2"],
        &["pos"],
        vec![int("axis", -1)],
    );
    n.node(
        "Reshape",
        "/gate",
        &["gating", "gate_dims"],
        &["g4"],
        vec![],
    );
    n.node("Sigmoid", "/sigmoid", &["g4"], &["sg"], vec![]);
    n.node("Sub", "/inverse", &["one", "sg"], &["inv"], vec![]);
    n.node("Mul", "/patches", &["inv", "x"], &["a"], vec![]);
    n.node("Mul", "/positions", &["sg", "pos"], &["b"], vec![]);
    n.node("Add", "/mix", &["a", "b"], &["out"], vec![]);
    n.output("out");
    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(g.param_count(), (HEADS * 3 + HEADS + HEADS) as u64);
    let node = |name: &str| g.nodes.iter().find(|x| x.name == name).unwrap();
    for shared in [
        "/pos/MatMul",
        "/softmax",
        "/sigmoid",
        "/inverse",
        "/positions",
    ] {
        assert!(node(shared).shared, "{shared}");
    }
    assert_eq!(node("/softmax").op, Op::Softmax { axis: -1 });
    assert!(!node("/patches").shared && !node("/mix").shared);
    assert_eq!(
        g.shape_of(&g.loss.input).unwrap().to_string(),
        format!("[B, {HEADS}, {N}, {N}]")
    );
}

const C: i64 = 4;
const SIDE: i64 = 2;

/// XCiT's Fourier positions: a constant grid (`arange(H).view(1, H, 1).repeat(1, 1,
/// W)`, folded), a 1x1 convolution of it (once per step), repeated over the batch
/// (`pos.repeat(B, 1, 1, 1)`), reshaped with the batch (`reshape(B, C, -1)`) and added
/// to each sample.
#[test]
fn a_convolved_constant_grid_repeated_over_the_batch_is_added_once_per_step() {
    let mut n = Net::new("fourier-positions");
    n.input("x", &format!("batch,{C},{SIDE},{SIDE}"));
    n.node(
        "Constant",
        "/rows",
        &[],
        &["rows"],
        vec![tensor("value", floats("rows", &[1, SIDE, 1], &[1.0, 2.0]))],
    );
    n.init(int64s("across", &[1, 1, SIDE]))
        .init(int64s("channel", &[1]))
        .init(int64s("flat", &[0, C, SIDE * SIDE]));
    n.node("Tile", "/grid", &["rows", "across"], &["grid"], vec![]);
    n.node(
        "Unsqueeze",
        "/grid4",
        &["grid", "channel"],
        &["grid4"],
        vec![],
    );
    n.node(
        "Concat",
        "/image",
        &["grid4", "grid4"],
        &["image"],
        vec![int("axis", 1)],
    );
    n.weight("proj.weight", &[C, 2, 1, 1])
        .weight("proj.bias", &[C]);
    n.node(
        "Conv",
        "/proj",
        &["image", "proj.weight", "proj.bias"],
        &["pc"],
        vec![ints("kernel_shape", &[1, 1])],
    );
    batch_and(&mut n, "x", &[1, 1, 1], "reps");
    n.node("Tile", "/repeat", &["pc", "reps"], &["pt"], vec![]);
    batch_and(&mut n, "x", &[C, SIDE * SIDE], "pos_sizes");
    n.node("Reshape", "/pos", &["pt", "pos_sizes"], &["pos"], vec![]);
    n.node("Reshape", "/xf", &["x", "flat"], &["xf"], vec![]);
    n.node("Add", "/add", &["xf", "pos"], &["out"], vec![]);
    n.output("out");
    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(g.param_count(), (C * 2 + C) as u64);
    let conv = g.nodes.iter().find(|x| x.name == "/proj").unwrap();
    assert!(conv.shared);
    assert_eq!(conv.shape.to_string(), format!("[B, {C}, {SIDE}, {SIDE}]"));
    let add = g.nodes.iter().find(|x| x.name == "/add").unwrap();
    assert!(!add.shared);
    assert_eq!(
        g.shape_of(&g.loss.input).unwrap().to_string(),
        format!("[B, {C}, {}]", SIDE * SIDE)
    );
}

/// A shared tensor repeated along an axis other than a leading 1 is refused by node.
#[test]
fn a_shared_tensor_tiled_along_its_own_axes_is_refused_by_node() {
    let mut n = relpos(&format!("batch,{HEADS},{N},{N}"));
    n.g.node.pop();
    n.init(int64s("twice", &[1, 2, 1, 1]));
    n.node("Tile", "/tile", &["bias", "twice"], &["tiled"], vec![]);
    n.node("Add", "/add_bias", &["x", "tiled"], &["out"], vec![]);
    let e = onnx::parse(&n.bytes()).unwrap_err().to_string();
    assert!(
        e.contains("/tile") && e.contains("leading axis of 1"),
        "{e}"
    );
}

/// timm's Swin V2 qkv bias: `cat(q_bias, k_bias, v_bias)` with `k_bias` a zero buffer
/// (a `Constant` node) added after the product: only the learned thirds count.
#[test]
fn a_bias_joined_from_learned_parts_and_a_constant_counts_the_learned_parts() {
    let mut n = Net::new("qkv-bias");
    n.input("x", &format!("batch,{N},{D}"));
    n.weight("w", &[D, 3 * D])
        .weight("q_bias", &[D])
        .weight("v_bias", &[D]);
    n.node(
        "Constant",
        "/k_bias",
        &[],
        &["k_bias"],
        vec![tensor("value", floats("k_bias", &[D], &[0.0; D as usize]))],
    );
    n.node(
        "Concat",
        "/bias",
        &["q_bias", "k_bias", "v_bias"],
        &["bias"],
        vec![int("axis", 0)],
    );
    n.node("MatMul", "/qkv", &["x", "w"], &["p"], vec![]);
    n.node("Add", "/add", &["bias", "p"], &["out"], vec![]);
    n.output("out");
    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(g.param_count(), (D * 3 * D + 2 * D) as u64);
    let bias = g.nodes.iter().find(|x| x.name == "/bias").unwrap();
    assert!(bias.shared && bias.op == Op::Concat { axis: 1 });
    assert_eq!(
        g.shape_of(&g.loss.input).unwrap().to_string(),
        format!("[B, {N}, {}]", 3 * D)
    );
}

/// `bias.reshape(bias.shape)`: the shape of a tensor computed once per step has no batch
/// axis, so reshaping to it changes nothing.
#[test]
fn the_shape_of_a_shared_tensor_has_no_batch_axis() {
    let mut n = relpos(&format!("batch,{HEADS},{N},{N}"));
    let add = n.g.node.pop().unwrap();
    n.node("Shape", "/bias_shape", &["bias"], &["bias_dims"], vec![]);
    n.node(
        "Reshape",
        "/same",
        &["bias", "bias_dims"],
        &["same"],
        vec![],
    );
    n.node("Add", &add.name, &["x", "same"], &["out"], vec![]);
    let g = onnx::parse(&n.bytes()).unwrap();
    let same = g.nodes.iter().find(|x| x.name == "/same").unwrap();
    assert!(same.shared);
    assert_eq!(same.shape.to_string(), format!("[B, 1, {HEADS}, {N}, {N}]"));
}

/// A learned tensor tiled (MViT's temporal positions, `repeat_interleave`d) is refused
/// by node rather than folded into a constant whose elements would stop counting.
#[test]
fn a_tiled_learned_tensor_is_refused_not_folded() {
    let mut n = Net::new("tiled-positions");
    n.input("x", &format!("batch,{N},{D}"));
    n.weight("temporal", &[1, D]).init(int64s("reps", &[N, 1]));
    n.node("Tile", "/tile", &["temporal", "reps"], &["pos"], vec![]);
    n.node("Add", "/add", &["x", "pos"], &["out"], vec![]);
    n.output("out");
    let e = onnx::parse(&n.bytes()).unwrap_err().to_string();
    assert!(e.contains("/tile") && e.contains("Tile"), "{e}");
}

/// timm's Swin V2-CR meta MLP: `Gemm`s over a constant `[rows, 2]` table of relative
/// coordinates, computed once per step and added to each sample.
#[test]
fn a_gemm_over_a_constant_table_is_computed_once_per_step() {
    let mut n = Net::new("meta-mlp");
    n.input("x", &format!("batch,{TABLE},{HEADS}"));
    let coords: Vec<f32> = (0..TABLE * 2).map(|k| k as f32 * 0.5 - 2.0).collect();
    n.node(
        "Constant",
        "/coords",
        &[],
        &["coords"],
        vec![tensor("value", floats("coords", &[TABLE, 2], &coords))],
    );
    n.weight("fc1.weight", &[HIDDEN, 2])
        .weight("fc1.bias", &[HIDDEN])
        .weight("fc2.weight", &[HEADS, HIDDEN])
        .weight("fc2.bias", &[HEADS]);
    let gemm = |n: &mut Net, name: &str, x: &str, w: &str, b: &str, out: &str| {
        n.node("Gemm", name, &[x, w, b], &[out], vec![int("transB", 1)]);
    };
    gemm(&mut n, "/fc1", "coords", "fc1.weight", "fc1.bias", "h");
    n.node("Relu", "/act", &["h"], &["r"], vec![]);
    gemm(&mut n, "/fc2", "r", "fc2.weight", "fc2.bias", "bias");
    n.node("Add", "/add", &["x", "bias"], &["out"], vec![]);
    n.output("out");
    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(g.param_count(), (3 * HIDDEN + (HIDDEN + 1) * HEADS) as u64);
    let node = |name: &str| g.nodes.iter().find(|x| x.name == name).unwrap();
    assert!(node("/fc1").shared && node("/fc2").shared && !node("/add").shared);
}
