//! burn's convolutions as the engine runs them: the im2col product of a batch
//! input (engine `model/conv.rs`), the engine's own convolution of a tracked
//! input on the CPU (engine `cpu/conv.rs`), and flex's convolution elsewhere.

use super::Burn;
use crate::rules::{BackwardMoment, Saved, Sizes};
use batchfit_graph::Op;

/// Burn: whether the engine runs `op` as one im2col matrix product (engine
/// `model/conv.rs` `conv_im2col`): a convolution without dilation or groups whose input
/// needs no gradient.
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

/// Burn (CPU): samples per chunk of the engine's convolution of a tracked input
/// (engine `cpu/conv.rs`): enough for about [`CONV_CHUNK_ROWS`] output positions, so
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

/// How the engine's CPU convolution of a tracked input (engine `cpu/conv.rs`) computes.
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
/// convolution of a tracked input (engine `cpu/conv.rs`); above, burn's.
pub const CONV_MAX_SAMPLE_COLS_BYTES: u64 = 16 << 20;

/// The engine's CPU convolution of a tracked input (engine `cpu/conv.rs`), when it runs
/// `op`: its path and the elements of one busy thread's scratch. The chunked path holds a
/// chunk's im2col rows and their product (rows x (k + C_out)) and a group's padded image;
/// the per-sample one a sample's unfolded taps (k x positions) and its padded image, or
/// nothing when pointwise. `k` is a group's im2col row length; a grouped convolution
/// builds one group's rows at a time.
pub(super) fn conv_cpu_scratch(op: &Op, s: &Sizes, gpu: bool) -> Option<(ConvCpuPath, u64)> {
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

/// What a convolution keeps for its backward.
pub(super) fn saved(op: &Op, s: &Sizes) -> Saved {
    // The im2col product keeps its matrix (`float_matmul` checkpoints the lhs when the
    // weight is tracked); the untracked input's pad and window views are not recorded.
    if burn_im2col(op, s) {
        return Saved {
            extra_elems: im2col_elems(op, s),
            ..Saved::default()
        };
    }
    // `conv2d`/`conv1d` (ops/module.rs) keep x, weight, bias, as the engine's own op does.
    Saved {
        inputs: true,
        ..Saved::default()
    }
}

/// The moments of a transposed convolution's backward (burn-backend modules/conv.rs):
/// `conv_transpose2d_x_backward` is flex's im2col convolution of dy by the weight
/// (`conv3d_impl`: dy in NHWC, dx, each busy thread's column tile);
/// `conv_transpose2d_weight_grad_no_groups` convolves the swapped dy by the swapped x as
/// its kernel (both copied by `to_contiguous`, x again as `w_flat`, dy again in NHWC) with
/// the batch as channels: each busy thread's tile is B x the input's positions x up to
/// 512 kernel positions.
pub(super) fn transpose_backward(
    b: &Burn,
    op: &Op,
    s: &Sizes,
    dx: u64,
    act: u64,
) -> Vec<BackwardMoment> {
    let Op::ConvTranspose {
        in_channels,
        out_channels,
        window,
        groups,
        ..
    } = op
    else {
        unreachable!("the dispatcher sends only transposed convolutions here")
    };
    let (out, input) = (s.output, s.inputs.first().copied().unwrap_or(0));
    let k = window.kernel_elements() as u64;
    let cpu = b.cpu;
    let mut moments = Vec::new();
    if dx > 0 {
        let col = (*out_channels / *groups) as u64 * k;
        let in_spatial = input / (*in_channels as u64).max(1);
        moments.push(BackwardMoment {
            bytes: (out + out + dx) * act,
            param_elems: op.param_count(),
            fixed_workspace: cpu.threads * col * in_spatial.min(FLEX_CONV_TILE) * act,
            ..BackwardMoment::default()
        });
    }
    let in_positions = input / (*in_channels as u64).max(1);
    let busy = cpu.threads.min(*out_channels as u64).max(1);
    let tiles = busy * in_positions * k.min(FLEX_CONV_TILE);
    moments.push(BackwardMoment {
        bytes: (out + dx + out + input + input + out + tiles) * act,
        param_elems: op.param_count(),
        ..BackwardMoment::default()
    });
    moments
}

/// Burn (flex): bytes of a convolution's per-thread kernel buffers at its forward pass,
/// which do not grow with the batch: flex `conv3d_impl` gives each busy thread an im2col
/// tile (C_in/groups x k by up to 512 output positions) and gemm's result for it. The
/// engine's own convolution of a tracked input gives each busy thread its chunk's im2col
/// rows, their product and a padded image.
pub(super) fn forward_workspace(b: &Burn, op: &Op, s: &Sizes, act: u64) -> u64 {
    if let Some((_, scratch)) = conv_cpu_scratch(op, s, b.gpu) {
        return b.cpu.threads * scratch * act;
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
            b.cpu.threads * (col + (*out_channels / *groups) as u64) * tile * act
        }
        _ => 0,
    }
}

/// Per-sample bytes a convolution's forward allocates besides its output and what it keeps.
pub(super) fn forward_temporaries(op: &Op, s: &Sizes, act: u64) -> u64 {
    let out = s.output;
    let input = s.inputs.first().copied().unwrap_or(0);
    match op {
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
        // The engine's own op and flex `conv3d_impl`: the input converted to NHWC (`x_nhwc`).
        _ => input * act,
    }
}

/// The moments of a convolution's backward.
pub(super) fn backward(b: &Burn, op: &Op, s: &Sizes, dx: u64, act: u64) -> Vec<BackwardMoment> {
    let cpu = b.cpu;
    let out = s.output;
    let input = s.inputs.first().copied().unwrap_or(0);
    let params: u64 = op.param_count();
    let largest = op.params().iter().map(|p| p.elements()).max().unwrap_or(0);
    // The im2col product: dy and the gradient of the bias add, then dW as one partial
    // per chunk (up to IM2COL_MAX_CHUNKS, counted as a fixed cost) summed into its twin.
    if burn_im2col(op, s) {
        return vec![BackwardMoment {
            bytes: 2 * out * act,
            param_elems: params + largest,
            fixed_workspace: IM2COL_MAX_CHUNKS as u64 * largest * act,
            ..BackwardMoment::default()
        }];
    }
    // The engine's own convolution (engine `cpu/conv.rs`): dy, the zeroed dx, and per busy
    // thread its scratch (`conv_cpu_scratch`: the forward's, reused for the rows'
    // gradient) and its sum of the weight gradient (one piece of the batch per thread;
    // the first sum becomes the gradient itself, so the others are the extra). A grouped
    // convolution runs a product per group on its block of each row.
    if let Some((_, scratch)) = conv_cpu_scratch(op, s, b.gpu) {
        return vec![BackwardMoment {
            bytes: (out + dx) * act,
            param_elems: params,
            fixed_workspace: (cpu.threads * scratch + cpu.threads.saturating_sub(1) * largest)
                * act,
            ..BackwardMoment::default()
        }];
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
    let Op::Conv {
        in_channels,
        out_channels,
        window,
        groups,
        ..
    } = op
    else {
        unreachable!("the dispatcher sends only convolutions here")
    };
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
            fixed_workspace: cpu.threads * (col * spatial * act).min(FLEX_CONV_TRANSPOSE_COLUMNS),
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
