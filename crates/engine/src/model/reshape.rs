//! Reshaping ops: concatenation along an axis, and axis arithmetic. Flatten
//! and reshape need no code: values are `[B, elements]` whatever their shape.

use super::compile::Kernel;
use super::{Value, float, prod};
use burn::tensor::Tensor;

/// Concatenation of `args` along `axis`, each seen as `[B, before, axis, after]`.
pub(super) fn concat(k: &Kernel, args: Vec<Value>, b: usize, axis: i64) -> Tensor<2> {
    let a = axis_index(k.out_dims.len(), axis);
    let parts: Vec<Tensor<4>> = args
        .into_iter()
        .zip(&k.in_dims)
        .map(|(v, d)| float(v).reshape([b, prod(&d[..a]), d[a], prod(&d[a + 1..])]))
        .collect();
    Tensor::cat(parts, 2).reshape([b, k.out_elems()])
}

/// A full-tensor axis (batch = 0, negative from the end) as an index into the sample dims.
pub(super) fn axis_index(sample_rank: usize, axis: i64) -> usize {
    let full = sample_rank as i64 + 1;
    let a = if axis < 0 { axis + full } else { axis };
    (a - 1) as usize
}
