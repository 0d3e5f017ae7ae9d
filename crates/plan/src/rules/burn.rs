//! burn's rules, as batchfit's engine drives burn 0.22.1 on the flex CPU backend:
//! burn-autodiff's backward ops (what `prep.checkpoint` keeps; `prep.checkpoint(&x)`
//! keeps `x`, a shared handle, so the tensor stays alive until that backward step), the
//! flex kernels (what they allocate) and the engine's composition of each op
//! (`crates/engine/src/model.rs`). burn frees and creates gradients during backward, so
//! each moment of the step is its own line in the batch.
//!
//! A gradient made by a matrix product is a new flex tensor from `FlexTensor::empty`, whose
//! zeroed `Vec<u8>` is copied into a 16-byte aligned buffer (`Bytes::from_bytes_vec` ->
//! `try_enforce_runtime_align`): two copies exist for a moment. Element-wise backward ops
//! (`relu_backward`, `mask_fill`, `mul` by the dropout mask) write into the incoming
//! gradient when nothing else holds it, adding nothing. burn-autodiff computes an op's
//! input gradient before its weight gradient (`binary`: lhs, then rhs).

use super::{BackwardMoment, RuntimeRules, Saved, Sizes, rnn_steps_dirs};
use crate::host::GemmKernel;
use crate::options::Optimizer;
use crate::units::Bytes;
use batchfit_graph::{Cell, LossKind, Op, PoolKind, ReduceKind};

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
    /// Bytes of gemm's packing buffer, which every thread that packs keeps (`CpuHost::gemm_slabs`).
    pub gemm_slab: u64,
    /// gemm's microkernel on this CPU: which products pack through that buffer.
    pub gemm_kernel: GemmKernel,
}

/// Burn: whether the engine runs `op` as one im2col matrix product (model.rs
/// `conv_im2col`): a convolution without dilation or groups whose input needs no gradient.
pub fn burn_im2col(op: &Op, s: &Sizes) -> bool {
    matches!(op, Op::Conv { window, groups: 1, .. }
        if !s.input_tracked && window.dilation.iter().all(|&d| d == 1))
}

/// Burn: how many chunks of whole samples the engine's im2col product splits a batch
/// of `b` into (their GEMMs run on separate threads, each leaving a weight-gradient
/// partial): the largest divisor of `b` up to [`IM2COL_MAX_CHUNKS`].
pub fn im2col_chunks(b: usize) -> usize {
    (1..=IM2COL_MAX_CHUNKS.min(b))
        .rev()
        .find(|&n| b.is_multiple_of(n))
        .unwrap_or(1)
}

impl Burn {
    /// Whether the engine runs `op` as its own 2-d max pool (engine `pool_cpu`): on the
    /// CPU, without dilation.
    fn own_max_pool(&self, op: &Op, s: &Sizes) -> bool {
        matches!(op, Op::Pool { pool: PoolKind::Max, window }
            if !self.gpu && s.in_dims.len() == 3 && window.dilation.iter().all(|&d| d == 1))
    }

    /// Whether the engine runs `op` as its own softmax (engine `act_cpu`): on the CPU, over
    /// an axis with nothing after it but axes of size 1 (`axis` counts the batch).
    fn own_softmax(&self, op: &Op, s: &Sizes) -> bool {
        let Op::Softmax { axis } = op else {
            return false;
        };
        let full = s.in_dims.len() as i64 + 1;
        let a = if *axis < 0 { axis + full } else { *axis };
        !self.gpu && a >= 1 && s.in_dims[a as usize..].iter().all(|&d| d == 1)
    }

    /// Whether a product with `m` rows packs through gemm's per-thread slab on this CPU.
    fn packs(&self, m: u64, unit_lhs_stride: bool) -> bool {
        self.cpu.gemm_kernel.uses_slab(m, unit_lhs_stride)
    }
}

/// Most chunks [`im2col_chunks`] makes: enough for the cores of a desktop CPU, and
/// the weight-gradient partials stay a small fixed cost (the plan counts this many).
pub const IM2COL_MAX_CHUNKS: usize = 16;

/// Burn (CPU): samples per chunk of the engine's convolution of a tracked input
/// (engine `conv_cpu`): enough for about [`CONV_CHUNK_ROWS`] output positions, so
/// each chunk's product is a matrix product even where a sample has few positions,
/// and its buffers (the chunk's im2col rows and result) are a fixed size. The engine
/// takes fewer when that leaves a thread without a chunk.
pub fn conv_samples_per_chunk(spatial: usize) -> usize {
    CONV_CHUNK_ROWS.div_ceil(spatial.max(1))
}

/// Output positions per chunk the engine's convolution of a tracked input aims at.
pub const CONV_CHUNK_ROWS: usize = 256;

/// Fewest output positions per sample for which the engine's convolution of a tracked
/// input runs one product per sample in NCHW order: the positions are the product's
/// lane dimension, and from one AVX-512 register of them (16) a sample alone makes a
/// matrix product worth running.
pub const CONV_PER_SAMPLE_MIN_POSITIONS: usize = 16;

/// How the engine's CPU convolution of a tracked input (engine `conv_cpu`) computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvCpuPath {
    /// Chunks of [`conv_samples_per_chunk`] samples: their im2col rows (position-major)
    /// times the weight, transposed back to NCHW; dy transposed to rows for the backward.
    Chunks,
    /// One product per sample on its NCHW planes: `W x cols`, `cols` the sample's
    /// unfolded taps `[C k, OH OW]`, or the sample itself for a pointwise convolution
    /// (1x1, stride 1, no padding), which then needs no scratch at all.
    PerSample {
        /// 1x1, stride 1, no padding: the sample is its own im2col.
        pointwise: bool,
    },
}

/// The path of a convolution with `spatial` output positions per sample.
pub fn conv_cpu_path(spatial: usize, groups: usize, pointwise: bool) -> ConvCpuPath {
    if groups == 1 && spatial >= CONV_PER_SAMPLE_MIN_POSITIONS {
        ConvCpuPath::PerSample { pointwise }
    } else {
        ConvCpuPath::Chunks
    }
}

/// Largest im2col matrix of one sample (bytes) for which the engine runs its own
/// convolution of a tracked input (engine `conv_cpu`); above, burn's.
pub const CONV_MAX_SAMPLE_COLS_BYTES: u64 = 16 << 20;

/// The engine's CPU convolution of a tracked input (engine `conv_cpu`), when it runs
/// `op`: its path and the elements of one busy thread's scratch. The chunked path holds a
/// chunk's im2col rows and their product (rows x (k + C_out)) and a group's padded image;
/// the per-sample one a sample's unfolded taps (k x positions) and its padded image, or
/// nothing when pointwise. `k` is a group's im2col row length; a grouped convolution
/// builds one group's rows at a time.
fn conv_cpu_scratch(op: &Op, s: &Sizes, gpu: bool) -> Option<(ConvCpuPath, u64)> {
    let Op::Conv {
        in_channels,
        out_channels,
        window,
        groups,
        ..
    } = op
    else {
        return None;
    };
    if gpu || burn_im2col(op, s) || window.dilation.iter().any(|&d| d != 1) {
        return None;
    }
    let spatial = s.output / (*out_channels as u64).max(1);
    let k = (*in_channels / *groups * window.kernel_elements()) as u64;
    if spatial * k * 4 > CONV_MAX_SAMPLE_COLS_BYTES {
        return None;
    }
    let padded: u64 = s
        .in_dims
        .iter()
        .skip(1)
        .zip(&window.padding)
        .map(|(&d, p)| (d + p[0] + p[1]) as u64)
        .product::<u64>()
        * (*in_channels / *groups) as u64;
    let pointwise = window.kernel_elements() == 1
        && window.stride.iter().all(|&st| st == 1)
        && window.padding.iter().all(|p| p[0] == 0 && p[1] == 0);
    let path = conv_cpu_path(spatial as usize, *groups, pointwise);
    let scratch = match path {
        ConvCpuPath::Chunks => {
            let rows = conv_samples_per_chunk(spatial as usize) as u64 * spatial;
            rows * (k + *out_channels as u64) + padded
        }
        ConvCpuPath::PerSample { pointwise: true } => 0,
        ConvCpuPath::PerSample { pointwise: false } => k * spatial + padded,
    };
    Some((path, scratch))
}

/// Largest window matrix (input by output positions) of an average pool the engine
/// runs as a matrix product (model.rs `avg_pool_matrix`); larger pools use burn's
/// `avg_pool2d`.
pub const POOL_MATRIX_MAX: usize = 1 << 16;

/// Per-sample elements of the im2col matrix `[OH·OW, k·C]` of a convolution.
fn im2col_elems(op: &Op, s: &Sizes) -> u64 {
    match op {
        Op::Conv {
            in_channels,
            out_channels,
            window,
            ..
        } => s.output / *out_channels as u64 * (*in_channels * window.kernel_elements()) as u64,
        _ => 0,
    }
}

/// flex's im2col tile: at most this many output positions per tile (`ops/conv.rs`, `TILE_SIZE`).
const FLEX_CONV_TILE: u64 = 512;
/// flex's transposed-convolution column buffer is tiled above this size (`ops/conv_transpose.rs`,
/// `COLUMNS_BYTES`).
const FLEX_CONV_TRANSPOSE_COLUMNS: u64 = 8 << 20;

impl RuntimeRules for Burn {
    /// What burn-autodiff keeps for each op as the engine builds it.
    fn saved(&self, op: &Op, s: &Sizes) -> Saved {
        let none = Saved::default();
        let inputs = Saved {
            inputs: true,
            ..none
        };
        match op {
            // The im2col product keeps its matrix (`float_matmul` checkpoints the lhs when the
            // weight is tracked); the untracked input's pad and window views are not recorded.
            Op::Conv { .. } if burn_im2col(op, s) => Saved {
                extra_elems: im2col_elems(op, s),
                ..none
            },
            // burn-autodiff `float_matmul` (ops/tensor.rs) checkpoints lhs (x) and rhs (W), as the
            // CPU's own dense layer and product (engine `dense_cpu`) keep them;
            // `conv2d`/`conv1d` (ops/module.rs): x, weight, bias.
            Op::Linear { .. } | Op::Conv { .. } | Op::MatMul => inputs,
            // On the CPU the engine's own ReLU (engine `act_cpu`) keeps its output, as
            // PyTorch's does (usually the buffer the next layer keeps).
            Op::Relu if !self.gpu => Saved {
                output: true,
                ..none
            },
            // `relu`, `sigmoid`, `gelu` (ops/activation.rs) and `float_tanh` (ops/tensor.rs)
            // checkpoint their INPUT and recompute from it: unlike PyTorch, the pre-activation
            // stays alive beside the activation the next layer keeps.
            Op::Relu | Op::Tanh | Op::Sigmoid | Op::Gelu => inputs,
            // On the CPU the engine's own clamp (engine `act_cpu`) keeps one byte per element
            // (whether the gradient passes). Elsewhere `clamp` is burn-backend's default
            // `float_clamp` = `clamp_min(clamp_max(x))`, each a comparison plus
            // `float_mask_fill`, whose backward keeps only the bool mask (flex stores bools as
            // one byte): two bytes per element, not the input.
            Op::ClippedRelu { .. } => Saved {
                extra_bytes: if self.gpu { 2 } else { 1 } * s.output,
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
            // `mul_scalar` keeps nothing; `slice` and `sum_dim`/`mean_dim` keep only shapes;
            // `max_dim` keeps the argmax indices (flex: i32).
            Op::Scale { .. } | Op::Slice { .. } => none,
            Op::Reduce {
                reduce: ReduceKind::Max,
                ..
            } => Saved {
                extra_bytes: 4 * s.output,
                ..none
            },
            Op::Reduce { .. } => none,
            // The engine's composed LRN (model/norm.rs `lrn`): `x * x` keeps x; the zero padding,
            // `cat`, the window slices and their sum keep shapes; `powf_scalar` keeps its input
            // (the scaled sum) and the final `div` keeps x and the power.
            Op::Lrn { .. } => Saved {
                inputs: true,
                extra_elems: 2 * s.output,
                ..none
            },
            // On the CPU the engine's own softmax over the last axis (engine `act_cpu`) keeps
            // its output. Elsewhere it is burn-backend's default `softmax`: x - max,
            // `float_exp` (keeps its input), sum, `float_div` (keeps the exponentials and the
            // sums).
            Op::Softmax { .. } if self.own_softmax(op, s) => Saved {
                output: true,
                ..none
            },
            Op::Softmax { .. } => Saved {
                extra_elems: 2 * s.inputs[0],
                ..none
            },
            // On the CPU the engine's own 2-d max pool (engine `pool_cpu`) keeps only each
            // output's winner (u32); burn's `max_pool2d` keeps x and the argmax indices at the
            // device's int type (i32).
            Op::Pool {
                pool: PoolKind::Max,
                ..
            } => Saved {
                inputs: !self.own_max_pool(op, s),
                extra_bytes: 4 * s.output,
                ..none
            },
            // burn's `avg_pool2d` keeps x. The engine's product with the window matrix
            // (model.rs `avg_pool_matrix`) should keep only the matrix, but without x the
            // plan under-predicts seed2-dual's measured peak by 11 % at batch 128 (5.5 % at
            // 1024): a tensor of x's size is alive at the peak, not yet identified. Counted
            // as x, which matches the measurements (-6.7 %, -0.6 %).
            Op::Pool { .. } => inputs,
            // The engine's global max pool is `max_dim` (keeps i32 indices); the average is
            // `mean_dim`, which keeps only the shape.
            Op::GlobalPool {
                pool: PoolKind::Max,
            } => Saved {
                extra_bytes: 4 * s.output,
                ..none
            },
            Op::GlobalPool { .. } => none,
            Op::Flatten | Op::Reshape { .. } | Op::Concat { .. } | Op::Add => none,
            // `permute` keeps the axes, the reshape that copies it back to `[B, elements]` its
            // shape; the learned addend's and the causal mask's `add` keep nothing (the mask
            // is an untracked constant).
            Op::Transpose { .. }
            | Op::AddParam { .. }
            | Op::ConcatParam { .. }
            | Op::CausalMask => none,
            // `float_mul` keeps each factor when the other one is tracked.
            Op::Mul => inputs,
            // The engine's dropout is `x * mask` with an untracked f32 mask: `float_mul` keeps
            // only the mask (at the activation's precision).
            // Dropout of probability 0 returns its input (engine `dropout`).
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
            // `embedding` keeps the index tensor, which is the batch's own token tensor.
            Op::Embedding { .. } => none,
            // On the CPU the engine's fused BatchNorm (engine `norm_cpu`) keeps x and two numbers
            // per channel, as PyTorch's `native_batch_norm`; its fused LayerNorm x and two
            // numbers per row, as `native_layer_norm`.
            Op::BatchNorm { .. } if !self.gpu => inputs,
            Op::LayerNorm { features } if !self.gpu => Saved {
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
            // The engine's fused CPU cells (engine lstm.rs, gru.rs) keep per step and direction
            // the gate activations and one more row: LSTM i, f, g, o and c_t (5H), GRU r, z, n
            // and `h W_hn + b_hn` (4H); and the layer's output. The input projection's
            // `matmul` keeps the input.
            Op::Rnn { cell, hidden, .. } if !self.gpu => Saved {
                inputs: true,
                output: true,
                extra_elems: rnn_steps_dirs(op, s) * (cell.gates() + 1) as u64 * *hidden as u64,
                ..none
            },
            // Elsewhere the cells are composed (model/recurrent.rs `rnn_direction`), and keep
            // per step and direction: the GRU the recurrent product 3H (its n slice is kept by
            // `r * rn`), the three gate pre-activations, r, z, n, 1 - z and h_t; the LSTM the
            // gates' sum 4H (its slices are kept by the activations), i, f, g, o, c_t,
            // tanh(c_t) and h_t: 11H either way. Plus the input (`matmul`).
            Op::Rnn { hidden, .. } => Saved {
                inputs: true,
                extra_elems: rnn_steps_dirs(op, s) * 11 * *hidden as u64,
                ..none
            },
        }
    }

    /// The engine's batch tensors are the very tensors the first layers keep.
    fn keeps_batch_as_data(&self) -> bool {
        true
    }

    /// A view (flatten, reshape) shares its input's buffer: a layer keeping the view keeps
    /// that buffer.
    fn views_share_buffers(&self) -> bool {
        true
    }

    /// The node's inputs no earlier node keeps, its output and what it keeps, plus what
    /// its kernel allocates on the way (`forward_temporaries` below).
    fn forward_live(&self, op: &Op, s: &Sizes, act: u64, loose: u64, extra: u64) -> u64 {
        let temporaries = match op {
            // The fused norms and the own max pool write their output (and what they keep)
            // and nothing else.
            Op::BatchNorm { .. } | Op::LayerNorm { .. } if !self.gpu => 0,
            Op::Pool { .. } if self.own_max_pool(op, s) => 0,
            _ => forward_temporaries(op, s, act, self.gpu),
        };
        loose + s.output * act + extra + temporaries
    }

    /// Burn (flex): bytes of the op's per-thread kernel buffers at its forward pass, which do
    /// not grow with the batch: flex `conv3d_impl` gives each busy thread an im2col tile
    /// (C_in/groups x k by up to 512 output positions) and gemm's result for it.
    /// The engine's own convolution of a tracked input gives each busy thread its chunk's
    /// im2col rows, their product and a padded image.
    fn forward_workspace(&self, op: &Op, s: &Sizes, act: u64) -> u64 {
        if let Some((_, scratch)) = conv_cpu_scratch(op, s, self.gpu) {
            return self.cpu.threads * scratch * act;
        }
        match op {
            Op::Conv { .. } if burn_im2col(op, s) => 0,
            Op::Conv {
                in_channels,
                out_channels,
                window,
                groups,
                ..
            } => {
                let spatial = s.output / *out_channels as u64;
                let col = (*in_channels / *groups) as u64 * window.kernel_elements() as u64;
                let tile = spatial.min(FLEX_CONV_TILE);
                self.cpu.threads * (col + (*out_channels / *groups) as u64) * tile * act
            }
            _ => 0,
        }
    }

    /// Burn (flex): the moments of `op`'s backward pass that can set the step's peak (the
    /// module docs say how flex makes gradients).
    fn backward(&self, op: &Op, s: &Sizes, tracked: &[bool], act: u64) -> Vec<BackwardMoment> {
        let cpu = self.cpu;
        let out = s.output;
        let input = s.inputs.first().copied().unwrap_or(0);
        let dx = if tracked.first().copied().unwrap_or(false) {
            input
        } else {
            0
        };
        let params: u64 = op.param_count();
        let largest = op.params().iter().map(|p| p.elements()).max().unwrap_or(0);
        let one = |elems: u64| {
            vec![BackwardMoment {
                bytes: elems * act,
                param_elems: params,
                ..BackwardMoment::default()
            }]
        };
        match op {
            // The im2col product: dy and the gradient of the bias add, then dW as one partial
            // per chunk (up to IM2COL_MAX_CHUNKS, counted as a fixed cost) summed into its twin.
            Op::Conv { .. } if burn_im2col(op, s) => vec![BackwardMoment {
                bytes: 2 * out * act,
                param_elems: params + largest,
                fixed_workspace: IM2COL_MAX_CHUNKS as u64 * largest * act,
                ..BackwardMoment::default()
            }],
            // The engine's own dense layer and product on the CPU (engine `dense_cpu`): dx =
            // dy W^T, then dW = x^T dy (and the bias's column sums), each written once.
            Op::Linear { .. } if !self.gpu => vec![
                BackwardMoment {
                    bytes: (out + dx) * act,
                    ..BackwardMoment::default()
                },
                BackwardMoment {
                    bytes: (out + dx) * act,
                    param_elems: params,
                    ..BackwardMoment::default()
                },
            ],
            Op::MatMul if !self.gpu => {
                let t: u64 = s
                    .inputs
                    .iter()
                    .zip(tracked)
                    .filter(|&(_, &t)| t)
                    .map(|(&e, _)| e)
                    .sum();
                one(out + t)
            }
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
                let t: Vec<u64> = s
                    .inputs
                    .iter()
                    .zip(tracked)
                    .filter(|&(_, &t)| t)
                    .map(|(&e, _)| e)
                    .collect();
                one(out + t.iter().sum::<u64>() + t.iter().copied().max().unwrap_or(0))
            }
            // The engine's own convolution (engine `conv_cpu`): dy, the zeroed dx, and per busy
            // thread its scratch (`conv_cpu_scratch`: the forward's, reused for the rows'
            // gradient) and its sum of the weight gradient (counted for every thread: one per
            // chunk up to the threads). A grouped convolution runs a product per group on its
            // block of each row.
            Op::Conv { .. } if conv_cpu_scratch(op, s, self.gpu).is_some() => {
                let (_, scratch) = conv_cpu_scratch(op, s, self.gpu).expect("checked");
                vec![BackwardMoment {
                    bytes: (out + dx) * act,
                    param_elems: params,
                    fixed_workspace: cpu.threads * (scratch + largest) * act,
                    ..BackwardMoment::default()
                }]
            }
            // burn-backend `conv2d_x_backward` (modules/conv.rs) is a `conv_transpose2d` into a
            // new tensor the size of x, with a column buffer of one sample per busy thread
            // (flex `conv_transpose3d_impl`). `conv2d_weight_backward` ->
            // `conv2d_weight_grad_no_groups` then runs flex's im2col convolution (`conv3d_impl`)
            // with the batch as channels: it copies the swapped x (`to_contiguous`, unless
            // C_in = 1 makes the swap a view) and the swapped dy, flattens dy again as the
            // kernel (`w_flat`), converts x to NHWC (`x_nhwc`), and each busy thread builds an
            // im2col tile of B x out_spatial x min(512, k) elements. The weight gradient is
            // written once into a `Vec` (no twin).
            Op::Conv {
                in_channels,
                out_channels,
                window,
                groups,
                ..
            } => {
                let spatial = out / (*out_channels as u64).max(1);
                let k = window.kernel_elements() as u64;
                let col = (*in_channels / *groups) as u64 * k;
                let x_copy = if *in_channels > 1 { input } else { 0 };
                let busy = cpu.threads.min(*in_channels as u64).max(1);
                let tiles = busy * spatial * k.min(FLEX_CONV_TILE);
                let mut moments = Vec::new();
                if dx > 0 {
                    moments.push(BackwardMoment {
                        bytes: (out + dx) * act,
                        fixed_workspace: cpu.threads
                            * (col * spatial * act).min(FLEX_CONV_TRANSPOSE_COLUMNS),
                        ..BackwardMoment::default()
                    });
                }
                moments.push(BackwardMoment {
                    bytes: (out + dx + x_copy + input + 2 * out + tiles) * act,
                    param_elems: params,
                    ..BackwardMoment::default()
                });
                moments
            }
            // `relu_backward`, the clamp masks' `mask_fill`, the dropout `mul`, views, `cat`'s
            // slices and `add`: written into the incoming gradient.
            Op::Relu
            | Op::ClippedRelu { .. }
            | Op::Dropout { .. }
            | Op::DropPath { .. }
            | Op::Flatten
            | Op::Reshape { .. }
            | Op::Concat { .. }
            | Op::Add
            | Op::CausalMask => one(out),
            // `cat` backward slices dy; the expanded parameter's gradient sums its slice
            // over the batch.
            Op::ConcatParam { .. } => one(out),
            // The learned addend's gradient is dy summed over the axes it broadcasts on.
            Op::AddParam { .. } => one(out),
            // The inverse `permute` of dy is a view; the reshape back copies it into dx.
            Op::Transpose { .. } => one(out + dx),
            // `embedding_backward` scatters into a parameter-sized zeroed tensor.
            Op::Embedding { .. } => vec![BackwardMoment {
                bytes: out * act,
                param_elems: 2 * params,
                ..BackwardMoment::default()
            }],
            // The clamp masks' `mask_fill` and `mul_scalar` write into the incoming gradient.
            Op::HardSigmoid { .. } | Op::Scale { .. } => one(out),
            // The product's two gradients, then the hard sigmoid's in place.
            Op::HardSwish => one(out + 2 * input),
            // On the CPU the engine's own slice (engine `view_cpu`) writes dx once, zeros
            // around dy. Elsewhere `slice` backward: `float_zeros` of x's shape (an `empty`,
            // two copies for a moment) and a `slice_assign` of dy.
            Op::Slice { .. } if !self.gpu => one(out + dx),
            Op::Slice { .. } => one(out + 2 * dx),
            // `sum_dim`/`mean_dim` backward expand dy to x's shape; `max_dim` scatters into zeros.
            Op::Reduce {
                reduce: ReduceKind::Max,
                ..
            } => one(out + 2 * dx),
            Op::Reduce { .. } => one(out + dx),
            // The quotient rule's products, the power's gradient, then each window slice's
            // zeroed padded-size gradient: about three input-sized tensors at a time.
            Op::Lrn { .. } => one(out + 3 * input),
            // `sigmoid`, `float_tanh`, `gelu` recompute the activation from the kept input.
            Op::Tanh | Op::Sigmoid | Op::Gelu => one(out + input),
            // The own softmax: dy and dx. burn's: exp recomputed, then the quotient rule's
            // two products.
            Op::Softmax { .. } if self.own_softmax(op, s) => one(out + dx),
            Op::Softmax { .. } => one(out + 2 * input),
            // `max_pool2d_with_indices_backward` / `avg_pool2d_backward`: a new dx.
            Op::Pool { .. } => one(out + dx),
            // `mean_dim` backward expands dy to x's shape; `max_dim` scatters into `float_zeros`
            // (an `empty`, so two copies for a moment).
            Op::GlobalPool {
                pool: PoolKind::Max,
            } => one(out + 2 * dx),
            Op::GlobalPool { .. } => one(out + dx),
            Op::Mul => one(out + s.inputs.iter().sum::<u64>()),
            // The fused norms' backward: dy and dx (and the layer norm's per-job partial
            // parameter gradients, a few rows of `features`: not counted).
            Op::BatchNorm { .. } | Op::LayerNorm { .. } if !self.gpu => one(out + dx),
            // The composed norm's backward: dy * gamma, the quotient rule's product and the
            // statistics' reductions, one input-sized temporary at a time.
            Op::BatchNorm { .. } | Op::LayerNorm { .. } => one(out + dx + input),
            // The fused cells' backward (both directions at once, one per thread): the output's
            // gradient, each direction's projection gradient `[T, gates x H]`, its h_{t-1} rows
            // `[T, H]` (and the GRU's gradient of `h W_hn + b_hn`, `[T, H]`), and the recurrent
            // weights' (and GRU biases') gradients; a bidirectional layer runs its
            // directions on the pool's threads (`rayon::join`): one on the stepping thread
            // (itself the pool's first, engine `set_threads`), whose slab the plan counts for
            // the step, the other on a second thread with a gemm packing buffer of its own,
            // when its `[B, H] x [H, gates x H]` products pack through the slab at all
            // (`GemmKernel::uses_slab`). (Where a split product already gave that thread its
            // slab, the pool's, it is counted twice.) Then each
            // projection's `matmul` makes dx (and its twin) and the input weight's gradient
            // while the projection gradients are alive.
            Op::Rnn {
                cell,
                hidden,
                bidirectional,
                ..
            } if !self.gpu => {
                let steps = s.in_dims.first().copied().unwrap_or(1) as u64;
                let dirs = if *bidirectional { 2 } else { 1 };
                let (g, h) = ((cell.gates() * *hidden) as u64, *hidden as u64);
                let (per_step, bias) = match cell {
                    Cell::Lstm => (g + h, 0),
                    Cell::Gru => (g + 2 * h, g),
                };
                let hh = g * h;
                vec![
                    BackwardMoment {
                        bytes: (out + dirs * steps * per_step) * act,
                        param_elems: dirs * (hh + bias),
                        fixed_workspace: if dirs == 2 && self.packs(g, true) {
                            dirs.min(cpu.threads).saturating_sub(1) * cpu.gemm_slab
                        } else {
                            0
                        },
                        ..BackwardMoment::default()
                    },
                    BackwardMoment {
                        bytes: (dirs * steps * g + 2 * dx) * act,
                        extras_freed: true,
                        param_elems: params + largest.max(hh),
                        ..BackwardMoment::default()
                    },
                ]
            }
            // burn-autodiff visits nodes by depth, so both directions' steps are differentiated
            // together, from the last step: at the start all per-step tensors are alive, with
            // the output's gradient, each direction's running sum of the recurrent weight's
            // gradient and one step's product and its twin. The steps' gate gradients then wait
            // for the `narrow` nodes that sliced them out of each direction's input projection
            // `[T, gates x H]`; those come last, all at one depth: each makes a zeroed tensor of
            // the whole projection (`float_zeros` -> `empty`: two copies for a moment) added to
            // the projection's gradient. Last, each projection's `float_matmul` makes dx and the
            // input weight's gradient (twin included).
            Op::Rnn {
                cell,
                hidden,
                bidirectional,
                ..
            } => {
                let steps = s.in_dims.first().copied().unwrap_or(1) as u64;
                let dirs = if *bidirectional { 2 } else { 1 };
                let g = (cell.gates() * *hidden) as u64;
                let projection = steps * g;
                let hh = g * *hidden as u64;
                let ih = largest.max(hh);
                vec![
                    BackwardMoment {
                        bytes: out * act,
                        param_elems: (dirs + 2) * hh,
                        ..BackwardMoment::default()
                    },
                    BackwardMoment {
                        bytes: (dirs + 3) * projection * act,
                        extras_freed: true,
                        param_elems: dirs * hh,
                        ..BackwardMoment::default()
                    },
                    BackwardMoment {
                        bytes: (dirs * projection + 2 * dx) * act,
                        extras_freed: true,
                        param_elems: params + ih,
                        ..BackwardMoment::default()
                    },
                ]
            }
        }
    }

    /// burn reports no per-sample workspace: its kernels' buffers are in the moments.
    fn workspace(&self, _op: &Op, _s: &Sizes, _act: u64) -> u64 {
        0
    }

    /// Burn (flex): from which batch one of `op`'s products makes gemm use its per-thread
    /// slab (gemm-common 0.19 `gemm_basic_generic`). gemm computes a row-major product
    /// transposed, so its `m` is the output's column count and its lhs the right operand
    /// transposed. A product with one output row (`n` = 1) or a depth of at most 2 goes to
    /// `gemv`/`gevv`; the rest pack the lhs into a per-call buffer instead of the slab when
    /// `m <= 2 mc && (m % lanes != 0 || lhs_rs != 1)` ([`GemmKernel::uses_slab`]). A linear layer's
    /// `x W` and `x^T dy` have `m` = out features and a unit lhs stride; `dy W^T` has
    /// `m` = in features and a strided lhs. A linear layer on one row per sample makes
    /// only matrix-vector products at batch 1.
    fn gemm_slab_from(&self, op: &Op, s: &Sizes) -> Option<u64> {
        let out_cols = s.out_dims.last().copied().unwrap_or(1) as u64;
        match op {
            Op::Linear {
                in_features,
                out_features,
                ..
            } => {
                let rows = s.inputs[0] / (*in_features as u64).max(1);
                let (i, o) = (*in_features as u64, *out_features as u64);
                let used =
                    (i > 2 && self.packs(o, true)) || (s.input_tracked && self.packs(i, false));
                used.then(|| 2u64.div_ceil(rows.max(1)))
            }
            // The convolutions' products run on the pool's threads (`gemm_on_pool_from`).
            Op::Conv { .. } => None,
            // [.., M, K] x [.., K, N]: `m` = N for the product and the right operand's
            // gradient; the left operand's gradient has `m` = K and a strided lhs.
            Op::MatMul => {
                let k = s.in_dims.last().copied().unwrap_or(1) as u64;
                let rows = s.out_dims.iter().rev().nth(1).copied().unwrap_or(1) as u64;
                let used = rows > 1 && (self.packs(out_cols, true) || self.packs(k, false));
                used.then_some(1)
            }
            // The engine's LSTM/GRU products (`cpu::gemm_into`) on every step.
            Op::Rnn { .. } => Some(1),
            _ => None,
        }
    }

    /// Burn (flex): the engine's convolutions run their products on rayon's pool, a chunk
    /// of samples per job, even one chunk (`par_chunks_mut` from outside the pool). The
    /// im2col product of a batch input has `m` = output channels with a unit lhs stride;
    /// the convolution of a tracked input (`conv_cpu`) multiplies by the weight with a
    /// strided lhs (`m` = output channels per group), and its gradients with `m` = the
    /// im2col width `C_in / groups x k` and a unit stride.
    fn gemm_on_pool_from(&self, op: &Op, s: &Sizes) -> Option<u64> {
        let Op::Conv {
            in_channels,
            out_channels,
            window,
            groups,
            ..
        } = op
        else {
            return None;
        };
        if self.gpu {
            return None;
        }
        let co = (*out_channels / (*groups).max(1)) as u64;
        let kg = (*in_channels / (*groups).max(1) * window.kernel_elements()) as u64;
        let packs = match conv_cpu_scratch(op, s, self.gpu) {
            _ if burn_im2col(op, s) => self.packs(co, true),
            // Per sample, row-major NCHW results: gemm's `m` is the positions, with a unit
            // lhs stride (forward, the taps' gradient); the weight gradient's is the im2col
            // width with a strided lhs.
            Some((ConvCpuPath::PerSample { .. }, _)) => {
                let spatial = s.output / (*out_channels as u64).max(1);
                self.packs(spatial, true) || self.packs(kg, false)
            }
            _ => self.packs(co, false) || self.packs(kg, true),
        };
        packs.then_some(1)
    }

    /// Burn: per-sample elements live at the start of backward besides the kept tensors (the
    /// loss's own kept tensor included). The engine's losses are composed of tensor ops, whose
    /// backward makes logits-sized gradients one after another: MSE `(y - t).powi_scalar(2)
    /// .mean()` = `mean` (expands the gradient), `mul(d, d)` (a product for each factor);
    /// cross-entropy = burn-backend's default `log_softmax` (`x - max`, `float_exp`, which
    /// recomputes the exponentials from its kept input, `sum`, `log`, `-`) then `logp * onehot`.
    /// Two logits-sized tensors beside the kept one, measured for both. On the CPU
    /// cross-entropy is the engine's own (engine `act_cpu`, keeping the logits): its
    /// backward writes the logits' gradient alone. CTC: the gradient.
    fn loss_backward_elems(&self, kind: LossKind, logits: u64) -> u64 {
        match kind {
            LossKind::CrossEntropy | LossKind::CrossEntropyPerFrame if !self.gpu => logits,
            LossKind::Mse | LossKind::CrossEntropy | LossKind::CrossEntropyPerFrame => 2 * logits,
            LossKind::Ctc { .. } => logits,
        }
    }

    /// CTC on a CPU: burn-flex has no CTC kernel, so burn-autodiff runs burn-backend's
    /// `ctc_loss_default` (`ops/modules/ctc.rs`) as tensor ops and keeps what each needs.
    /// Over the label with blanks, S = 2L + 1 (the engine's labels: L = T / 4, `data.rs`):
    /// for the whole loss alpha `[T, S]`, the log-probabilities gathered at the labels
    /// `[T, S]` and the gather's int64 indices `[T, S]` (16 bytes per entry); then per
    /// frame after the first, two `log_sum_exp`, each keeping `abs`'s input and `exp`'s
    /// output (f32 `[S]`) and four bool masks `[S]` (24 bytes per entry in all). The log-
    /// softmax's kept input comes first. On a GPU burn-cubecl's kernel keeps the
    /// log-probabilities only, as PyTorch's does (the shared rule).
    fn loss_saved_bytes(&self, kind: LossKind, logits: u64, steps: u64) -> u64 {
        match kind {
            LossKind::Ctc { .. } if !self.gpu => {
                let s = 2 * (steps / 4).max(1) + 1;
                4 * logits + 16 * steps * s + 24 * steps.saturating_sub(1) * s
            }
            _ => super::loss_saved_elems(kind, logits, steps) * 4,
        }
    }

    /// The input's shape for MSE; the engine feeds cross-entropy one-hot fp32 rows
    /// (`data::one_hot`): the logits' size; CTC a label sequence of up to T int64.
    fn target_bytes(&self, kind: LossKind, logits: u64, seq: usize) -> u64 {
        match kind {
            LossKind::Mse | LossKind::CrossEntropy | LossKind::CrossEntropyPerFrame => logits * 4,
            LossKind::Ctc { .. } => 8 * seq as u64,
        }
    }

    /// burn-autodiff makes each parameter gradient during backward and frees its inputs' as
    /// it goes: the moments carry the gradients alive then.
    fn gradients_held_all_step(&self) -> bool {
        false
    }

    /// burn-optim `AdaptiveMomentum::transform` and `Momentum::transform` clone the gradient
    /// or a moment into a new tensor; plain SGD updates in place, and so do Adam and AdamW
    /// on the CPU, where the engine runs its own update (engine `adam_cpu`).
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

    /// On a CPU, gemm's packing buffer (`CpuHost::gemm_slabs`); nothing on a GPU.
    fn runtime_bytes(&self) -> Bytes {
        Bytes(if self.gpu { 0 } else { self.cpu.gemm_slab })
    }

    /// flex allocates exact sizes.
    fn rounding_bytes(&self, _nodes: usize) -> Bytes {
        Bytes(0)
    }

    /// flex splits a matrix product across rayon's pool once it reaches 192^3
    /// multiply-adds (burn-flex 0.22.1 `ops/matmul.rs`, `PARALLEL_THRESHOLD`: gemm with
    /// `Parallelism::Rayon(0)`); a linear layer's products (forward, input and weight
    /// gradients) all take `B x rows x in x out` of them. The engine's own CPU ops (im2col
    /// product, LSTM) run gemm unsplit, one product per thread, within the one slab counted
    /// in [`RuntimeRules::runtime_bytes`].
    fn pool_from_batch(&self, op: &Op, s: &Sizes) -> Option<u64> {
        const PARALLEL_THRESHOLD: u64 = 192 * 192 * 192;
        let per_sample = match op {
            Op::Linear {
                in_features,
                out_features,
                ..
            } => {
                // Split products whose `m` makes gemm pack into per-call buffers leave the
                // pool threads' slabs unmade.
                let (i, o) = (*in_features as u64, *out_features as u64);
                if !(self.packs(o, true) || (s.input_tracked && self.packs(i, false))) {
                    return None;
                }
                let rows = s.inputs[0] / i.max(1);
                rows * i * o
            }
            // The engine's own convolution runs a product per chunk of samples on the pool's
            // threads, with a chunk for each thread once the batch has a sample for each.
            Op::Conv { .. } if conv_cpu_scratch(op, s, self.gpu).is_some() => {
                return Some(self.cpu.threads.max(1));
            }
            // The im2col product of a batch input runs its chunks (two from batch 2,
            // `im2col_chunks`) on the pool's threads, which pack through their slabs when
            // the output channels make gemm use it.
            Op::Conv {
                out_channels,
                groups,
                ..
            } if burn_im2col(op, s) => {
                let co = (*out_channels / (*groups).max(1)) as u64;
                return self.packs(co, true).then_some(2);
            }
            // [.., M, K] x [.., K, N]: flex splits one product that reaches the threshold
            // across the pool, and runs a batch of products on the pool's threads once
            // they add up to `BATCH_PARALLEL_THRESHOLD` (`matmul_batched_gemm`). Their
            // threads pack through their slabs when the product uses it (`m` = N).
            Op::MatMul => {
                const BATCH_PARALLEL_THRESHOLD: u64 = 128 * 128 * 128;
                let k = s.in_dims.last().copied().unwrap_or(1) as u64;
                let n = s.out_dims.last().copied().unwrap_or(1) as u64;
                let per_sample = k * s.output;
                if !self.packs(n, true) || per_sample == 0 {
                    return None;
                }
                let per_product_from = (per_sample >= PARALLEL_THRESHOLD).then_some(1);
                let batched_from = BATCH_PARALLEL_THRESHOLD.div_ceil(per_sample).max(2);
                return Some(per_product_from.unwrap_or(batched_from));
            }
            _ => return None,
        };
        (per_sample > 0).then(|| PARALLEL_THRESHOLD.div_ceil(per_sample))
    }

    /// Every pool thread packs into a slab of its own when gemm splits a product across
    /// all of them (`Rayon(0)`); the engine's step runs on one of them (engine
    /// `Trainer::step`), whose slab is the one [`RuntimeRules::gemm_buffer`] counts. With
    /// one thread the product stays on the caller.
    fn pool_buffers(&self) -> Bytes {
        Bytes(if self.gpu || self.cpu.threads <= 1 {
            0
        } else {
            (self.cpu.threads - 1) * self.cpu.gemm_slab
        })
    }

    /// On a CPU, gemm's packing buffer exists from batch 1 if some product is matrix-matrix
    /// there, else from batch 2.
    fn gemm_buffer(&self, slab_from: Option<u64>) -> (Bytes, u64) {
        if self.gpu {
            (Bytes(0), 0)
        } else {
            (Bytes(self.cpu.gemm_slab), slab_from.unwrap_or(u64::MAX))
        }
    }
}

/// Burn (flex): per-sample bytes the forward pass of `op` allocates besides its output and
/// the tensors it keeps for backward, freed before the next op; `gpu`: off the CPU, where
/// the engine composes what it fuses on the CPU.
fn forward_temporaries(op: &Op, s: &Sizes, act: u64, gpu: bool) -> u64 {
    let out = s.output;
    let input = s.inputs.first().copied().unwrap_or(0);
    match op {
        // The CPU's own products write their output once; flex's `matmul` output comes from
        // `FlexTensor::empty`: zeroed, then copied aligned.
        Op::Linear { .. } | Op::MatMul if !gpu => 0,
        Op::Linear { .. } | Op::MatMul => out * act,
        // The im2col product: the padded channels-last input while the matrix is copied out
        // of it, then the product (two copies for a moment) before its transposed copy.
        Op::Conv { window, .. } if burn_im2col(op, s) => {
            let channels = s.in_dims.first().copied().unwrap_or(1) as u64;
            let padded: u64 = s.in_dims[1..]
                .iter()
                .zip(&window.padding)
                .map(|(&d, p)| (d + p[0] + p[1]) as u64)
                .product();
            (channels * padded).max(out) * act
        }
        // flex `conv3d_impl`: the input converted to NHWC (`x_nhwc`).
        Op::Conv { .. } => input * act,
        // flex `max_pool2d_with_indices` returns i64 indices, cast to the device's i32.
        Op::Pool {
            pool: PoolKind::Max,
            ..
        } => 8 * out,
        // Centred input squared before its mean.
        Op::BatchNorm { .. } | Op::LayerNorm { .. } => input * act,
        // The fused cells: every direction's input projection `[T, gates x H]` and its h_t
        // `[T, H]` until the output is assembled.
        Op::Rnn { cell, hidden, .. } if !gpu => {
            rnn_steps_dirs(op, s) * (cell.gates() + 1) as u64 * *hidden as u64 * act
        }
        // Per direction the input projection `[T, gates x H]` lives through the loop.
        Op::Rnn { cell, hidden, .. } => {
            let steps = s.in_dims.first().copied().unwrap_or(1) as u64;
            steps * (cell.gates() * *hidden) as u64 * act
        }
        _ => 0,
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
        let clip = CPU.saved(&Op::ClippedRelu { max: 20.0 }, &s);
        assert_eq!((clip.inputs, clip.extra_bytes), (false, 512));
        let clip = gpu.saved(&Op::ClippedRelu { max: 20.0 }, &s);
        assert_eq!((clip.inputs, clip.extra_bytes), (false, 1024));
    }

    /// seed2-dual's conv on a 2-thread CPU. Its input is a batch input: the engine's im2col
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
        };
        let mut s = sizes(&[2106], 2106, &[26, 9, 9], &[26, 9, 9]);
        s.input_tracked = false;
        assert!(burn_im2col(&op, &s));
        assert_eq!(CPU.saved(&op, &s).extra_elems, 81 * 234);
        let m = CPU.backward(&op, &s, &[false], 4);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].bytes, 2 * 2106 * 4);
        assert_eq!(m[0].fixed_workspace, 16 * 6084 * 4);
        assert_eq!(forward_temporaries(&op, &s, 4, false), 26 * 11 * 11 * 4);
        let s = sizes(&[2106], 2106, &[26, 9, 9], &[26, 9, 9]);
        assert!(!burn_im2col(&op, &s));
        assert!(CPU.saved(&op, &s).inputs);
        // The engine's own op on the CPU, one product per sample (81 positions): dy and
        // dx, and per thread a sample's unfolded taps (234 x 81), a padded image
        // (26 x 11 x 11) and a weight-gradient sum (26 x 234).
        let m = CPU.backward(&op, &s, &[true], 4);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].bytes, 2 * 2106 * 4);
        assert_eq!(
            m[0].fixed_workspace,
            2 * (234 * 81 + 26 * 11 * 11 + 26 * 234) * 4
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

    /// flex splits a product of 192^3 multiply-adds or more across the pool, and every
    /// pool thread then keeps a slab: from batch 18 for a 784 -> 512 layer.
    #[test]
    fn pool_buffers_from_the_batch_a_product_is_split() {
        let fc = Op::Linear {
            in_features: 784,
            out_features: 512,
            bias: true,
        };
        let s = sizes(&[784], 512, &[784], &[512]);
        assert_eq!(CPU.pool_from_batch(&fc, &s), Some(18));
        // 17 x 784 x 512 = 6.82 M < 192^3 = 7.08 M <= 18 x 784 x 512 = 7.23 M.
        assert_eq!(CPU.pool_buffers(), Bytes(512 * 1024));
        let one = Burn {
            cpu: BurnCpu {
                threads: 1,
                ..CPU.cpu
            },
            ..CPU
        };
        assert_eq!(one.pool_buffers(), Bytes(0));
        assert_eq!(Burn { gpu: true, ..CPU }.pool_buffers(), Bytes(0));
        assert_eq!(CPU.pool_from_batch(&Op::Relu, &s), None);
    }

    #[test]
    fn gemm_uses_its_slab_for_lane_multiples_and_tall_products() {
        // gemm-common's do_prepack_lhs: m <= 2 mc and m % lanes != 0 or a strided lhs; AVX2:
        // 8 lanes, mc up to 128.
        let avx2 = GemmKernel::AVX2;
        assert!(avx2.uses_slab(64, true));
        assert!(!avx2.uses_slab(26, true));
        assert!(!avx2.uses_slab(64, false));
        assert!(avx2.uses_slab(257, false));
        assert!(!avx2.uses_slab(1, true));
        // AVX-512: 16 lanes, mc up to 512.
        let avx512 = GemmKernel::AVX512;
        assert!(!avx512.uses_slab(8, true) && avx512.uses_slab(16, true));
        assert!(!avx512.uses_slab(1000, false) && avx512.uses_slab(1025, false));
        // seed 2's conv has 26 output channels: no slab at batch 1. A classifier with 10
        // classes on one row per sample: its products never use it.
        let conv = Op::Conv {
            in_channels: 26,
            out_channels: 26,
            window: batchfit_graph::Window::square(2, 3, 1, 1),
            groups: 1,
            bias: true,
        };
        let s = sizes(&[26 * 81], 26 * 81, &[26, 9, 9], &[26, 9, 9]);
        assert_eq!(CPU.gemm_slab_from(&conv, &s), None);
        assert_eq!(CPU.gemm_on_pool_from(&conv, &s), None);
        let fc = |i: usize, o: usize| Op::Linear {
            in_features: i,
            out_features: o,
            bias: true,
        };
        let s = sizes(&[64], 10, &[64], &[10]);
        assert_eq!(CPU.gemm_slab_from(&fc(64, 10), &s), None);
        let s = sizes(&[64], 32, &[64], &[32]);
        assert_eq!(CPU.gemm_slab_from(&fc(64, 32), &s), Some(2));
        // Rows of a sequence: a matrix product from batch 1.
        let s = sizes(&[5 * 64], 5 * 32, &[5, 64], &[5, 32]);
        assert_eq!(CPU.gemm_slab_from(&fc(64, 32), &s), Some(1));
    }

    #[test]
    fn gemm_buffer_only_on_a_cpu() {
        assert_eq!(CPU.runtime_bytes(), Bytes(512 * 1024));
        assert_eq!(CPU.gemm_buffer(Some(2)), (Bytes(512 * 1024), 2));
        assert_eq!(CPU.gemm_buffer(None), (Bytes(512 * 1024), u64::MAX));
        let gpu = Burn { gpu: true, ..CPU };
        assert_eq!(
            (gpu.runtime_bytes(), gpu.gemm_buffer(Some(1))),
            (Bytes(0), (Bytes(0), 0))
        );
    }
}
