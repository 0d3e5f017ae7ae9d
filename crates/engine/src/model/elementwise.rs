//! Element-wise ops: activations, softmax, dropout, and sums and products with
//! broadcasting.

use super::compile::Kernel;
use super::prod;
use super::reshape::axis_index;
use batchfit_graph::Op;
use burn::tensor::activation::{gelu, hard_sigmoid, hard_swish, relu, sigmoid, softmax, tanh};
use burn::tensor::{Distribution, Tensor};

/// An activation (relu, clipped relu, gelu, tanh, sigmoid, the hard sigmoid and
/// swish, a constant scale); any
/// layout, since it acts on each element alone.
pub(super) fn activation(op: &Op, t: Tensor<2>) -> Tensor<2> {
    match op {
        Op::Relu => relu(t),
        Op::ClippedRelu { max } => t.clamp(0.0, *max),
        Op::Gelu => gelu(t),
        Op::Tanh => tanh(t),
        Op::Sigmoid => sigmoid(t),
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
    let x = x.reshape([b, prod(&d[..a]), d[a], prod(&d[a + 1..])]);
    softmax(x, 2).reshape([b, k.out_elems()])
}

/// Inverted dropout: zeroes elements with probability `rate` while training and
/// scales the rest by `1 / (1 - rate)`, so evaluation needs no scaling.
pub(super) fn dropout(x: Tensor<2>, rate: f32, train: bool) -> Tensor<2> {
    if !train || rate <= 0.0 {
        return x;
    }
    let keep = 1.0 - rate as f64;
    let mask = Tensor::<2>::random(x.dims(), Distribution::Bernoulli(keep), &x.device());
    x * mask.div_scalar(keep as f32)
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

/// The sum or product (`k.op`) of two values, broadcast when their shapes differ.
pub(super) fn binary(k: &Kernel, x: Tensor<2>, y: Tensor<2>, b: usize) -> Tensor<2> {
    if k.in_dims[0] != k.in_dims[1] {
        return broadcast_binary(&k.op, x, &k.in_dims[0], y, &k.in_dims[1], b, k.out_elems());
    }
    if matches!(k.op, Op::Add) {
        x + y
    } else {
        x * y
    }
}

/// Element-wise op with numpy broadcasting, through rank-6 tensors `[B, d1..d5]`.
fn broadcast_binary(
    op: &Op,
    x: Tensor<2>,
    xd: &[usize],
    y: Tensor<2>,
    yd: &[usize],
    b: usize,
    out_elems: usize,
) -> Tensor<2> {
    let pad = |d: &[usize]| -> [usize; 6] {
        let mut s = [1usize; 6];
        s[0] = b;
        let off = 6 - d.len();
        s[off..].copy_from_slice(d);
        s
    };
    assert!(
        xd.len() <= 5 && yd.len() <= 5,
        "broadcasting supports up to 5 sample dims"
    );
    let x6: Tensor<6> = x.reshape(pad(xd));
    let y6: Tensor<6> = y.reshape(pad(yd));
    let z = if matches!(op, Op::Add) {
        x6 + y6
    } else {
        x6 * y6
    };
    z.reshape([b, out_elems])
}
