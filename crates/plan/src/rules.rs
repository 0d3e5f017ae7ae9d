//! Per-op rules: what the backward pass keeps and what the forward pass costs.
//!
//! This file is the one place that knows, for each op, which tensors autograd
//! saves for the backward pass, what its kernels allocate on the way, and how
//! many FLOPs the forward pass takes. The PyTorch rules follow PyTorch's
//! `tools/autograd/derivatives.yaml` (which tensors each derivative formula
//! reads). The burn rules follow burn 0.22.1 as batchfit's engine drives it:
//! burn-autodiff's backward ops (what `prep.checkpoint` keeps), the flex CPU
//! backend's kernels (what they allocate) and the engine's composition of each
//! op (`crates/engine/src/model.rs`). Where the two differ, the arm says so.

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
    /// Burn: whether the first input needs a gradient (batch inputs do not).
    pub input_tracked: bool,
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

/// Most chunks [`im2col_chunks`] makes: enough for the cores of a desktop CPU, and
/// the weight-gradient partials stay a small fixed cost (the plan counts this many).
pub const IM2COL_MAX_CHUNKS: usize = 16;

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
    if runtime == Runtime::Burn {
        return saved_burn(op, s);
    }
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
        // `native_dropout`: a one-byte bool mask.
        Op::Dropout { .. } => Saved {
            extra_bytes: s.output,
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

/// Steps times directions of a recurrent layer (its input is `[T, features]`).
fn rnn_steps_dirs(op: &Op, s: &Sizes) -> u64 {
    let steps = s.in_dims.first().copied().unwrap_or(1) as u64;
    match op {
        Op::Rnn {
            bidirectional: true,
            ..
        } => 2 * steps,
        _ => steps,
    }
}

/// What burn-autodiff keeps for each op as the engine builds it. `prep.checkpoint(&x)`
/// keeps `x` (a shared handle, so the tensor stays alive until that backward step).
fn saved_burn(op: &Op, s: &Sizes) -> Saved {
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
        // burn-autodiff `float_matmul` (ops/tensor.rs): checkpoints lhs (x) and rhs (W);
        // `conv2d`/`conv1d` (ops/module.rs): x, weight, bias.
        Op::Linear { .. } | Op::Conv { .. } | Op::MatMul => inputs,
        // `relu`, `sigmoid`, `gelu` (ops/activation.rs) and `float_tanh` (ops/tensor.rs)
        // checkpoint their INPUT and recompute from it: unlike PyTorch, the pre-activation
        // stays alive beside the activation the next layer keeps.
        Op::Relu | Op::Tanh | Op::Sigmoid | Op::Gelu => inputs,
        // `clamp` is burn-backend's default `float_clamp` = `clamp_min(clamp_max(x))`, each
        // a comparison plus `float_mask_fill`, whose backward keeps only the bool mask
        // (flex stores bools as one byte): two bytes per element, not the input.
        Op::ClippedRelu { .. } => Saved {
            extra_bytes: 2 * s.output,
            ..none
        },
        // Softmax is burn-backend's default `softmax`: x - max, `float_exp` (keeps its
        // input), sum, `float_div` (keeps the exponentials and the sums).
        Op::Softmax { .. } => Saved {
            extra_elems: 2 * s.inputs[0],
            ..none
        },
        // `max_pool2d` keeps x and the argmax indices at the device's int type (flex: i32).
        Op::Pool {
            pool: PoolKind::Max,
            ..
        } => Saved {
            inputs: true,
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
        // `float_mul` keeps each factor when the other one is tracked.
        Op::Mul => inputs,
        // The engine's dropout is `x * mask` with an untracked f32 mask: `float_mul` keeps
        // only the mask (at the activation's precision).
        Op::Dropout { .. } => Saved {
            extra_elems: s.output,
            ..none
        },
        // `embedding` keeps the index tensor, which is the batch's own token tensor.
        Op::Embedding { .. } => none,
        // The engine's norms are composed: `x - mean` and the normalised `y` are each kept
        // once (by `powi_scalar(2)` = mul, by `div`, by the scale's mul); LayerNorm adds
        // per-row statistics.
        Op::BatchNorm { .. } => Saved {
            extra_elems: 2 * s.inputs[0],
            ..none
        },
        Op::LayerNorm { features } => Saved {
            extra_elems: 2 * s.inputs[0] + 2 * (s.inputs[0] / *features as u64),
            ..none
        },
        // The engine's fused CPU LSTM (engine lstm.rs) keeps per step and direction the gate
        // activations i, f, g, o and c_t (5H), and the layer's output; the input
        // projection's `matmul` keeps the input.
        Op::Rnn {
            cell: Cell::Lstm,
            hidden,
            ..
        } => Saved {
            inputs: true,
            output: true,
            extra_elems: rnn_steps_dirs(op, s) * 5 * *hidden as u64,
            ..none
        },
        // The engine's composed GRU (model.rs `rnn_direction`) keeps per step and direction:
        // the recurrent product 3H (its n slice is kept by `r * rn`), the three gate
        // pre-activations, r, z, n, 1 - z and h_t: 11H. Plus the input (`matmul`).
        Op::Rnn { hidden, .. } => Saved {
            inputs: true,
            extra_elems: rnn_steps_dirs(op, s) * 11 * *hidden as u64,
            ..none
        },
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

/// Burn: per-sample elements live at the start of backward besides the kept tensors (the
/// loss's own kept tensor included). The engine's losses are composed of tensor ops, whose
/// backward makes logits-sized gradients one after another: MSE `(y - t).powi_scalar(2)
/// .mean()` = `mean` (expands the gradient), `mul(d, d)` (a product for each factor);
/// cross-entropy = burn-backend's default `log_softmax` (`x - max`, `float_exp`, which
/// recomputes the exponentials from its kept input, `sum`, `log`, `-`) then `logp * onehot`.
/// Two logits-sized tensors beside the kept one, measured for both. CTC: the gradient.
pub fn burn_loss_backward_elems(kind: LossKind, logits: u64) -> u64 {
    match kind {
        LossKind::Mse | LossKind::CrossEntropy | LossKind::CrossEntropyPerFrame => 2 * logits,
        LossKind::Ctc { .. } => logits,
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

/// The flex CPU backend's parallel kernels run on rayon's pool; a few temporaries exist
/// once per thread working at the same time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BurnCpu {
    /// Threads of rayon's global pool.
    pub threads: u64,
    /// Bytes of gemm's packing buffer, which every thread that packs keeps (`CpuHost::gemm_slabs`).
    pub gemm_slab: u64,
}

/// Burn: one moment of a node's backward pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BurnMoment {
    /// Per-sample bytes live besides the tensors kept for backward: the output's gradient,
    /// the input gradients made so far, kernel temporaries.
    pub bytes: u64,
    /// Whether the node's own extra kept tensors (`Saved::extra_*`) are already freed.
    pub extras_freed: bool,
    /// Elements of the node's parameter gradients alive then, finished or being made.
    pub param_elems: u64,
    /// Bytes of per-thread kernel buffers (independent of the batch).
    pub fixed_workspace: u64,
}

/// flex's im2col tile: at most this many output positions per tile (`ops/conv.rs`, `TILE_SIZE`).
const FLEX_CONV_TILE: u64 = 512;
/// flex's transposed-convolution column buffer is tiled above this size (`ops/conv_transpose.rs`,
/// `COLUMNS_BYTES`).
const FLEX_CONV_TRANSPOSE_COLUMNS: u64 = 8 << 20;

/// Burn (flex): the moments of `op`'s backward pass that can set the step's peak.
/// `tracked[j]`: whether input `j` needs a gradient (batch inputs do not).
///
/// A gradient made by a matrix product is a new flex tensor from `FlexTensor::empty`, whose
/// zeroed `Vec<u8>` is copied into a 16-byte aligned buffer (`Bytes::from_bytes_vec` ->
/// `try_enforce_runtime_align`): two copies exist for a moment. Element-wise backward ops
/// (`relu_backward`, `mask_fill`, `mul` by the dropout mask) write into the incoming
/// gradient when nothing else holds it, adding nothing. burn-autodiff computes an op's
/// input gradient before its weight gradient (`binary`: lhs, then rhs).
pub fn burn_backward(
    op: &Op,
    s: &Sizes,
    tracked: &[bool],
    cpu: BurnCpu,
    act: u64,
) -> Vec<BurnMoment> {
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
        vec![BurnMoment {
            bytes: elems * act,
            param_elems: params,
            ..BurnMoment::default()
        }]
    };
    match op {
        // The im2col product: dy and the gradient of the bias add, then dW as one partial
        // per chunk (up to IM2COL_MAX_CHUNKS, counted as a fixed cost) summed into its twin.
        Op::Conv { .. } if burn_im2col(op, s) => vec![BurnMoment {
            bytes: 2 * out * act,
            param_elems: params + largest,
            fixed_workspace: IM2COL_MAX_CHUNKS as u64 * largest * act,
            ..BurnMoment::default()
        }],
        // `float_matmul` backward: dx = dy W^T, a new matmul output (two copies for a
        // moment); then dW = x^T dy, parameter-sized, also with its twin for a moment.
        Op::Linear { .. } => vec![
            BurnMoment {
                bytes: (out + 2 * dx) * act,
                ..BurnMoment::default()
            },
            BurnMoment {
                bytes: (out + dx) * act,
                param_elems: params + largest,
                ..BurnMoment::default()
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
                moments.push(BurnMoment {
                    bytes: (out + dx) * act,
                    fixed_workspace: cpu.threads
                        * (col * spatial * act).min(FLEX_CONV_TRANSPOSE_COLUMNS),
                    ..BurnMoment::default()
                });
            }
            moments.push(BurnMoment {
                bytes: (out + dx + x_copy + input + 2 * out + tiles) * act,
                param_elems: params,
                ..BurnMoment::default()
            });
            moments
        }
        // `relu_backward`, the clamp masks' `mask_fill`, the dropout `mul`, views, `cat`'s
        // slices and `add`: written into the incoming gradient.
        Op::Relu
        | Op::ClippedRelu { .. }
        | Op::Dropout { .. }
        | Op::Flatten
        | Op::Reshape { .. }
        | Op::Concat { .. }
        | Op::Add => one(out),
        // `embedding_backward` scatters into a parameter-sized zeroed tensor.
        Op::Embedding { .. } => vec![BurnMoment {
            bytes: out * act,
            param_elems: 2 * params,
            ..BurnMoment::default()
        }],
        // `sigmoid`, `float_tanh`, `gelu` recompute the activation from the kept input.
        Op::Tanh | Op::Sigmoid | Op::Gelu => one(out + input),
        // exp recomputed, then the quotient rule's two products.
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
        // The composed norm's backward: dy * gamma, the quotient rule's product and the
        // statistics' reductions, one input-sized temporary at a time.
        Op::BatchNorm { .. } | Op::LayerNorm { .. } => one(out + dx + input),
        // The fused LSTM's backward (both directions at once, one per thread): the output's
        // gradient, each direction's projection gradient `[T, 4H]` and its h_{t-1} rows
        // `[T, H]`, and the recurrent weights' gradients; each direction's thread keeps a
        // gemm packing buffer besides the one the plan counts for the step. Then each
        // projection's `matmul` makes dx (and its twin) and the input weight's gradient
        // while the projection gradients are alive.
        Op::Rnn {
            cell: Cell::Lstm,
            hidden,
            bidirectional,
            ..
        } => {
            let steps = s.in_dims.first().copied().unwrap_or(1) as u64;
            let dirs = if *bidirectional { 2 } else { 1 };
            let (g, h) = (4 * *hidden as u64, *hidden as u64);
            let hh = g * h;
            vec![
                BurnMoment {
                    bytes: (out + dirs * steps * (g + h)) * act,
                    param_elems: dirs * hh,
                    fixed_workspace: dirs.min(cpu.threads) * cpu.gemm_slab,
                    ..BurnMoment::default()
                },
                BurnMoment {
                    bytes: (dirs * steps * g + 2 * dx) * act,
                    extras_freed: true,
                    param_elems: params + largest.max(hh),
                    ..BurnMoment::default()
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
                BurnMoment {
                    bytes: out * act,
                    param_elems: (dirs + 2) * hh,
                    ..BurnMoment::default()
                },
                BurnMoment {
                    bytes: (dirs + 3) * projection * act,
                    extras_freed: true,
                    param_elems: dirs * hh,
                    ..BurnMoment::default()
                },
                BurnMoment {
                    bytes: (dirs * projection + 2 * dx) * act,
                    extras_freed: true,
                    param_elems: params + ih,
                    ..BurnMoment::default()
                },
            ]
        }
    }
}

/// Burn (flex): whether `op` multiplies matrices, not a matrix and a vector, at batch 1,
/// which makes gemm pack and allocate its buffer. A linear layer on one row per sample
/// makes only matrix-vector products at batch 1 (x W and dy W^T have one row, x^T dy a
/// depth of one), which gemm-common's `gemm_basic_generic` hands to `gemv`/`gevv`.
pub fn burn_packs_at_batch_one(op: &Op, s: &Sizes) -> bool {
    match op {
        Op::Linear { in_features, .. } => s.inputs[0] / (*in_features as u64).max(1) > 1,
        Op::Conv { .. } | Op::MatMul | Op::Rnn { .. } => true,
        _ => false,
    }
}

/// Burn (flex): per-sample bytes the forward pass of `op` allocates besides its output and
/// the tensors it keeps for backward, freed before the next op.
pub fn burn_forward(op: &Op, s: &Sizes, act: u64) -> u64 {
    let out = s.output;
    let input = s.inputs.first().copied().unwrap_or(0);
    match op {
        // `matmul` output from `FlexTensor::empty`: zeroed, then copied aligned.
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
        // The fused LSTM: every direction's input projection `[T, 4H]` and its h_t `[T, H]`
        // until the output is assembled.
        Op::Rnn {
            cell: Cell::Lstm,
            hidden,
            ..
        } => rnn_steps_dirs(op, s) * 5 * *hidden as u64 * act,
        // Per direction the input projection `[T, gates x H]` lives through the loop.
        Op::Rnn { cell, hidden, .. } => {
            let steps = s.in_dims.first().copied().unwrap_or(1) as u64;
            steps * (cell.gates() * *hidden) as u64 * act
        }
        _ => 0,
    }
}

/// Burn (flex): bytes of the op's per-thread kernel buffers at its forward pass, which do
/// not grow with the batch: flex `conv3d_impl` gives each busy thread an im2col tile
/// (C_in/groups x k by up to 512 output positions) and gemm's result for it.
pub fn burn_forward_workspace(op: &Op, s: &Sizes, cpu: BurnCpu, act: u64) -> u64 {
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
            cpu.threads * (col + (*out_channels / *groups) as u64) * tile * act
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
            input_tracked: true,
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
    fn relu_keeps_its_output_in_pytorch_its_input_in_burn() {
        let s = sizes(&[512], 512, &[512], &[512]);
        assert!(saved(&Op::Relu, &s, Runtime::Pytorch).output);
        let burn = saved(&Op::Relu, &s, Runtime::Burn);
        assert!(burn.inputs && !burn.output);
        // clamp: two one-byte masks instead of the input.
        let clip = saved(&Op::ClippedRelu { max: 20.0 }, &s, Runtime::Burn);
        assert_eq!((clip.inputs, clip.extra_bytes), (false, 1024));
    }

    /// seed2-dual's conv on a 2-thread CPU. Its input is a batch input: the engine's im2col
    /// product keeps the `[81, 234]` matrix per sample, and its backward holds dy and dy's
    /// contiguous copy. With a tracked input, burn's convolution: dx and its transposed
    /// convolution's column buffers, then the weight gradient (as measured with the engine
    /// before the im2col path: dy, the copies of x and dy, x in NHWC, two tiles).
    #[test]
    fn burn_conv_moments() {
        let op = Op::Conv {
            in_channels: 26,
            out_channels: 26,
            window: Window::square(2, 3, 1, 1),
            groups: 1,
            bias: true,
        };
        let cpu = BurnCpu {
            threads: 2,
            gemm_slab: 512 * 1024,
        };
        let mut s = sizes(&[2106], 2106, &[26, 9, 9], &[26, 9, 9]);
        s.input_tracked = false;
        assert!(burn_im2col(&op, &s));
        assert_eq!(saved(&op, &s, Runtime::Burn).extra_elems, 81 * 234);
        let m = burn_backward(&op, &s, &[false], cpu, 4);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].bytes, 2 * 2106 * 4);
        assert_eq!(m[0].fixed_workspace, 16 * 6084 * 4);
        assert_eq!(burn_forward(&op, &s, 4), 26 * 11 * 11 * 4);
        let s = sizes(&[2106], 2106, &[26, 9, 9], &[26, 9, 9]);
        assert!(!burn_im2col(&op, &s));
        let m = burn_backward(&op, &s, &[true], cpu, 4);
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
