//! Normalisation: batch norm over the channel axis, layer norm over the last.

use super::compile::Kernel;
use super::params::Params;
use super::prod;
use burn::tensor::Tensor;

/// Batch normalisation with the batch's own statistics (training mode), per channel.
pub(super) fn batch_norm(
    k: &Kernel,
    p: &Params,
    x: Tensor<2>,
    b: usize,
    features: usize,
) -> Tensor<2> {
    let x = x.reshape([b, features, prod(&k.in_dims[0]) / features]);
    let mean = x.clone().mean_dim(0).mean_dim(2);
    let centered = x - mean;
    let var = centered.clone().powi_scalar(2).mean_dim(0).mean_dim(2);
    let y = centered / (var + 1e-5).sqrt();
    let gamma = p.t1(k.params[0]).reshape([1, features, 1]);
    let beta = p.t1(k.params[1]).reshape([1, features, 1]);
    (y * gamma + beta).reshape([b, k.out_elems()])
}

/// Layer normalisation over the last `features` values of every position.
pub(super) fn layer_norm(
    k: &Kernel,
    p: &Params,
    x: Tensor<2>,
    b: usize,
    features: usize,
) -> Tensor<2> {
    let rows = b * prod(&k.in_dims[0]) / features;
    let x = x.reshape([rows, features]);
    let mean = x.clone().mean_dim(1);
    let centered = x - mean;
    let var = centered.clone().powi_scalar(2).mean_dim(1);
    let y = centered / (var + 1e-5).sqrt();
    let y = y * p.t1(k.params[0]).unsqueeze::<2>() + p.t1(k.params[1]).unsqueeze::<2>();
    y.reshape([b, k.out_elems()])
}
