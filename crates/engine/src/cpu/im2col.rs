//! The im2col matrix of a batch input, the engine's way to run a convolution
//! without dilation or groups as matrix products (`model/conv.rs` `conv_im2col`): from
//! window views on any backend, or built by hand on the CPU, where flex copies
//! overlapping views element by element; and on the CPU, the product with the
//! weight as one custom autodiff op ([`conv_product_cpu`]).

use crate::cpu::tensor::{
    Ad, FlexDevice, Strided, contiguous, finish_op, from_vec, gemm_into, values,
};
use burn::backend::Flex;
use burn::tensor::Tensor;
#[cfg(test)]
use burn::tensor::TensorData;
use burn::tensor::ops::PadMode;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops};
use rayon::prelude::*;

/// The im2col matrix `[B·OH·OW, kh·kw·C]` of `x` `[B, C, H, W]` (row: the window at one
/// output position, kh·kw runs of C channels), and `[OH, OW]`, from window views
/// of the padded channels-last input (any backend).
pub fn im2col_views(
    x: Tensor<4>,
    [kh, kw]: [usize; 2],
    stride: [usize; 2],
    pads: [(usize, usize); 2],
) -> (Tensor<2>, [usize; 2]) {
    let [b, c, _, _] = x.dims();
    // Channels last, so that each row of the matrix is kh runs of kw·C
    // contiguous values.
    let x = x.permute([0, 2, 3, 1]);
    let x = if pads == [(0, 0); 2] {
        x
    } else {
        x.pad([pads[0], pads[1], (0, 0)], PadMode::Constant(0.0))
    };
    // [B, OH, OW, C, kh, kw], a view of x.
    let win: Tensor<6> = x.unfold::<5, _>(1, kh, stride[0]).unfold(2, kw, stride[1]);
    let [_, oh, ow, _, _, _] = win.dims();
    let cols = win
        .permute([0, 1, 2, 4, 5, 3])
        .reshape([b * oh * ow, kh * kw * c]);
    (cols, [oh, ow])
}

/// [`im2col_views`] on the CPU (`None` elsewhere), written by hand: flex copies
/// overlapping window views element by element (its strided copy takes them for
/// transposes), 10.6 ms with the channels-last copy for the dual-input regressor's matrix at batch 512
/// here, 7.6 ms this way. It reads the input in place, builds each sample's padded
/// channels-last image in a small buffer that stays in cache and copies every row
/// as kh runs of kw·C values; samples run in parallel on rayon's pool.
#[cfg(test)]
pub fn im2col_host(
    x: &Tensor<4>,
    kernel: [usize; 2],
    stride: [usize; 2],
    pads: [(usize, usize); 2],
) -> Option<(Tensor<2>, [usize; 2])> {
    let (cols, [oh, ow]) = im2col_values(x, kernel, stride, pads)?;
    let [b, ..] = x.dims();
    let k = cols.len() / (b * oh * ow);
    let cols = Tensor::from_data(TensorData::new(cols, [b * oh * ow, k]), &x.device());
    Some((cols, [oh, ow]))
}

/// The values of [`im2col_host`]'s matrix, or `None` off the CPU.
fn im2col_values(
    x: &Tensor<4>,
    [kh, kw]: [usize; 2],
    stride: [usize; 2],
    pads: [(usize, usize); 2],
) -> Option<(Vec<f32>, [usize; 2])> {
    let [b, c, h, w] = x.dims();
    // The flex tensor behind a batch input (not tracked, so `inner` is free).
    let flex = x.clone().inner().try_into_primitive::<Flex>().ok()?;
    let (start, end) = flex.layout().contiguous_offsets()?;
    let x: &[f32] = &flex.storage::<f32>()[start..end];
    let (hp, wp) = (h + pads[0].0 + pads[0].1, w + pads[1].0 + pads[1].1);
    let (oh, ow) = ((hp - kh) / stride[0] + 1, (wp - kw) / stride[1] + 1);
    let (k, run) = (kh * kw * c, kw * c);
    let n = b * oh * ow * k;
    // Not zeroed first: a pass over the largest tensor of the step for nothing.
    let mut cols: Vec<f32> = Vec::with_capacity(n);
    cols.spare_capacity_mut()[..n]
        .par_chunks_mut(oh * ow * k)
        .zip(x.par_chunks(c * h * w))
        .for_each_init(
            || vec![0.0f32; hp * wp * c],
            |padded, (out, image)| {
                // Channels last, zero border.
                for (ch, plane) in image.chunks_exact(h * w).enumerate() {
                    for (y, line) in plane.chunks_exact(w).enumerate() {
                        let row = (y + pads[0].0) * wp + pads[1].0;
                        for (xi, &v) in line.iter().enumerate() {
                            padded[(row + xi) * c + ch] = v;
                        }
                    }
                }
                for (pos, dst) in out.chunks_exact_mut(k).enumerate() {
                    let (y, xo) = (pos / ow * stride[0], pos % ow * stride[1]);
                    for (i, part) in dst.chunks_exact_mut(run).enumerate() {
                        let start = ((y + i) * wp + xo) * c;
                        part.write_copy_of_slice(&padded[start..start + run]);
                    }
                }
            },
        );
    // SAFETY: every one of the n elements was written above: each of the B·OH·OW rows
    // of k = kh·kw·C values is kh runs of kw·C.
    unsafe { cols.set_len(n) };
    Some((cols, [oh, ow]))
}

/// A convolution of a batch input on the CPU (`None` elsewhere): the hand-built
/// im2col matrix times the weight `w` `[C_out, k]` (k in the matrix's kh, kw, C
/// order), as one custom autodiff op, returning `[chunks, C_out, samples·OH·OW]`
/// (the layout of `model/mod.rs` `ConvRows`) and `[OH, OW]`.
///
/// burn's autodiff ties a product's forward and weight-gradient orientations
/// together, and no single one is fast for both here. Forward, per chunk of
/// samples: `cols_chunk x Wᵀ` channels-last, which gemm streams without packing
/// the im2col matrix (9-10 ms at the dual-input regressor's batch 512 against 17-18 ms for the
/// channel-major product), then a transpose of the small result. Backward:
/// `dY_chunk x cols_chunk` per chunk, channel-major, the fast orientation for this
/// long-K product; chunks on rayon's threads, partials summed.
pub fn conv_product_cpu(
    x: &Tensor<4>,
    w: Tensor<2>,
    kernel: [usize; 2],
    stride: [usize; 2],
    pads: [(usize, usize); 2],
    chunks: usize,
) -> Option<(Tensor<3>, [usize; 2])> {
    let [co, k] = w.dims();
    let w = w.try_into_primitive::<Ad>().ok()?;
    let (cols, [oh, ow]) = im2col_values(x, kernel, stride, pads)?;
    let r = x.dims()[0] / chunks * oh * ow;
    let shape = ProductShape { co, k, r };
    let node = w.node();
    let wf = contiguous(w.into_primitive());
    let wv = values(&wf);
    let mut out = vec![0.0f32; chunks * co * r];
    out.par_chunks_mut(co * r)
        .zip(cols.par_chunks(r * k))
        .for_each(|(out, cols)| {
            let mut rows = vec![0.0f32; r * co];
            gemm_into(
                r,
                co,
                k,
                Strided::new(&mut rows, co, 1),
                false,
                Strided::new(cols, k, 1),
                Strided::new(wv, 1, k),
            );
            for (pos, row) in rows.chunks_exact(co).enumerate() {
                for (ch, &v) in row.iter().enumerate() {
                    out[ch * r + pos] = v;
                }
            }
        });
    let out = from_vec(out, &[chunks, co, r], &FlexDevice::default());
    let state = || ConvState { shape, cols };
    Some((finish_op(ConvProduct, [node], state, out), [oh, ow]))
}

#[derive(Clone, Copy, Debug)]
struct ProductShape {
    co: usize,
    k: usize,
    /// Rows of the im2col matrix per chunk.
    r: usize,
}

#[derive(Clone, Debug)]
struct ConvState {
    shape: ProductShape,
    /// The im2col matrix `[chunks · r, k]`, kept for the weight gradient.
    cols: Vec<f32>,
}

#[derive(Debug)]
struct ConvProduct;

impl Backward<Flex, 1> for ConvProduct {
    type State = ConvState;

    fn backward(self, ops: Ops<ConvState, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let ConvState { shape, cols } = ops.state;
        let ProductShape { co, k, r, .. } = shape;
        let grad = contiguous(grads.consume::<Flex>(&ops.node));
        let Some(node) = &ops.parents[0] else { return };
        let dw = values(&grad)
            .par_chunks(co * r)
            .zip(cols.par_chunks(r * k))
            .map(|(dy, cols)| {
                let mut dw = vec![0.0f32; co * k];
                gemm_into(
                    co,
                    k,
                    r,
                    Strided::new(&mut dw, k, 1),
                    false,
                    Strided::new(dy, r, 1),
                    Strided::new(cols, k, 1),
                );
                dw
            })
            .reduce_with(|mut a, b| {
                a.iter_mut().zip(&b).for_each(|(a, b)| *a += b);
                a
            })
            .expect("at least one chunk");
        grads.register::<Flex>(node.id, from_vec(dw, &[co, k], &FlexDevice::default()));
    }
}
