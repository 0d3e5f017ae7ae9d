//! Where the engine's matrix products make gemm keep buffers: its per-thread
//! packing slab (gemm-common 0.19), and the pool threads' slabs when flex or
//! the engine splits a product across rayon's pool.

use super::Burn;
use super::conv::{ConvCpuPath, burn_im2col, conv_cpu_scratch};
use crate::rules::Sizes;
use batchfit_graph::Op;

/// Burn (flex): from which batch one of `op`'s products makes gemm use its per-thread
/// slab (gemm-common 0.19 `gemm_basic_generic`). gemm computes a row-major product
/// transposed, so its `m` is the output's column count and its lhs the right operand
/// transposed. A product with one output row (`n` = 1) or a depth of at most 2 goes to
/// `gemv`/`gevv`; the rest pack the lhs into a per-call buffer instead of the slab when
/// `m <= 2 mc && (m % lanes != 0 || lhs_rs != 1)` ([`crate::host::GemmKernel::uses_slab`]). A linear layer's
/// `x W` and `x^T dy` have `m` = out features and a unit lhs stride; `dy W^T` has
/// `m` = in features and a strided lhs. A linear layer on one row per sample makes
/// only matrix-vector products at batch 1.
pub(super) fn gemm_slab_from(b: &Burn, op: &Op, s: &Sizes) -> Option<u64> {
    let out_cols = s.out_dims.last().copied().unwrap_or(1) as u64;
    match op {
        Op::Linear {
            in_features,
            out_features,
            ..
        } => {
            let rows = s.inputs[0] / (*in_features as u64).max(1);
            let (i, o) = (*in_features as u64, *out_features as u64);
            let used = (i > 2 && b.packs(o, true)) || (s.input_tracked && b.packs(i, false));
            used.then(|| 2u64.div_ceil(rows.max(1)))
        }
        // The convolutions' products run on the pool's threads (`gemm_on_pool_from`).
        Op::Conv { .. } => None,
        // [.., M, K] x [.., K, N]: `m` = N for the product and the right operand's
        // gradient; the left operand's gradient has `m` = K and a strided lhs.
        Op::MatMul => {
            let k = s.in_dims.last().copied().unwrap_or(1) as u64;
            let rows = s.out_dims.iter().rev().nth(1).copied().unwrap_or(1) as u64;
            let used = rows > 1 && (b.packs(out_cols, true) || b.packs(k, false));
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
/// the convolution of a tracked input (engine `cpu/conv.rs`) multiplies by the weight with a
/// strided lhs (`m` = output channels per group), and its gradients with `m` = the
/// im2col width `C_in / groups x k` and a unit stride.
pub(super) fn gemm_on_pool_from(b: &Burn, op: &Op, s: &Sizes) -> Option<u64> {
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
    if b.gpu {
        return None;
    }
    let co = (*out_channels / (*groups).max(1)) as u64;
    let kg = (*in_channels / (*groups).max(1) * window.kernel_elements()) as u64;
    let packs = match conv_cpu_scratch(op, s, b.gpu) {
        _ if burn_im2col(op, s) => b.packs(co, true),
        // Per sample, row-major NCHW results: gemm's `m` is the positions, with a unit
        // lhs stride (forward, the taps' gradient); the weight gradient's is the im2col
        // width with a strided lhs.
        Some((ConvCpuPath::PerSample { .. }, _)) => {
            let spatial = s.output / (*out_channels as u64).max(1);
            b.packs(spatial, true) || b.packs(kg, false)
        }
        _ => b.packs(co, false) || b.packs(kg, true),
    };
    packs.then_some(1)
}

/// flex splits a matrix product across rayon's pool once it reaches 192^3
/// multiply-adds (burn-flex 0.22.1 `ops/matmul.rs`, `PARALLEL_THRESHOLD`: gemm with
/// `Parallelism::Rayon(0)`); a linear layer's products (forward, input and weight
/// gradients) all take `B x rows x in x out` of them. The engine's own CPU ops (im2col
/// product, LSTM) run gemm unsplit, one product per thread, within the one slab counted
/// in [`crate::rules::RuntimeRules::runtime_bytes`].
pub(super) fn pool_from_batch(b: &Burn, op: &Op, s: &Sizes) -> Option<u64> {
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
            if !(b.packs(o, true) || (s.input_tracked && b.packs(i, false))) {
                return None;
            }
            let rows = s.inputs[0] / i.max(1);
            rows * i * o
        }
        // The engine's own convolution runs a product per chunk of samples on the pool's
        // threads, with a chunk for each thread once the batch has a sample for each.
        Op::Conv { .. } if conv_cpu_scratch(op, s, b.gpu).is_some() => {
            return Some(b.cpu.threads.max(1));
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
            return b.packs(co, true).then_some(2);
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
            if !b.packs(n, true) || per_sample == 0 {
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
