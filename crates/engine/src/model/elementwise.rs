//! Element-wise ops: activations, softmax, dropout, and sums and products with
//! broadcasting.

use super::kernel::Kernel;
use super::params::Params;
use super::prod;
use super::reshape::axis_index;
use crate::cpu::act::{clamp_cpu, gelu_cpu, relu_cpu, softmax_rows_cpu};
use crate::cpu::tensor::available;
use batchfit_graph::Op;
use burn::tensor::activation::{
    gelu, hard_sigmoid, hard_swish, leaky_relu, prelu, relu, sigmoid, softmax, tanh,
};
use burn::tensor::{Distribution, Int, Tensor, TensorData};

/// An activation (relu, clipped relu, gelu, tanh, sigmoid, the hard sigmoid and
/// swish, a constant scale); any
/// layout, since it acts on each element alone.
pub(super) fn activation(op: &Op, t: Tensor<2>) -> Tensor<2> {
    match op {
        // Not through a clone: the CPU op writes over x when nothing else holds it.
        Op::Relu if available(&t) => relu_cpu(t).expect("a CPU tensor"),
        Op::Relu => relu(t),
        Op::Clamp { min, max } => {
            clamp_cpu(t.clone(), *min, *max).unwrap_or_else(|| t.clamp(*min, *max))
        }
        Op::LeakyRelu { alpha } => leaky_relu(t, f64::from(*alpha)),
        Op::Gelu => gelu_cpu(t.clone()).unwrap_or_else(|| gelu(t)),
        Op::Tanh => tanh(t),
        Op::Sigmoid => sigmoid(t),
        Op::Exp => t.exp(),
        Op::HardSigmoid { alpha, beta } => hard_sigmoid(t, f64::from(*alpha), f64::from(*beta)),
        Op::HardSwish => hard_swish(t),
        Op::Scale { factor } => t.mul_scalar(*factor),
        _ => unreachable!("{} is not an activation", op.name()),
    }
}

/// Softmax along `axis`, the sample seen as `[before, axis, after]`.
pub(super) fn softmax_along(k: &Kernel, x: Tensor<2>, b: usize, axis: i64) -> Tensor<2> {
    let d = &k.in_dims[0];
    let a = axis_index(d.len(), axis);
    let after = prod(&d[a + 1..]);
    if after == 1
        && let Some(y) = softmax_rows_cpu(x.clone().reshape([b * prod(&d[..a]), d[a]]))
    {
        return y.reshape([b, k.out_elems()]);
    }
    let x = x.reshape([b, prod(&d[..a]), d[a], after]);
    softmax(x, 2).reshape([b, k.out_elems()])
}

/// Inverted dropout: zeroes elements with probability `rate` while training and
/// scales the rest by `1 / (1 - rate)`, so evaluation needs no scaling.
pub(super) fn dropout(x: Tensor<2>, rate: f32, train: bool) -> Tensor<2> {
    if !train || rate <= 0.0 {
        return x;
    }
    let keep = 1.0 - rate as f64;
    if available(&x) {
        let (dims, device) = (x.dims(), x.device());
        let mask = bernoulli_mask(dims[0] * dims[1], keep, &device);
        return x * Tensor::<2>::from_data(TensorData::new(mask, dims), &device);
    }
    let mask = Tensor::<2>::random(x.dims(), Distribution::Bernoulli(keep), &x.device());
    x * mask.div_scalar(keep as f32)
}

/// `len` values, each `1 / keep` with probability `keep` and 0 otherwise, drawn on
/// the CPU's threads. Written by hand because burn's `Distribution::Bernoulli`
/// draws each element through a ChaCha sampler: 19 % of a small GPT's step went
/// there. Each chunk runs its own xoshiro generator (rand's `SmallRng`), seeded from
/// burn's generator so a seeded run draws the same masks.
fn bernoulli_mask(len: usize, keep: f64, device: &burn::tensor::Device) -> Vec<f32> {
    use rand::rngs::SmallRng;
    use rand::{RngCore, SeedableRng};
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 16;
    let seed_bits = Tensor::<1>::random([2], Distribution::Uniform(0.0, 1.0), device)
        .into_data()
        .try_to_vec::<f32>()
        .unwrap_or_default();
    let seed = seed_bits
        .iter()
        .fold(0u64, |acc, v| (acc << 32) | u64::from(v.to_bits()));
    let threshold = (keep * 4_294_967_296.0) as u64;
    let scale = (1.0 / keep) as f32;
    let mut mask = vec![0.0f32; len];
    mask.par_chunks_mut(CHUNK)
        .enumerate()
        .for_each(|(k, chunk)| {
            let mut rng =
                SmallRng::seed_from_u64(seed ^ (k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            for m in chunk {
                if u64::from(rng.next_u32()) < threshold {
                    *m = scale;
                }
            }
        });
    mask
}

/// Stochastic depth: zeroes whole samples with probability `rate` while training
/// and scales the rest by `1 / (1 - rate)`; one mask value per sample, broadcast.
pub(super) fn drop_path(x: Tensor<2>, rate: f32, train: bool) -> Tensor<2> {
    if !train || rate <= 0.0 {
        return x;
    }
    let keep = 1.0 - rate as f64;
    let [b, _] = x.dims();
    let mask = Tensor::<2>::random([b, 1], Distribution::Bernoulli(keep), &x.device());
    x * mask.div_scalar(keep as f32)
}

/// The sum or product (`k.op`) of two values, broadcast when their shapes differ or
/// one is shared (a batch of 1).
pub(super) fn binary(k: &Kernel, x: Tensor<2>, y: Tensor<2>, b: usize) -> Tensor<2> {
    if k.in_dims[0] != k.in_dims[1] || k.in_shared[0] != k.in_shared[1] {
        let batch = |i: usize| if k.in_shared[i] { 1 } else { b };
        return broadcast_binary(
            &k.op,
            (x, &k.in_dims[0], batch(0)),
            (y, &k.in_dims[1], batch(1)),
            b,
            k.out_elems(),
        );
    }
    match k.op {
        Op::Add => x + y,
        Op::Div => x / y,
        _ => x * y,
    }
}

/// Element-wise op with numpy broadcasting, through rank-6 tensors `[B, d1..d5]`; each
/// operand with its sample dims and its batch (1 for a shared one).
fn broadcast_binary(
    op: &Op,
    (x, xd, xb): (Tensor<2>, &[usize], usize),
    (y, yd, yb): (Tensor<2>, &[usize], usize),
    b: usize,
    out_elems: usize,
) -> Tensor<2> {
    let pad = |d: &[usize], batch: usize| -> [usize; 6] {
        let mut s = [1usize; 6];
        s[0] = batch;
        let off = 6 - d.len();
        s[off..].copy_from_slice(d);
        s
    };
    assert!(
        xd.len() <= 5 && yd.len() <= 5,
        "broadcasting supports up to 5 sample dims"
    );
    let x6: Tensor<6> = x.reshape(pad(xd, xb));
    let y6: Tensor<6> = y.reshape(pad(yd, yb));
    let z = match op {
        Op::Add => x6 + y6,
        Op::Div => x6 / y6,
        _ => x6 * y6,
    };
    z.reshape([b, out_elems])
}

/// Where a parameter of `shape` broadcast against `sample` (from the right) varies:
/// the sample as `(before, mid, after)` with the parameter's non-1 axes all in `mid`
/// and equal to the sample's there; `None` when they do not form one run.
pub(super) fn broadcast_run(sample: &[usize], shape: &[usize]) -> Option<(usize, usize, usize)> {
    let r = sample.len();
    if shape.len() > r {
        return None;
    }
    let mut padded = vec![1; r - shape.len()];
    padded.extend(shape);
    let varying: Vec<usize> = (0..r).filter(|&k| padded[k] != 1).collect();
    let (lo, hi) = match (varying.first(), varying.last()) {
        (Some(&lo), Some(&hi)) => (lo, hi + 1),
        _ => (r, r),
    };
    (lo..hi).all(|k| padded[k] == sample[k]).then(|| {
        (
            prod(&sample[..lo]),
            prod(&sample[lo..hi]),
            prod(&sample[hi..]),
        )
    })
}

/// How a learned tensor meets the activation.
#[derive(Clone, Copy)]
pub(super) enum Combine {
    Add,
    Mul,
    /// `x` where positive, else `p x` (burn's `prelu`, the slope over axis 1).
    PRelu,
}

/// `x + p`, `x * p` or `prelu(x, p)` for a learned `p` of `shape` broadcast against the
/// sample (stored flat): `AddParam`, `MulParam` (a layer scale), `PRelu`.
pub(super) fn learned(
    k: &Kernel,
    p: &Params,
    x: Tensor<2>,
    b: usize,
    shape: &[usize],
    combine: Combine,
) -> Tensor<2> {
    let learned = p.t1(k.params[0]);
    broadcast_learned(k, x, b, shape, learned, combine)
}

/// `x + t[index]` for a learned table `t` read at constant indices, broadcast as
/// [`learned`]'s (burn's `select` scatters the gradient back into the table).
pub(super) fn add_table(
    k: &Kernel,
    p: &Params,
    x: Tensor<2>,
    b: usize,
    shape: &[usize],
    index: &[usize],
) -> Tensor<2> {
    let ids: Vec<i64> = index.iter().map(|&i| i as i64).collect();
    let ids = Tensor::<1, Int>::from_data(TensorData::new(ids, [index.len()]), &x.device());
    let read = p.t1(k.params[0]).select(0, ids);
    broadcast_learned(k, x, b, shape, read, Combine::Add)
}

/// `x` combined with `learned` (one run of the sample's axes, [`broadcast_run`]).
fn broadcast_learned(
    k: &Kernel,
    x: Tensor<2>,
    b: usize,
    shape: &[usize],
    learned: Tensor<1>,
    combine: Combine,
) -> Tensor<2> {
    let (before, mid, after) =
        broadcast_run(&k.in_dims[0], shape).expect("checked by check_trainable");
    let out = [b, k.out_elems()];
    let x = x.reshape([b, before, mid, after]);
    match combine {
        Combine::Add => (x + learned.reshape([1, 1, mid, 1])).reshape(out),
        Combine::Mul => (x * learned.reshape([1, 1, mid, 1])).reshape(out),
        Combine::PRelu => prelu(x.reshape([b * before, mid, after]), learned).reshape(out),
    }
}

/// `x + c` or `x * c` for an untracked constant `c` of `shape` broadcast against the
/// sample (numpy's rules, through rank-6 tensors `[B, d1..d5]`; the sum keeps nothing for
/// the backward, the product only `c`).
pub(super) fn with_const(
    k: &Kernel,
    x: Tensor<2>,
    b: usize,
    shape: &[usize],
    values: &[f32],
    how: Combine,
) -> Tensor<2> {
    let pad = |lead: usize, d: &[usize]| -> [usize; 6] {
        let mut s = [1usize; 6];
        s[0] = lead;
        s[6 - d.len()..].copy_from_slice(d);
        s
    };
    let c = Tensor::<1>::from_data(
        TensorData::new(values.to_vec(), [values.len()]),
        &x.device(),
    );
    let (x, c): (Tensor<6>, Tensor<6>) =
        (x.reshape(pad(b, &k.in_dims[0])), c.reshape(pad(1, shape)));
    let y = match how {
        Combine::Mul => x * c,
        _ => x + c,
    };
    y.reshape([b, k.out_elems()])
}

/// Scores `[.., T, T]` plus a causal mask: -inf above the diagonal, an untracked
/// constant (nothing kept for the backward, as PyTorch's `scores + mask`).
pub(super) fn causal_mask(k: &Kernel, x: Tensor<2>, b: usize) -> Tensor<2> {
    let d = &k.in_dims[0];
    let t = d[d.len() - 1];
    let outer = b * prod(&d[..d.len() - 2]);
    let mask: Vec<f32> = (0..t * t)
        .map(|i| {
            if i % t > i / t {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    let mask = Tensor::<2>::from_data(TensorData::new(mask, [t, t]), &x.device());
    (x.reshape([outer, t, t]) + mask.unsqueeze::<3>()).reshape([b, k.out_elems()])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropout_mask_keeps_the_asked_fraction_scaled() {
        let device = burn::tensor::Device::default();
        let (len, keep) = (1 << 20, 0.7);
        let mask = bernoulli_mask(len, keep, &device);
        let scale = (1.0 / keep) as f32;
        assert!(mask.iter().all(|&m| m == 0.0 || m == scale));
        let kept = mask.iter().filter(|&&m| m != 0.0).count() as f64 / len as f64;
        // The fraction's standard deviation is 0.0005 here: 0.01 is 20 of them.
        assert!((kept - keep).abs() < 0.01, "kept {kept}");
        // Chunks draw different numbers.
        assert_ne!(mask[..1 << 16], mask[1 << 16..2 << 16]);
    }
}
