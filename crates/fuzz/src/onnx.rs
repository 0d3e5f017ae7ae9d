//! ONNX inputs: well-formed graphs of the importer's families mutated field
//! by field, or random chains of the ops it supports, encoded as protobuf.

use crate::mutate;
use arbitrary::{Result, Unstructured};
use batchfit_graph::onnx::proto::tensor_shape_proto::{Dimension, dimension};
use batchfit_graph::onnx::proto::{
    AttributeProto, AttributeType, GraphProto, ModelProto, NodeProto, OperatorSetIdProto,
    TensorProto, TensorShapeProto, TypeProto, ValueInfoProto, type_proto,
};
use prost::Message as _;

/// Attribute names the importer reads, and strings its attributes take.
const ATTRIBUTES: &[&str] = &[
    "axis",
    "axes",
    "perm",
    "kernel_shape",
    "strides",
    "pads",
    "dilations",
    "group",
    "auto_pad",
    "ceil_mode",
    "hidden_size",
    "direction",
    "layout",
    "keepdims",
    "alpha",
    "beta",
    "epsilon",
    "transA",
    "transB",
    "value",
    "to",
    "allowzero",
    "ratio",
    "size",
    "activations",
    "split",
    "num_outputs",
    "mode",
    "upper",
    "noop_with_empty_axes",
    "equation",
];
const STRINGS: &[&str] = &[
    // Einsum's equations: the forms it lowers and the forms it refuses.
    "bij,bjk->bik",
    "bhqd,bhkd->bhqk",
    "btd,dh->bth",
    "hd,btd->bth",
    "bi,bj->bij",
    "bij,bj->bi",
    "ij,jk",
    "ab->ba",
    "ii,ij->j",
    "...ij,jk->...ik",
    "ab,bc,cd->ad",
    "abc,abc->a",
    "ab,cd->abcd",
    ",->",
    "->",
    "NOTSET",
    "SAME_UPPER",
    "SAME_LOWER",
    "VALID",
    "forward",
    "reverse",
    "bidirectional",
    "Relu",
    "Tanh",
    "Sigmoid",
    "nearest",
    "linear",
    "none",
    "tanh",
];

/// An op type the importer reads: one it imports, or now and then an `Einsum`,
/// which is rewritten into them before import.
fn op_type(u: &mut Unstructured, ops: &'static [&'static str]) -> Result<&'static str> {
    if u.ratio(1, 20)? {
        return Ok("Einsum");
    }
    Ok(u.choose(ops)?)
}

fn small_int(u: &mut Unstructured) -> Result<i64> {
    Ok(match u.int_in_range(0..=9)? {
        0 => i64::MAX,
        1 => i64::MIN,
        2 => -1,
        3 => 0,
        4 => u.int_in_range(-4..=4)?,
        _ => u.int_in_range(1..=16)?,
    })
}

fn dims(u: &mut Unstructured, max_rank: usize) -> Result<Vec<i64>> {
    (0..u.int_in_range(0..=max_rank)?)
        .map(|_| {
            Ok(if u.ratio(1, 12)? {
                small_int(u)?
            } else {
                u.int_in_range(1..=8)?
            })
        })
        .collect()
}

/// A float (1) or int64 (7) initializer, its data the right length or not.
fn initializer(u: &mut Unstructured, name: String) -> Result<TensorProto> {
    let dims = dims(u, 4)?;
    let elements = dims
        .iter()
        .try_fold(1i64, |a, &d| a.checked_mul(d))
        .filter(|n| (0..=4096).contains(n))
        .unwrap_or(1) as usize;
    let int64 = u.ratio(1, 4)?;
    let width = if int64 { 8 } else { 4 };
    let len = if u.ratio(1, 8)? {
        u.int_in_range(0..=64)?
    } else {
        elements * width
    };
    let raw_data = if int64 {
        (0..len.div_ceil(8))
            .flat_map(|_| small_int(u).unwrap_or(1).to_le_bytes())
            .take(len)
            .collect()
    } else {
        (0..len.div_ceil(4))
            .flat_map(|_| (u.int_in_range(-100..=100).unwrap_or(0) as f32 * 0.01).to_le_bytes())
            .take(len)
            .collect()
    };
    Ok(TensorProto {
        name,
        dims,
        data_type: if int64 { 7 } else { 1 },
        raw_data,
        ..Default::default()
    })
}

fn attribute(u: &mut Unstructured) -> Result<AttributeProto> {
    let name = u.choose(ATTRIBUTES)?.to_string();
    let mut a = AttributeProto {
        name,
        ..Default::default()
    };
    match u.int_in_range(0..=4)? {
        0 => {
            a.r#type = AttributeType::Int as i32;
            a.i = small_int(u)?;
        }
        1 => {
            a.r#type = AttributeType::Ints as i32;
            a.ints = (0..u.int_in_range(0..=6)?)
                .map(|_| small_int(u))
                .collect::<Result<_>>()?;
        }
        2 => {
            a.r#type = AttributeType::Float as i32;
            a.f = *u.choose(&[0.0, 1e-5, 0.5, -1.0, f32::NAN, f32::INFINITY, 1e30])?;
        }
        3 => {
            a.r#type = AttributeType::String as i32;
            a.s = u.choose(STRINGS)?.as_bytes().to_vec();
        }
        _ => {
            a.r#type = AttributeType::Tensor as i32;
            a.t = Some(initializer(u, String::new())?);
        }
    }
    Ok(a)
}

fn value_info(name: &str, dims: &[Option<i64>]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| Dimension {
            value: Some(match d {
                Some(v) => dimension::Value::DimValue(*v),
                None => dimension::Value::DimParam("batch".into()),
            }),
            ..Default::default()
        })
        .collect();
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: 1,
                shape: Some(TensorShapeProto { dim }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn node(op: &str, inputs: &[&str], output: &str, attrs: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        name: format!("/{output}"),
        op_type: op.into(),
        attribute: attrs,
        ..Default::default()
    }
}

fn ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: AttributeType::Ints as i32,
        ints: v.to_vec(),
        ..Default::default()
    }
}

fn int(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: AttributeType::Int as i32,
        i: v,
        ..Default::default()
    }
}

fn weight(name: &str, dims: &[i64]) -> TensorProto {
    let n: i64 = dims.iter().product();
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: 1,
        raw_data: vec![0; 4 * n as usize],
        ..Default::default()
    }
}

/// Well-formed models of the families the importer knows (an MLP, a CNN, a
/// recurrent net, an attention block), for mutations to start from.
fn onnx_seed(u: &mut Unstructured) -> Result<GraphProto> {
    let batch = None;
    Ok(match u.int_in_range(0..=3)? {
        0 => GraphProto {
            name: "mlp".into(),
            input: vec![value_info("x", &[batch, Some(1), Some(4), Some(4)])],
            output: vec![value_info("y", &[batch, Some(3)])],
            initializer: vec![
                weight("w1", &[8, 16]),
                weight("b1", &[8]),
                weight("w2", &[3, 8]),
            ],
            node: vec![
                node("Flatten", &["x"], "f", vec![int("axis", 1)]),
                node("Gemm", &["f", "w1", "b1"], "h", vec![int("transB", 1)]),
                node("Relu", &["h"], "r", vec![]),
                node("Gemm", &["r", "w2"], "y", vec![int("transB", 1)]),
            ],
            ..Default::default()
        },
        1 => GraphProto {
            name: "cnn".into(),
            input: vec![value_info("x", &[batch, Some(3), Some(8), Some(8)])],
            output: vec![value_info("y", &[batch, Some(2)])],
            initializer: vec![
                weight("k", &[4, 3, 3, 3]),
                weight("kb", &[4]),
                weight("s", &[4]),
                weight("bb", &[4]),
                weight("m", &[4]),
                weight("v", &[4]),
                weight("w", &[2, 64]),
            ],
            node: vec![
                node(
                    "Conv",
                    &["x", "k", "kb"],
                    "c",
                    vec![ints("kernel_shape", &[3, 3]), ints("pads", &[1, 1, 1, 1])],
                ),
                node(
                    "BatchNormalization",
                    &["c", "s", "bb", "m", "v"],
                    "n",
                    vec![],
                ),
                node("Relu", &["n"], "r", vec![]),
                node(
                    "MaxPool",
                    &["r"],
                    "p",
                    vec![ints("kernel_shape", &[2, 2]), ints("strides", &[2, 2])],
                ),
                node("Flatten", &["p"], "f", vec![]),
                node("Gemm", &["f", "w"], "y", vec![int("transB", 1)]),
            ],
            ..Default::default()
        },
        2 => GraphProto {
            name: "rnn".into(),
            input: vec![value_info("x", &[Some(5), batch, Some(4)])],
            output: vec![value_info("y", &[batch, Some(2)])],
            initializer: vec![
                weight("W", &[1, 24, 4]),
                weight("R", &[1, 24, 6]),
                weight("B", &[1, 48]),
                weight("w", &[2, 6]),
            ],
            node: vec![
                node(
                    "GRU",
                    &["x", "W", "R", "B"],
                    "h",
                    vec![int("hidden_size", 6)],
                ),
                node("ReduceMean", &["h"], "m", vec![ints("axes", &[0, 1])]),
                node("Gemm", &["m", "w"], "y", vec![int("transB", 1)]),
            ],
            ..Default::default()
        },
        _ => GraphProto {
            name: "attention".into(),
            input: vec![value_info("x", &[batch, Some(4), Some(8)])],
            output: vec![value_info("y", &[batch, Some(4), Some(8)])],
            initializer: vec![weight("q", &[8, 8]), weight("k", &[8, 8])],
            node: vec![
                node("MatMul", &["x", "q"], "xq", vec![]),
                node("MatMul", &["x", "k"], "xk", vec![]),
                node("Transpose", &["xk"], "kt", vec![ints("perm", &[0, 2, 1])]),
                node("MatMul", &["xq", "kt"], "s", vec![]),
                node("Softmax", &["s"], "a", vec![int("axis", -1)]),
                node("MatMul", &["a", "x"], "y", vec![]),
            ],
            ..Default::default()
        },
    })
}

/// Structural edits of a graph: an op swapped, an attribute added or
/// changed, an input renamed or dropped, an initializer reshaped, a node
/// added, removed or duplicated.
fn mutate_graph(u: &mut Unstructured, g: &mut GraphProto) -> Result<()> {
    let ops = batchfit_graph::onnx::SUPPORTED_ONNX_OPS;
    for _ in 0..u.int_in_range(1..=4)? {
        let n = g.node.len();
        match u.int_in_range(0..=7)? {
            0 if n > 0 => {
                let i = u.choose_index(n)?;
                g.node[i].op_type = op_type(u, ops)?.to_string();
            }
            1 if n > 0 => {
                let i = u.choose_index(n)?;
                let a = attribute(u)?;
                g.node[i].attribute.push(a);
            }
            2 if n > 0 => {
                let i = u.choose_index(n)?;
                if !g.node[i].input.is_empty() {
                    let j = u.choose_index(g.node[i].input.len())?;
                    match u.int_in_range(0..=2)? {
                        0 => {
                            g.node[i].input.remove(j);
                        }
                        1 => g.node[i].input[j] = String::new(),
                        _ => g.node[i].input[j] = "missing".into(),
                    }
                }
            }
            3 if !g.initializer.is_empty() => {
                let i = u.choose_index(g.initializer.len())?;
                let name = g.initializer[i].name.clone();
                g.initializer[i] = initializer(u, name)?;
            }
            4 if n > 0 => {
                let i = u.choose_index(n)?;
                g.node.remove(i);
            }
            5 if n > 0 => {
                let i = u.choose_index(n)?;
                let copy = g.node[i].clone();
                g.node.insert(i, copy);
            }
            6 if n > 0 => {
                // A random node reading a value of the graph, written to it.
                let i = u.choose_index(n)?;
                let input = g.node[i].output.first().cloned().unwrap_or_default();
                let extra = format!("extra{i}");
                g.initializer.push(initializer(u, extra.clone())?);
                let attrs = (0..u.int_in_range(0..=3)?)
                    .map(|_| attribute(u))
                    .collect::<Result<_>>()?;
                let new = node(op_type(u, ops)?, &[&input, &extra], &input, attrs);
                g.node.insert(i + 1, new);
                g.node[i].output = vec![format!("{input}_pre")];
                if let Some(next) = g.node.get_mut(i + 1) {
                    next.input[0] = format!("{input}_pre");
                }
            }
            _ => {
                if let Some(v) = g.input.first_mut() {
                    let d: Vec<Option<i64>> = dims(u, 5)?
                        .into_iter()
                        .enumerate()
                        .map(|(k, d)| (k > 0).then_some(d))
                        .collect();
                    *v = value_info(&v.name, &d);
                }
            }
        }
    }
    Ok(())
}

/// A random graph: a chain of supported ops over the input and fresh
/// initializers, attributes drawn from the names the importer reads.
fn onnx_random(u: &mut Unstructured) -> Result<GraphProto> {
    let ops = batchfit_graph::onnx::SUPPORTED_ONNX_OPS;
    let input_dims: Vec<Option<i64>> = std::iter::once(Ok(None))
        .chain((0..u.int_in_range(0..=4)?).map(|_| Ok(Some(u.int_in_range(1..=8)?))))
        .collect::<Result<_>>()?;
    let mut g = GraphProto {
        name: "random".into(),
        input: vec![value_info("x", &input_dims)],
        ..Default::default()
    };
    let mut values = vec!["x".to_string()];
    for i in 0..u.int_in_range(1..=8)? {
        let mut inputs = Vec::new();
        for j in 0..u.int_in_range(1..=3)? {
            if j == 0 || u.ratio(1, 3)? {
                inputs.push(u.choose(&values)?.clone());
            } else {
                let name = format!("w{i}_{j}");
                g.initializer.push(initializer(u, name.clone())?);
                inputs.push(name);
            }
        }
        let attrs = (0..u.int_in_range(0..=4)?)
            .map(|_| attribute(u))
            .collect::<Result<_>>()?;
        let out = format!("v{i}");
        let refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
        g.node.push(node(op_type(u, ops)?, &refs, &out, attrs));
        values.push(out);
    }
    let last = values.last().cloned().unwrap_or_default();
    g.output = vec![value_info(&last, &[None, Some(u.int_in_range(1..=8)?)])];
    Ok(g)
}

/// One ONNX model's bytes.
pub(crate) fn onnx(u: &mut Unstructured) -> Result<Vec<u8>> {
    let graph = if u.arbitrary()? {
        let mut g = onnx_seed(u)?;
        mutate_graph(u, &mut g)?;
        g
    } else {
        onnx_random(u)?
    };
    let opset = *u.choose(&[7, 9, 11, 13, 17, 18, 21])?;
    let mut bytes = ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: opset,
        }],
        graph: Some(graph),
        ..Default::default()
    }
    .encode_to_vec();
    if u.ratio(1, 5)? {
        mutate::bytes(u, &mut bytes)?;
    }
    Ok(bytes)
}
