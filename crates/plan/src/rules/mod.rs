//! Per-op rules: what the backward pass keeps and what the forward pass costs.
//!
//! This module is the one place that knows, for each op, which tensors autograd
//! saves for the backward pass, what its kernels allocate on the way, and how
//! many FLOPs the forward pass takes. What every runtime shares (FLOPs, sizes,
//! the loss's own tensors) is here; what differs is the [`RuntimeRules`] trait,
//! with one implementation per runtime:
//!
//! - [`pytorch`]: the rules follow PyTorch's `tools/autograd/derivatives.yaml`
//!   (which tensors each derivative formula reads) and its caching allocator.
//! - [`burn`]: the rules follow burn 0.22.1 as batchfit's engine drives it:
//!   burn-autodiff's backward ops (what `prep.checkpoint` keeps), the flex CPU
//!   backend's kernels (what they allocate), the engine's own CPU ops
//!   (`crates/engine/src/cpu/`) and its composition of the rest
//!   (`crates/engine/src/model/`).
//!
//! burn's rules are one file per op family, as the engine's CPU backend is: "the
//! burn rule for Conv" is in `rules/burn/conv.rs`. PyTorch's file has one `match`
//! per question with one arm per op. Where a device changes a rule, the arm says so.

pub mod burn;
pub mod pytorch;

use crate::host::{CpuHost, GemmCall};
use crate::options::{Optimizer, Runtime};
use crate::units::Bytes;
use batchfit_graph::{Graph, LossKind, Op, ReduceKind, ResizeMode};

pub use burn::{
    Burn, BurnCpu, CONV_CHUNK_ROWS, CONV_MAX_SAMPLE_COLS_BYTES, CONV_PER_SAMPLE_MIN_POSITIONS,
    ConvCpuPath, IM2COL_MAX_CHUNKS, POOL_MATRIX_MAX, burn_im2col, conv_cpu_path,
    conv_samples_per_chunk, im2col_chunks,
};
pub use pytorch::Pytorch;

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
    /// Elements of one sample of each input.
    pub inputs: &'a [u64],
    /// Elements of one sample of the output.
    pub output: u64,
    /// Resolved output dimensions of one sample.
    pub out_dims: &'a [usize],
    /// Resolved dimensions of one sample of the first input.
    pub in_dims: &'a [usize],
    /// Whether the first input needs a gradient (batch inputs do not); burn's rules read it.
    pub input_tracked: bool,
}

/// One moment of a node's backward pass: what is alive then besides what the forward kept.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackwardMoment {
    /// Per-sample bytes live besides the tensors kept for backward: the output's gradient,
    /// the input gradients made so far, kernel temporaries.
    pub bytes: u64,
    /// Whether the node's own extra kept tensors (`Saved::extra_*`) are already freed.
    pub extras_freed: bool,
    /// Elements of the node's parameter gradients alive then, finished or being made.
    pub param_elems: u64,
    /// Bytes of per-thread kernel buffers (independent of the batch).
    pub fixed_workspace: u64,
    /// The matrix product running then, whose packing buffers gemm allocates per call.
    pub gemm_call: Option<GemmCall>,
}

/// What differs between runtimes: which tensors autograd keeps, what kernels and the
/// allocator add, how gradients live. [`crate::plan::plan_on`] asks these questions of
/// every node and of the step; the answers for one runtime are in its own file.
pub trait RuntimeRules {
    /// The tensors `op` saves for backward.
    fn saved(&self, op: &Op, s: &Sizes) -> Saved;

    /// Whether the tensors the first layers keep of the batch are the batch's own buffers,
    /// so that they are counted once, as data (else also as activations).
    fn keeps_batch_as_data(&self) -> bool;

    /// Elements a weight standardised every step (`Op::Conv`'s `standardize`) keeps for
    /// the backward: `weight` elements in `channels` output channels.
    fn standardized_weight_kept(&self, weight: u64, channels: u64) -> u64;

    /// Whether a view (flatten, reshape) is counted as its input's buffer when kept.
    fn views_share_buffers(&self) -> bool;

    /// Whether a slice or a transpose is, like a view, its input's buffer (a layer keeping
    /// one then keeps the whole input).
    fn strided_views_share_buffers(&self) -> bool {
        false
    }

    /// Whether `op`'s output stays in its matrix product's layout through the
    /// element-wise ops after it, so that any other op reads a copy in the graph's
    /// order made for it (burn's engine: a convolution of a batch input).
    fn output_in_product_layout(&self, _op: &Op, _s: &Sizes) -> bool {
        false
    }

    /// Per-sample bytes live during `op`'s forward pass besides what earlier nodes keep.
    /// `loose`: bytes of its inputs that no earlier node keeps; `extra`: the bytes it keeps
    /// besides its inputs and output.
    fn forward_live(&self, op: &Op, s: &Sizes, act: u64, loose: u64, extra: u64) -> u64;

    /// Bytes of `op`'s kernel buffers during its forward pass that do not grow with the batch.
    fn forward_workspace(&self, op: &Op, s: &Sizes, act: u64) -> u64;

    /// The matrix product of `op`'s forward pass whose packing buffers gemm allocates per
    /// call (burn on a CPU: the engine's dense layers).
    fn forward_gemm_call(&self, _op: &Op, _s: &Sizes) -> Option<GemmCall> {
        None
    }

    /// The moments of `op`'s backward pass that can set the step's peak. `tracked[j]`:
    /// whether input `j` needs a gradient (batch inputs do not).
    fn backward(&self, op: &Op, s: &Sizes, tracked: &[bool], act: u64) -> Vec<BackwardMoment>;

    /// Per-sample bytes of `op`'s kernel workspace, reported as `per_sample.workspace`.
    fn workspace(&self, op: &Op, s: &Sizes, act: u64) -> u64;

    /// Per-sample elements the loss's backward holds besides the tensors the loss keeps.
    fn loss_backward_elems(&self, kind: LossKind, logits: u64) -> u64;

    /// Per-sample bytes the loss keeps from its forward to its backward, over `steps` frames.
    fn loss_saved_bytes(&self, kind: LossKind, logits: u64, steps: u64) -> u64 {
        loss_saved_elems(kind, logits, steps) * 4
    }

    /// Whether `x * sigmoid(x)` runs as one SiLU keeping only x, and an attention without
    /// dropout as one kernel (see `plan::fused_parts`).
    fn fuses_silu_and_attention(&self) -> bool {
        false
    }

    /// Bytes of one token id of a batch input (float inputs are fp32).
    fn token_bytes(&self) -> u64 {
        4
    }

    /// Bytes of one sample's target, given the logits' elements and the sequence length.
    fn target_bytes(&self, kind: LossKind, logits: u64, seq: usize) -> u64;

    /// Whether every parameter gradient is held for the whole step (each moment's fixed
    /// memory is then the optimizer's), rather than made and freed during backward.
    fn gradients_held_all_step(&self) -> bool;

    /// Whether the runtime holds the constants the graph's ops carry ([`Op::constant_bytes`])
    /// all step: batchfit's engine keeps them as imported; PyTorch computes most of them
    /// (masks, rotary tables, relative positions) in its forward pass.
    fn holds_op_constants(&self) -> bool;

    /// The optimizer's temporaries during its update: `largest_param` elements in the
    /// largest parameter tensor, `params` in all of them.
    fn optimizer_transient(&self, largest_param: u64, params: u64, optimizer: Optimizer) -> Bytes;

    /// The gradient accumulation buffer for `params` parameters.
    fn accumulation(&self, micro_batch: Option<u64>, params: u64) -> Bytes;

    /// The runtime's own fixed share: device context, allocator segments, CPU buffers.
    fn runtime_bytes(&self) -> Bytes;

    /// Bytes added at every batch for the allocator's rounding, for a graph of `nodes` nodes.
    fn rounding_bytes(&self, nodes: usize) -> Bytes;

    /// Index of the moment reported as the step's peak among `(per_sample, fixed)` lines:
    /// the most per sample, then the most fixed; the last of equals.
    fn peak_index(&self, lines: &[(u64, Bytes)]) -> usize {
        (0..lines.len())
            .max_by_key(|&i| lines[i])
            .expect("a step has an optimizer moment")
    }
}

/// The rules of `runtime`, on a GPU or on the CPU `host` (burn's CPU kernels read it).
pub fn for_runtime(runtime: Runtime, host: CpuHost, gpu: bool) -> Box<dyn RuntimeRules> {
    match runtime {
        Runtime::Burn => Box::new(Burn {
            cpu: BurnCpu {
                threads: host.threads.max(1),
                gemm_slab: host.gemm_slabs().0,
                l2_ways: host.l2_ways,
                gemm_kernel: host.gemm_kernel,
            },
            gpu,
        }),
        Runtime::Pytorch => Box::new(Pytorch { gpu }),
    }
}

/// A recurrent layer's input `[sequences.., T, features]`: the sequences of one sample
/// (1 for `[T, features]`; more where the layer runs over a batch merged with another
/// axis, Sequencer's rows) and the steps of each.
pub(crate) fn rnn_sequences_steps(s: &Sizes) -> (u64, u64) {
    let d = s.in_dims;
    let lead = d.len().saturating_sub(2);
    let steps = d.get(lead).copied().unwrap_or(1).max(1) as u64;
    let sequences = d[..lead].iter().product::<usize>().max(1) as u64;
    (sequences, steps)
}

/// Steps of one sample (every sequence's) times directions of a recurrent layer.
pub(crate) fn rnn_steps_dirs(op: &Op, s: &Sizes) -> u64 {
    let (sequences, steps) = rnn_sequences_steps(s);
    let steps = sequences * steps;
    match op {
        Op::Rnn {
            bidirectional: true,
            ..
        } => 2 * steps,
        _ => steps,
    }
}

/// The positions a per-frame loss reads (CTC's frames, a segmentation's pixels):
/// every axis of the loss's input but the classes, as the engine reads them,
/// whether a symbolic `T`, a fixed length or an image made them.
pub fn loss_frames(graph: &Graph, seq: usize) -> usize {
    let dims = graph.output().shape.resolve(seq);
    dims.iter().rev().skip(1).product::<usize>().max(1)
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
        // Every input element meets `out_channels / groups` kernels.
        Op::ConvTranspose {
            out_channels,
            window,
            groups,
            bias,
            ..
        } => {
            let per_in = 2.0 * (*out_channels / *groups) as f64 * window.kernel_elements() as f64;
            inp * per_in + out * f64::from(u8::from(*bias))
        }
        // Mean, variance, normalise, scale and shift.
        Op::BatchNorm { .. } | Op::LayerNorm { .. } | Op::InstanceNorm { .. } => 8.0 * inp,
        // Square, mean, divide and scale.
        Op::RmsNorm { .. } => 4.0 * inp,
        Op::Relu | Op::Clamp { .. } | Op::Dropout { .. } | Op::DropPath { .. } => out,
        // A comparison, the scaled copy and the select.
        Op::LeakyRelu { .. } | Op::PRelu { .. } => 3.0 * out,
        Op::Tanh | Op::Sigmoid | Op::Exp => 4.0 * out,
        Op::Gelu => 8.0 * out,
        // Scale and shift, two comparisons (and the product for the swish).
        Op::HardSigmoid { .. } => 4.0 * out,
        Op::HardSwish => 5.0 * out,
        Op::Scale { .. } => out,
        // Square, the window's sum, scale, power and divide.
        Op::Lrn { size, .. } => (*size as f64 + 6.0) * out,
        Op::Slice { .. } => 0.0,
        // Square, sum and the root.
        Op::Reduce {
            reduce: ReduceKind::L2,
            ..
        } => 2.0 * inp + out,
        Op::Reduce { .. } => inp,
        Op::Softmax { .. } => 5.0 * out,
        Op::Pool { window, .. } => out * window.kernel_elements() as f64,
        Op::GlobalPool { .. } => inp,
        // Per output element: the taps read and weighted (1, 2^d or 4^d of them).
        Op::Resize { mode, size, .. } => {
            let taps = match mode {
                ResizeMode::Nearest => 1.0,
                ResizeMode::Linear => 2f64.powi(size.len() as i32),
                ResizeMode::Cubic => 4f64.powi(size.len() as i32),
            };
            2.0 * taps * out
        }
        Op::Add
        | Op::Mul
        | Op::Div
        | Op::AddParam { .. }
        | Op::MulParam { .. }
        | Op::AddTable { .. }
        | Op::CausalMask
        | Op::AddConst { .. }
        | Op::MulConst { .. } => out,
        Op::Transpose { .. }
        | Op::ConcatParam { .. }
        | Op::BroadcastParam { .. }
        | Op::Parameter { .. }
        | Op::Constant { .. }
        | Op::Take { .. }
        | Op::Pad { .. }
        | Op::Expand { .. } => 0.0,
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
            let (sequences, steps) = rnn_sequences_steps(s);
            let steps = (sequences * steps) as f64;
            let dirs = if *bidirectional { 2.0 } else { 1.0 };
            // Gate matmuls plus about ten element-wise ops per hidden unit.
            steps * dirs * (2.0 * g * h * (*input_size as f64 + h) + 10.0 * h)
        }
    }
}

/// Per-sample elements of the im2col column buffer `[k·C/groups, OH·OW]` of a
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
        // The transposed product's columns `[k·C_out/groups, in positions]`, before col2im.
        Op::ConvTranspose {
            in_channels,
            out_channels,
            window,
            groups,
            ..
        } => {
            let in_spatial = s.inputs.first().copied().unwrap_or(0) / *in_channels as u64;
            (*out_channels / *groups) as u64 * window.kernel_elements() as u64 * in_spatial
        }
        _ => 0,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use batchfit_graph::Window;

    /// Sizes of a node whose first input needs a gradient.
    pub(crate) fn sizes<'a>(
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
            input_tracked: true,
        }
    }

    #[test]
    fn linear_costs_2_in_out() {
        let op = Op::Linear {
            in_features: 234,
            out_features: 26,
            bias: true,
        };
        let s = sizes(&[234], 26, &[234], &[26]);
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
            standardize: None,
        };
        let s = sizes(&[2106], 2106, &[26, 9, 9], &[26, 9, 9]);
        assert_eq!(forward_flops(&op, &s), 2106.0 * (2.0 * 26.0 * 9.0 + 1.0));
        assert_eq!(workspace_elems(&op, &s), 26 * 9 * 81);
    }
}
