//! Patterns an exporter writes out op by op that the IR models as one op, fused
//! before import so the plan sees what the user's framework runs: PyTorch's exact
//! GELU (`F.gelu`, `nn.GELU()`) reaches ONNX before opset 20 as
//! `x * 0.5 * (1 + erf(x / sqrt(2)))`.

use super::proto::NodeProto;
use std::collections::{HashMap, HashSet};

/// Rewrites every erf-GELU into one `Gelu` node; `konst` reads a scalar constant.
pub(super) fn fuse_gelu(
    nodes: Vec<NodeProto>,
    konst: impl Fn(&str) -> Option<f32>,
) -> Vec<NodeProto> {
    let producer: HashMap<&str, usize> = nodes
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
    // The one node reading `name`.
    let sole = |name: &str| match consumers.get(name).map(Vec::as_slice) {
        Some([i]) => Some(*i),
        _ => None,
    };
    let near = |name: &str, want: f32| konst(name).is_some_and(|v| (v - want).abs() < 1e-3);
    // For `op(a, b)` with one constant operand near `want`: the other operand.
    let other = |n: &NodeProto, op: &str, want: f32, commutes: bool| -> Option<String> {
        match n.input.as_slice() {
            [a, b] if n.op_type == op && near(b, want) => Some(a.clone()),
            [a, b] if n.op_type == op && commutes && near(a, want) => Some(b.clone()),
            _ => None,
        }
    };
    let mut dead = HashSet::new();
    let mut replace: HashMap<usize, NodeProto> = HashMap::new();
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
            dead.extend(gone);
            let mut gelu = nodes[last].clone();
            gelu.op_type = "Gelu".into();
            gelu.input = vec![x];
            gelu.attribute.clear();
            replace.insert(last, gelu);
        }
    }
    nodes
        .into_iter()
        .enumerate()
        .filter(|(i, _)| !dead.contains(i))
        .map(|(i, n)| replace.remove(&i).unwrap_or(n))
        .collect()
}
