//! Matrix products: dense (linear) layers, products of two activations, and
//! embedding lookups.

use super::kernel::Kernel;
use super::params::Params;
use super::{Value, prod};
use crate::cpu::dense::{linear_cpu, matmul_cpu};
use burn::tensor::Tensor;
use burn::tensor::module::embedding;

/// `x W + b` over the last dimension, every leading position of a sample as a row.
pub(super) fn linear(
    k: &Kernel,
    p: &Params,
    x: Tensor<2>,
    b: usize,
    in_features: usize,
    out_features: usize,
) -> Tensor<2> {
    let rows = prod(&k.in_dims[0]) / in_features;
    let x = x.reshape([b * rows, in_features]);
    let bias = k.params.get(1).map(|&bias| p.t1(bias));
    // The CPU's own op (engine `cpu/dense.rs`); burn's matmul and broadcast add elsewhere.
    if let Some(y) = linear_cpu(x.clone(), p.t2(k.params[0]), bias) {
        return y.reshape([b, rows * out_features]);
    }
    let mut y = x.matmul(p.t2(k.params[0]));
    if let Some(&bias) = k.params.get(1) {
        y = y + p.t1(bias).unsqueeze::<2>();
    }
    y.reshape([b, rows * out_features])
}

/// The batched product of two activations over their last two dimensions.
pub(super) fn matmul(k: &Kernel, x: Tensor<2>, y: Tensor<2>, b: usize) -> Tensor<2> {
    let (a_dims, b_dims) = (&k.in_dims[0], &k.in_dims[1]);
    let r = a_dims.len();
    let batch: usize = b * prod(&a_dims[..r - 2]);
    let a = x.reshape([batch, a_dims[r - 2], a_dims[r - 1]]);
    let c = y.reshape([batch, b_dims[r - 2], b_dims[r - 1]]);
    matmul_cpu(a.clone(), c.clone())
        .unwrap_or_else(|| a.matmul(c))
        .reshape([b, k.out_elems()])
}

/// The embedding rows of token ids `[B, T]`, as `[B, T · dim]`.
pub(super) fn embedding_lookup(
    k: &Kernel,
    p: &Params,
    ids: Value,
    b: usize,
    dim: usize,
) -> Tensor<2> {
    let ids = match ids {
        Value::Tokens(t) => t,
        Value::Float(_) | Value::ConvRows(_) => unreachable!("embedding reads token ids"),
    };
    let steps = ids.dims()[1];
    embedding(p.t2(k.params[0]), ids).reshape([b, steps * dim])
}
