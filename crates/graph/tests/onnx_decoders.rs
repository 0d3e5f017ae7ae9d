//! Decoder and encoder-decoder families as Hugging Face exports them: RMSNorm written
//! out op by op (T5, LLaMA), rotary position embeddings (cosines and sines folded from
//! constants, `rotate_half`'s `Neg`), T5's relative position buckets computed from
//! constants and one bias table read by every layer, a head tied to the token
//! embedding, and BERT's token type ids gathered from an expanded buffer.

use batchfit_graph::onnx::proto::DataType;
use batchfit_graph::{Op, onnx};

mod common;
use common::*;

const T: i64 = 4;
const D: i64 = 8;

/// `x.pow(2).mean(-1, keepdim=True)`, `x * (1 / sqrt(v + eps))`, `weight * x` into `out`.
fn rms_norm(n: &mut Net, name: &str, x: &str, out: &str) {
    let p = |s: &str| format!("{name}/{s}");
    n.init(scalar(&p("two"), 2.0))
        .init(scalar(&p("eps"), 1e-6))
        .init(scalar(&p("one"), 1.0))
        .weight(&p("weight"), &[D]);
    n.node("Pow", &p("Pow"), &[x, &p("two")], &[&p("sq")], vec![]);
    n.node(
        "ReduceMean",
        &p("ReduceMean"),
        &[&p("sq")],
        &[&p("var")],
        vec![ints("axes", &[-1]), int("keepdims", 1)],
    );
    n.node(
        "Add",
        &p("Add"),
        &[&p("var"), &p("eps")],
        &[&p("v")],
        vec![],
    );
    n.node("Sqrt", &p("Sqrt"), &[&p("v")], &[&p("root")], vec![]);
    n.node(
        "Div",
        &p("Div"),
        &[&p("one"), &p("root")],
        &[&p("r")],
        vec![],
    );
    n.node("Mul", &p("Mul"), &[x, &p("r")], &[&p("y")], vec![]);
    n.node("Mul", &p("Scale"), &[&p("weight"), &p("y")], &[out], vec![]);
}

#[test]
fn llama_style_rms_norm_and_rotary_embedding_load_as_pytorch_counts_them() {
    let mut n = Net::new("llama-block");
    n.input("x", &format!("batch,{T},{D}"));
    rms_norm(&mut n, "/norm", "x", "h");
    // Frequencies: positions [T, 1] times inverse frequencies [1, D/2], doubled along
    // the last axis, then their cosines and sines (a buffer's arithmetic: no parameter).
    let positions: Vec<f32> = (0..T).map(|t| t as f32).collect();
    let inv: Vec<f32> = (0..D / 2).map(|i| 1.0 / 10f32.powi(i as i32)).collect();
    n.init(floats("pos", &[T, 1], &positions))
        .init(floats("inv_freq", &[1, D / 2], &inv));
    n.node("Mul", "/freqs", &["pos", "inv_freq"], &["f"], vec![]);
    n.node(
        "Concat",
        "/emb",
        &["f", "f"],
        &["emb"],
        vec![int("axis", -1)],
    );
    n.node("Cos", "/cos", &["emb"], &["cos"], vec![]);
    n.node("Sin", "/sin", &["emb"], &["sin"], vec![]);
    // q * cos + rotate_half(q) * sin, rotate_half(q) = cat(-q[..., D/2:], q[..., :D/2]).
    n.init(int64s("zero", &[0]))
        .init(int64s("half", &[D / 2]))
        .init(int64s("end", &[D]))
        .init(int64s("last", &[-1]));
    n.node(
        "Slice",
        "/q1",
        &["h", "zero", "half", "last"],
        &["q1"],
        vec![],
    );
    n.node(
        "Slice",
        "/q2",
        &["h", "half", "end", "last"],
        &["q2"],
        vec![],
    );
    n.node("Neg", "/neg", &["q2"], &["nq2"], vec![]);
    n.node(
        "Concat",
        "/rot",
        &["nq2", "q1"],
        &["rot"],
        vec![int("axis", -1)],
    );
    n.node("Mul", "/qcos", &["h", "cos"], &["a"], vec![]);
    n.node("Mul", "/rsin", &["rot", "sin"], &["b"], vec![]);
    n.node("Add", "/rope", &["a", "b"], &["out"], vec![]);
    n.output("out");

    let g = onnx::parse(&n.bytes()).unwrap();
    // The norm's scale is the only parameter; the frequencies are a buffer.
    assert_eq!(g.param_count(), D as u64);
    let op = |name: &str| &g.nodes.iter().find(|x| x.name == name).unwrap().op;
    assert_eq!(*op("/norm/Scale"), Op::RmsNorm { features: 8 });
    assert!(
        !g.nodes.iter().any(|x| x.name.starts_with("/norm/Pow")),
        "the written-out norm is one op: {:?}",
        g.nodes.iter().map(|x| &x.name).collect::<Vec<_>>()
    );
    assert_eq!(*op("/neg"), Op::Scale { factor: -1.0 });
    let Op::MulConst { shape, values } = op("/qcos") else {
        panic!("{:?}", op("/qcos"))
    };
    assert_eq!(shape, &[T as usize, D as usize]);
    // Row t, column i: cos(t * inv_freq[i mod D/2]).
    let (t, i) = (3usize, 5usize);
    let want = (t as f32 * inv[i % (D as usize / 2)]).cos();
    assert!((values[t * D as usize + i] - want).abs() < 1e-6);
    let Op::MulConst { values, .. } = op("/rsin") else {
        panic!("{:?}", op("/rsin"))
    };
    assert!((values[t * D as usize + i] - want.acos().sin()).abs() < 1e-5);
    assert_eq!(g.shape_of(&g.loss.input).unwrap().to_string(), "[B, 4, 8]");
}

#[test]
fn a_tied_head_and_a_shared_bias_table_count_once_and_equal_zeros_do_not_tie() {
    const V: i64 = 10;
    const BUCKETS: i64 = 16;
    let mut n = Net::new("t5-tied");
    n.input_of("ids", &format!("batch,{T}"), DataType::Int64);
    n.weight("wte", &[V, D]);
    n.node("Gather", "/wte", &["wte", "ids"], &["tok"], vec![]);
    // A second table of the same shape and the same (zero) values is its own parameter.
    n.weight("other", &[V, D]);
    n.node("Gather", "/other", &["other", "ids"], &["tok2"], vec![]);
    n.node("Add", "/sum", &["tok", "tok2"], &["h"], vec![]);
    // T5's buckets from relative positions j - i: min(floor(log(|j - i| + 1) * 4), 15),
    // cast to int64, looked up in a [buckets, heads = 1] table.
    let rel: Vec<f32> = (0..T * T).map(|k| (k % T - k / T) as f32).collect();
    n.init(floats("rel", &[T, T], &rel))
        .init(scalar("one", 1.0))
        .init(scalar("four", 4.0))
        .init(scalar("top", (BUCKETS - 1) as f32));
    n.node("Abs", "/abs", &["rel"], &["a"], vec![]);
    n.node("Add", "/add1", &["a", "one"], &["a1"], vec![]);
    n.node("Log", "/log", &["a1"], &["l"], vec![]);
    n.node("Mul", "/scale", &["l", "four"], &["l4"], vec![]);
    n.node("Floor", "/floor", &["l4"], &["fl"], vec![]);
    n.node("Min", "/min", &["fl", "top"], &["m"], vec![]);
    n.node("Cast", "/cast", &["m"], &["bucket"], vec![int("to", 7)]);
    n.weight("rel_bias", &[BUCKETS, 1]);
    n.node("Gather", "/bias", &["rel_bias", "bucket"], &["bt"], vec![]);
    n.node(
        "Transpose",
        "/bias_t",
        &["bt"],
        &["bias"],
        vec![ints("perm", &[2, 0, 1])],
    );
    // Two layers of scores, each adding the same bias.
    n.node(
        "Transpose",
        "/hT",
        &["h"],
        &["hT"],
        vec![ints("perm", &[0, 2, 1])],
    );
    n.node("MatMul", "/s1", &["h", "hT"], &["s1"], vec![]);
    n.node("Add", "/s1b", &["s1", "bias"], &["s1b"], vec![]);
    n.node("Softmax", "/p1", &["s1b"], &["p1"], vec![int("axis", -1)]);
    n.node("MatMul", "/c1", &["p1", "h"], &["c1"], vec![]);
    n.node(
        "Transpose",
        "/c1T",
        &["c1"],
        &["c1T"],
        vec![ints("perm", &[0, 2, 1])],
    );
    n.node("MatMul", "/s2", &["c1", "c1T"], &["s2"], vec![]);
    n.node("Add", "/s2b", &["s2", "bias"], &["s2b"], vec![]);
    n.node("Softmax", "/p2", &["s2b"], &["p2"], vec![int("axis", -1)]);
    n.node("MatMul", "/c2", &["p2", "c1"], &["c2"], vec![]);
    // The head: `h @ wte.T`, the embedding's own table.
    n.node(
        "Transpose",
        "/wteT",
        &["wte"],
        &["wteT"],
        vec![ints("perm", &[1, 0])],
    );
    n.node("MatMul", "/lm_head", &["c2", "wteT"], &["logits"], vec![]);
    n.output("logits");

    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(g.param_count(), (2 * V * D + BUCKETS) as u64);
    let node = |name: &str| g.nodes.iter().find(|x| x.name == name).unwrap();
    let head = node("/lm_head");
    assert_eq!(
        head.op,
        Op::Linear {
            in_features: 8,
            out_features: 10,
            bias: false
        }
    );
    assert_eq!(head.tied.len(), 1);
    assert_eq!(
        (head.tied[0].to.as_str(), head.own_param_count()),
        ("/wte", 0)
    );
    assert!(node("/other").tied.is_empty());
    let second = node("/s2b");
    assert_eq!((second.tied.len(), second.tied[0].to.as_str()), (1, "/s1b"));
    // The buckets as T5 computes them: |j - i| = 0, 1, 2, 3 gives 0, 2, 4, 5.
    let Op::AddTable { index, table, .. } = &node("/s1b").op else {
        panic!("{:?}", node("/s1b").op)
    };
    assert_eq!(*table, BUCKETS as usize);
    assert_eq!(index[..T as usize], [0, 2, 4, 5]);
}

#[test]
fn bert_token_types_gathered_from_an_expanded_buffer_fold_to_their_ids() {
    // `token_type_ids.expand(B, T)`, then `torch.gather(.., 1, position_ids)`: every
    // sample reads the buffer's one row.
    let mut n = Net::new("bert-token-types");
    n.input_of("ids", &format!("batch,{T}"), DataType::Int64);
    n.weight("word", &[10, D]);
    n.node("Gather", "/word", &["word", "ids"], &["w"], vec![]);
    n.init(int64_tensor("token_type_ids", &[1, T], &[0, 1, 1, 0]));
    n.node("Shape", "/Shape", &["ids"], &["shape"], vec![]);
    n.node(
        "Expand",
        "/expand",
        &["token_type_ids", "shape"],
        &["tt_wide"],
        vec![],
    );
    n.init(int64_tensor("position_ids", &[1, T], &[3, 2, 1, 0]));
    n.node(
        "GatherElements",
        "/gather",
        &["tt_wide", "position_ids"],
        &["tt_ids"],
        vec![int("axis", 1)],
    );
    n.weight("token_type", &[2, D]);
    n.node(
        "Gather",
        "/token_type",
        &["token_type", "tt_ids"],
        &["tt"],
        vec![],
    );
    n.node("Add", "/add_tt", &["w", "tt"], &["e"], vec![]);
    n.output("e");

    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(g.param_count(), (10 + 2) as u64 * D as u64);
    let add = g.nodes.iter().find(|x| x.name == "/add_tt").unwrap();
    let Op::AddTable { index, .. } = &add.op else {
        panic!("{:?}", add.op)
    };
    // Positions 3, 2, 1, 0 of [0, 1, 1, 0]: types 0, 1, 1, 0, each a row of D.
    let rows: Vec<usize> = index
        .chunks(D as usize)
        .map(|r| r[0] / D as usize)
        .collect();
    assert_eq!(rows, [0, 1, 1, 0]);
}
