//! ONNX import of transformers as `torch.onnx.export` writes them (opset 17,
//! training mode): `nn.MultiheadAttention`'s `[T, B·heads, d]` layout, batch-first
//! and sequence-first encoders, and a GPT-style decoder with a learned positional
//! embedding, a causal mask built in the graph and the erf form of GELU.

use batchfit_graph::onnx::proto::{DataType, TensorProto};
use batchfit_graph::{Graph, Op, onnx};

mod common;
use common::*;

const T: i64 = 6;
const E: i64 = 8;
const HEADS: i64 = 2;
const FF: i64 = 16;

/// A rank-0 int64 constant (a `Gather` index, as the exporter writes one).
fn index(name: &str, v: i64) -> TensorProto {
    TensorProto {
        name: name.into(),
        data_type: DataType::Int64 as i32,
        int64_data: vec![v],
        ..Default::default()
    }
}

/// `Unsqueeze(Gather(Shape(x), axis), 0)`: one size of `x` as a shape value.
fn size_of(n: &mut Net, p: &str, x: &str, axis: i64) -> String {
    n.node(
        "Shape",
        &format!("{p}/Shape{axis}"),
        &[x],
        &[&format!("{p}.s{axis}")],
        vec![],
    );
    n.init(index(&format!("{p}.i{axis}"), axis));
    let g = format!("{p}.g{axis}");
    n.node(
        "Gather",
        &format!("{p}/Gather{axis}"),
        &[&format!("{p}.s{axis}"), &format!("{p}.i{axis}")],
        &[&g],
        vec![int("axis", 0)],
    );
    g
}

fn unsqueezed(n: &mut Net, p: &str, x: &str) -> String {
    let out = format!("{x}.u");
    n.init(int64s(&format!("{p}.{x}.axes"), &[0]));
    n.node(
        "Unsqueeze",
        &format!("{p}/Unsqueeze/{x}"),
        &[x, &format!("{p}.{x}.axes")],
        &[&out],
        vec![],
    );
    out
}

/// `y = x Wᵀ + b` as the exporter writes a `Linear` on a 3-d input.
fn linear(n: &mut Net, p: &str, x: &str, i: i64, o: i64, out: &str) {
    n.weight(&format!("{p}.weight"), &[o, i])
        .weight(&format!("{p}.bias"), &[o]);
    n.node(
        "Transpose",
        &format!("{p}/Transpose"),
        &[&format!("{p}.weight")],
        &[&format!("{p}.wt")],
        vec![ints("perm", &[1, 0])],
    );
    n.node(
        "MatMul",
        &format!("{p}/MatMul"),
        &[x, &format!("{p}.wt")],
        &[&format!("{p}.mm")],
        vec![],
    );
    n.node(
        "Add",
        &format!("{p}/Add"),
        &[&format!("{p}.bias"), &format!("{p}.mm")],
        &[out],
        vec![],
    );
}

/// `nn.MultiheadAttention` on `x` `[T, B, E]`, as exported: the packed in-projection
/// split through `[3, T, B, E]`, heads as `[T, B·heads, d]` transposed to
/// `[B·heads, T, d]`, scores as `[B, heads, T, T]` (plus `mask`), the heads merged
/// back through `[T·B, E]` into the out-projection (a `Gemm`).
fn attention(n: &mut Net, p: &str, x: &str, mask: Option<&str>, out: &str) {
    let d = E / HEADS;
    linear(n, &format!("{p}.in_proj"), x, E, 3 * E, &format!("{p}.qkv"));
    n.init(int64s(&format!("{p}.split"), &[0, 0, 3, E]));
    n.node(
        "Reshape",
        &format!("{p}/Reshape"),
        &[&format!("{p}.qkv"), &format!("{p}.split")],
        &[&format!("{p}.qkv4")],
        vec![],
    );
    let q5 = unsqueezed(n, p, &format!("{p}.qkv4"));
    n.node(
        "Transpose",
        &format!("{p}/Transpose"),
        &[&q5],
        &[&format!("{p}.qkv5")],
        vec![ints("perm", &[3, 1, 2, 0, 4])],
    );
    n.init(int64s(&format!("{p}.sq"), &[-2]));
    n.node(
        "Squeeze",
        &format!("{p}/Squeeze"),
        &[&format!("{p}.qkv5"), &format!("{p}.sq")],
        &[&format!("{p}.qkv3")],
        vec![],
    );
    // Sizes: T, B, B·heads.
    let t = size_of(n, p, x, 0);
    let b = size_of(n, p, x, 1);
    n.init(int64s(&format!("{p}.heads"), &[HEADS]));
    n.node(
        "Mul",
        &format!("{p}/Mul_bh"),
        &[&b, &format!("{p}.heads")],
        &[&format!("{p}.bh")],
        vec![],
    );
    let (tu, bu) = (unsqueezed(n, p, &t), unsqueezed(n, p, &b));
    n.init(int64s(&format!("{p}.d"), &[d]));
    n.init(int64s(&format!("{p}.T"), &[T]));
    n.node(
        "Concat",
        &format!("{p}/Concat_heads"),
        &[&tu, &format!("{p}.bh"), &format!("{p}.d")],
        &[&format!("{p}.shape_heads")],
        vec![int("axis", 0)],
    );
    n.node(
        "Concat",
        &format!("{p}/Concat_bhtd"),
        &[
            &bu,
            &format!("{p}.heads"),
            &format!("{p}.T"),
            &format!("{p}.d"),
        ],
        &[&format!("{p}.shape_bhtd")],
        vec![int("axis", 0)],
    );
    for (k, name) in ["q", "k", "v"].into_iter().enumerate() {
        n.init(index(&format!("{p}.{name}.idx"), k as i64));
        n.node(
            "Gather",
            &format!("{p}/Gather_{name}"),
            &[&format!("{p}.qkv3"), &format!("{p}.{name}.idx")],
            &[&format!("{p}.{name}")],
            vec![int("axis", 0)],
        );
        n.node(
            "Reshape",
            &format!("{p}/Reshape_{name}"),
            &[&format!("{p}.{name}"), &format!("{p}.shape_heads")],
            &[&format!("{p}.{name}h")],
            vec![],
        );
        n.node(
            "Transpose",
            &format!("{p}/Transpose_{name}"),
            &[&format!("{p}.{name}h")],
            &[&format!("{p}.{name}bh")],
            vec![ints("perm", &[1, 0, 2])],
        );
        n.node(
            "Reshape",
            &format!("{p}/Reshape4_{name}"),
            &[&format!("{p}.{name}bh"), &format!("{p}.shape_bhtd")],
            &[&format!("{p}.{name}4")],
            vec![],
        );
    }
    n.node(
        "Transpose",
        &format!("{p}/Transpose_kt"),
        &[&format!("{p}.k4")],
        &[&format!("{p}.kt")],
        vec![ints("perm", &[0, 1, 3, 2])],
    );
    n.init(scalar(&format!("{p}.scale"), 1.0 / (d as f32).sqrt()));
    n.node(
        "Mul",
        &format!("{p}/Mul_scale"),
        &[&format!("{p}.q4"), &format!("{p}.scale")],
        &[&format!("{p}.qs")],
        vec![],
    );
    n.node(
        "MatMul",
        &format!("{p}/MatMul_scores"),
        &[&format!("{p}.qs"), &format!("{p}.kt")],
        &[&format!("{p}.scores")],
        vec![],
    );
    let scores = match mask {
        Some(m) => {
            n.node(
                "Add",
                &format!("{p}/Add_mask"),
                &[&format!("{p}.scores"), m],
                &[&format!("{p}.masked")],
                vec![],
            );
            format!("{p}.masked")
        }
        None => format!("{p}.scores"),
    };
    n.node(
        "Softmax",
        &format!("{p}/Softmax"),
        &[&scores],
        &[&format!("{p}.attn")],
        vec![int("axis", -1)],
    );
    n.node(
        "MatMul",
        &format!("{p}/MatMul_ctx"),
        &[&format!("{p}.attn"), &format!("{p}.v4")],
        &[&format!("{p}.ctx")],
        vec![],
    );
    n.node(
        "Transpose",
        &format!("{p}/Transpose_merge"),
        &[&format!("{p}.ctx")],
        &[&format!("{p}.ctx_t")],
        vec![ints("perm", &[2, 0, 1, 3])],
    );
    // [T·B, E] from T times B.
    n.node(
        "Mul",
        &format!("{p}/Mul_tb"),
        &[&t, &b],
        &[&format!("{p}.tb")],
        vec![],
    );
    let tbu = unsqueezed(n, p, &format!("{p}.tb"));
    n.init(int64s(&format!("{p}.E"), &[E]));
    n.node(
        "Concat",
        &format!("{p}/Concat_rows"),
        &[&tbu, &format!("{p}.E")],
        &[&format!("{p}.shape_rows")],
        vec![int("axis", 0)],
    );
    n.node(
        "Reshape",
        &format!("{p}/Reshape_rows"),
        &[&format!("{p}.ctx_t"), &format!("{p}.shape_rows")],
        &[&format!("{p}.rows")],
        vec![],
    );
    n.weight(&format!("{p}.out_proj.weight"), &[E, E])
        .weight(&format!("{p}.out_proj.bias"), &[E]);
    n.node(
        "Gemm",
        &format!("{p}/Gemm"),
        &[
            &format!("{p}.rows"),
            &format!("{p}.out_proj.weight"),
            &format!("{p}.out_proj.bias"),
        ],
        &[&format!("{p}.proj")],
        vec![int("transB", 1)],
    );
    n.node(
        "Concat",
        &format!("{p}/Concat_tbe"),
        &[&tu, &bu, &format!("{p}.E")],
        &[&format!("{p}.shape_tbe")],
        vec![int("axis", 0)],
    );
    n.node(
        "Reshape",
        &format!("{p}/Reshape_tbe"),
        &[&format!("{p}.proj"), &format!("{p}.shape_tbe")],
        &[out],
        vec![],
    );
}

fn layer_norm(n: &mut Net, p: &str, x: &str, out: &str) {
    n.weight(&format!("{p}.weight"), &[E])
        .weight(&format!("{p}.bias"), &[E]);
    n.node(
        "LayerNormalization",
        &format!("{p}/LayerNormalization"),
        &[x, &format!("{p}.weight"), &format!("{p}.bias")],
        &[out],
        vec![int("axis", -1)],
    );
}

/// PyTorch's exact GELU before opset 20: `x * (1 + erf(x / sqrt 2)) * 0.5`.
fn erf_gelu(n: &mut Net, p: &str, x: &str, out: &str) {
    n.init(scalar(&format!("{p}.sqrt2"), std::f32::consts::SQRT_2))
        .init(scalar(&format!("{p}.one"), 1.0))
        .init(scalar(&format!("{p}.half"), 0.5));
    let v = |s: &str| format!("{p}.{s}");
    n.node(
        "Div",
        &format!("{p}/Div"),
        &[x, &v("sqrt2")],
        &[&v("d")],
        vec![],
    );
    n.node("Erf", &format!("{p}/Erf"), &[&v("d")], &[&v("e")], vec![]);
    n.node(
        "Add",
        &format!("{p}/Add"),
        &[&v("e"), &v("one")],
        &[&v("a")],
        vec![],
    );
    n.node(
        "Mul",
        &format!("{p}/Mul"),
        &[x, &v("a")],
        &[&v("m")],
        vec![],
    );
    n.node(
        "Mul",
        &format!("{p}/Mul_1"),
        &[&v("m"), &v("half")],
        &[out],
        vec![],
    );
}

/// A post-norm encoder layer (`nn.TransformerEncoderLayer`) on `[T, B, E]`.
fn encoder_layer(n: &mut Net, p: &str, x: &str, mask: Option<&str>, gelu: bool, out: &str) {
    let v = |s: &str| format!("{p}.{s}");
    attention(n, &format!("{p}.self_attn"), x, mask, &v("sa"));
    n.node(
        "Add",
        &format!("{p}/Add"),
        &[x, &v("sa")],
        &[&v("r1")],
        vec![],
    );
    layer_norm(n, &format!("{p}.norm1"), &v("r1"), &v("n1"));
    linear(n, &format!("{p}.linear1"), &v("n1"), E, FF, &v("h"));
    if gelu {
        erf_gelu(n, &format!("{p}.gelu"), &v("h"), &v("act"));
    } else {
        n.node(
            "Relu",
            &format!("{p}/Relu"),
            &[&v("h")],
            &[&v("act")],
            vec![],
        );
    }
    linear(n, &format!("{p}.linear2"), &v("act"), FF, E, &v("f"));
    n.node(
        "Add",
        &format!("{p}/Add_1"),
        &[&v("n1"), &v("f")],
        &[&v("r2")],
        vec![],
    );
    layer_norm(n, &format!("{p}.norm2"), &v("r2"), out);
}

/// One layer's parameters: attention, two norms, the feed-forward pair.
const LAYER_PARAMS: u64 =
    ((3 * E * E + 3 * E) + (E * E + E) + 4 * E + (E * FF + FF) + (FF * E + E)) as u64;

fn count(g: &Graph, pred: impl Fn(&Op) -> bool) -> usize {
    g.nodes.iter().filter(|n| pred(&n.op)).count()
}

/// An encoder classifier reading the first position (a CLS token), with the batch
/// first around the encoder (`batch_first=True`: the layer transposes in and out)
/// or the model working sequence-first throughout.
fn encoder_classifier(batch_first: bool) -> Net {
    let mut n = Net::new("encoder");
    n.input("x", &format!("batch,{T},4"));
    linear(&mut n, "proj", "x", 4, E, "h");
    n.node(
        "Transpose",
        "/to_tbe",
        &["h"],
        &["h_tbe"],
        vec![ints("perm", &[1, 0, 2])],
    );
    encoder_layer(&mut n, "layers.0", "h_tbe", None, false, "enc");
    let (first_in, axis) = if batch_first {
        n.node(
            "Transpose",
            "/to_bte",
            &["enc"],
            &["enc_bte"],
            vec![ints("perm", &[1, 0, 2])],
        );
        ("enc_bte", 1)
    } else {
        ("enc", 0)
    };
    n.init(index("first", 0));
    n.node(
        "Gather",
        "/cls",
        &[first_in, "first"],
        &["cls"],
        vec![int("axis", axis)],
    );
    n.weight("fc.weight", &[3, E]).weight("fc.bias", &[3]);
    n.node(
        "Gemm",
        "/fc",
        &["cls", "fc.weight", "fc.bias"],
        &["out"],
        vec![int("transB", 1)],
    );
    n.output("out");
    n
}

#[test]
fn encoder_loads_batch_first_and_sequence_first() {
    for batch_first in [true, false] {
        let g = onnx::parse(&encoder_classifier(batch_first).bytes())
            .unwrap_or_else(|e| panic!("batch_first {batch_first}: {e}"));
        let want = (4 * E + E) as u64 + LAYER_PARAMS + (E * 3 + 3) as u64;
        assert_eq!(g.param_count(), want, "batch_first {batch_first}");
        // Scores are [B, heads, T, T] per sample: the batch never merges in the IR.
        let scores = g
            .nodes
            .iter()
            .find(|n| n.name.ends_with("MatMul_scores"))
            .unwrap();
        assert_eq!(scores.shape.to_string(), format!("[B, {HEADS}, {T}, {T}]"));
        // q, k and v each need one transpose into heads; the merge needs one back.
        assert!(count(&g, |op| matches!(op, Op::Transpose { .. })) >= 4);
        assert_eq!(g.nodes.last().unwrap().shape.to_string(), "[B, 3]");
    }
}

#[test]
fn gpt_decoder_with_positions_causal_mask_and_erf_gelu() {
    let mut n = Net::new("gpt");
    n.input_of("tokens", &format!("batch,{T}"), DataType::Int64);
    n.weight("tok.weight", &[50, E]);
    n.node(
        "Gather",
        "/tok",
        &["tok.weight", "tokens"],
        &["emb"],
        vec![],
    );
    // A learned positional embedding, still at its initial zeros.
    n.weight("pos", &[1, T, E]);
    n.node("Add", "/Add_pos", &["emb", "pos"], &["h"], vec![]);
    n.node(
        "Transpose",
        "/to_tbe",
        &["h"],
        &["h_tbe"],
        vec![ints("perm", &[1, 0, 2])],
    );
    // The causal mask as `is_causal` builds it: ones expanded to [T, T], the lower
    // triangle, compared with 0, then -inf where it was 0.
    n.init(scalar("one", 1.0))
        .init(int64s("tt", &[T, T]))
        .init(scalar("zero", 0.0))
        .init(scalar("ninf", f32::NEG_INFINITY));
    n.node("Expand", "/Expand", &["one", "tt"], &["ones"], vec![]);
    n.node(
        "Trilu",
        "/Trilu",
        &["ones"],
        &["lower"],
        vec![int("upper", 0)],
    );
    n.node("Equal", "/Equal", &["lower", "zero"], &["above"], vec![]);
    n.node(
        "Where",
        "/Where",
        &["above", "ninf", "zero"],
        &["mask"],
        vec![],
    );
    encoder_layer(&mut n, "blocks.0", "h_tbe", Some("mask"), true, "enc");
    n.node(
        "Transpose",
        "/to_bte",
        &["enc"],
        &["enc_bte"],
        vec![ints("perm", &[1, 0, 2])],
    );
    linear(&mut n, "head", "enc_bte", E, 50, "out");
    n.output("out");

    let g = onnx::parse(&n.bytes()).unwrap();
    let want = (50 * E + T * E) as u64 + LAYER_PARAMS + (E * 50 + 50) as u64;
    assert_eq!(g.param_count(), want);
    assert_eq!(count(&g, |op| *op == Op::CausalMask), 1);
    assert_eq!(
        count(&g, |op| *op
            == Op::AddParam {
                shape: vec![T as usize, E as usize]
            }),
        1
    );
    assert_eq!(count(&g, |op| *op == Op::Gelu), 1);
    assert_eq!(
        g.nodes.last().unwrap().shape.to_string(),
        format!("[B, {T}, 50]")
    );

    // A constant added to the scores that is not causal is added as it is (untrained).
    let mut anti = n.clone();
    for node in &mut anti.g.node {
        if node.name == "/Trilu" {
            node.attribute = vec![int("upper", 1)];
        }
    }
    let g = onnx::parse(&anti.bytes()).unwrap();
    let mask = g
        .nodes
        .iter()
        .find(|x| x.name.ends_with("Add_mask"))
        .unwrap();
    let Op::AddConst { shape, values } = &mask.op else {
        panic!("{:?}", mask.op);
    };
    assert_eq!(shape, &vec![T as usize, T as usize]);
    // -inf below the diagonal, where the causal mask has zeros.
    assert!(
        values[T as usize].is_infinite() && values[1] == 0.0,
        "{values:?}"
    );
    assert_eq!(
        g.param_count(),
        onnx::parse(&n.bytes()).unwrap().param_count()
    );
}

#[test]
fn a_reshape_that_splits_the_batch_names_the_node() {
    let mut n = Net::new("split-batch");
    n.input("x", &format!("batch,{T},{E}"));
    n.node(
        "Transpose",
        "/tbe",
        &["x"],
        &["x_tbe"],
        vec![ints("perm", &[1, 0, 2])],
    );
    n.init(int64s("shape", &[T, 2, -1, E]));
    n.node("Reshape", "/split", &["x_tbe", "shape"], &["y"], vec![]);
    n.node("Relu", "/relu", &["y"], &["out"], vec![]);
    n.output("out");
    let err = onnx::parse(&n.bytes()).unwrap_err().to_string();
    assert!(
        err.contains("/split") && err.contains("batch cannot be split"),
        "{err}"
    );
}

/// Cross-attention (`nn.TransformerDecoder`) projects the memory with rows
/// `E..3E` of the packed in-projection, sliced at sizes read from a shape: folded
/// into one weight.
#[test]
fn a_weight_sliced_at_a_computed_size_folds() {
    let mut n = Net::new("cross-kv");
    n.input("x", &format!("batch,{T},{E}"));
    let e = size_of(&mut n, "kv", "x", 2);
    let start = unsqueezed(&mut n, "kv", &e);
    n.init(int64s("end", &[3 * E])).init(int64s("axis0", &[0]));
    n.weight("in_proj_weight", &[3 * E, E]);
    n.node(
        "Slice",
        "/kv/Slice",
        &["in_proj_weight", &start, "end", "axis0"],
        &["w_kv"],
        vec![],
    );
    n.node(
        "Transpose",
        "/kv/T",
        &["w_kv"],
        &["w_kv_t"],
        vec![ints("perm", &[1, 0])],
    );
    n.node("MatMul", "/kv/MatMul", &["x", "w_kv_t"], &["out"], vec![]);
    n.output("out");
    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(g.param_count(), (2 * E * E) as u64);
    assert_eq!(g.nodes[0].shape.to_string(), format!("[B, {T}, {}]", 2 * E));
}

/// `ConstantOfShape` of fixed sizes is a constant (here zeros added, so nothing);
/// only one of a shape holding the batch starts a random mask.
#[test]
fn constant_of_a_fixed_shape_is_a_constant() {
    let mut n = Net::new("zeros");
    n.input("x", &format!("batch,{E}"));
    n.init(int64s("shape", &[E]));
    n.node("ConstantOfShape", "/zeros", &["shape"], &["z"], vec![]);
    n.node("Add", "/add", &["x", "z"], &["y"], vec![]);
    n.node("Relu", "/relu", &["y"], &["out"], vec![]);
    n.output("out");
    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(g.nodes.len(), 1);
    assert_eq!(g.nodes[0].inputs, ["x"]);
}

/// ViT's blocks keep `nn.Dropout(0.0)` in a training-mode export: no layer.
#[test]
fn dropout_of_probability_zero_is_no_layer() {
    let mut n = Net::new("vit-dropout");
    n.input("x", &format!("batch,{E}"));
    n.init(scalar("ratio", 0.0));
    n.node("Dropout", "/drop", &["x", "ratio"], &["d"], vec![]);
    n.node("Relu", "/relu", &["d"], &["out"], vec![]);
    n.output("out");
    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(g.nodes.len(), 1);
    assert_eq!(g.nodes[0].inputs, ["x"]);
}

/// torchvision's ViT: `cls_token.expand(B, -1, -1)` (the -1s replaced through
/// `Where(shape == -1, 1, shape)`) concatenated before the patches, then a learned
/// position added.
#[test]
fn vit_class_token_and_positions() {
    let mut n = Net::new("vit-embed");
    n.input("x", &format!("batch,{T},{E}"));
    let b = size_of(&mut n, "cls", "x", 0);
    let bu = unsqueezed(&mut n, "cls", &b);
    n.init(int64s("minus_ones", &[-1, -1]));
    n.node(
        "Concat",
        "/shape",
        &[&bu, "minus_ones"],
        &["shape"],
        vec![int("axis", 0)],
    );
    n.init(int64s("neg", &[-1]));
    n.node("Equal", "/Equal", &["shape", "neg"], &["is_neg"], vec![]);
    n.init(int64s("ones", &[1, 1, 1]));
    n.node(
        "Where",
        "/Where",
        &["is_neg", "ones", "shape"],
        &["target"],
        vec![],
    );
    n.weight("class_token", &[1, 1, E]);
    n.node(
        "Expand",
        "/Expand",
        &["class_token", "target"],
        &["cls"],
        vec![],
    );
    n.node(
        "Concat",
        "/Concat",
        &["cls", "x"],
        &["tokens"],
        vec![int("axis", 1)],
    );
    n.weight("pos_embedding", &[1, T + 1, E]);
    n.node(
        "Add",
        "/pos",
        &["tokens", "pos_embedding"],
        &["out"],
        vec![],
    );
    n.output("out");
    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(
        g.nodes[0].op,
        Op::ConcatParam {
            axis: 1,
            shape: vec![1, E as usize],
            first: true
        }
    );
    assert_eq!(g.nodes[0].shape.to_string(), format!("[B, {}, {E}]", T + 1));
    assert_eq!(g.param_count(), (E + (T + 1) * E) as u64);
    // Expanding to anything but the batch is refused, naming the node.
    let mut bad = n.clone();
    bad.g.initializer.retain(|t| t.name != "ones");
    bad.init(int64s("ones", &[1, 2, 1]));
    let err = onnx::parse(&bad.bytes()).unwrap_err().to_string();
    assert!(err.contains("/Expand"), "{err}");
}

/// An activation with the batch moved, added to one with the batch first, would
/// broadcast the wrong axes: refused, naming the node and the layout.
#[test]
fn mixing_layouts_in_an_add_is_refused() {
    let mut n = Net::new("mixed");
    n.input("x", &format!("batch,{T},{T}"));
    n.node(
        "Transpose",
        "/tbe",
        &["x"],
        &["x_t"],
        vec![ints("perm", &[1, 0, 2])],
    );
    n.node("Add", "/add", &["x_t", "x"], &["out"], vec![]);
    n.output("out");
    let err = onnx::parse(&n.bytes()).unwrap_err().to_string();
    assert!(err.contains("/add") && err.contains("batch moved"), "{err}");
}

/// `nn.LayerNorm` as an export before opset 17 (and Keras) writes it: mean, centre,
/// square, mean, epsilon, root, divide, scale, shift. One LayerNorm, whether the
/// reductions take their axes as an attribute or (opset 18) as an input.
#[test]
fn decomposed_layer_norm_is_one_layer() {
    for axes_as_input in [false, true] {
        let mut n = Net::new("ln");
        n.input("x", &format!("batch,{T},{E}"));
        let reduce = |n: &mut Net, name: &str, x: &str, out: &str| {
            if axes_as_input {
                n.node("ReduceMean", name, &[x, "last"], &[out], vec![]);
            } else {
                n.node("ReduceMean", name, &[x], &[out], vec![ints("axes", &[-1])]);
            }
        };
        n.init(int64s("last", &[-1]))
            .init(scalar("two", 2.0))
            .init(scalar("eps", 1e-5));
        reduce(&mut n, "/mean", "x", "mean");
        n.node("Sub", "/sub", &["x", "mean"], &["d"], vec![]);
        n.node("Pow", "/pow", &["d", "two"], &["sq"], vec![]);
        reduce(&mut n, "/var", "sq", "var");
        n.node("Add", "/eps", &["var", "eps"], &["ve"], vec![]);
        n.node("Sqrt", "/sqrt", &["ve"], &["std"], vec![]);
        n.node("Div", "/div", &["d", "std"], &["norm"], vec![]);
        n.weight("gamma", &[E]).weight("beta", &[E]);
        n.node("Mul", "/scale", &["norm", "gamma"], &["scaled"], vec![]);
        n.node("Add", "/shift", &["scaled", "beta"], &["out"], vec![]);
        n.output("out");
        let g = onnx::parse(&n.bytes()).unwrap();
        assert_eq!(g.nodes.len(), 1, "axes as input: {axes_as_input}");
        assert_eq!(
            g.nodes[0].op,
            Op::LayerNorm {
                features: E as usize
            }
        );
        assert_eq!(g.nodes[0].name, "/shift");
        // Centring over another axis is not a LayerNorm: what it computes is that mean
        // subtracted, then an RMS norm of the difference over the last axis.
        let mut other = n.clone();
        for node in &mut other.g.node {
            if node.name == "/mean" && !axes_as_input {
                node.attribute = vec![ints("axes", &[1])];
            }
        }
        if !axes_as_input {
            let g = onnx::parse(&other.bytes()).unwrap();
            let ops: Vec<&str> = g.nodes.iter().map(|x| x.op.name()).collect();
            assert!(!ops.contains(&"layernorm"), "{ops:?}");
            assert!(ops.contains(&"rmsnorm"), "{ops:?}");
            assert_eq!(g.param_count(), 2 * E as u64);
        }
    }
}

/// `[B, 1, 1]` from the batch of `x` (an `expand(B, -1, -1)`'s target, the -1s
/// already replaced), named `target`.
fn batch_then_ones(n: &mut Net, p: &str, target: &str) {
    let b = size_of(n, p, "x", 0);
    let bu = unsqueezed(n, p, &b);
    n.init(int64s("ones", &[1, 1]));
    n.node(
        "Concat",
        "/shape",
        &[&bu, "ones"],
        &[target],
        vec![int("axis", 0)],
    );
}

/// A class token and two register tokens before the patches and a distillation-style
/// token after them, each `x.expand(B, -1, -1)`, in one `Concat` (timm's ViTs with
/// registers): each run of learned tensors is one `ConcatParam`, its values joined in
/// the Concat's order, counted as PyTorch counts the tokens.
#[test]
fn several_learned_tokens_in_one_concat() {
    let mut n = Net::new("vit-registers");
    n.input("x", &format!("batch,{T},{E}"));
    batch_then_ones(&mut n, "cls", "target");
    let e = E as usize;
    let tokens = [
        ("cls_token", 1, 1.0),
        ("reg_token", 2, 2.0),
        ("end_token", 1, 3.0),
    ];
    for (name, count, value) in tokens {
        n.init(floats(
            name,
            &[1, count, E],
            &vec![value; count as usize * e],
        ));
        n.node(
            "Expand",
            &format!("/expand_{name}"),
            &[name, "target"],
            &[&format!("{name}_b")],
            vec![],
        );
    }
    n.node(
        "Concat",
        "/Concat",
        &["cls_token_b", "reg_token_b", "x", "end_token_b"],
        &["out"],
        vec![int("axis", 1)],
    );
    n.output("out");
    let g = onnx::parse(&n.bytes()).unwrap();
    let concats: Vec<_> = g
        .nodes
        .iter()
        .filter(|x| matches!(x.op, Op::ConcatParam { .. }))
        .collect();
    assert_eq!(concats.len(), 2);
    assert_eq!(
        concats[0].op,
        Op::ConcatParam {
            axis: 1,
            shape: vec![3, e],
            first: true
        }
    );
    let mut before = vec![1.0; e];
    before.extend(vec![2.0; 2 * e]);
    assert_eq!(concats[0].weights, Some(vec![before]));
    assert_eq!(concats[1].weights, Some(vec![vec![3.0; e]]));
    assert_eq!(
        g.shape_of(&g.loss.input).unwrap().to_string(),
        format!("[B, {}, {E}]", T + 4)
    );
    assert_eq!(g.param_count(), 4 * E as u64);
}

/// An attention pool's latent query (`latent.expand(B, -1, -1)` into its linear
/// layer, timm's `AttentionPoolLatent`): the learned tensor repeated over the batch,
/// one parameter as PyTorch counts it.
#[test]
fn a_learned_query_expanded_over_the_batch_feeds_a_linear_layer() {
    let mut n = Net::new("attention-pool");
    n.input("x", &format!("batch,{T},{E}"));
    batch_then_ones(&mut n, "latent", "target");
    n.weight("latent", &[1, 2, E]);
    n.node(
        "Expand",
        "/expand",
        &["latent", "target"],
        &["q_in"],
        vec![],
    );
    n.weight("q_weight", &[E, E]);
    n.node("MatMul", "/q", &["q_in", "q_weight"], &["q"], vec![]);
    n.output("q");
    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(
        g.nodes[0].op,
        Op::BroadcastParam {
            shape: vec![2, E as usize]
        }
    );
    assert_eq!(g.nodes[0].inputs, ["x"]);
    assert_eq!(
        g.shape_of(&g.loss.input).unwrap().to_string(),
        format!("[B, 2, {E}]")
    );
    assert_eq!(g.param_count(), (2 * E + E * E) as u64);
}
