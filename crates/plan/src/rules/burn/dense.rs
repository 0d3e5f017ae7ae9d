//! burn's matrix products: dense layers and products of two activations (the
//! engine's own on the CPU, engine `cpu/dense.rs`; burn's `float_matmul`
//! elsewhere), and embeddings.

use super::Burn;
use crate::rules::{BackwardMoment, Saved, Sizes};
use batchfit_graph::Op;

/// What a product or an embedding keeps for its backward.
pub(super) fn saved(op: &Op) -> Saved {
    match op {
        // `embedding` keeps the index tensor, which is the batch's own token tensor.
        Op::Embedding { .. } => Saved::default(),
        // burn-autodiff `float_matmul` (ops/tensor.rs) checkpoints lhs (x) and rhs (W), as the
        // CPU's own dense layer and product keep them.
        _ => Saved {
            inputs: true,
            ..Saved::default()
        },
    }
}

/// Per-sample bytes the forward allocates besides its output: the CPU's own products
/// write their output once; flex's `matmul` output comes from `FlexTensor::empty`:
/// zeroed, then copied aligned.
pub(super) fn forward_temporaries(b: &Burn, op: &Op, s: &Sizes, act: u64) -> u64 {
    match op {
        Op::Linear { .. } | Op::MatMul if !b.gpu => 0,
        Op::Linear { .. } | Op::MatMul => s.output * act,
        _ => 0,
    }
}

/// The moments of a product's or an embedding's backward.
pub(super) fn backward(
    b: &Burn,
    op: &Op,
    s: &Sizes,
    tracked: &[bool],
    dx: u64,
    act: u64,
) -> Vec<BackwardMoment> {
    let out = s.output;
    let params: u64 = op.param_count();
    let largest = op.params().iter().map(|p| p.elements()).max().unwrap_or(0);
    let one = |elems: u64| {
        vec![BackwardMoment {
            bytes: elems * act,
            param_elems: params,
            ..BackwardMoment::default()
        }]
    };
    let tracked_inputs = || -> Vec<u64> {
        s.inputs
            .iter()
            .zip(tracked)
            .filter(|&(_, &t)| t)
            .map(|(&e, _)| e)
            .collect()
    };
    match op {
        // The engine's own dense layer and product on the CPU: dx = dy W^T, then
        // dW = x^T dy (and the bias's column sums), each written once.
        // gemm allocates packing buffers per call (`Burn::gemm_call`): dx's product is
        // `[rows, in] = dy [rows, out] x W^T`, dW's `[in, out] = x^T [in, rows] x dy`.
        Op::Linear {
            in_features,
            out_features,
            ..
        } if !b.gpu => {
            let (i, o) = (*in_features as u64, *out_features as u64);
            let rows = s.inputs[0] / i.max(1);
            vec![
                BackwardMoment {
                    bytes: (out + dx) * act,
                    gemm_call: (dx > 0)
                        .then(|| b.gemm_call([rows, i, o], 0, [true, o == 1]))
                        .flatten(),
                    ..BackwardMoment::default()
                },
                BackwardMoment {
                    bytes: (out + dx) * act,
                    param_elems: params,
                    gemm_call: b.gemm_call([i, o, rows], 2, [i == 1, true]),
                    ..BackwardMoment::default()
                },
            ]
        }
        Op::MatMul if !b.gpu => one(out + tracked_inputs().iter().sum::<u64>()),
        // `float_matmul` backward: dx = dy W^T, a new matmul output (two copies for a
        // moment); then dW = x^T dy, parameter-sized, also with its twin for a moment.
        Op::Linear { .. } => vec![
            BackwardMoment {
                bytes: (out + 2 * dx) * act,
                ..BackwardMoment::default()
            },
            BackwardMoment {
                bytes: (out + dx) * act,
                param_elems: params + largest,
                ..BackwardMoment::default()
            },
        ],
        Op::MatMul => {
            let t = tracked_inputs();
            one(out + t.iter().sum::<u64>() + t.iter().copied().max().unwrap_or(0))
        }
        // `embedding_backward` scatters into a parameter-sized zeroed tensor.
        _ => vec![BackwardMoment {
            bytes: out * act,
            param_elems: 2 * params,
            ..BackwardMoment::default()
        }],
    }
}
