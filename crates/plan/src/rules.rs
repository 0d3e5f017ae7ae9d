//! Per-op rules: what the backward pass keeps and what the forward pass costs.
//!
//! This file is the one place that knows, for each op, which tensors autograd
//! saves for the backward pass and how many FLOPs the forward pass takes. The
//! rules follow PyTorch's `tools/autograd/derivatives.yaml` (which tensors each
//! derivative formula reads) and burn-autodiff's backward ops, which save the
//! same tensors for the ops batchfit uses; a differing rule is marked per runtime.

use crate::options::Runtime;
use batchfit_graph::{Cell, LossKind, Op, PoolKind};

/// What one op keeps alive from its forward pass until its backward pass.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Saved {
    /// All inputs are kept (e.g. `Linear` reads `x` to form `dW = dY^T x`).
    pub inputs: bool,
    /// The output is kept (e.g. `ReLU`, `Tanh` and `Sigmoid` differentiate through `y`).
    pub output: bool,
    /// Further per-sample elements at activation precision (LSTM gates, ...).
    pub extra_elems: u64,
    /// Further per-sample bytes at a fixed width (indices, masks).
    pub extra_bytes: u64,
}

/// Element counts of one sample's inputs and output of a node.
#[derive(Clone, Debug)]
pub struct Sizes<'a> {
    pub inputs: &'a [u64],
    pub output: u64,
    /// Resolved output dimensions of one sample.
    pub out_dims: &'a [usize],
    /// Resolved dimensions of one sample of the first input.
    pub in_dims: &'a [usize],
}

/// The tensors `op` saves for backward. Sources per arm.
pub fn saved(op: &Op, s: &Sizes, runtime: Runtime) -> Saved {
    let none = Saved::default();
    let inputs = Saved {
        inputs: true,
        ..none
    };
    let output = Saved {
        output: true,
        ..none
    };
    match op {
        // derivatives.yaml `addmm`/`mm`/`convolution`: dW needs x; dx needs W (a parameter).
        Op::Linear { .. } | Op::Conv { .. } => inputs,
        // `bmm`: each operand's gradient reads the other.
        Op::MatMul => inputs,
        // `native_batch_norm`/`native_layer_norm`: x plus per-channel or per-row mean and
        // rstd (per-row stats scale with the sample: two floats per normalised row).
        Op::BatchNorm { .. } => inputs,
        Op::LayerNorm { features } => Saved {
            inputs: true,
            extra_elems: 2 * (s.inputs[0] / *features as u64),
            ..none
        },
        // `relu`, `tanh`, `sigmoid`, `softmax` differentiate through their result.
        Op::Relu | Op::Tanh | Op::Sigmoid | Op::Softmax { .. } => output,
        // `clamp`/`hardtanh` and `gelu` read their input.
        Op::ClippedRelu { .. } | Op::Gelu => inputs,
        // `max_pool2d_with_indices`: input and int64 argmax indices.
        Op::Pool {
            pool: PoolKind::Max,
            ..
        } => Saved {
            inputs: true,
            extra_bytes: 8 * s.output,
            ..none
        },
        // `avg_pool2d`, `adaptive_*_pool2d`: the backward reads the input.
        Op::Pool { .. } | Op::GlobalPool { .. } => inputs,
        // Views and concatenation need only sizes; `add` none.
        Op::Flatten | Op::Reshape { .. } | Op::Concat { .. } | Op::Add => none,
        // `mul`: each factor's gradient reads the other.
        Op::Mul => inputs,
        // `native_dropout`: a one-byte bool mask in PyTorch; burn keeps the mask as a
        // float tensor of the activation's precision.
        Op::Dropout { .. } => match runtime {
            Runtime::Pytorch => Saved {
                extra_bytes: s.output,
                ..none
            },
            Runtime::Burn => Saved {
                extra_elems: s.output,
                ..none
            },
        },
        // `embedding`: the int64 indices.
        Op::Embedding { .. } => Saved {
            extra_bytes: 8 * s.inputs[0],
            ..none
        },
        // An unfused recurrent layer keeps, per step and direction, the gate
        // activations and the states its backward reads: LSTM i, f, g, o, c_t,
        // tanh(c_t), h_t (7H); GRU r, z, n, h_t, W_hn h + b_hn, h_{t-1} (6H);
        // plus the input sequence for dW_ih.
        Op::Rnn {
            cell,
            hidden,
            bidirectional,
            ..
        } => {
            let per_step = match cell {
                Cell::Lstm => 7,
                Cell::Gru => 6,
            } * *hidden as u64;
            let steps = s.in_dims.first().copied().unwrap_or(1) as u64;
            let dirs = if *bidirectional { 2 } else { 1 };
            Saved {
                inputs: true,
                extra_elems: steps * dirs * per_step,
                ..none
            }
        }
    }
}

/// Saved per-sample elements of the loss: MSE keeps the difference; cross-entropy
/// the log-softmax; CTC the log-probabilities and the forward variables alpha
/// (T x (2L + 1) with the label length L taken as T/2, the worst case CTC allows).
pub fn loss_saved_elems(kind: LossKind, logits: u64, steps: u64) -> u64 {
    match kind {
        LossKind::Mse | LossKind::CrossEntropy | LossKind::CrossEntropyPerFrame => logits,
        LossKind::Ctc { .. } => logits + steps * (steps + 1),
    }
}

/// Forward FLOPs of one sample (multiply-add = 2). Backward costs about twice this.
pub fn forward_flops(op: &Op, s: &Sizes) -> f64 {
    let out = s.output as f64;
    let inp = s.inputs.first().copied().unwrap_or(0) as f64;
    match op {
        Op::Linear {
            in_features,
            out_features,
            bias,
        } => {
            let rows = out / *out_features as f64;
            rows * (*out_features as f64) * (2.0 * *in_features as f64 + f64::from(u8::from(*bias)))
        }
        Op::MatMul => {
            // [.., M, K] x [.., K, N]: 2K per output element.
            let k = s.in_dims.last().copied().unwrap_or(1) as f64;
            2.0 * k * out
        }
        Op::Conv {
            in_channels,
            window,
            groups,
            bias,
            ..
        } => {
            let per_out = 2.0 * (*in_channels / *groups) as f64 * window.kernel_elements() as f64;
            out * (per_out + f64::from(u8::from(*bias)))
        }
        // Mean, variance, normalise, scale and shift.
        Op::BatchNorm { .. } | Op::LayerNorm { .. } => 8.0 * inp,
        Op::Relu | Op::ClippedRelu { .. } | Op::Dropout { .. } => out,
        Op::Tanh | Op::Sigmoid => 4.0 * out,
        Op::Gelu => 8.0 * out,
        Op::Softmax { .. } => 5.0 * out,
        Op::Pool { window, .. } => out * window.kernel_elements() as f64,
        Op::GlobalPool { .. } => inp,
        Op::Add | Op::Mul => out,
        Op::Flatten | Op::Reshape { .. } | Op::Concat { .. } | Op::Embedding { .. } => 0.0,
        Op::Rnn {
            cell,
            input_size,
            hidden,
            bidirectional,
            ..
        } => {
            let g = cell.gates() as f64;
            let h = *hidden as f64;
            let steps = s.in_dims.first().copied().unwrap_or(1) as f64;
            let dirs = if *bidirectional { 2.0 } else { 1.0 };
            // Gate matmuls plus about ten element-wise ops per hidden unit.
            steps * dirs * (2.0 * g * h * (*input_size as f64 + h) + 10.0 * h)
        }
    }
}

/// Per-sample workspace of the op's kernel: the im2col column buffer of a
/// convolution (burn's CPU convolution and PyTorch's fallback path build it;
/// cuDNN picks an algorithm whose workspace is at most of this order).
pub fn workspace_elems(op: &Op, s: &Sizes) -> u64 {
    match op {
        Op::Conv {
            in_channels,
            out_channels,
            window,
            groups,
            ..
        } => {
            let out_spatial = s.output / *out_channels as u64;
            (*in_channels / *groups) as u64 * window.kernel_elements() as u64 * out_spatial
        }
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use batchfit_graph::Window;

    fn sizes<'a>(
        inputs: &'a [u64],
        output: u64,
        in_dims: &'a [usize],
        out_dims: &'a [usize],
    ) -> Sizes<'a> {
        Sizes {
            inputs,
            output,
            in_dims,
            out_dims,
        }
    }

    #[test]
    fn linear_saves_its_input_and_costs_2_in_out() {
        let op = Op::Linear {
            in_features: 234,
            out_features: 26,
            bias: true,
        };
        let s = sizes(&[234], 26, &[234], &[26]);
        let saved = saved(&op, &s, Runtime::Pytorch);
        assert!(saved.inputs && !saved.output);
        assert_eq!(forward_flops(&op, &s), 26.0 * (2.0 * 234.0 + 1.0));
    }

    #[test]
    fn conv_flops_and_im2col_workspace() {
        // 3x3 conv 26 -> 26 on 9x9 'same': 81 outputs per channel.
        let op = Op::Conv {
            in_channels: 26,
            out_channels: 26,
            window: Window::square(2, 3, 1, 1),
            groups: 1,
            bias: true,
        };
        let s = sizes(&[2106], 2106, &[26, 9, 9], &[26, 9, 9]);
        assert_eq!(forward_flops(&op, &s), 2106.0 * (2.0 * 26.0 * 9.0 + 1.0));
        assert_eq!(workspace_elems(&op, &s), 26 * 9 * 81);
        assert!(saved(&op, &s, Runtime::Burn).inputs);
    }

    #[test]
    fn max_pool_keeps_int64_indices() {
        let op = Op::Pool {
            pool: PoolKind::Max,
            window: Window::square(2, 2, 2, 0),
        };
        let s = sizes(&[100], 25, &[1, 10, 10], &[1, 5, 5]);
        assert_eq!(saved(&op, &s, Runtime::Pytorch).extra_bytes, 200);
    }
}
