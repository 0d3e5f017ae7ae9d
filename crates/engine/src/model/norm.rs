//! Normalisation: batch norm over the channel axis, layer norm over the last,
//! instance norm over each channel's positions, local response normalisation across
//! channels.

use super::kernel::Kernel;
use super::params::Params;
use super::prod;
use crate::cpu::norm::{batch_norm_cpu, layer_norm_cpu};
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
    let (gamma, beta) = (p.t1(k.params[0]), p.t1(k.params[1]));
    // The CPU's fused op (engine `cpu/norm.rs`); composed of burn ops elsewhere.
    if let Some(y) = batch_norm_cpu(x.clone(), gamma.clone(), beta.clone()) {
        return y.reshape([b, k.out_elems()]);
    }
    let mean = x.clone().mean_dim(0).mean_dim(2);
    let centered = x - mean;
    let var = centered.clone().powi_scalar(2).mean_dim(0).mean_dim(2);
    let y = centered / (var + 1e-5).sqrt();
    let gamma = gamma.reshape([1, features, 1]);
    let beta = beta.reshape([1, features, 1]);
    (y * gamma + beta).reshape([b, k.out_elems()])
}

/// Instance normalisation: each `(sample, channel)` row normalised over its positions by
/// the layer norm (the CPU's fused one with a scale of ones and a shift of zeros, neither
/// trained), then the per-channel scale and shift when `affine`.
pub(super) fn instance_norm(
    k: &Kernel,
    p: &Params,
    x: Tensor<2>,
    b: usize,
    channels: usize,
    affine: bool,
) -> Tensor<2> {
    let positions = prod(&k.in_dims[0]) / channels;
    let rows = x.reshape([b * channels, positions]);
    let device = rows.device();
    let (ones, zeros) = (
        Tensor::<1>::ones([positions], &device),
        Tensor::<1>::zeros([positions], &device),
    );
    let y = layer_norm_cpu(rows.clone(), ones, zeros).unwrap_or_else(|| {
        let centered = rows.clone() - rows.mean_dim(1);
        let var = centered.clone().powi_scalar(2).mean_dim(1);
        centered / (var + 1e-5).sqrt()
    });
    let y = y.reshape([b, channels, positions]);
    let y = match affine {
        true => {
            let gamma = p.t1(k.params[0]).reshape([1, channels, 1]);
            let beta = p.t1(k.params[1]).reshape([1, channels, 1]);
            y * gamma + beta
        }
        false => y,
    };
    y.reshape([b, k.out_elems()])
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
    let (gamma, beta) = (p.t1(k.params[0]), p.t1(k.params[1]));
    // The CPU's fused op (engine `cpu/norm.rs`); composed of burn ops elsewhere.
    if let Some(y) = layer_norm_cpu(x.clone(), gamma.clone(), beta.clone()) {
        return y.reshape([b, k.out_elems()]);
    }
    let mean = x.clone().mean_dim(1);
    let centered = x - mean;
    let var = centered.clone().powi_scalar(2).mean_dim(1);
    let y = centered / (var + 1e-5).sqrt();
    let y = y * gamma.unsqueeze::<2>() + beta.unsqueeze::<2>();
    y.reshape([b, k.out_elems()])
}

/// Root-mean-square normalisation over the last `features` values of every position,
/// composed of burn ops (autodiff differentiates it), with T5's and LLaMA's epsilon.
pub(super) fn rms_norm(
    k: &Kernel,
    p: &Params,
    x: Tensor<2>,
    b: usize,
    features: usize,
) -> Tensor<2> {
    let rows = b * prod(&k.in_dims[0]) / features;
    let x = x.reshape([rows, features]);
    let rms = (x.clone().powi_scalar(2).mean_dim(1) + 1e-6).sqrt();
    let y = x / rms * p.t1(k.params[0]).unsqueeze::<2>();
    y.reshape([b, k.out_elems()])
}

/// Local response normalisation across channels (ONNX `LRN`): each value divided by
/// `(bias + alpha / size * sum of the squares of `size` neighbouring channels)^beta`,
/// the window taking `(size - 1) / 2` channels before and the rest after.
pub(super) fn lrn(
    k: &Kernel,
    x: Tensor<2>,
    b: usize,
    size: usize,
    alpha: f32,
    beta: f32,
    bias: f32,
) -> Tensor<2> {
    let channels = k.in_dims[0][0];
    let spatial = prod(&k.in_dims[0][1..]);
    let x = x.reshape([b, channels, spatial]);
    let squares = x.clone() * x.clone();
    let (before, after) = ((size - 1) / 2, size - 1 - (size - 1) / 2);
    let device = x.device();
    let mut parts = Vec::with_capacity(3);
    if before > 0 {
        parts.push(Tensor::<3>::zeros([b, before, spatial], &device));
    }
    parts.push(squares);
    if after > 0 {
        parts.push(Tensor::<3>::zeros([b, after, spatial], &device));
    }
    let padded = Tensor::cat(parts, 1);
    let mut sum = padded.clone().slice([0..b, 0..channels, 0..spatial]);
    for s in 1..size {
        sum = sum + padded.clone().slice([0..b, s..s + channels, 0..spatial]);
    }
    let scale = (sum.mul_scalar(alpha / size as f32).add_scalar(bias)).powf_scalar(beta);
    (x / scale).reshape([b, k.out_elems()])
}
