//! Reshaping ops: concatenation along an axis, slices and reductions of an axis,
//! and axis arithmetic. Flatten
//! and reshape need no code: values are `[B, elements]` whatever their shape.

use super::kernel::Kernel;
use super::params::Params;
use super::{Value, float, prod};
use crate::cpu::tensor::available;
use crate::cpu::view::{permute_cpu, slice_cpu};
use batchfit_graph::ReduceKind;
use burn::tensor::{Device, Int, Tensor, TensorData};

/// Concatenation of `args` along `axis`, each seen as `[B, before, axis, after]`.
pub(super) fn concat(k: &Kernel, args: Vec<Value>, b: usize, axis: i64) -> Tensor<2> {
    let a = axis_index(k.out_dims.len(), axis);
    if a == 0 {
        // Along the first sample axis (channels, say) each part is one block per sample:
        // a concatenation of the `[B, elements]` values themselves. Its backward's slices
        // of dy then reach the parts' ops as views, which copy them in parallel, not
        // through a reshape's serial copy.
        return Tensor::cat(args.into_iter().map(float).collect(), 1);
    }
    let parts: Vec<Tensor<4>> = args
        .into_iter()
        .zip(&k.in_dims)
        .map(|(v, d)| float(v).reshape([b, prod(&d[..a]), d[a], prod(&d[a + 1..])]))
        .collect();
    Tensor::cat(parts, 2).reshape([b, k.out_elems()])
}

/// Zeros before and after each padded sample axis: the sample seen as `[before, axis,
/// after]`, the zeros concatenated along the axis (burn's `cat` slices dy back).
pub(super) fn pad(
    k: &Kernel,
    x: Tensor<2>,
    b: usize,
    pads: &[[usize; 2]],
    value: f32,
) -> Tensor<2> {
    let mut dims = k.in_dims[0].clone();
    let mut y = x;
    for (a, &[lo, hi]) in pads.iter().enumerate() {
        if lo + hi == 0 {
            continue;
        }
        let (before, after) = (b * prod(&dims[..a]), prod(&dims[a + 1..]));
        let device = y.device();
        let mut parts = Vec::with_capacity(3);
        if lo > 0 {
            parts.push(Tensor::<3>::full([before, lo, after], value, &device));
        }
        parts.push(y.reshape([before, dims[a], after]));
        if hi > 0 {
            parts.push(Tensor::<3>::full([before, hi, after], value, &device));
        }
        dims[a] += lo + hi;
        y = Tensor::cat(parts, 1).reshape([b, prod(&dims)]);
    }
    y
}

/// A full-tensor axis (batch = 0, negative from the end) as an index into the sample dims.
pub(super) fn axis_index(sample_rank: usize, axis: i64) -> usize {
    let full = sample_rank as i64 + 1;
    let a = if axis < 0 { axis + full } else { axis };
    (a - 1) as usize
}

/// Elements `start..end` of sample axis `axis`, the sample seen as `[before, axis, after]`.
pub(super) fn slice(
    k: &Kernel,
    x: Tensor<2>,
    b: usize,
    axis: i64,
    start: usize,
    end: usize,
) -> Tensor<2> {
    let d = &k.in_dims[0];
    let a = axis_index(d.len(), axis);
    let (before, after) = (prod(&d[..a]), prod(&d[a + 1..]));
    if available(&x) {
        return slice_cpu(x, [before, d[a], after], start, end).expect("a CPU tensor");
    }
    x.reshape([b, before, d[a], after])
        .slice([0..b, 0..before, start..end, 0..after])
        .reshape([b, k.out_elems()])
}

/// Sum, mean or max over sample axes, one axis at a time (the sample seen as
/// `[before, axis, after]` each time); dropped axes need no code, as values are
/// `[B, elements]` whatever their shape.
pub(super) fn reduce(
    k: &Kernel,
    x: Tensor<2>,
    b: usize,
    reduce: ReduceKind,
    axes: &[i64],
) -> Tensor<2> {
    let mut dims = k.in_dims[0].clone();
    let mut picked: Vec<usize> = axes.iter().map(|&a| axis_index(dims.len(), a)).collect();
    picked.sort_unstable();
    picked.dedup();
    let mut t = x;
    for &a in picked.iter().rev() {
        let (before, after) = (prod(&dims[..a]), prod(&dims[a + 1..]));
        let v: Tensor<4> = t.reshape([b, before, dims[a], after]);
        let r = match reduce {
            ReduceKind::Sum => v.sum_dim(2),
            ReduceKind::Mean => v.mean_dim(2),
            ReduceKind::Max => v.max_dim(2),
            // PyTorch's norm has gradient 0 at a zero vector (a padded window's keys in
            // `F.normalize`); a plain sqrt's is 0 x inf = NaN. 1e-24 under the root moves
            // no norm above 1e-12 (F.normalize's own floor) by a float's rounding.
            ReduceKind::L2 => v.powi_scalar(2).sum_dim(2).add_scalar(1e-24).sqrt(),
        };
        dims[a] = 1;
        t = r.reshape([b, before * after]);
    }
    t.reshape([b, k.out_elems()])
}

/// Each sample repeated along its axes of size 1 (`Op::Expand`), through rank-6
/// `[B, d1..d5]` tensors as the broadcasting ops do; autodiff sums dy back over the
/// repeated axes.
pub(super) fn expand(k: &Kernel, x: Tensor<2>, b: usize) -> Tensor<2> {
    let six = |d: &[usize]| -> [usize; 6] {
        let mut s = [1usize; 6];
        s[0] = b;
        s[6 - d.len()..].copy_from_slice(d);
        s
    };
    // `compile` refuses a sample of more axes (`check_trainable`).
    let x6: Tensor<6> = x.reshape(six(&k.in_dims[0]));
    x6.expand(six(&k.out_dims)).reshape([b, k.out_elems()])
}

/// Sample axes reordered (`perm[k]` is the input axis of output axis `k`): a permuted
/// view of `[B, dims..]`, copied back to `[B, elements]`.
pub(super) fn transpose(k: &Kernel, x: Tensor<2>, b: usize, perm: &[usize]) -> Tensor<2> {
    let (d, perm) = merged_transpose(&k.in_dims[0], perm);
    let (d, perm) = (&d[..], &perm[..]);
    if d.len() > 1 && available(&x) {
        return permute_cpu(x, d, perm).expect("a CPU tensor");
    }
    macro_rules! permuted {
        ($rank:literal) => {{
            let mut dims = [b; $rank];
            dims[1..].copy_from_slice(d);
            let mut axes = [0usize; $rank];
            for (to, &from) in perm.iter().enumerate() {
                axes[to + 1] = from + 1;
            }
            x.reshape(dims).permute(axes).reshape([b, k.out_elems()])
        }};
    }
    match d.len() {
        0 | 1 => x,
        2 => permuted!(3),
        3 => permuted!(4),
        4 => permuted!(5),
        5 => permuted!(6),
        _ => unreachable!("checked by check_trainable"),
    }
}

/// The same transpose on fewer axes: every run of input axes that stay next to each
/// other, in order, in `perm` merged into one (MaxViT's window and grid partitions
/// move 6 axes, 2 of them together). Returns the merged dims and their permutation.
pub(super) fn merged_transpose(dims: &[usize], perm: &[usize]) -> (Vec<usize>, Vec<usize>) {
    // Runs of input axes in output order: (first axis, length).
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &p in perm {
        match runs.last_mut() {
            Some((start, len)) if *start + *len == p => *len += 1,
            _ => runs.push((p, 1)),
        }
    }
    let mut by_input: Vec<usize> = (0..runs.len()).collect();
    by_input.sort_by_key(|&r| runs[r].0);
    let merged: Vec<usize> = by_input
        .iter()
        .map(|&r| dims[runs[r].0..runs[r].0 + runs[r].1].iter().product())
        .collect();
    let mut at = vec![0; runs.len()];
    for (i, &r) in by_input.iter().enumerate() {
        at[r] = i;
    }
    (merged, at)
}

/// A constant computed once per step: `[1, elements]`, not tracked.
pub(super) fn constant(values: &[f32], device: &Device) -> Tensor<2> {
    Tensor::from_data(TensorData::new(values.to_vec(), [1, values.len()]), device)
}

/// Elements of `x` gathered along sample axis `axis` at `indices`.
pub(super) fn take(k: &Kernel, x: Tensor<2>, b: usize, axis: i64, indices: &[usize]) -> Tensor<2> {
    let d = &k.in_dims[0];
    let a = axis_index(d.len(), axis);
    let (before, after) = (prod(&d[..a]), prod(&d[a + 1..]));
    let ids: Vec<i64> = indices.iter().map(|&i| i as i64).collect();
    let ids = Tensor::<1, Int>::from_data(TensorData::new(ids, [indices.len()]), &x.device());
    x.reshape([b, before, d[a], after])
        .select(2, ids)
        .reshape([b, k.out_elems()])
}

/// A learned tensor repeated over the batch: `[B, elements]`, each row the parameter.
pub(super) fn broadcast_param(k: &Kernel, p: &Params, b: usize) -> Tensor<2> {
    let elements = k.out_elems();
    p.t1(k.params[0])
        .reshape([1, elements])
        .expand([b, elements])
}

/// `x` and a learned tensor (stored flat, the same for every sample) concatenated
/// along `axis`, the tensor first or last: ViT's class token.
pub(super) fn concat_param(
    k: &Kernel,
    p: &Params,
    x: Tensor<2>,
    b: usize,
    axis: i64,
    first: bool,
) -> Tensor<2> {
    let d = &k.in_dims[0];
    let a = axis_index(d.len(), axis);
    let (before, after) = (prod(&d[..a]), prod(&d[a + 1..]));
    let along = k.out_dims[a] - d[a];
    let learned = p
        .t1(k.params[0])
        .reshape([1, before, along, after])
        .expand([b, before, along, after]);
    let x = x.reshape([b, before, d[a], after]);
    let parts = if first {
        vec![learned, x]
    } else {
        vec![x, learned]
    };
    Tensor::cat(parts, 2).reshape([b, k.out_elems()])
}

#[cfg(test)]
mod tests {
    use super::merged_transpose;

    /// Row-major values of `0..n` in `dims`, transposed by `perm` (output axis k is
    /// input axis perm[k]), computed element by element.
    fn permuted(dims: &[usize], perm: &[usize]) -> Vec<usize> {
        let out_dims: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
        let strides: Vec<usize> = (0..dims.len())
            .map(|k| dims[k + 1..].iter().product())
            .collect();
        let n: usize = dims.iter().product();
        (0..n)
            .map(|mut flat| {
                let mut src = 0;
                for k in (0..out_dims.len()).rev() {
                    src += (flat % out_dims[k]) * strides[perm[k]];
                    flat /= out_dims[k];
                }
                src
            })
            .collect()
    }

    /// Merging the axes that move together moves every element where the full
    /// transpose does.
    #[test]
    fn a_merged_transpose_moves_every_element_alike() {
        let dims = [2, 3, 2, 4, 3, 2];
        for perm in [
            vec![0, 1, 3, 2, 4, 5],
            vec![2, 3, 0, 1, 4, 5],
            vec![5, 4, 3, 2, 1, 0],
            vec![0, 1, 2, 3, 4, 5],
            vec![1, 2, 0, 4, 5, 3],
        ] {
            let (d, p) = merged_transpose(&dims, &perm);
            assert_eq!(permuted(&d, &p), permuted(&dims, &perm), "{perm:?}");
        }
        assert_eq!(merged_transpose(&dims, &[0, 1, 3, 2, 4, 5]).1.len(), 4);
    }
}
