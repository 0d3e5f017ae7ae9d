//! The im2col matrix of a batch input, the engine's way to run a convolution
//! without dilation or groups as matrix products (model.rs `conv_im2col`): from
//! window views on any backend, or built by hand on the CPU, where flex copies
//! overlapping views element by element.

use burn::tensor::ops::PadMode;
use burn::tensor::{Tensor, TensorData};

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
/// transposes), 10.6 ms with the channels-last copy for seed 2's matrix at batch 512
/// here, 7.6 ms this way. It reads the input in place, builds each sample's padded
/// channels-last image in a small buffer that stays in cache and copies every row
/// as kh runs of kw·C values; samples run in parallel on rayon's pool.
pub fn im2col_host(
    x: &Tensor<4>,
    [kh, kw]: [usize; 2],
    stride: [usize; 2],
    pads: [(usize, usize); 2],
) -> Option<(Tensor<2>, [usize; 2])> {
    use rayon::prelude::*;
    let [b, c, h, w] = x.dims();
    let device = x.device();
    // The flex tensor behind a batch input (not tracked, so `inner` is free).
    let flex = x
        .clone()
        .inner()
        .try_into_primitive::<burn::backend::Flex>()
        .ok()?;
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
    let cols = Tensor::from_data(TensorData::new(cols, [b * oh * ow, k]), &device);
    Some((cols, [oh, ow]))
}
