//! burn's tensor plumbing as the engine composes it: views, concatenation,
//! sums and products of activations, slices (the engine's own on the CPU,
//! engine `cpu/view.rs`), reductions, learned addends and dropout.

use super::Burn;
use crate::rules::{BackwardMoment, Saved, Sizes};
use batchfit_graph::{Op, ReduceKind};

/// What the op keeps for its backward.
pub(super) fn saved(op: &Op, s: &Sizes) -> Saved {
    let none = Saved::default();
    match op {
        // `max_dim` keeps the argmax indices (flex: i32); `sum_dim`/`mean_dim` only shapes.
        Op::Reduce {
            reduce: ReduceKind::Max,
            ..
        } => Saved {
            extra_bytes: 4 * s.output,
            ..none
        },
        // The engine's composed norm: `powi_scalar` keeps x, `sqrt` the sum.
        Op::Reduce {
            reduce: ReduceKind::L2,
            ..
        } => Saved {
            inputs: true,
            extra_elems: s.output,
            ..none
        },
        // `float_mul` keeps each factor when the other one is tracked (a learned factor is
        // a parameter, kept anyway).
        // burn-autodiff's `interpolate` keeps its input for `interpolate_backward`.
        // `float_div` keeps both operands (each one's gradient reads the other, the
        // divisor's also the dividend).
        Op::Mul
        | Op::Div
        | Op::MulParam { .. }
        | Op::Resize { .. }
        // burn's `conv_transpose` backward reads x (for the weight) and the weight.
        | Op::ConvTranspose { .. } => Saved {
            inputs: true,
            ..none
        },
        // The engine's dropout is `x * mask` with an untracked f32 mask: `float_mul` keeps
        // only the mask (at the activation's precision). Dropout of probability 0 returns
        // its input (engine `dropout`).
        Op::Dropout { p } if *p <= 0.0 => none,
        Op::Dropout { .. } => Saved {
            extra_elems: s.output,
            ..none
        },
        // Stochastic depth is `x * mask` with one mask value per sample (kept by `float_mul`).
        Op::DropPath { .. } => Saved {
            extra_elems: 1,
            ..none
        },
        // `slice` keeps only shapes; views, `cat` and `add` nothing; `permute` keeps the
        // axes, the reshape that copies it back to `[B, elements]` its shape; the learned
        // addend's and the causal mask's `add` keep nothing (the mask is an untracked
        // constant); the product with an untracked constant keeps only the constant.
        _ => none,
    }
}

/// The moments of the op's backward.
pub(super) fn backward(b: &Burn, op: &Op, s: &Sizes, dx: u64, act: u64) -> Vec<BackwardMoment> {
    let out = s.output;
    let elems = match op {
        // The dropout `mul`, views, `cat`'s slices and `add`: written into the incoming
        // gradient; `cat` backward slices dy, the expanded parameter's gradient sums its
        // slice over the batch; the learned addend's gradient is dy summed over the axes
        // it broadcasts on.
        Op::Dropout { .. }
        | Op::DropPath { .. }
        | Op::Flatten
        | Op::Reshape { .. }
        | Op::Concat { .. }
        | Op::Add
        | Op::CausalMask
        | Op::AddConst { .. }
        | Op::ConcatParam { .. }
        | Op::BroadcastParam { .. }
        | Op::Parameter { .. }
        | Op::Constant { .. }
        | Op::AddParam { .. }
        | Op::AddTable { .. } => out,
        // The inverse `permute` of dy is a view; the reshape back copies it into dx.
        Op::Transpose { .. } => out + dx,
        // The repeated values copied into `[B, elements]`; `expand`'s backward sums dy
        // over the repeated axes into dx.
        Op::Expand { .. } => out + dx,
        // `select` backward: `select_assign` of dy into zeros of x's shape.
        Op::Take { .. } => out + dx,
        // On the CPU the engine's own slice writes dx once, zeros around dy. Elsewhere
        // `slice` backward: `float_zeros` of x's shape (an `empty`, two copies for a moment)
        // and a `slice_assign` of dy.
        Op::Slice { .. } if !b.gpu => out + dx,
        Op::Slice { .. } => out + 2 * dx,
        // `sum_dim`/`mean_dim` backward expand dy to x's shape; `max_dim` scatters into zeros.
        Op::Reduce {
            reduce: ReduceKind::Max,
            ..
        } => out + 2 * dx,
        // The norm's chain: the root's gradient, expanded, times 2x (two of x's size).
        Op::Reduce {
            reduce: ReduceKind::L2,
            ..
        } => out + 2 * dx,
        Op::Reduce { .. } => out + dx,
        Op::Mul => out + s.inputs.iter().sum::<u64>(),
        // Both quotient-rule terms, each of the output's size, then reduced to the
        // operands' shapes.
        Op::Div => 3 * out + s.inputs.iter().sum::<u64>(),
        // dx = dy * p, and dp = dy * x summed over the axes p broadcasts on.
        Op::MulParam { .. } => 2 * out,
        // dx = dy * c.
        Op::MulConst { .. } => out + dx,
        // `interpolate_backward` writes dx of the input's size; `cat`'s backward slices dy
        // into the padded input's gradient.
        Op::Resize { .. } | Op::Pad { .. } => out + dx,
        _ => unreachable!("the dispatcher sends only tensor plumbing here"),
    };
    super::one(op, elems, act)
}
