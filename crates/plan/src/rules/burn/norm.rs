//! burn's normalisation as the engine runs it: its fused batch and layer norms
//! on the CPU (engine `cpu/norm.rs`), composed of burn ops elsewhere, and the
//! composed local response normalisation (engine `model/norm.rs`).

use super::Burn;
use crate::rules::{BackwardMoment, Saved, Sizes};
use batchfit_graph::Op;

/// What a normalisation keeps for its backward.
pub(super) fn saved(b: &Burn, op: &Op, s: &Sizes) -> Saved {
    let none = Saved::default();
    let inputs = Saved {
        inputs: true,
        ..none
    };
    match op {
        // The engine's composed LRN: `x * x` keeps x; the zero padding, `cat`, the window
        // slices and their sum keep shapes; `powf_scalar` keeps its input (the scaled sum)
        // and the final `div` keeps x and the power.
        Op::Lrn { .. } => Saved {
            inputs: true,
            extra_elems: 2 * s.output,
            ..none
        },
        // On the CPU the engine's fused BatchNorm keeps x and two numbers per channel, as
        // PyTorch's `native_batch_norm`; its fused LayerNorm x and two numbers per row, as
        // `native_layer_norm`.
        Op::BatchNorm { .. } if !b.gpu => inputs,
        Op::LayerNorm { features } if !b.gpu => Saved {
            extra_elems: 2 * (s.inputs[0] / *features as u64),
            ..inputs
        },
        // Elsewhere the engine's norms are composed: `x - mean` and the normalised `y` are
        // each kept once (by `powi_scalar(2)` = mul, by `div`, by the scale's mul);
        // LayerNorm adds per-row statistics.
        Op::BatchNorm { .. } => Saved {
            extra_elems: 2 * s.inputs[0],
            ..none
        },
        Op::LayerNorm { features } => Saved {
            extra_elems: 2 * s.inputs[0] + 2 * (s.inputs[0] / *features as u64),
            ..none
        },
        // Composed everywhere (engine `model/norm.rs`): the square keeps x, the division
        // x and the root per row, the scale's product the quotient.
        Op::RmsNorm { features } => Saved {
            inputs: true,
            extra_elems: s.output + s.inputs[0] / *features as u64,
            ..none
        },
        // The layer norm over each channel's positions (fused on the CPU: x and two numbers
        // per row; composed elsewhere: the centred input and the quotient), then the affine
        // product, which keeps the normalised values.
        Op::InstanceNorm { channels, affine } => {
            let rows = 2 * *channels as u64;
            let norm = match b.gpu {
                false => Saved {
                    extra_elems: rows,
                    ..inputs
                },
                true => Saved {
                    extra_elems: 2 * s.inputs[0],
                    ..none
                },
            };
            Saved {
                extra_elems: norm.extra_elems + if *affine { s.output } else { 0 },
                ..norm
            }
        }
        _ => unreachable!("the dispatcher sends only normalisations here"),
    }
}

/// Per-sample bytes the forward allocates besides its output and what it keeps: the
/// fused norms write their output (and what they keep) and nothing else; the composed
/// ones the centred input squared before its mean.
pub(super) fn forward_temporaries(b: &Burn, op: &Op, s: &Sizes, act: u64) -> u64 {
    match op {
        Op::BatchNorm { .. } | Op::LayerNorm { .. } if !b.gpu => 0,
        Op::BatchNorm { .. } | Op::LayerNorm { .. } => s.inputs.first().copied().unwrap_or(0) * act,
        // The normalised values before the affine product (on the CPU); the composed
        // norm's squares elsewhere.
        Op::InstanceNorm { affine, .. } if !b.gpu => u64::from(*affine) * s.output * act,
        Op::InstanceNorm { .. } => s.inputs.first().copied().unwrap_or(0) * act,
        // The squares before their mean, and the quotient before the scale.
        Op::RmsNorm { .. } => s.inputs.first().copied().unwrap_or(0) * act,
        _ => 0,
    }
}

/// The moments of a normalisation's backward.
pub(super) fn backward(b: &Burn, op: &Op, s: &Sizes, dx: u64, act: u64) -> Vec<BackwardMoment> {
    let out = s.output;
    let input = s.inputs.first().copied().unwrap_or(0);
    let elems = match op {
        // The quotient rule's products, the power's gradient, then each window slice's
        // zeroed padded-size gradient: about three input-sized tensors at a time.
        Op::Lrn { .. } => out + 3 * input,
        // The fused norms' backward: dy and dx (and the layer norm's per-job partial
        // parameter gradients, a few rows of `features`: not counted).
        _ if !b.gpu && !matches!(op, Op::RmsNorm { .. }) => out + dx,
        // The composed norm's backward: dy * gamma, the quotient rule's product and the
        // statistics' reductions, one input-sized temporary at a time.
        _ => out + dx + input,
    };
    super::one(op, elems, act)
}
