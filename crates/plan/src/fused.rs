//! Ops a runtime runs as one kernel though the graph writes them as several: what
//! that kernel reads and keeps ([`crate::rules::RuntimeRules::fuses_silu_and_attention`]).

use batchfit_graph::{Graph, Op};
use std::collections::HashMap;

/// A node's part in ops the runtime runs as one kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Fused<'g> {
    /// An op inside the kernel: no tensor of its own is made or kept (a SiLU's sigmoid;
    /// an attention's scores, their softmax).
    Inner,
    /// The attention's last product: the kernel reads (and keeps) the unscaled queries,
    /// keys and values, and keeps its output and one log-sum-exp per query and head.
    Attention { reads: [&'g str; 3], lse_elems: u64 },
}

/// The nodes of `graph` that PyTorch runs as one kernel:
///
/// - `x * sigmoid(x)`, how ONNX before opset 22 writes `nn.SiLU`: `silu` keeps x alone
///   (derivatives.yaml `silu_backward(grad, self)`). The product keeps x as a `mul`
///   would; the sigmoid is inner.
/// - `softmax((q * sqrt(s)) (k * sqrt(s))^T) v` with no dropout, how the exporter writes
///   `F.scaled_dot_product_attention` (its symbolic scales both operands): PyTorch runs
///   the fused kernel (flash attention on a CPU and on a GPU), which makes no
///   `T x T` tensor. With a dropout the CPU takes the composed path, kept as written.
pub(crate) fn fused_parts(graph: &Graph, seq: usize) -> HashMap<&str, Fused<'_>> {
    let mut readers: HashMap<&str, usize> = HashMap::new();
    for node in &graph.nodes {
        for input in &node.inputs {
            *readers.entry(input.as_str()).or_default() += 1;
        }
    }
    *readers.entry(graph.loss.input.as_str()).or_default() += 1;
    let by_name: HashMap<&str, &batchfit_graph::Node> =
        graph.nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    // The node named `name` if it is read once and `is` its op.
    let sole = |name: &str, is: fn(&Op) -> bool| {
        by_name
            .get(name)
            .copied()
            .filter(|n| readers.get(name) == Some(&1) && is(&n.op))
    };
    let mut parts = HashMap::new();
    for node in graph.nodes.iter() {
        match node.op {
            Op::Mul => {
                let [a, b] = [node.inputs[0].as_str(), node.inputs[1].as_str()];
                for (sig, x) in [(a, b), (b, a)] {
                    if sole(sig, |op| matches!(op, Op::Sigmoid)).is_some_and(|n| n.inputs[0] == x) {
                        parts.insert(sig, Fused::Inner);
                        break;
                    }
                }
            }
            Op::MatMul => {
                let no_dropout = |op: &Op| matches!(op, Op::Dropout { p } if *p <= 0.0);
                let probs = node.inputs[0].as_str();
                let dropout = sole(probs, no_dropout);
                let softmax_name = dropout.map_or(probs, |d| d.inputs[0].as_str());
                let Some(softmax) = sole(softmax_name, |op| matches!(op, Op::Softmax { .. }))
                else {
                    continue;
                };
                let Some(scores) = sole(&softmax.inputs[0], |op| matches!(op, Op::MatMul)) else {
                    continue;
                };
                let scaled =
                    |i: usize| sole(&scores.inputs[i], |op| matches!(op, Op::Scale { .. }));
                let (Some(q), Some(k)) = (scaled(0), scaled(1)) else {
                    continue;
                };
                let keys = scores
                    .shape
                    .resolve(seq)
                    .last()
                    .copied()
                    .unwrap_or(1)
                    .max(1) as u64;
                for inner in [q, k, softmax, scores].iter().map(|n| n.name.as_str()) {
                    parts.insert(inner, Fused::Inner);
                }
                if let Some(d) = dropout {
                    parts.insert(d.name.as_str(), Fused::Inner);
                }
                parts.insert(
                    node.name.as_str(),
                    Fused::Attention {
                        reads: [&q.inputs[0], &k.inputs[0], &node.inputs[1]],
                        lse_elems: scores.shape.elements(seq) / keys,
                    },
                );
            }
            _ => {}
        }
    }
    parts
}
