//! burn's rules, as batchfit's engine drives burn 0.22.1 on the flex CPU backend:
//! burn-autodiff's backward ops (what `prep.checkpoint` keeps; `prep.checkpoint(&x)`
//! keeps `x`, a shared handle, so the tensor stays alive until that backward step), the
//! flex kernels (what they allocate), the engine's own CPU ops (`crates/engine/src/cpu/`)
//! and its composition of the rest (`crates/engine/src/model/`). burn frees and creates
//! gradients during backward, so each moment of the step is its own line in the batch.
//!
//! One file per op family, as the engine's CPU backend is split: `conv`,
//! `dense`, `activation`, `norm`, `pool`, `recurrent`, `tensor`
//! (views, sums, slices, dropout); `products` for gemm's buffers and `loss`
//! for the losses. [`Burn`]'s methods send each op to its family.
//!
//! A gradient made by a matrix product is a new flex tensor from `FlexTensor::empty`, whose
//! zeroed `Vec<u8>` is copied into a 16-byte aligned buffer (`Bytes::from_bytes_vec` ->
//! `try_enforce_runtime_align`): two copies exist for a moment. Element-wise backward ops
//! (`relu_backward`, `mask_fill`, `mul` by the dropout mask) write into the incoming
//! gradient when nothing else holds it, adding nothing. burn-autodiff computes an op's
//! input gradient before its weight gradient (`binary`: lhs, then rhs).

mod activation;
mod conv;
mod dense;
mod loss;
mod norm;
mod pool;
mod recurrent;
mod tensor;

pub use conv::{
    CONV_CHUNK_ROWS, CONV_MAX_SAMPLE_COLS_BYTES, CONV_PER_SAMPLE_MIN_POSITIONS, ConvCpuPath,
    IM2COL_MAX_CHUNKS, burn_im2col, conv_cpu_path, conv_samples_per_chunk, im2col_chunks,
};
pub use pool::POOL_MATRIX_MAX;

use super::{BackwardMoment, RuntimeRules, Saved, Sizes};
use crate::host::{GemmCall, GemmKernel};
use crate::options::Optimizer;
use crate::units::Bytes;
use batchfit_graph::{LossKind, Op};

/// burn's rules on a GPU or on a CPU with the given threads and gemm buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Burn {
    /// The CPU the flex kernels run on (their per-thread buffers).
    pub cpu: BurnCpu,
    /// Whether the step runs on a GPU (no CPU gemm buffer then).
    pub gpu: bool,
}

/// The flex CPU backend's parallel kernels run on rayon's pool; a few temporaries exist
/// once per thread working at the same time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BurnCpu {
    /// Threads of rayon's global pool.
    pub threads: u64,
    /// Bytes of gemm's packing buffer, which every pool thread keeps (`CpuHost::gemm_slabs`).
    pub gemm_slab: u64,
    /// Ways of associativity of the L2 the slab is sized for.
    pub l2_ways: u64,
    /// gemm's microkernel on this CPU: which products pack through that buffer.
    pub gemm_kernel: GemmKernel,
}

impl Burn {
    /// A product of the engine's (row-major `[m, n] = [m, k] x [k, n]`, each operand's
    /// columns contiguous or not) as gemm runs it on this CPU: transposed, so gemm's `m`
    /// is the output's columns and its lhs the right operand. `batch_axis` is the axis
    /// of `[m, n, k]` that holds the batch's rows, given at one sample. `None` on a GPU.
    fn gemm_call(
        &self,
        [m, n, k]: [u64; 3],
        batch_axis: usize,
        unit_cols: [bool; 2],
    ) -> Option<GemmCall> {
        (!self.gpu).then(|| GemmCall {
            kernel: self.cpu.gemm_kernel,
            l2: [self.cpu.gemm_slab, self.cpu.l2_ways],
            mnk: [n, m, k],
            batch_axis: [1, 0, 2][batch_axis],
            unit_rows: [unit_cols[1], unit_cols[0]],
        })
    }
}

/// The op families, each in its own file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    Conv,
    Dense,
    Activation,
    Norm,
    Pool,
    Recurrent,
    Tensor,
}

/// Which file `op`'s rules are in.
fn family(op: &Op) -> Family {
    match op {
        Op::Conv { .. } => Family::Conv,
        Op::Linear { .. } | Op::MatMul | Op::Embedding { .. } => Family::Dense,
        Op::Relu
        | Op::Clamp { .. }
        | Op::LeakyRelu { .. }
        | Op::PRelu { .. }
        | Op::HardSigmoid { .. }
        | Op::HardSwish
        | Op::Tanh
        | Op::Sigmoid
        | Op::Exp
        | Op::Gelu
        | Op::Softmax { .. }
        | Op::Scale { .. } => Family::Activation,
        Op::BatchNorm { .. }
        | Op::LayerNorm { .. }
        | Op::RmsNorm { .. }
        | Op::InstanceNorm { .. }
        | Op::Lrn { .. } => Family::Norm,
        Op::Pool { .. } | Op::GlobalPool { .. } => Family::Pool,
        Op::Rnn { .. } => Family::Recurrent,
        Op::Flatten
        | Op::Reshape { .. }
        | Op::Concat { .. }
        | Op::Add
        | Op::Transpose { .. }
        | Op::Expand { .. }
        | Op::AddParam { .. }
        | Op::MulParam { .. }
        | Op::AddTable { .. }
        | Op::Resize { .. }
        | Op::Pad { .. }
        | Op::ConcatParam { .. }
        | Op::BroadcastParam { .. }
        | Op::Parameter { .. }
        | Op::Constant { .. }
        | Op::Take { .. }
        | Op::CausalMask
        | Op::AddConst { .. }
        | Op::MulConst { .. }
        | Op::Slice { .. }
        | Op::Reduce { .. }
        | Op::Mul
        | Op::Div
        // Its backward is a convolution's (`conv::transpose_backward`).
        | Op::ConvTranspose { .. }
        | Op::Dropout { .. }
        | Op::DropPath { .. } => Family::Tensor,
    }
}

/// One backward moment of `elems` activations' worth, with the op's parameter gradients.
fn one(op: &Op, elems: u64, act: u64) -> Vec<BackwardMoment> {
    vec![BackwardMoment {
        bytes: elems * act,
        param_elems: op.param_count(),
        ..BackwardMoment::default()
    }]
}

impl RuntimeRules for Burn {
    /// What burn-autodiff keeps for each op as the engine builds it.
    fn saved(&self, op: &Op, s: &Sizes) -> Saved {
        match family(op) {
            Family::Conv => conv::saved(op, s),
            Family::Dense => dense::saved(op),
            Family::Activation => activation::saved(self, op, s),
            Family::Norm => norm::saved(self, op, s),
            Family::Pool => pool::saved(self, op, s),
            Family::Recurrent => recurrent::saved(self, op, s),
            Family::Tensor => tensor::saved(op, s),
        }
    }

    /// The engine's batch tensors are the very tensors the first layers keep.
    fn keeps_batch_as_data(&self) -> bool {
        true
    }

    /// The engine's `conv_weight`: the centred weight (kept by its square and by the
    /// product with the factor), the result (kept by the convolution), and per channel
    /// the root, its reciprocal, the gain's product and the factor.
    fn standardized_weight_kept(&self, weight: u64, channels: u64) -> u64 {
        2 * weight + 4 * channels
    }

    /// A view (flatten, reshape) shares its input's buffer: a layer keeping the view keeps
    /// that buffer.
    fn views_share_buffers(&self) -> bool {
        true
    }

    /// The im2col product's rows `[chunks, C_out, samples x positions]` (engine
    /// `ConvRows`), made NCHW by the first op that is not element-wise.
    fn output_in_product_layout(&self, op: &Op, s: &Sizes) -> bool {
        conv::burn_im2col(op, s)
    }

    /// The node's inputs no earlier node keeps, its output and what it keeps, plus what
    /// its kernel allocates on the way and frees before the next op.
    fn forward_live(&self, op: &Op, s: &Sizes, act: u64, loose: u64, extra: u64) -> u64 {
        let temporaries = match family(op) {
            Family::Conv => conv::forward_temporaries(op, s, act),
            Family::Dense => dense::forward_temporaries(self, op, s, act),
            Family::Norm => norm::forward_temporaries(self, op, s, act),
            Family::Pool => pool::forward_temporaries(self, op, s),
            Family::Recurrent => recurrent::forward_temporaries(self, op, s, act),
            Family::Activation | Family::Tensor => 0,
        };
        loose + s.output * act + extra + temporaries
    }

    /// Burn (flex): bytes of the op's per-thread kernel buffers at its forward pass
    /// (the convolutions' alone).
    fn forward_workspace(&self, op: &Op, s: &Sizes, act: u64) -> u64 {
        match family(op) {
            Family::Conv => conv::forward_workspace(self, op, s, act),
            _ => 0,
        }
    }

    /// Burn (flex): the moments of `op`'s backward pass that can set the step's peak (the
    /// module docs say how flex makes gradients).
    fn backward(&self, op: &Op, s: &Sizes, tracked: &[bool], act: u64) -> Vec<BackwardMoment> {
        let input = s.inputs.first().copied().unwrap_or(0);
        let dx = if tracked.first().copied().unwrap_or(false) {
            input
        } else {
            0
        };
        match family(op) {
            Family::Conv => conv::backward(self, op, s, dx, act),
            Family::Dense => dense::backward(self, op, s, tracked, dx, act),
            Family::Activation => activation::backward(self, op, s, dx, act),
            Family::Norm => norm::backward(self, op, s, dx, act),
            Family::Pool => pool::backward(op, s, dx, act),
            Family::Recurrent => recurrent::backward(self, op, s, dx, act),
            Family::Tensor if matches!(op, Op::ConvTranspose { .. }) => {
                conv::transpose_backward(self, op, s, dx, act)
            }
            Family::Tensor => tensor::backward(self, op, s, dx, act),
        }
    }

    /// burn reports no per-sample workspace: its kernels' buffers are in the moments.
    fn workspace(&self, _op: &Op, _s: &Sizes, _act: u64) -> u64 {
        0
    }

    fn loss_backward_elems(&self, kind: LossKind, logits: u64) -> u64 {
        loss::loss_backward_elems(self, kind, logits)
    }

    fn loss_saved_bytes(&self, kind: LossKind, logits: u64, steps: u64) -> u64 {
        loss::loss_saved_bytes(self, kind, logits, steps)
    }

    fn target_bytes(&self, kind: LossKind, logits: u64, seq: usize) -> u64 {
        loss::target_bytes(kind, logits, seq)
    }

    /// burn-autodiff makes each parameter gradient during backward and frees its inputs' as
    /// it goes: the moments carry the gradients alive then.
    fn gradients_held_all_step(&self) -> bool {
        false
    }

    /// The engine's program keeps the ops' constants in host memory (on a GPU they are
    /// uploaded per use).
    fn holds_op_constants(&self) -> bool {
        !self.gpu
    }

    /// burn-optim `AdaptiveMomentum::transform` and `Momentum::transform` clone the gradient
    /// or a moment into a new tensor; plain SGD updates in place, and so do Adam and AdamW
    /// on the CPU, where the engine runs its own update (engine `cpu/adam.rs`).
    fn optimizer_transient(&self, largest_param: u64, _params: u64, optimizer: Optimizer) -> Bytes {
        let in_place = match optimizer {
            Optimizer::Sgd => true,
            Optimizer::Momentum => false,
            Optimizer::Adam | Optimizer::Adamw => !self.gpu,
        };
        Bytes(if in_place { 0 } else { largest_param * 4 })
    }

    /// The engine keeps one accumulated gradient beside the step's gradients.
    fn accumulation(&self, micro_batch: Option<u64>, params: u64) -> Bytes {
        Bytes(if micro_batch.is_some() { params * 4 } else { 0 })
    }

    /// On a CPU, gemm's packing buffer (`CpuHost::gemm_slabs`) on every thread of the
    /// pool: the engine has each allocate it when it starts the pool (engine
    /// `set_threads`), rather than whichever threads win a piece of a split product.
    /// Nothing on a GPU.
    fn runtime_bytes(&self) -> Bytes {
        Bytes(if self.gpu {
            0
        } else {
            self.cpu.threads.max(1) * self.cpu.gemm_slab
        })
    }

    /// flex allocates exact sizes.
    fn rounding_bytes(&self, _nodes: usize) -> Bytes {
        Bytes(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::tests::sizes;
    use batchfit_graph::Window;

    const CPU: Burn = Burn {
        cpu: BurnCpu {
            threads: 2,
            gemm_slab: 512 * 1024,
            l2_ways: 8,
            gemm_kernel: GemmKernel::AVX2,
        },
        gpu: false,
    };

    #[test]
    fn relu_keeps_its_output_on_the_cpu_input_elsewhere_clamp_masks() {
        let s = sizes(&[512], 512, &[512], &[512]);
        let relu = CPU.saved(&Op::Relu, &s);
        assert!(!relu.inputs && relu.output);
        let gpu = Burn { gpu: true, ..CPU };
        let relu = gpu.saved(&Op::Relu, &s);
        assert!(relu.inputs && !relu.output);
        // clamp: one byte per element (the engine's own on the CPU), two one-byte masks
        // (burn's on a GPU) instead of the input.
        let clip = CPU.saved(
            &Op::Clamp {
                min: 0.0,
                max: 20.0,
            },
            &s,
        );
        assert_eq!((clip.inputs, clip.extra_bytes), (false, 512));
        let clip = gpu.saved(
            &Op::Clamp {
                min: 0.0,
                max: 20.0,
            },
            &s,
        );
        assert_eq!((clip.inputs, clip.extra_bytes), (false, 1024));
    }

    /// The dual-input regressor's conv (question 2) on a 2-thread CPU. Its input is a batch input: the engine's im2col
    /// product keeps the `[81, 234]` matrix per sample, and its backward holds dy and dy's
    /// contiguous copy. With a tracked input the engine's own op keeps its input; on a GPU
    /// burn's convolution keeps its input too: dx and its transposed convolution's column
    /// buffers, then the weight gradient (dy, the copies of x and dy, x in NHWC, two tiles).
    #[test]
    fn conv_moments() {
        let op = Op::Conv {
            in_channels: 26,
            out_channels: 26,
            window: Window::square(2, 3, 1, 1),
            groups: 1,
            bias: true,
            standardize: None,
        };
        let mut s = sizes(&[2106], 2106, &[26, 9, 9], &[26, 9, 9]);
        s.input_tracked = false;
        assert!(burn_im2col(&op, &s));
        assert_eq!(CPU.saved(&op, &s).extra_elems, 81 * 234);
        let m = CPU.backward(&op, &s, &[false], 4);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].bytes, 2 * 2106 * 4);
        assert_eq!(m[0].fixed_workspace, 16 * 6084 * 4);
        assert_eq!(conv::forward_temporaries(&op, &s, 4), 26 * 11 * 11 * 4);
        let s = sizes(&[2106], 2106, &[26, 9, 9], &[26, 9, 9]);
        assert!(!burn_im2col(&op, &s));
        assert!(CPU.saved(&op, &s).inputs);
        // The engine's own op on the CPU, one product per sample (81 positions): dy and
        // dx, per thread a sample's unfolded taps (234 x 81) and a padded image
        // (26 x 11 x 11), and a weight-gradient sum (26 x 234) per thread but the one
        // that becomes the gradient.
        let m = CPU.backward(&op, &s, &[true], 4);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].bytes, 2 * 2106 * 4);
        assert_eq!(
            m[0].fixed_workspace,
            (2 * (234 * 81 + 26 * 11 * 11) + 26 * 234) * 4
        );
        assert_eq!(
            CPU.forward_workspace(&op, &s, 4),
            2 * (234 * 81 + 26 * 11 * 11) * 4
        );
        // On 3 x 3 positions it takes chunks of ceil(256 / 9) = 29 samples' rows
        // (261 x (234 + 26)).
        let small = sizes(&[26 * 25], 26 * 9, &[26, 5, 5], &[26, 3, 3]);
        assert_eq!(
            CPU.forward_workspace(&op, &small, 4),
            2 * (261 * 260 + 26 * 7 * 7) * 4
        );
        // burn's convolution on a GPU.
        let gpu = Burn { gpu: true, ..CPU };
        let m = gpu.backward(&op, &s, &[true], 4);
        assert_eq!(m[0].bytes, 2 * 2106 * 4);
        assert_eq!(m[0].fixed_workspace, 2 * 26 * 9 * 81 * 4);
        assert_eq!(m[1].bytes, (6 * 2106 + 2 * 81 * 9) * 4);
    }

    #[test]
    fn im2col_chunks_divide_the_batch() {
        assert_eq!(im2col_chunks(1), 1);
        assert_eq!(im2col_chunks(34), 2);
        assert_eq!(im2col_chunks(512), 16);
        assert_eq!(im2col_chunks(12), 12);
        assert_eq!(im2col_chunks(509), 1);
        for b in 1..2000 {
            let n = im2col_chunks(b);
            assert!(b % n == 0 && n <= IM2COL_MAX_CHUNKS);
        }
    }

    /// Every pool thread holds gemm's packing buffer from the start (the engine allocates
    /// it on each when it starts its pool): threads x L2 on a CPU, at any batch, whatever
    /// the products; nothing on a GPU.
    #[test]
    fn a_packing_buffer_per_pool_thread_on_a_cpu() {
        assert_eq!(CPU.runtime_bytes(), Bytes(2 * 512 * 1024));
        let one = Burn {
            cpu: BurnCpu {
                threads: 1,
                ..CPU.cpu
            },
            ..CPU
        };
        assert_eq!(one.runtime_bytes(), Bytes(512 * 1024));
        assert_eq!(Burn { gpu: true, ..CPU }.runtime_bytes(), Bytes(0));
    }
}
