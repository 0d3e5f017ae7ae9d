//! Permutations and slices of a sample's axes on the CPU, as custom autodiff ops that
//! copy on rayon's threads. burn's are views that the next reshape copies on one thread
//! (flex's tiled copy), and a slice's backward is a zero-filled tensor of the input's
//! size (filled twice: `FlexTensor::empty` zero-fills, then realigns by copying) and a
//! `slice_assign`; in a small ViT's attention (three slices of the packed q, k, v
//! projection, a transpose of each) those took 16 % of the step at batch 32, all on one
//! thread. Here each is one parallel pass each way, sample by sample; the slice's
//! backward writes its input's gradient once (zeros around dy). Neither keeps anything.

use crate::cpu::tensor::{
    Ad, FlexDevice, assume_init, contiguous, finish_op, from_vec, uninit, values,
};
use burn::backend::Flex;
use burn::tensor::Tensor;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops};
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// Elements per rayon job (whole samples, at least one).
const JOB_ELEMS: usize = 1 << 14;

/// Samples per job for samples of `per_sample` elements.
fn samples_per_job(per_sample: usize) -> usize {
    (JOB_ELEMS / per_sample.max(1)).max(1)
}

/// `out` (one sample, row-major over `out_dims`) gathered from `x`, whose element at
/// output index `(i_0, ..)` is `x[sum i_k strides[k]]`.
fn gather(out: &mut [MaybeUninit<f32>], x: &[f32], out_dims: &[usize], strides: &[usize]) {
    let Some((&last, outer)) = out_dims.split_last() else {
        out[0].write(x[0]);
        return;
    };
    let step = strides[strides.len() - 1];
    let mut index = vec![0usize; outer.len()];
    let mut base = 0usize;
    for row in out.chunks_exact_mut(last.max(1)) {
        if step == 1 {
            row.write_copy_of_slice(&x[base..base + last]);
        } else {
            for (k, o) in row.iter_mut().enumerate() {
                o.write(x[base + k * step]);
            }
        }
        // The next row: an odometer over the outer axes.
        for a in (0..outer.len()).rev() {
            index[a] += 1;
            base += strides[a];
            if index[a] < outer[a] {
                break;
            }
            base -= index[a] * strides[a];
            index[a] = 0;
        }
    }
}

/// Row-major strides of `dims`.
fn row_major(dims: &[usize]) -> Vec<usize> {
    let mut strides = vec![1usize; dims.len()];
    for a in (0..dims.len().saturating_sub(1)).rev() {
        strides[a] = strides[a + 1] * dims[a + 1];
    }
    strides
}

/// `x` `[B, elements]`, each sample `[dims]`, with its axes permuted (`out` axis k is
/// input axis `perm[k]`), as `[B, elements]`.
fn permuted(x: &[f32], b: usize, dims: &[usize], perm: &[usize]) -> Vec<f32> {
    let per_sample: usize = dims.iter().product();
    let in_strides = row_major(dims);
    let out_dims: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
    let strides: Vec<usize> = perm.iter().map(|&p| in_strides[p]).collect();
    let mut out = uninit(b * per_sample);
    let job = samples_per_job(per_sample) * per_sample;
    if per_sample > 0 {
        out.par_chunks_mut(job)
            .zip(x.par_chunks(job))
            .for_each(|(out, x)| {
                for (out, x) in out
                    .chunks_exact_mut(per_sample)
                    .zip(x.chunks_exact(per_sample))
                {
                    gather(out, x, &out_dims, &strides);
                }
            });
    }
    // SAFETY: `gather` wrote every element of every sample.
    unsafe { assume_init(out) }
}

/// `x` `[B, elements]` with each sample's axes `dims` permuted by `perm` (output axis k
/// is input axis `perm[k]`); `None` off the CPU.
pub fn permute_cpu(x: Tensor<2>, dims: &[usize], perm: &[usize]) -> Option<Tensor<2>> {
    let [b, elements] = x.dims();
    let xa = x.try_into_primitive::<Ad>().ok()?;
    let node = xa.node();
    let xf = contiguous(xa.into_primitive());
    let y = permuted(values(&xf), b, dims, perm);
    let y = from_vec(y, &[b, elements], &FlexDevice::default());
    let mut inverse = vec![0usize; perm.len()];
    for (to, &from) in perm.iter().enumerate() {
        inverse[from] = to;
    }
    let out_dims = perm.iter().map(|&p| dims[p]).collect();
    Some(finish_op(PermuteOp, [node], || (out_dims, inverse), y))
}

#[derive(Debug)]
struct PermuteOp;

impl Backward<Flex, 1> for PermuteOp {
    /// The output's sample axes and the inverse permutation.
    type State = (Vec<usize>, Vec<usize>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (out_dims, inverse) = ops.state;
        let dy = contiguous(grads.consume::<Flex>(&ops.node));
        let [Some(node)] = &ops.parents else {
            return;
        };
        let shape = dy.layout().shape().to_vec();
        let dx = permuted(values(&dy), shape[0], &out_dims, &inverse);
        grads.register::<Flex>(node.id, from_vec(dx, &shape, &FlexDevice::default()));
    }
}

/// A slice of each sample seen as `[before, axis, after]`: `start..end` of the axis.
#[derive(Clone, Copy, Debug)]
struct Slicing {
    before: usize,
    axis: usize,
    after: usize,
    start: usize,
    end: usize,
}

impl Slicing {
    /// One row of the input, `[axis, after]`, and of the output.
    fn rows(&self) -> (usize, usize) {
        (self.axis * self.after, (self.end - self.start) * self.after)
    }
}

/// `start..end` of sample axis `[before, axis, after]`'s middle axis, of `x` `[B,
/// elements]`; `None` off the CPU.
pub fn slice_cpu(
    x: Tensor<2>,
    [before, axis, after]: [usize; 3],
    start: usize,
    end: usize,
) -> Option<Tensor<2>> {
    let [b, _] = x.dims();
    if start > end || end > axis {
        return None;
    }
    let s = Slicing {
        before,
        axis,
        after,
        start,
        end,
    };
    let xa = x.try_into_primitive::<Ad>().ok()?;
    let node = xa.node();
    let xf = contiguous(xa.into_primitive());
    let (row_in, row_out) = s.rows();
    let mut y = uninit(b * before * row_out);
    if row_out > 0 {
        let rows = samples_per_job(row_out);
        y.par_chunks_mut(rows * row_out)
            .zip(values(&xf).par_chunks(rows * row_in))
            .for_each(|(y, x)| {
                for (y, x) in y.chunks_exact_mut(row_out).zip(x.chunks_exact(row_in)) {
                    y.write_copy_of_slice(&x[s.start * after..s.end * after]);
                }
            });
    }
    // SAFETY: every output row was copied whole.
    let y = unsafe { assume_init(y) };
    let y = from_vec(y, &[b, before * row_out], &FlexDevice::default());
    Some(finish_op(SliceOp, [node], || s, y))
}

#[derive(Debug)]
struct SliceOp;

impl Backward<Flex, 1> for SliceOp {
    type State = Slicing;

    fn backward(self, ops: Ops<Slicing, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let s = ops.state;
        let dy = contiguous(grads.consume::<Flex>(&ops.node));
        let [Some(node)] = &ops.parents else {
            return;
        };
        let b = dy.layout().shape()[0];
        let (row_in, row_out) = s.rows();
        let shape = [b, s.before * row_in];
        if row_out == 0 {
            let dx = vec![0.0; b * s.before * row_in];
            grads.register::<Flex>(node.id, from_vec(dx, &shape, &FlexDevice::default()));
            return;
        }
        let mut dx = uninit(b * s.before * row_in);
        if row_in > 0 {
            let rows = samples_per_job(row_in);
            let (head, tail) = (s.start * s.after, (s.axis - s.end) * s.after);
            dx.par_chunks_mut(rows * row_in)
                .zip(values(&dy).par_chunks(rows * row_out))
                .for_each(|(dx, dy)| {
                    for (r, dx) in dx.chunks_exact_mut(row_in).enumerate() {
                        let (lo, rest) = dx.split_at_mut(head);
                        let (mid, hi) = rest.split_at_mut(row_out);
                        lo.fill(MaybeUninit::new(0.0));
                        mid.write_copy_of_slice(&dy[r * row_out..(r + 1) * row_out]);
                        hi[..tail].fill(MaybeUninit::new(0.0));
                    }
                });
        }
        // SAFETY: each row of dx is written whole: zeros, dy's row, zeros.
        let dx = unsafe { assume_init(dx) };
        grads.register::<Flex>(node.id, from_vec(dx, &shape, &FlexDevice::default()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::max_rel_err;
    use burn::tensor::{Device, Distribution};

    /// Output and input gradient against burn's permute and slice, with transposes of
    /// the last axis (strided reads) and of the outer ones (whole rows), more samples
    /// than one job.
    #[test]
    fn permute_and_slice_match_burn() {
        let device = Device::flex().autodiff();
        device.seed(12);
        for (b, dims, perm) in [
            (3, vec![5, 1, 4, 6], vec![2, 1, 0, 3]),
            (2, vec![5, 1, 4, 6], vec![2, 3, 1, 0]),
            (700, vec![7, 3], vec![1, 0]),
            (2, vec![4], vec![0]),
        ] {
            let n: usize = dims.iter().product();
            let x =
                Tensor::<2>::random([b, n], Distribution::Normal(0.0, 1.0), &device).require_grad();
            let got = permute_cpu(x.clone(), &dims, &perm).expect("a CPU tensor");
            let mut full = vec![b];
            full.extend(&dims);
            let mut axes = vec![0];
            axes.extend(perm.iter().map(|p| p + 1));
            let want = || -> Tensor<2> {
                match full.len() {
                    2 => x.clone() * 1.0,
                    3 => x
                        .clone()
                        .reshape([b, dims[0], dims[1]])
                        .permute([0, axes[1], axes[2]].map(|a| a as isize))
                        .reshape([b, n]),
                    _ => x
                        .clone()
                        .reshape([b, dims[0], dims[1], dims[2], dims[3]])
                        .permute([0, axes[1], axes[2], axes[3], axes[4]].map(|a| a as isize))
                        .reshape([b, n]),
                }
            };
            assert_eq!(max_rel_err(got.clone(), want()), 0.0, "{dims:?} {perm:?}");
            let r = Tensor::<2>::random([b, n], Distribution::Normal(0.0, 1.0), &device);
            let g_got = (got * r.clone()).sum().backward();
            let g_want = (want() * r).sum().backward();
            let dx = |g: &burn::tensor::Gradients| x.grad(g).expect("input gradient");
            assert_eq!(
                max_rel_err(dx(&g_got), dx(&g_want)),
                0.0,
                "{dims:?} {perm:?}"
            );
        }
        for (b, [before, axis, after], start, end) in [
            (3, [5, 3, 4], 1, 2),
            (2, [1, 7, 1], 0, 7),
            (900, [2, 6, 3], 4, 6),
            (2, [3, 4, 2], 0, 0),
        ] {
            let x = Tensor::<2>::random(
                [b, before * axis * after],
                Distribution::Normal(0.0, 1.0),
                &device,
            )
            .require_grad();
            let out = before * (end - start) * after;
            let got =
                slice_cpu(x.clone(), [before, axis, after], start, end).expect("a CPU tensor");
            let want = || {
                x.clone()
                    .reshape([b, before, axis, after])
                    .slice([0..b, 0..before, start..end, 0..after])
                    .reshape([b, out])
            };
            assert_eq!(got.dims(), [b, out]);
            if out == 0 {
                continue;
            }
            assert_eq!(max_rel_err(got.clone(), want()), 0.0);
            let r = Tensor::<2>::random([b, out], Distribution::Normal(0.0, 1.0), &device);
            let g_got = (got * r.clone()).sum().backward();
            let g_want = (want() * r).sum().backward();
            let dx = |g: &burn::tensor::Gradients| x.grad(g).expect("input gradient");
            assert_eq!(max_rel_err(dx(&g_got), dx(&g_want)), 0.0);
        }
    }
}
