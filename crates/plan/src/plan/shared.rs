//! Tensors computed once per step (`Node::shared`): what they keep is fixed memory.

use crate::rules::{RuntimeRules, Sizes};
use batchfit_graph::{Graph, Node, Op};
use std::collections::HashSet;

/// Bytes shared node `node` keeps for the backward, by the runtime's own rules at a
/// batch of one (its inputs other than shared tensors are not read: a constant's model
/// input).
pub(super) fn kept_bytes(
    graph: &Graph,
    node: &Node,
    shared: &HashSet<&str>,
    rules: &dyn RuntimeRules,
    seq: usize,
    act: u64,
) -> u64 {
    let whole = |t: &str| -> u64 {
        if !shared.contains(t) {
            return 0;
        }
        graph.shape_of(t).map(|s| s.elements(seq)).unwrap_or(0)
    };
    let in_elems: Vec<u64> = node.inputs.iter().map(|i| whole(i)).collect();
    let in_dims = graph
        .shape_of(&node.inputs[0])
        .map(|s| s.resolve(seq))
        .unwrap_or_default();
    let sizes = Sizes {
        inputs: &in_elems,
        output: whole(&node.name),
        out_dims: &node.shape.resolve(seq),
        in_dims: &in_dims,
        input_tracked: true,
    };
    let rule = rules.saved(&node.op, &sizes);
    let inputs: u64 = if rule.inputs {
        in_elems.iter().sum()
    } else {
        0
    };
    let output = if rule.output { sizes.output } else { 0 };
    (rule.extra_elems + inputs + output) * act + rule.extra_bytes
}

/// Bytes the graph's standardised convolution weights keep for the backward: fixed
/// memory like a shared tensor's (computed once per step from a parameter).
pub(super) fn standardized_weights(graph: &Graph, rules: &dyn RuntimeRules, act: u64) -> u64 {
    let kept = |n: &Node| match &n.op {
        Op::Conv {
            out_channels,
            standardize: Some(_),
            ..
        } => {
            let weight = n.op.params().first().map_or(0, |w| w.elements());
            rules.standardized_weight_kept(weight, *out_channels as u64)
        }
        _ => 0,
    };
    graph.nodes.iter().map(kept).sum::<u64>() * act
}
