//! Patterns an exporter writes out op by op that the IR models as one op, fused
//! before import so the plan sees what the user's framework runs: PyTorch's exact
//! GELU (`F.gelu`, `nn.GELU()`) reaches ONNX before opset 20 as
//! `x * 0.5 * (1 + erf(x / sqrt(2)))` (its tanh form as
//! `0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))`), and `nn.LayerNorm` before opset 17 (and
//! from Keras) as `ReduceMean`, `Sub`, `Pow`, `ReduceMean`, `Add`, `Sqrt`, `Div`,
//! then the scale's `Mul` and the shift's `Add`.

use super::decode::Attrs;
use super::proto::{AttributeProto, AttributeType, NodeProto};
use std::collections::{HashMap, HashSet};

/// Who produces and who reads each tensor of `nodes`.
struct Uses<'a> {
    producer: HashMap<&'a str, usize>,
    consumers: HashMap<&'a str, Vec<usize>>,
}

/// Nodes a fusion removes and the node it puts in place of the pattern's last one.
#[derive(Default)]
struct Rewrite {
    dead: HashSet<usize>,
    replace: HashMap<usize, NodeProto>,
}

impl Rewrite {
    fn fuse(&mut self, gone: Vec<usize>, last: usize, node: NodeProto) {
        self.dead.extend(gone);
        self.replace.insert(last, node);
    }

    fn apply(mut self, nodes: Vec<NodeProto>) -> Vec<NodeProto> {
        nodes
            .into_iter()
            .enumerate()
            .filter(|(i, _)| !self.dead.contains(i))
            .map(|(i, n)| self.replace.remove(&i).unwrap_or(n))
            .collect()
    }
}

impl<'a> Uses<'a> {
    fn of(nodes: &'a [NodeProto]) -> Uses<'a> {
        let producer = nodes
            .iter()
            .enumerate()
            .flat_map(|(i, n)| n.output.iter().map(move |o| (o.as_str(), i)))
            .collect();
        let mut consumers: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, n) in nodes.iter().enumerate() {
            for input in &n.input {
                consumers.entry(input.as_str()).or_default().push(i);
            }
        }
        Uses {
            producer,
            consumers,
        }
    }

    /// The one node reading `name` (once or more).
    fn sole(&self, name: &str) -> Option<usize> {
        let mut readers = self.consumers.get(name)?.clone();
        readers.dedup();
        match readers[..] {
            [i] => Some(i),
            _ => None,
        }
    }
}

/// Rewrites every erf-GELU into one `Gelu` node; `konst` reads a scalar constant.
pub(super) fn fuse_gelu(
    nodes: Vec<NodeProto>,
    konst: impl Fn(&str) -> Option<f32>,
) -> Vec<NodeProto> {
    let uses = Uses::of(&nodes);
    let (producer, sole) = (&uses.producer, |name: &str| uses.sole(name));
    let near = |name: &str, want: f32| konst(name).is_some_and(|v| (v - want).abs() < 1e-3);
    // For `op(a, b)` with one constant operand near `want`: the other operand.
    let other = |n: &NodeProto, op: &str, want: f32, commutes: bool| -> Option<String> {
        match n.input.as_slice() {
            [a, b] if n.op_type == op && near(b, want) => Some(a.clone()),
            [a, b] if n.op_type == op && commutes && near(a, want) => Some(b.clone()),
            _ => None,
        }
    };
    let mut rewrite = Rewrite::default();
    fuse_tanh_gelu(&nodes, &uses, &other, &mut rewrite);
    for (e, erf) in nodes.iter().enumerate() {
        if erf.op_type != "Erf" || erf.input.len() != 1 {
            continue;
        }
        let fused = (|| {
            let d = *producer.get(erf.input[0].as_str())?;
            let scaled = &nodes[d];
            let x = other(scaled, "Div", std::f32::consts::SQRT_2, false)
                .or_else(|| other(scaled, "Mul", std::f32::consts::FRAC_1_SQRT_2, true))?;
            (sole(&scaled.output[0])? == e).then_some(())?;
            let a = sole(&erf.output[0])?;
            (other(&nodes[a], "Add", 1.0, true)? == erf.output[0]).then_some(())?;
            let m = sole(&nodes[a].output[0])?;
            let mul = &nodes[m];
            let [p, q] = mul.input.as_slice() else {
                return None;
            };
            let half_x = if *p == nodes[a].output[0] { q } else { p };
            if *half_x == x {
                // (x * (1 + erf)) * 0.5
                let last = sole(&mul.output[0])?;
                (other(&nodes[last], "Mul", 0.5, true)? == mul.output[0]).then_some(())?;
                Some((x, vec![d, e, a, m], last))
            } else {
                // (x * 0.5) * (1 + erf)
                let h = *producer.get(half_x.as_str())?;
                (other(&nodes[h], "Mul", 0.5, true)? == x && sole(half_x)? == m).then_some(())?;
                Some((x, vec![d, e, a, h], m))
            }
        })();
        if let Some((x, gone, last)) = fused {
            rewrite.fuse(gone, last, gelu_node(&nodes[last], x));
        }
    }
    rewrite.apply(nodes)
}

/// One `Gelu` of `x` in place of `last`, the pattern's final node (its name and output).
fn gelu_node(last: &NodeProto, x: String) -> NodeProto {
    let mut gelu = last.clone();
    gelu.op_type = "Gelu".into();
    gelu.input = vec![x];
    gelu.attribute.clear();
    gelu
}

/// The tanh form of GELU written out (GPT-2's `gelu_new`, `F.gelu(approximate="tanh")`
/// before opset 20): `0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`, as one `Gelu`
/// (the IR's GELU is the exact one; the two differ by under 1e-3).
fn fuse_tanh_gelu(
    nodes: &[NodeProto],
    uses: &Uses,
    other: &impl Fn(&NodeProto, &str, f32, bool) -> Option<String>,
    rewrite: &mut Rewrite,
) {
    let (producer, sole) = (&uses.producer, |name: &str| uses.sole(name));
    let made = |name: &str| producer.get(name).map(|&i| (i, &nodes[i]));
    for (t, tanh) in nodes.iter().enumerate() {
        if tanh.op_type != "Tanh" || tanh.input.len() != 1 {
            continue;
        }
        let fused = (|| {
            // tanh(c (x + 0.044715 x^3)), c = sqrt(2 / pi)
            let (s, scaled) = made(&tanh.input[0])?;
            let inner = other(scaled, "Mul", (2.0 / std::f32::consts::PI).sqrt(), true)?;
            let (r, sum) = made(&inner)?;
            let [p, q] = sum.input.as_slice() else {
                return None;
            };
            (sum.op_type == "Add").then_some(())?;
            let cubic_of = |name: &str| -> Option<(usize, usize, String)> {
                let (k, kn) = made(name)?;
                let cube = other(kn, "Mul", 0.044715, true)?;
                let (c, cn) = made(&cube)?;
                let x = match cn.op_type.as_str() {
                    "Pow" => other(cn, "Pow", 3.0, false)?,
                    _ => return None,
                };
                Some((k, c, x))
            };
            let (k, c, x) = match (cubic_of(q), cubic_of(p)) {
                (Some((k, c, x)), _) if x == *p => (k, c, x),
                (_, Some((k, c, x))) if x == *q => (k, c, x),
                _ => return None,
            };
            (sole(&scaled.output[0])? == t && sole(&sum.output[0])? == s).then_some(())?;
            (sole(&nodes[k].output[0])? == r && sole(&nodes[c].output[0])? == k).then_some(())?;
            // 1 + tanh, times 0.5 x (either order of the two products).
            let a = sole(&tanh.output[0])?;
            (other(&nodes[a], "Add", 1.0, true)? == tanh.output[0]).then_some(())?;
            let m = sole(&nodes[a].output[0])?;
            let [u, v] = nodes[m].input.as_slice() else {
                return None;
            };
            (nodes[m].op_type == "Mul").then_some(())?;
            let half_x = if *u == nodes[a].output[0] { v } else { u };
            if *half_x == x {
                let last = sole(&nodes[m].output[0])?;
                (other(&nodes[last], "Mul", 0.5, true)? == nodes[m].output[0]).then_some(())?;
                Some((x, vec![c, k, r, s, t, a, m], last))
            } else {
                let (h, hn) = made(half_x)?;
                (other(hn, "Mul", 0.5, true)? == x && sole(half_x)? == m).then_some(())?;
                Some((x, vec![c, k, r, s, t, a, h], m))
            }
        })();
        if let Some((x, gone, last)) = fused {
            rewrite.fuse(gone, last, gelu_node(&nodes[last], x));
        }
    }
}

/// Rewrites every layer norm over the last axis written out op by op, with its scale
/// and shift, into one `LayerNormalization`. `scalar` reads a scalar constant,
/// `ints` an integer constant, `is_weight` whether a name is an initializer.
pub(super) fn fuse_layer_norm(
    nodes: Vec<NodeProto>,
    scalar: impl Fn(&str) -> Option<f32>,
    ints: impl Fn(&str) -> Option<Vec<i64>>,
    is_weight: impl Fn(&str) -> bool,
) -> Vec<NodeProto> {
    let uses = Uses::of(&nodes);
    let mean_last = |n: &NodeProto| is_mean_over_last(n, &ints);
    let one = |n: &NodeProto, op: &str| n.op_type == op && n.input.len() == 2;
    let mut rewrite = Rewrite::default();
    for (d, sub) in nodes.iter().enumerate() {
        if !one(sub, "Sub") {
            continue;
        }
        let fused = (|| {
            let (x, centred) = (&sub.input[0], &sub.output[0]);
            let m = *uses.producer.get(sub.input[1].as_str())?;
            (mean_last(&nodes[m])
                && nodes[m].input[0] == *x
                && uses.sole(&nodes[m].output[0])? == d)
                .then_some(())?;
            // The centred values feed the square and the division, nothing else.
            let readers = uses.consumers.get(centred.as_str())?;
            let square = readers.iter().copied().find(|&r| {
                let n = &nodes[r];
                (one(n, "Pow") && n.input[0] == *centred && scalar(&n.input[1]) == Some(2.0))
                    || (one(n, "Mul") && n.input[0] == *centred && n.input[1] == *centred)
            })?;
            let div = readers.iter().copied().find(|&r| one(&nodes[r], "Div"))?;
            (readers.iter().all(|&r| r == square || r == div) && nodes[div].input[0] == *centred)
                .then_some(())?;
            let var = uses.sole(&nodes[square].output[0])?;
            mean_last(&nodes[var]).then_some(())?;
            let add = uses.sole(&nodes[var].output[0])?;
            let eps = match nodes[add].input.as_slice() {
                [v, e] if *v == nodes[var].output[0] && one(&nodes[add], "Add") => scalar(e)?,
                [e, v] if *v == nodes[var].output[0] && one(&nodes[add], "Add") => scalar(e)?,
                _ => return None,
            };
            let sqrt = uses.sole(&nodes[add].output[0])?;
            (nodes[sqrt].op_type == "Sqrt"
                && uses.sole(&nodes[sqrt].output[0])? == div
                && nodes[div].input[1] == nodes[sqrt].output[0])
                .then_some(())?;
            // The scale and the shift, each a weight.
            let other = |n: &NodeProto, mine: &str| -> Option<String> {
                match n.input.as_slice() {
                    [p, q] if p == mine && is_weight(q) => Some(q.clone()),
                    [p, q] if q == mine && is_weight(p) => Some(p.clone()),
                    _ => None,
                }
            };
            let mul = uses.sole(&nodes[div].output[0])?;
            let gamma =
                one(&nodes[mul], "Mul").then(|| other(&nodes[mul], &nodes[div].output[0]))??;
            let shift = uses.sole(&nodes[mul].output[0])?;
            let beta = one(&nodes[shift], "Add")
                .then(|| other(&nodes[shift], &nodes[mul].output[0]))??;
            Some((
                x.clone(),
                gamma,
                beta,
                eps,
                vec![m, d, square, var, add, sqrt, div, mul],
                shift,
            ))
        })();
        if let Some((x, gamma, beta, eps, gone, last)) = fused {
            let norm = last_axis_norm(
                &nodes[last],
                "LayerNormalization",
                vec![x, gamma, beta],
                eps,
            );
            rewrite.fuse(gone, last, norm);
        }
    }
    rewrite.apply(nodes)
}

/// Rewrites every RMS norm over the last axis written out op by op (Hugging Face's T5 and
/// LLaMA: `x.pow(2).mean(-1, keepdim=True)`, `x * rsqrt(v + eps)`, `weight * x`; ONNX
/// writes `rsqrt` as `1 / Sqrt` or `Reciprocal`, or the whole as `x / Sqrt`) with its
/// scale into one `RMSNormalization` (the spec's op since opset 23). Arguments as
/// [`fuse_layer_norm`]'s.
pub(super) fn fuse_rms_norm(
    nodes: Vec<NodeProto>,
    scalar: impl Fn(&str) -> Option<f32>,
    ints: impl Fn(&str) -> Option<Vec<i64>>,
    is_weight: impl Fn(&str) -> bool,
) -> Vec<NodeProto> {
    let uses = Uses::of(&nodes);
    let mean_last = |n: &NodeProto| is_mean_over_last(n, &ints);
    let two = |n: &NodeProto, op: &str| n.op_type == op && n.input.len() == 2;
    // The operand of the two-input `n` that is not `mine`.
    let other = |n: &NodeProto, mine: &str| -> Option<String> {
        match n.input.as_slice() {
            [p, q] if p == mine => Some(q.clone()),
            [p, q] if q == mine => Some(p.clone()),
            _ => None,
        }
    };
    let mut rewrite = Rewrite::default();
    for (q, square) in nodes.iter().enumerate() {
        let x = match square.input.as_slice() {
            [x, two_] if two(square, "Pow") && scalar(two_) == Some(2.0) => x.clone(),
            [x, y] if two(square, "Mul") && x == y => x.clone(),
            _ => continue,
        };
        let fused = (|| {
            let var = uses.sole(&square.output[0])?;
            (mean_last(&nodes[var]) && nodes[var].input[0] == square.output[0]).then_some(())?;
            let add = uses.sole(&nodes[var].output[0])?;
            two(&nodes[add], "Add").then_some(())?;
            let eps = scalar(&other(&nodes[add], &nodes[var].output[0])?)?;
            let sqrt = uses.sole(&nodes[add].output[0])?;
            (nodes[sqrt].op_type == "Sqrt").then_some(())?;
            let root = &nodes[sqrt].output[0];
            let next = uses.sole(root)?;
            // `x / root`, or `x * (1 / root)`.
            let (normed, mut gone) = match (nodes[next].op_type.as_str(), &nodes[next].input[..]) {
                ("Div", [p, r]) if p == &x && r == root => (next, vec![q, var, add, sqrt]),
                ("Div", [one, r]) if r == root && scalar(one) == Some(1.0) => {
                    let m = uses.sole(&nodes[next].output[0])?;
                    (two(&nodes[m], "Mul") && other(&nodes[m], &nodes[next].output[0])? == x)
                        .then_some(())?;
                    (m, vec![q, var, add, sqrt, next])
                }
                ("Reciprocal", [r]) if r == root => {
                    let m = uses.sole(&nodes[next].output[0])?;
                    (two(&nodes[m], "Mul") && other(&nodes[m], &nodes[next].output[0])? == x)
                        .then_some(())?;
                    (m, vec![q, var, add, sqrt, next])
                }
                _ => return None,
            };
            // The scale, a weight (a `Cast` back to the input's type may come between).
            let mut y = nodes[normed].output[0].clone();
            let mut at = uses.sole(&y)?;
            if nodes[at].op_type == "Cast" {
                gone.push(at);
                y = nodes[at].output[0].clone();
                at = uses.sole(&y)?;
            }
            let weight = two(&nodes[at], "Mul")
                .then(|| other(&nodes[at], &y))?
                .filter(|w| is_weight(w))?;
            gone.push(normed);
            Some((x.clone(), weight, eps, gone, at))
        })();
        if let Some((x, weight, eps, gone, last)) = fused {
            let norm = last_axis_norm(&nodes[last], "RMSNormalization", vec![x, weight], eps);
            rewrite.fuse(gone, last, norm);
        }
    }
    rewrite.apply(nodes)
}

/// Whether `n` is a `ReduceMean` over the last axis keeping it: the axes from the
/// attribute (before opset 18) or the second input, which `ints` reads.
fn is_mean_over_last(n: &NodeProto, ints: &impl Fn(&str) -> Option<Vec<i64>>) -> bool {
    let a = Attrs(&n.attribute);
    let axes = a
        .ints("axes")
        .or_else(|| n.input.get(1).and_then(|i| ints(i)));
    n.op_type == "ReduceMean" && axes.as_deref() == Some(&[-1]) && a.int("keepdims", 1) == 1
}

/// A normalisation over the last axis with epsilon `eps`, of op type `op` reading
/// `input`, in place of `last` (the pattern's final node: its name and output).
fn last_axis_norm(last: &NodeProto, op: &str, input: Vec<String>, eps: f32) -> NodeProto {
    let mut norm = last.clone();
    norm.op_type = op.into();
    norm.input = input;
    norm.attribute = vec![
        AttributeProto {
            name: "axis".into(),
            i: -1,
            r#type: AttributeType::Int as i32,
            ..Default::default()
        },
        AttributeProto {
            name: "epsilon".into(),
            f: eps,
            r#type: AttributeType::Float as i32,
            ..Default::default()
        },
    ];
    norm
}
