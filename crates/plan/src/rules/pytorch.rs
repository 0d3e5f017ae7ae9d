//! PyTorch's rules: which tensors each derivative formula of
//! `tools/autograd/derivatives.yaml` reads, and what the caching allocator and the CUDA
//! context add. Every parameter's `.grad` is held for the whole step, so the step's
//! moments share one fixed memory and differ only per sample.

use super::{
    BackwardMoment, RuntimeRules, Saved, Sizes, rnn_sequences_steps, rnn_steps_dirs,
    workspace_elems,
};
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
            Op::Linear { .. } | Op::Conv { .. } | Op::ConvTranspose { .. } => inputs,
            // `bmm`: each operand's gradient reads the other.
            Op::MatMul => inputs,
            // `native_batch_norm`/`native_layer_norm`: x plus per-channel or per-row mean and
            // rstd (per-row stats scale with the sample: two floats per normalised row).
            Op::BatchNorm { .. } => inputs,
            // `instance_norm` runs `batch_norm` over `[1, B x C, ...]`: x, and the mean and
            // rstd per sample and channel.
            Op::InstanceNorm { channels, .. } => Saved {
                inputs: true,
                extra_elems: 2 * *channels as u64,
                ..none
            },
            Op::LayerNorm { features } => Saved {
                inputs: true,
                extra_elems: 2 * (s.inputs[0] / *features as u64),
                ..none
            },
            // RMSNorm as Hugging Face writes it (`x.pow(2).mean(-1)`, `x * rsqrt(v + eps)`,
            // `weight * x`): `pow` and `mul` keep x, `rsqrt` its result per row, the scale's
            // `mul` the normalised values.
            Op::RmsNorm { features } => Saved {
                inputs: true,
                extra_elems: s.output + s.inputs[0] / *features as u64,
                ..none
            },
            // `relu`, `tanh`, `sigmoid`, `exp`, `softmax` differentiate through their result.
            Op::Relu | Op::Tanh | Op::Sigmoid | Op::Exp | Op::Softmax { .. } => output,
            // `clamp`/`hardtanh`, `gelu`, `hardsigmoid_backward` and `hardswish_backward` read
            // their input.
            Op::Clamp { .. }
            | Op::LeakyRelu { .. }
            // `_prelu_kernel` keeps its input (and the weight, a parameter).
            | Op::PRelu { .. }
            | Op::Gelu
            | Op::HardSigmoid { .. }
            | Op::HardSwish => inputs,
            // `mul` by a Python scalar, `slice`/`select`, `sum` and `mean` need only sizes.
            Op::Scale { .. } | Op::Slice { .. } => none,
            // `upsample_*` and `constant_pad_nd` backward need only the sizes.
            Op::Resize { .. } | Op::Pad { .. } => none,
            // `amax` reads its input and its result (`grad * (self == result)`), as
            // `linalg_vector_norm` does (`self * grad / result`).
            Op::Reduce {
                reduce: ReduceKind::Max | ReduceKind::L2,
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
            | Op::Expand { .. }
            | Op::Concat { .. }
            | Op::Add
            | Op::AddParam { .. }
            | Op::AddTable { .. }
            | Op::ConcatParam { .. }
            | Op::BroadcastParam { .. }
            | Op::Parameter { .. }
            | Op::Constant { .. }
            | Op::Take { .. }
            | Op::CausalMask
            | Op::AddConst { .. } => none,
            // `mul` by an untracked buffer keeps that buffer (no per-sample memory).
            Op::MulConst { .. } => none,
            // `mul`: each factor's gradient reads the other.
            Op::Mul | Op::MulParam { .. } => inputs,
            // `div`: `grad / other` and `-grad * self / other^2` read both.
            Op::Div => inputs,
            // `at::native::dropout` returns its input when p is 0. On a GPU it runs the fused
            // `native_dropout`, which saves a one-byte bool mask; elsewhere
            // (`is_fused_kernel_acceptable` is false off CUDA) `_dropout_impl` multiplies by
            // a noise tensor of the input's type, which `mul` saves (aten/src/ATen/native/
            // Dropout.cpp).
            Op::Dropout { p } if *p <= 0.0 => none,
            Op::Dropout { .. } if self.gpu => Saved {
                extra_bytes: s.output,
                ..none
            },
            Op::Dropout { .. } => Saved {
                extra_elems: s.output,
                ..none
            },
            // torchvision's `StochasticDepth`: `input * noise`, noise one value per sample.
            Op::DropPath { .. } => Saved {
                extra_elems: 1,
                ..none
            },
            // `embedding`: the int64 indices; the batch's own tensor when they are the batch.
            Op::Embedding { .. } if !s.input_tracked => none,
            Op::Embedding { .. } => Saved {
                extra_bytes: 8 * s.inputs[0],
                ..none
            },
            // On a GPU, cuDNN's layer keeps its reserve space, taken as what an unfused layer
            // keeps per step and direction: LSTM i, f, g, o, c_t, tanh(c_t), h_t (7H); GRU
            // r, z, n, h_t, W_hn h + b_hn, h_{t-1} (6H); the plain cell its pre-activation
            // and h_t (2H); plus the input sequence for dW_ih.
            Op::Rnn { cell, hidden, .. } if self.gpu => {
                let per_step = match cell {
                    Cell::Lstm => 7,
                    Cell::Gru => 6,
                    Cell::RnnTanh | Cell::RnnRelu => 2,
                } * *hidden as u64;
                Saved {
                    inputs: true,
                    extra_elems: rnn_steps_dirs(op, s) * per_step,
                    ..none
                }
            }
            // On a CPU each layer's input is kept as a time-major copy of a batch-first
            // input (past the first layer, the previous layer's concatenated output, which
            // only this layer keeps): counted as its own T x I, shared by the directions.
            // An LSTM runs as oneDNN's layer (`mkldnn_rnn_layer`, one per layer and
            // direction), which keeps its output T x H, h_T and c_T, and its workspace
            // ([`onednn_lstm_workspace`]).
            Op::Rnn {
                cell: Cell::Lstm,
                input_size,
                hidden,
                ..
            } => {
                let (sequences, steps) = rnn_sequences_steps(s);
                let dirs = steps_and_dirs(op, s).1;
                let h = *hidden as u64;
                Saved {
                    extra_elems: s.inputs[0] + sequences * dirs * (steps * h + 2 * h),
                    extra_bytes: sequences
                        * dirs
                        * onednn_lstm_workspace(steps, *input_size as u64, h),
                    ..none
                }
            }
            // A GRU is composed of autograd ops (`gru_cell` in aten/src/ATen/native/RNN.cpp),
            // per step and direction: the hidden gates' 3H (their sigmoids run in place),
            // `mul_`'s copies of the original n-gate slice and of h - n (2H), tanh's n (H)
            // and h_{t-1}, read by the next step's `addmm` (H). The plain cell
            // (`SimpleCell`: `linear_hh(h).add_(x W_ih)`, then tanh or relu, which keep
            // their output) keeps h_t, also read by the next step's `addmm` (H).
            Op::Rnn { cell, hidden, .. } => {
                let (steps, dirs) = steps_and_dirs(op, s);
                let per_step = match cell {
                    Cell::RnnTanh | Cell::RnnRelu => 1,
                    _ => 7,
                };
                Saved {
                    extra_elems: s.inputs[0] + dirs * steps * per_step * *hidden as u64,
                    ..none
                }
            }
        }
    }

    /// A layer that saves the batch saves a reference to the batch's own storage
    /// (autograd's `SavedVariable` holds the tensor, not a copy).
    fn keeps_batch_as_data(&self) -> bool {
        true
    }

    /// `F.batch_norm` of the weight (`native_batch_norm`) keeps its input, a view of the
    /// parameter, and the mean and rstd per channel; the convolution keeps its result.
    fn standardized_weight_kept(&self, weight: u64, channels: u64) -> u64 {
        weight + 2 * channels
    }

    /// `flatten` and `reshape` of a contiguous tensor are views of its storage.
    fn views_share_buffers(&self) -> bool {
        true
    }

    /// `slice`, `select` and `transpose` return strided views: a layer saving `y[:, -1]`
    /// keeps all of `y`. (A `reshape` of a transposed tensor copies it; that copy is
    /// counted once, under the storage the transpose views.)
    fn strided_views_share_buffers(&self) -> bool {
        true
    }

    /// The node's output, its inputs that no earlier node keeps, what it keeps besides
    /// them, and its kernel's workspace.
    fn forward_live(&self, op: &Op, s: &Sizes, act: u64, loose: u64, extra: u64) -> u64 {
        // A GRU's (and the plain cell's) input projection of one direction's whole
        // sequence (`x W_ih^T` for all steps at once) lives until that direction's last
        // step.
        let projection = match op {
            Op::Rnn { cell, hidden, .. } if !self.gpu && *cell != Cell::Lstm => {
                steps_and_dirs(op, s).0 * (cell.gates() * *hidden) as u64 * act
            }
            _ => 0,
        };
        s.output * act + loose + extra + projection + self.workspace(op, s, act)
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

    /// On a GPU, the convolution's cuDNN workspace, taken as its im2col column buffer
    /// ([`workspace_elems`]), which the caching allocator serves. On a CPU, oneDNN's
    /// scratchpad and `slow_conv2d`'s columns are the kernel's own allocations, not
    /// tensors of the step (MemTracker and the plan count tensors).
    fn workspace(&self, op: &Op, s: &Sizes, act: u64) -> u64 {
        if self.gpu {
            workspace_elems(op, s) * act
        } else {
            0
        }
    }

    /// `nn.SiLU` is one op, `silu`, whose derivative reads its input alone
    /// (derivatives.yaml `silu_backward(grad, self)`); `F.scaled_dot_product_attention`
    /// without dropout runs a fused kernel (`_scaled_dot_product_flash_attention_for_cpu`
    /// on a CPU) that keeps its inputs, its output and a log-sum-exp per query and head.
    /// The export writes both as their composition.
    fn fuses_silu_and_attention(&self) -> bool {
        true
    }

    /// Token ids are int64 tensors (`nn.Embedding` takes `torch.long`).
    fn token_bytes(&self) -> u64 {
        8
    }

    /// Cross-entropy is `nll_loss(log_softmax(x))`: `_log_softmax_backward_data` makes the
    /// logits' gradient while `nll_loss_backward`'s dense gradient of the log-probabilities
    /// is alive (two logits-sized tensors). MSE and CTC make one.
    fn loss_backward_elems(&self, kind: LossKind, logits: u64) -> u64 {
        match kind {
            LossKind::CrossEntropy | LossKind::CrossEntropyPerFrame => 2 * logits,
            LossKind::Mse | LossKind::Ctc { .. } => logits,
        }
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

    /// `zero_grad(set_to_none=True)` (the default since PyTorch 2.0) frees every `.grad`
    /// before the forward pass; backward allocates each as it reaches its parameter.
    fn gradients_held_all_step(&self) -> bool {
        false
    }

    fn holds_op_constants(&self) -> bool {
        false
    }

    /// `torch.optim`'s default path: on a GPU the `foreach` one, on a CPU the per-tensor
    /// one (`_default_to_fused_or_foreach`: foreach only on CUDA-like devices). SGD, with or
    /// without momentum, updates in place on both. Adam and AdamW's denominator:
    /// `_multi_tensor_adam`'s `torch._foreach_sqrt(exp_avg_sqs)` is a copy of every
    /// second moment at once; `_single_tensor_adam`'s `exp_avg_sq.sqrt() / bias_correction2_sqrt`
    /// holds the root and the quotient of one tensor at a time (torch/optim/adam.py).
    fn optimizer_transient(&self, largest_param: u64, params: u64, optimizer: Optimizer) -> Bytes {
        Bytes(match optimizer {
            Optimizer::Sgd | Optimizer::Momentum => 0,
            Optimizer::Adam | Optimizer::Adamw if self.gpu => params * 4,
            Optimizer::Adam | Optimizer::Adamw => 2 * largest_param * 4,
        })
    }

    /// Gradients accumulate in `.grad` itself.
    fn accumulation(&self, _micro_batch: Option<u64>, _params: u64) -> Bytes {
        Bytes(0)
    }

    /// On a GPU, the CUDA context and the caching allocator's first small segment. The CPU
    /// allocator (`c10::DefaultCPUAllocator`) holds no pool: a tensor's memory is its bytes.
    fn runtime_bytes(&self) -> Bytes {
        if self.gpu {
            PYTORCH_CUDA_CONTEXT + PYTORCH_SMALL_SEGMENT
        } else {
            Bytes(0)
        }
    }

    /// On a GPU, rounding each of the step's tensors up to 512 bytes costs at most 511
    /// bytes a tensor; about 4 tensors per node are live at the peak. None on a CPU.
    fn rounding_bytes(&self, nodes: usize) -> Bytes {
        Bytes(if self.gpu {
            PYTORCH_BLOCK * 4 * nodes as u64
        } else {
            0
        })
    }
}

/// Steps and directions of a recurrent layer.
/// Steps of one sample (every sequence's) and directions of a recurrent layer.
fn steps_and_dirs(op: &Op, s: &Sizes) -> (u64, u64) {
    let (sequences, steps) = rnn_sequences_steps(s);
    let steps = sequences * steps;
    (steps, rnn_steps_dirs(op, s) / steps)
}

/// Bytes per sample of the fp32 workspace oneDNN's LSTM keeps from its forward to its
/// backward pass, for one layer and direction of `t` steps, `i` inputs and `h` hidden
/// units. oneDNN 3.x `src/cpu/rnn/rnn_utils.cpp` (`set_offsets`): the gates
/// (T x B x ld(4H)), the hidden states before projection (T x B x ld(H)), the layer states
/// and their two gradients (each 2 x (T+1) x B x ld(max(I, H))) and the cell states and their
/// gradient (each 2 x (T+1) x B x H), where `get_good_ld` pads a leading dimension to 16
/// floats and by 16 more where it is a multiple of 256. Each part is also rounded to a
/// 4 KiB page, at most 28 KiB a layer and direction: left out, as it does not grow with
/// the batch.
pub fn onednn_lstm_workspace(t: u64, i: u64, h: u64) -> u64 {
    let ld = |x: u64| {
        let padded = x.div_ceil(16) * 16;
        if padded.is_multiple_of(256) {
            padded + 16
        } else {
            padded
        }
    };
    4 * t * (ld(4 * h) + ld(h)) + (t + 1) * (3 * 8 * ld(i.max(h)) + 2 * 8 * h)
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

    /// The caching allocator's rounding and first segment, the CUDA context: on a GPU only.
    #[test]
    fn allocator_and_context_on_a_gpu_only() {
        let gpu = Pytorch { gpu: true };
        assert_eq!(TORCH.rounding_bytes(3), Bytes(0));
        assert_eq!(TORCH.runtime_bytes(), Bytes(0));
        assert_eq!(gpu.rounding_bytes(3), Bytes(3 * 4 * PYTORCH_BLOCK));
        assert_eq!(
            gpu.runtime_bytes(),
            PYTORCH_CUDA_CONTEXT + PYTORCH_SMALL_SEGMENT
        );
    }

    /// Adam's denominator: one tensor's root and quotient on a CPU, every second moment's
    /// root at once on a GPU; SGD in place.
    #[test]
    fn optimizer_temporaries_by_path() {
        let gpu = Pytorch { gpu: true };
        for o in [Optimizer::Adam, Optimizer::Adamw] {
            assert_eq!(TORCH.optimizer_transient(100, 1000, o), Bytes(800));
            assert_eq!(gpu.optimizer_transient(100, 1000, o), Bytes(4000));
        }
        for o in [Optimizer::Sgd, Optimizer::Momentum] {
            assert_eq!(TORCH.optimizer_transient(100, 1000, o), Bytes(0));
            assert_eq!(gpu.optimizer_transient(100, 1000, o), Bytes(0));
        }
    }

    /// Dropout keeps a float noise tensor on a CPU, a bool mask on a GPU.
    #[test]
    fn dropout_mask_by_device() {
        let s = sizes(&[64], 64, &[64], &[64]);
        let op = Op::Dropout { p: 0.1 };
        let cpu = TORCH.saved(&op, &s);
        let gpu = Pytorch { gpu: true }.saved(&op, &s);
        assert_eq!((cpu.extra_elems, cpu.extra_bytes), (64, 0));
        assert_eq!((gpu.extra_elems, gpu.extra_bytes), (0, 64));
    }

    /// oneDNN's LSTM workspace, against the bytes PyTorch 2.15 (oneDNN 3.13) saved for one
    /// layer and direction at batch B, (T, B, I, H) -> bytes: the formula times B, plus
    /// each of its seven parts' rounding to 4 KiB pages (at most 7 x 4095).
    #[test]
    fn onednn_lstm_workspace_matches_pytorch() {
        for (t, b, i, h, measured) in [
            (50, 8, 40, 128, 3_141_632u64),
            (100, 8, 40, 128, 6_238_208),
            (50, 16, 40, 128, 6_279_168),
            (50, 8, 80, 128, 3_141_632),
            (50, 8, 40, 64, 1_585_152),
            (50, 8, 40, 256, 6_443_008),
            (50, 8, 256, 128, 4_554_752),
        ] {
            let planned = b * onednn_lstm_workspace(t, i, h);
            assert!(
                planned <= measured && measured - planned < 7 * 4096,
                "T {t} B {b} I {i} H {h}: planned {planned}, PyTorch {measured}"
            );
        }
    }

    /// A GRU on a CPU keeps 7H per step and direction and a copy of its input; an LSTM
    /// its input copy, output, final states and workspace per direction.
    #[test]
    fn recurrent_layers_on_a_cpu() {
        let gru = Op::Rnn {
            cell: Cell::Gru,
            input_size: 40,
            hidden: 96,
            bidirectional: false,
            bias: batchfit_graph::RnnBias::Double,
        };
        let s = sizes(&[50 * 40], 50 * 96, &[50, 40], &[50, 96]);
        let saved = TORCH.saved(&gru, &s);
        assert!(!saved.inputs);
        assert_eq!(saved.extra_elems, 50 * 40 + 50 * 7 * 96);
        let lstm = Op::Rnn {
            cell: Cell::Lstm,
            input_size: 40,
            hidden: 128,
            bidirectional: true,
            bias: batchfit_graph::RnnBias::Double,
        };
        let s = sizes(&[50 * 40], 50 * 256, &[50, 40], &[50, 256]);
        let saved = TORCH.saved(&lstm, &s);
        assert_eq!(saved.extra_elems, 50 * 40 + 2 * (50 * 128 + 2 * 128));
        assert_eq!(saved.extra_bytes, 2 * onednn_lstm_workspace(50, 40, 128));
    }
}
