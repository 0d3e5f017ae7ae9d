//! burn's activations as the engine runs them: its own ReLU, clipped ReLU and
//! softmax on the CPU (engine `cpu/act.rs`), burn's elsewhere, and the
//! activations burn composes everywhere.

use super::Burn;
use crate::rules::{BackwardMoment, Saved, Sizes};
use batchfit_graph::Op;

/// Whether the engine runs `op` as its own softmax (engine `cpu/act.rs`): on the CPU,
/// over an axis with nothing after it but axes of size 1 (`axis` counts the batch).
pub(super) fn own_softmax(b: &Burn, op: &Op, s: &Sizes) -> bool {
    let Op::Softmax { axis } = op else {
        return false;
    };
    let full = s.in_dims.len() as i64 + 1;
    let a = if *axis < 0 { axis + full } else { *axis };
    !b.gpu && a >= 1 && s.in_dims[a as usize..].iter().all(|&d| d == 1)
}

/// What an activation keeps for its backward.
pub(super) fn saved(b: &Burn, op: &Op, s: &Sizes) -> Saved {
    let none = Saved::default();
    let inputs = Saved {
        inputs: true,
        ..none
    };
    match op {
        // On the CPU the engine's own ReLU keeps its output, as PyTorch's does (usually the
        // buffer the next layer keeps).
        Op::Relu if !b.gpu => Saved {
            output: true,
            ..none
        },
        // `relu`, `sigmoid`, `gelu` (ops/activation.rs), `float_tanh` and `float_exp`
        // (ops/tensor.rs) checkpoint their INPUT and recompute from it: unlike PyTorch, the pre-activation
        // stays alive beside the activation the next layer keeps.
        Op::Relu | Op::Tanh | Op::Sigmoid | Op::Exp | Op::Gelu => inputs,
        // On the CPU the engine's own clamp keeps one byte per element (whether the
        // gradient passes). Elsewhere `clamp` is burn-backend's default `float_clamp` =
        // `clamp_min(clamp_max(x))`, each a comparison plus `float_mask_fill`, whose
        // backward keeps only the bool mask (flex stores bools as one byte): two bytes per
        // element, not the input.
        Op::Clamp { .. } => Saved {
            extra_bytes: if b.gpu { 2 } else { 1 } * s.output,
            ..none
        },
        // `leaky_relu` is burn-backend's default: `x < 0` (a bool mask), `mul_scalar`
        // (nothing kept) and `float_mask_where`, which keeps the mask.
        Op::LeakyRelu { .. } => Saved {
            extra_bytes: s.output,
            ..none
        },
        // `prelu` is the same with `float_mul` by the learned slope, which keeps x (the
        // slope is a parameter, kept anyway).
        Op::PRelu { .. } => Saved {
            inputs: true,
            extra_bytes: s.output,
            ..none
        },
        // `hard_sigmoid` is burn-backend's default: `mul_scalar`, `add_scalar` (nothing kept)
        // and the clamp's two masks. `hard_swish` multiplies x by it: `float_mul` keeps both
        // factors, x and the hard sigmoid.
        Op::HardSigmoid { .. } => Saved {
            extra_bytes: 2 * s.output,
            ..none
        },
        Op::HardSwish => Saved {
            inputs: true,
            extra_elems: s.output,
            extra_bytes: 2 * s.output,
            ..none
        },
        // On the CPU the engine's own softmax over the last axis keeps its output. Elsewhere
        // it is burn-backend's default `softmax`: x - max, `float_exp` (keeps its input), sum,
        // `float_div` (keeps the exponentials and the sums).
        Op::Softmax { .. } if own_softmax(b, op, s) => Saved {
            output: true,
            ..none
        },
        Op::Softmax { .. } => Saved {
            extra_elems: 2 * s.inputs[0],
            ..none
        },
        // `mul_scalar` keeps nothing.
        _ => none,
    }
}

/// The moments of an activation's backward.
pub(super) fn backward(b: &Burn, op: &Op, s: &Sizes, dx: u64, act: u64) -> Vec<BackwardMoment> {
    let out = s.output;
    let input = s.inputs.first().copied().unwrap_or(0);
    let elems = match op {
        // `relu_backward` and the clamp masks' `mask_fill`, `mul_scalar`: written into the
        // incoming gradient.
        Op::Relu | Op::Clamp { .. } | Op::HardSigmoid { .. } | Op::Scale { .. } => out,
        // The product's two gradients, then the hard sigmoid's in place.
        Op::HardSwish => out + 2 * input,
        // `sigmoid`, `float_tanh`, `gelu` recompute the activation from the kept input.
        Op::Tanh | Op::Sigmoid | Op::Exp | Op::Gelu => out + input,
        // The own softmax: dy and dx. burn's: exp recomputed, then the quotient rule's
        // two products.
        Op::Softmax { .. } if own_softmax(b, op, s) => out + dx,
        _ => out + 2 * input,
    };
    super::one(op, elems, act)
}
