//! Convolutions: on the CPU, the engine's own op for a tracked input
//! ([`crate::cpu::conv`]) and the chunked im2col product ([`crate::cpu::im2col`]) for a
//! batch input; burn's for dilations and other devices.

use super::ConvRows;
use super::kernel::Kernel;
use super::params::Params;
use crate::cpu::conv::{channel_bias_cpu, conv2d_cpu};
use crate::cpu::im2col::{conv_product_cpu, im2col_views};
use batchfit_graph::{Op, Window};
use batchfit_plan::rules::im2col_chunks;
use burn::tensor::Tensor;
use burn::tensor::module::{conv_transpose1d, conv_transpose2d, conv1d, conv2d};
use burn::tensor::ops::{ConvOptions, ConvTransposeOptions};

/// Why the engine cannot run a transposed convolution with `window`, if it cannot:
/// burn's has 1 and 2 spatial dimensions and one padding per dimension (PyTorch's
/// layers only make equal ones).
pub(super) fn transpose_unsupported(window: &Window) -> Option<&'static str> {
    if window.spatial() > 2 {
        Some("3-d transposed convolution")
    } else if window.padding.iter().any(|[a, z]| a != z) {
        Some("transposed convolution with unequal pads at a dimension's ends")
    } else {
        None
    }
}

/// The bias of convolution node `k`, when it has one (a gain may follow it).
fn conv_bias(k: &Kernel, p: &Params) -> Option<Tensor<1>> {
    let has = matches!(
        k.op,
        Op::Conv { bias: true, .. } | Op::ConvTranspose { bias: true, .. }
    );
    has.then(|| p.t1(k.params[1]))
}

/// The weight `w` of convolution node `k` as it convolves: standardised per output
/// channel over its fan-in (biased variance, then gain and scale) when the node says
/// so, every step, so that its gradient reaches the raw weight through the
/// standardisation as in PyTorch's `F.batch_norm` of the weight.
fn conv_weight<const D: usize>(k: &Kernel, p: &Params, w: Tensor<D>) -> Tensor<D> {
    let Op::Conv {
        standardize: Some(s),
        ..
    } = &k.op
    else {
        return w;
    };
    let dims = w.dims();
    let rows = dims[0];
    let w = w.reshape([rows, dims[1..].iter().product::<usize>()]);
    let centered = w.clone() - w.mean_dim(1);
    let var = centered.clone().powi_scalar(2).mean_dim(1);
    let mut factor = var.add_scalar(s.eps).sqrt().recip().mul_scalar(s.scale);
    if s.gain {
        let gain = p.t1(*k.params.last().expect("a gain parameter"));
        factor = factor * gain.reshape([rows, 1]);
    }
    (centered * factor).reshape(dims)
}

/// A 1-d or 2-d transposed convolution by burn on `[B, elements]`; axes before the
/// channels are more batch (a batch merged with separated sources).
pub(super) fn conv_transpose(
    k: &Kernel,
    p: &Params,
    x: Tensor<2>,
    b: usize,
    window: &Window,
    output_padding: &[usize],
    groups: usize,
) -> Tensor<2> {
    let d = &k.in_dims[0];
    let lead = d.len() - window.spatial() - 1;
    let rows = b * d[..lead].iter().product::<usize>();
    let bias = conv_bias(k, p);
    let pad = |i: usize| window.padding[i][0];
    if window.spatial() == 1 {
        let opts = ConvTransposeOptions::new(
            [window.stride[0]],
            [pad(0)],
            [output_padding[0]],
            [window.dilation[0]],
            groups,
        );
        let x = x.reshape([rows, d[lead], d[lead + 1]]);
        conv_transpose1d(x, p.t3(k.params[0]), bias, opts).reshape([b, k.out_elems()])
    } else {
        let opts = ConvTransposeOptions::new(
            [window.stride[0], window.stride[1]],
            [pad(0), pad(1)],
            [output_padding[0], output_padding[1]],
            [window.dilation[0], window.dilation[1]],
            groups,
        );
        let x = x.reshape([rows, d[lead], d[lead + 1], d[lead + 2]]);
        conv_transpose2d(x, p.t4(k.params[0]), bias, opts).reshape([b, k.out_elems()])
    }
}

/// A 1-d or 2-d convolution by burn, on `[B, elements]` in NCHW order.
pub(super) fn conv(
    k: &Kernel,
    p: &Params,
    x: Tensor<2>,
    b: usize,
    window: &Window,
    groups: usize,
) -> Tensor<2> {
    let d = &k.in_dims[0];
    let bias = conv_bias(k, p);
    // The CPU's own op for the common case (see engine `cpu/conv.rs`); burn's elsewhere.
    if window.dilation.iter().all(|&r| r == 1) {
        let (x4, w4, stride, pads) = as_2d(k, p, x.clone(), b, window);
        if let Some(y) = conv2d_cpu(x4, w4, stride, pads, groups) {
            let [_, co, oh, ow] = y.dims();
            let y = y.reshape([b, co, oh * ow]);
            let y = match bias {
                Some(bias) => channel_bias_cpu(y, bias).expect("a CPU tensor, as the convolution"),
                None => y,
            };
            return y.reshape([b, k.out_elems()]);
        }
    }
    if window.spatial() == 1 {
        let opts = ConvOptions::new_with_padding(
            [window.stride[0]],
            [(window.padding[0][0], window.padding[0][1])],
            [window.dilation[0]],
            groups,
        );
        let w = conv_weight(k, p, p.t3(k.params[0]));
        conv1d(x.reshape([b, d[0], d[1]]), w, bias, opts).reshape([b, k.out_elems()])
    } else {
        let opts = ConvOptions::new_with_padding(
            [window.stride[0], window.stride[1]],
            pads2(window),
            [window.dilation[0], window.dilation[1]],
            groups,
        );
        conv2d(
            x.reshape([b, d[0], d[1], d[2]]),
            conv_weight(k, p, p.t4(k.params[0])),
            bias,
            opts,
        )
        .reshape([b, k.out_elems()])
    }
}

/// A 2-d convolution without dilation or groups as matrix products of the
/// im2col matrix `[B·OH·OW, kh·kw·C]` ([`crate::cpu::im2col`]) and the weight,
/// returning the output as [`ConvRows`]. burn-flex has no native conv weight
/// gradient (burn's fallback transposes and repacks serially, then runs skinny
/// GEMMs). Here the rows go in [`im2col_chunks`] (the plan's rule) chunks of
/// whole samples whose products run on separate threads, so the weight gradient
/// `dy_chunk x cols_chunk` (a long-K product with a tiny result, which one GEMM
/// parallelises poorly) is split over the cores; each chunk's output is
/// channel-major, so NCHW is a copy of `OH·OW`-long runs rather than an
/// element-wise transpose. On the CPU the product is one custom op
/// ([`conv_product_cpu`]); elsewhere one batched matmul ([`conv_product_views`]).
fn conv_im2col(
    x: Tensor<4>,
    w: Tensor<4>,
    bias: Option<Tensor<1>>,
    stride: [usize; 2],
    pads: [(usize, usize); 2],
) -> ConvRows {
    let [b, c, _, _] = x.dims();
    let [co, _, kh, kw] = w.dims();
    let k = kh * kw * c;
    let chunks = im2col_chunks(b);
    let per_chunk = b / chunks;
    // The weight in the matrix's (kh, kw, C) order, a small copy.
    let w = w.permute([0, 2, 3, 1]).reshape([co, k]);
    // [chunks, C_out, samples·OH·OW]
    let (mut y, [oh, ow]) = match conv_product_cpu(&x, w.clone(), [kh, kw], stride, pads, chunks) {
        Some(done) => done,
        None => conv_product_views(x, w, [kh, kw], stride, pads, chunks),
    };
    let spatial = oh * ow;
    if let Some(bias) = bias {
        // Not through a clone: the CPU op adds in place when nothing else holds y.
        y = if crate::cpu::tensor::available(&y) {
            channel_bias_cpu(y, bias).expect("a CPU tensor")
        } else {
            y + bias.reshape([1, co, 1])
        };
    }
    ConvRows {
        rows: y.reshape([chunks * co * per_chunk, spatial]),
        chunks,
        channels: co,
        per_chunk,
    }
}

/// [`conv_product_cpu`] on any backend: the window views' im2col matrix in chunks,
/// `W [1, C_out, k] x cols_chunkᵀ` as one batched product (channel-major, so the
/// weight gradient `dY_chunk x cols_chunk` is the fast orientation).
fn conv_product_views(
    x: Tensor<4>,
    w: Tensor<2>,
    kernel: [usize; 2],
    stride: [usize; 2],
    pads: [(usize, usize); 2],
    chunks: usize,
) -> (Tensor<3>, [usize; 2]) {
    let (cols, out) = im2col_views(x, kernel, stride, pads);
    let [rows, k] = cols.dims();
    let cols = cols.reshape([chunks, rows / chunks, k]);
    (w.unsqueeze::<3>().matmul(cols.swap_dims(1, 2)), out)
}

/// [`conv_im2col`] for a graph node (1-d convolutions as 2-d ones over a single row).
pub(super) fn conv_im2col_node(k: &Kernel, p: &Params, x: Tensor<2>, b: usize) -> ConvRows {
    let batchfit_graph::Op::Conv { window, .. } = &k.op else {
        unreachable!("a convolution node")
    };
    let bias = conv_bias(k, p);
    let (x, w, stride, pads) = as_2d(k, p, x, b, window);
    conv_im2col(x, w, bias, stride, pads)
}

/// A node's input, weight, stride and padding as a 2-d convolution's (a 1-d one
/// over a single row).
fn as_2d(
    k: &Kernel,
    p: &Params,
    x: Tensor<2>,
    b: usize,
    window: &Window,
) -> (Tensor<4>, Tensor<4>, [usize; 2], [(usize, usize); 2]) {
    let d = &k.in_dims[0];
    if window.spatial() == 1 {
        let w = conv_weight(k, p, p.t3(k.params[0]));
        let [co, ci, kw] = w.dims();
        (
            x.reshape([b, d[0], 1, d[1]]),
            w.reshape([co, ci, 1, kw]),
            [1, window.stride[0]],
            [(0, 0), (window.padding[0][0], window.padding[0][1])],
        )
    } else {
        (
            x.reshape([b, d[0], d[1], d[2]]),
            conv_weight(k, p, p.t4(k.params[0])),
            [window.stride[0], window.stride[1]],
            pads2(window),
        )
    }
}

/// A 2-d window's padding as burn's (begin, end) pairs.
pub(super) fn pads2(w: &Window) -> [(usize, usize); 2] {
    [
        (w.padding[0][0], w.padding[0][1]),
        (w.padding[1][0], w.padding[1][1]),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::im2col::im2col_host;
    use crate::model::tests::max_rel_err;
    use burn::tensor::{Device, Distribution};

    /// The im2col product against burn's convolution: output, weight and bias
    /// gradients, with asymmetric padding and a stride, in 2-d and as a 1-d row.
    #[test]
    fn im2col_conv_matches_burn_conv() {
        let device = Device::flex().autodiff();
        device.seed(3);
        // (x, weight, stride, padding)
        let cases = [
            ([3, 4, 7, 6], [5, 4, 3, 2], [1, 2], [(1, 0), (2, 1)]),
            ([2, 26, 9, 9], [26, 26, 3, 3], [1, 1], [(1, 1), (1, 1)]),
            ([4, 3, 1, 10], [2, 3, 1, 3], [1, 2], [(0, 0), (1, 2)]),
            // 2 chunks of 17 samples.
            ([34, 3, 5, 5], [4, 3, 3, 3], [1, 1], [(1, 1), (1, 1)]),
        ];
        for (xd, wd, stride, pads) in cases {
            let x = Tensor::<4>::random(xd, Distribution::Normal(0.0, 1.0), &device);
            // The CPU's hand-written matrix is the window views' (other devices') exactly.
            let kernel = [wd[2], wd[3]];
            let (host, hw) = im2col_host(&x, kernel, stride, pads).expect("a CPU tensor");
            let (views, vw) = im2col_views(x.clone(), kernel, stride, pads);
            assert_eq!(hw, vw);
            assert_eq!(host.into_data(), views.into_data());
            let w = Tensor::<4>::random(wd, Distribution::Normal(0.0, 1.0), &device).require_grad();
            // The CPU's product op against the views' batched matmul (other devices):
            // output and weight gradient.
            let (co, k) = (wd[0], wd[1] * wd[2] * wd[3]);
            let chunks = im2col_chunks(xd[0]);
            // (A tape per product: burn consumes it at backward.)
            let w2 = || w.clone().permute([0, 2, 3, 1]).reshape([co, k]);
            let (cpu, _) =
                conv_product_cpu(&x, w2(), kernel, stride, pads, chunks).expect("a CPU tensor");
            let (views, _) = conv_product_views(x.clone(), w2(), kernel, stride, pads, chunks);
            assert!(max_rel_err(cpu.clone(), views.clone()) < 1e-5);
            let r = Tensor::<3>::random(cpu.dims(), Distribution::Normal(0.0, 1.0), &device);
            let g_cpu = (cpu * r.clone()).sum().backward();
            let g_views = (views * r).sum().backward();
            let grad = |g: &burn::tensor::Gradients| w.grad(g).expect("weight gradient");
            assert!(max_rel_err(grad(&g_cpu), grad(&g_views)) < 1e-4);
            let bias = Tensor::<1>::random([wd[0]], Distribution::Normal(0.0, 1.0), &device)
                .require_grad();
            let opts = ConvOptions::new_with_padding(stride, pads, [1, 1], 1);
            let want = conv2d(x.clone(), w.clone(), Some(bias.clone()), opts.clone());
            let [b, co, oh, ow] = want.dims();
            let got = conv_im2col(x.clone(), w.clone(), Some(bias.clone()), stride, pads)
                .canonical()
                .reshape([b, co, oh, ow]);
            assert!(max_rel_err(got.clone(), want.clone()) < 1e-4);
            let r = Tensor::<4>::random([b, co, oh, ow], Distribution::Normal(0.0, 1.0), &device);
            let g_want = (want * r.clone()).sum().backward();
            let g_got = (got * r).sum().backward();
            let grad = |g: &burn::tensor::Gradients| w.grad(g).expect("weight gradient");
            assert!(max_rel_err(grad(&g_got), grad(&g_want)) < 1e-4);
            let grad = |g: &burn::tensor::Gradients| bias.grad(g).expect("bias gradient");
            assert!(max_rel_err(grad(&g_got), grad(&g_want)) < 1e-4);
        }
    }
}
