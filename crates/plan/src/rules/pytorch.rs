//! PyTorch's rules: which tensors each derivative formula of
//! `tools/autograd/derivatives.yaml` reads, and what the caching allocator and the CUDA
//! context add. Every parameter's `.grad` is held for the whole step, so the step's
//! moments share one fixed memory and differ only per sample.

use super::{BackwardMoment, RuntimeRules, Saved, Sizes, rnn_steps_dirs, workspace_elems};
use crate::options::Optimizer;
use crate::units::Bytes;
use batchfit_graph::{Cell, LossKind, Op, PoolKind, ReduceKind};

/// PyTorch's CUDA context (driver, cuBLAS and cuDNN handles) as seen in
/// `nvidia-smi` before any tensor: 300-800 MiB depending on versions; 500 MiB taken.
pub const PYTORCH_CUDA_CONTEXT: Bytes = Bytes(500 * Bytes::MIB);
/// PyTorch's caching allocator serves tensors of at most 1 MiB from 2 MiB segments.
pub const PYTORCH_SMALL_SEGMENT: Bytes = Bytes(2 * Bytes::MIB);
/// PyTorch rounds every allocation up to a multiple of 512 bytes.
pub const PYTORCH_BLOCK: u64 = 512;

/// PyTorch's rules, on a GPU or a CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pytorch {
    /// Whether the step runs on a GPU (adds the CUDA context).
    pub gpu: bool,
}

impl RuntimeRules for Pytorch {
    /// The tensors `op` saves for backward (`derivatives.yaml`). Sources per arm.
    fn saved(&self, op: &Op, s: &Sizes) -> Saved {
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
            // `clamp`/`hardtanh`, `gelu`, `hardsigmoid_backward` and `hardswish_backward` read
            // their input.
            Op::ClippedRelu { .. } | Op::Gelu | Op::HardSigmoid { .. } | Op::HardSwish => inputs,
            // `mul` by a Python scalar, `slice`/`select`, `sum` and `mean` need only sizes.
            Op::Scale { .. } | Op::Slice { .. } => none,
            // `amax` reads its input and its result (`grad * (self == result)`).
            Op::Reduce {
                reduce: ReduceKind::Max,
                ..
            } => Saved {
                inputs: true,
                output: true,
                ..none
            },
            Op::Reduce { .. } => none,
            // `F.local_response_norm` is composed: `x * x` keeps x, `avg_pool2d` keeps the padded
            // squares, `pow` its input and `x / div` the divisor (three tensors of x's size).
            Op::Lrn { .. } => Saved {
                inputs: true,
                extra_elems: 3 * s.output,
                ..none
            },
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
            // Views (`transpose`/`permute` too) and concatenation need only sizes; `add` none,
            // whether of a learned tensor or of a causal mask.
            Op::Flatten
            | Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::Concat { .. }
            | Op::Add
            | Op::AddParam { .. }
            | Op::ConcatParam { .. }
            | Op::CausalMask => none,
            // `mul`: each factor's gradient reads the other.
            Op::Mul => inputs,
            // `native_dropout`: a one-byte bool mask.
            // `at::native::dropout` returns its input when p is 0.
            Op::Dropout { p } if *p <= 0.0 => none,
            Op::Dropout { .. } => Saved {
                extra_bytes: s.output,
                ..none
            },
            // torchvision's `StochasticDepth`: `input * noise`, noise one value per sample.
            Op::DropPath { .. } => Saved {
                extra_elems: 1,
                ..none
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
            Op::Rnn { cell, hidden, .. } => {
                let per_step = match cell {
                    Cell::Lstm => 7,
                    Cell::Gru => 6,
                } * *hidden as u64;
                Saved {
                    inputs: true,
                    extra_elems: rnn_steps_dirs(op, s) * per_step,
                    ..none
                }
            }
        }
    }

    /// The batch is a tensor of its own; a layer keeping it keeps a reference counted as an
    /// activation too.
    fn keeps_batch_as_data(&self) -> bool {
        false
    }

    /// Each kept name is counted as its own tensor.
    fn views_share_buffers(&self) -> bool {
        false
    }

    /// The node's inputs, its output and its kernel's workspace.
    fn forward_live(&self, op: &Op, s: &Sizes, act: u64, _loose: u64, _extra: u64) -> u64 {
        (s.output + s.inputs.iter().sum::<u64>()) * act + self.workspace(op, s, act)
    }

    /// cuDNN and the CPU kernels' workspaces are counted per sample ([`workspace_elems`]).
    fn forward_workspace(&self, _op: &Op, _s: &Sizes, _act: u64) -> u64 {
        0
    }

    /// One moment: the output's gradient, every input's gradient and the workspace.
    fn backward(&self, op: &Op, s: &Sizes, _tracked: &[bool], act: u64) -> Vec<BackwardMoment> {
        vec![BackwardMoment {
            bytes: (s.output + s.inputs.iter().sum::<u64>()) * act + self.workspace(op, s, act),
            param_elems: op.param_count(),
            ..BackwardMoment::default()
        }]
    }

    /// The convolution's im2col column buffer ([`workspace_elems`]).
    fn workspace(&self, op: &Op, s: &Sizes, act: u64) -> u64 {
        workspace_elems(op, s) * act
    }

    /// No CPU gemm buffer is modelled.
    fn gemm_slab_from(&self, _op: &Op, _s: &Sizes) -> Option<u64> {
        None
    }

    /// The logits' gradient.
    fn loss_backward_elems(&self, _kind: LossKind, logits: u64) -> u64 {
        logits
    }

    /// The output's shape for MSE, one int64 class per sample or frame for cross-entropy,
    /// a label sequence of up to T int64 for CTC.
    fn target_bytes(&self, kind: LossKind, logits: u64, seq: usize) -> u64 {
        match kind {
            LossKind::Mse => logits * 4,
            LossKind::CrossEntropy => 8,
            LossKind::CrossEntropyPerFrame | LossKind::Ctc { .. } => 8 * seq as u64,
        }
    }

    /// Every parameter's `.grad` is allocated by the first backward and kept.
    fn gradients_held_all_step(&self) -> bool {
        true
    }

    /// The update of one tensor allocates its new value and new state before the old ones
    /// are dropped (PyTorch's foreach temporaries).
    fn optimizer_transient(&self, largest_param: u64, optimizer: Optimizer) -> Bytes {
        Bytes(largest_param * 4 * (optimizer.state_per_param() + 1))
    }

    /// Gradients accumulate in `.grad` itself.
    fn accumulation(&self, _micro_batch: Option<u64>, _params: u64) -> Bytes {
        Bytes(0)
    }

    /// The CUDA context on a GPU, and the caching allocator's first small segment.
    fn runtime_bytes(&self) -> Bytes {
        if self.gpu {
            PYTORCH_CUDA_CONTEXT + PYTORCH_SMALL_SEGMENT
        } else {
            PYTORCH_SMALL_SEGMENT
        }
    }

    /// Rounding each of the step's tensors up to 512 bytes costs at most 511 bytes a
    /// tensor; about 4 tensors per node are live at the peak.
    fn rounding_bytes(&self, nodes: usize) -> Bytes {
        Bytes(PYTORCH_BLOCK * 4 * nodes as u64)
    }

    /// No CPU gemm buffer is modelled.
    fn gemm_buffer(&self, _slab_from: Option<u64>) -> (Bytes, u64) {
        (Bytes(0), 0)
    }

    /// The first moment in step order with the most per sample (all share one fixed).
    fn peak_index(&self, lines: &[(u64, Bytes)]) -> usize {
        (0..lines.len())
            .max_by_key(|&i| (lines[i].0, std::cmp::Reverse(i)))
            .expect("a step has an optimizer moment")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::tests::sizes;
    use batchfit_graph::Window;

    const TORCH: Pytorch = Pytorch { gpu: false };

    #[test]
    fn linear_saves_its_input() {
        let op = Op::Linear {
            in_features: 234,
            out_features: 26,
            bias: true,
        };
        let s = sizes(&[234], 26, &[234], &[26]);
        let saved = TORCH.saved(&op, &s);
        assert!(saved.inputs && !saved.output);
    }

    #[test]
    fn relu_keeps_its_output() {
        let s = sizes(&[512], 512, &[512], &[512]);
        assert!(TORCH.saved(&Op::Relu, &s).output);
    }

    #[test]
    fn max_pool_keeps_int64_indices() {
        let op = Op::Pool {
            pool: PoolKind::Max,
            window: Window::square(2, 2, 2, 0),
        };
        let s = sizes(&[100], 25, &[1, 10, 10], &[1, 5, 5]);
        assert_eq!(TORCH.saved(&op, &s).extra_bytes, 200);
    }

    /// Ties name the first moment; every moment shares one fixed part.
    #[test]
    fn peak_is_the_first_largest_moment() {
        let lines = [(5, Bytes(1)), (9, Bytes(1)), (9, Bytes(1)), (2, Bytes(1))];
        assert_eq!(TORCH.peak_index(&lines), 1);
        assert_eq!(
            TORCH.rounding_bytes(3),
            Bytes(3 * 4 * PYTORCH_BLOCK),
            "4 blocks per node"
        );
    }
}
