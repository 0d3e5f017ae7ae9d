//! Pooling: windowed max and average (an average as one product with a window
//! matrix where it fits), global pooling, and resizing.

use super::conv::pads2;
use super::kernel::Kernel;
use super::prod;
use crate::cpu::pool::max_pool2d_cpu;
use batchfit_graph::{PoolKind, ResizeMode, Window};
use batchfit_plan::rules::POOL_MATRIX_MAX;
use burn::tensor::Tensor;
use burn::tensor::module::{avg_pool1d, avg_pool2d, interpolate, max_pool1d, max_pool2d};
use burn::tensor::ops::{AvgPoolOptions, InterpolateMode, InterpolateOptions, MaxPoolOptions};

/// Max or average pooling by burn over `[B, C, L]` or `[B, C, H, W]`.
pub(super) fn pool(
    k: &Kernel,
    x: Tensor<2>,
    b: usize,
    pool: PoolKind,
    window: &Window,
) -> Tensor<2> {
    let d = &k.in_dims[0];
    if window.spatial() == 1 {
        let x = x.reshape([b, d[0], d[1]]);
        let pad = (window.padding[0][0], window.padding[0][1]);
        let y = match pool {
            PoolKind::Max => max_pool1d(
                x,
                MaxPoolOptions {
                    kernel_size: [window.kernel[0]],
                    stride: [window.stride[0]],
                    padding: [pad],
                    dilation: [window.dilation[0]],
                    ceil_mode: false,
                },
            ),
            PoolKind::Avg => avg_pool1d(
                x,
                AvgPoolOptions {
                    kernel_size: [window.kernel[0]],
                    stride: [window.stride[0]],
                    padding: [pad],
                    count_include_pad: false,
                    ceil_mode: false,
                },
            ),
        };
        y.reshape([b, k.out_elems()])
    } else {
        let x = x.reshape([b, d[0], d[1], d[2]]);
        let kernel = [window.kernel[0], window.kernel[1]];
        let stride = [window.stride[0], window.stride[1]];
        if pool == PoolKind::Max
            && window.dilation.iter().all(|&d| d == 1)
            && let Some(y) = max_pool2d_cpu(x.clone(), kernel, stride, pads2(window))
        {
            return y.reshape([b, k.out_elems()]);
        }
        let y = match pool {
            PoolKind::Max => max_pool2d(
                x,
                MaxPoolOptions {
                    kernel_size: kernel,
                    stride,
                    padding: pads2(window),
                    dilation: [window.dilation[0], window.dilation[1]],
                    ceil_mode: false,
                },
            ),
            PoolKind::Avg => avg_pool2d(
                x,
                AvgPoolOptions {
                    kernel_size: kernel,
                    stride,
                    padding: pads2(window),
                    count_include_pad: false,
                    ceil_mode: false,
                },
            ),
        };
        y.reshape([b, k.out_elems()])
    }
}

/// The max or mean of each channel over all its spatial positions.
pub(super) fn global_pool(k: &Kernel, x: Tensor<2>, b: usize, pool: PoolKind) -> Tensor<2> {
    let d = &k.in_dims[0];
    let x = x.reshape([b, d[0], prod(&d[1..])]);
    let y = match pool {
        PoolKind::Max => x.max_dim(2),
        PoolKind::Avg => x.mean_dim(2),
    };
    y.reshape([b, k.out_elems()])
}

/// An average pool as the matrix `[in spatial, out spatial]` whose product with a row
/// of input values gives the row of window means (padding left out of the count, as
/// `count_include_pad: false`). One small GEMM each way instead of flex's pooling
/// kernels (its backward scatters element by element); `None` for dilated windows or
/// a matrix over [`POOL_MATRIX_MAX`].
pub(super) fn avg_pool_matrix(input: &[usize], output: &[usize], w: &Window) -> Option<Vec<f32>> {
    let (n_in, n_out) = (prod(input), prod(output));
    if w.dilation.iter().any(|&d| d != 1) || n_in * n_out > POOL_MATRIX_MAX {
        return None;
    }
    let mut m = vec![0.0f32; n_in * n_out];
    let mut out_idx = vec![0usize; output.len()];
    for o in 0..n_out {
        // The window's valid input range along each spatial axis.
        let ranges: Vec<(usize, usize)> = (0..output.len())
            .map(|a| {
                let start = (out_idx[a] * w.stride[a]) as i64 - w.padding[a][0] as i64;
                let end = (start + w.kernel[a] as i64).min(input[a] as i64);
                (start.max(0) as usize, end.max(0) as usize)
            })
            .collect();
        let count: usize = ranges.iter().map(|(a, b)| b.saturating_sub(*a)).product();
        if count > 0 {
            let mut in_idx: Vec<usize> = ranges.iter().map(|r| r.0).collect();
            'window: loop {
                let flat = in_idx
                    .iter()
                    .zip(input)
                    .fold(0, |acc, (&i, &n)| acc * n + i);
                m[flat * n_out + o] = 1.0 / count as f32;
                for a in (0..in_idx.len()).rev() {
                    in_idx[a] += 1;
                    if in_idx[a] < ranges[a].1 {
                        continue 'window;
                    }
                    in_idx[a] = ranges[a].0;
                }
                break;
            }
        }
        for a in (0..out_idx.len()).rev() {
            out_idx[a] += 1;
            if out_idx[a] < output[a] {
                break;
            }
            out_idx[a] = 0;
        }
    }
    Some(m)
}

/// `[B, C, H, W]` resized to `size` by burn's `interpolate` (2 spatial axes: checked by
/// `check_trainable`).
pub(super) fn resize(
    k: &Kernel,
    x: Tensor<2>,
    b: usize,
    size: &[usize],
    mode: ResizeMode,
    align_corners: bool,
) -> Tensor<2> {
    let d = &k.in_dims[0];
    let mode = match mode {
        ResizeMode::Nearest => InterpolateMode::Nearest,
        ResizeMode::Linear => InterpolateMode::Bilinear,
        ResizeMode::Cubic => InterpolateMode::Bicubic,
    };
    let options = InterpolateOptions::new(mode)
        .with_output_size([size[0], size[1]])
        .with_align_corners(align_corners);
    interpolate(x.reshape([b, d[0], d[1], d[2]]), options).reshape([b, k.out_elems()])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::max_rel_err;
    use burn::tensor::{Device, Distribution, TensorData};

    /// The window matrix against burn's average pooling, with padding (left out of
    /// the count), strides, overlapping windows and a 1-d pool.
    #[test]
    fn avg_pool_matrix_matches_burn_pooling() {
        let device = Device::flex();
        device.seed(5);
        // (input [B, C, H, W], kernel, stride, padding)
        let cases = [
            ([2, 3, 9, 9], [3, 3], [3, 3], [(0, 0), (0, 0)]),
            ([2, 2, 7, 6], [3, 2], [2, 1], [(1, 1), (1, 0)]),
            ([3, 2, 1, 10], [1, 3], [1, 2], [(0, 0), (1, 1)]),
        ];
        for (xd, kernel, stride, pads) in cases {
            let x = Tensor::<4>::random(xd, Distribution::Normal(0.0, 1.0), &device);
            let opts = AvgPoolOptions {
                kernel_size: kernel,
                stride,
                padding: pads,
                count_include_pad: false,
                ceil_mode: false,
            };
            let want = avg_pool2d(x.clone(), opts);
            let [b, c, oh, ow] = want.dims();
            let window = Window {
                kernel: kernel.to_vec(),
                stride: stride.to_vec(),
                padding: pads.iter().map(|&(a, z)| [a, z]).collect(),
                dilation: vec![1, 1],
            };
            let m = avg_pool_matrix(&xd[2..], &[oh, ow], &window).expect("small");
            let m = Tensor::<2>::from_data(TensorData::new(m, [xd[2] * xd[3], oh * ow]), &device);
            let got = x
                .reshape([b * c, xd[2] * xd[3]])
                .matmul(m)
                .reshape([b, c, oh, ow]);
            assert!(max_rel_err(got, want) < 1e-5, "{xd:?} {kernel:?}");
        }
        let big = Window::square(2, 2, 2, 0);
        assert!(avg_pool_matrix(&[224, 224], &[112, 112], &big).is_none());
    }
}
