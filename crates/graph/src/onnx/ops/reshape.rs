//! Reshaping ops: `Flatten`, `Reshape`, `Squeeze`/`Unsqueeze`, `Transpose`
//! (of constants and of the recurrent layouts) and `Concat` of activations.

use crate::error::GraphError;
use crate::onnx::decode::{Attrs, positive, tensor_f32};
use crate::onnx::import::{Importer, label};
use crate::onnx::proto::{DataType, NodeProto, TensorProto};
use crate::onnx::shapes::{squeeze, unsqueeze};
use crate::onnx::view::{
    Ax, LayoutError, Val, View, permutation, view_reshape, view_squeeze, view_transpose,
};
use crate::op::Op;
use std::rc::Rc;

impl Importer {
    /// `Flatten` that keeps the batch.
    pub(super) fn flatten(
        &mut self,
        _i: usize,
        n: &NodeProto,
        a: &Attrs,
    ) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let x = self.act(n, 0)?;
        let full = self.shape(&x)?.rank() as i64 + 1;
        let axis = a.int("axis", 1);
        if axis != 1 && axis + full != 1 {
            return Err(err(format!(
                "Flatten with axis {axis}: only axis 1 (keep the batch) is supported"
            )));
        }
        self.emit(n, Op::Flatten, &[&x])?;
        Ok(())
    }

    /// `Reshape` of each sample, or of a recurrent layout view.
    pub(super) fn reshape(
        &mut self,
        _i: usize,
        n: &NodeProto,
        a: &Attrs,
    ) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let target = self.reshape_target(n)?;
        match self.val(n, 0)?.clone() {
            Val::View(v) => {
                let v = view_reshape(v, &target).map_err(|e| err(e.to_string()))?;
                self.define(n, v);
            }
            _ => {
                let x = self.act(n, 0)?;
                let Some((&first, rest)) = target.split_first() else {
                    return Err(err("Reshape to a scalar drops the batch".into()));
                };
                if !(first == 0 || first == -1 || Some(first) == self.batch) {
                    return Err(err(format!(
                        "Reshape to {target:?} changes the batch dimension; only \
                         reshapes of each sample (leading 0 or -1) are supported"
                    )));
                }
                if first == -1 && rest.contains(&-1) {
                    return Err(err(format!("Reshape to {target:?} has two -1")));
                }
                if a.int("allowzero", 0) != 0 && rest.contains(&0) {
                    return Err(err(format!(
                        "Reshape to {target:?} with allowzero makes an empty tensor"
                    )));
                }
                self.emit(
                    n,
                    Op::Reshape {
                        shape: rest.to_vec(),
                    },
                    &[&x],
                )?;
            }
        }
        Ok(())
    }

    /// `Squeeze` and `Unsqueeze` of sample axes, or of the directions axis of a view.
    pub(super) fn squeeze(
        &mut self,
        _i: usize,
        n: &NodeProto,
        a: &Attrs,
    ) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let axes = if Self::has_input(n, 1) {
            Some(self.const_ints(n, 1, "axes")?)
        } else {
            a.ints("axes")
        };
        match self.val(n, 0)?.clone() {
            Val::View(v) if n.op_type == "Squeeze" => {
                let v = view_squeeze(v, axes.as_deref()).map_err(|e| err(e.to_string()))?;
                self.define(n, v);
            }
            _ => {
                let x = self.act(n, 0)?;
                let s = self.shape(&x)?;
                let dims = s.all_fixed().ok_or_else(|| {
                    err(format!(
                        "{} of {s}: the sequence length T is symbolic",
                        n.op_type
                    ))
                })?;
                let target = if n.op_type == "Squeeze" {
                    squeeze(&dims, axes.as_deref())
                } else {
                    unsqueeze(&dims, axes.as_deref())
                }
                .map_err(|why| err(format!("{} of {s}: {why}", n.op_type)))?;
                self.emit(n, Op::Reshape { shape: target }, &[&x])?;
            }
        }
        Ok(())
    }

    /// `Transpose` of a constant or of a recurrent layout; the IR has no transpose.
    pub(super) fn transpose(
        &mut self,
        _i: usize,
        n: &NodeProto,
        a: &Attrs,
    ) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let v = self.val(n, 0)?.clone();
        let rank = match &v {
            Val::View(v) => v.axes.len(),
            Val::Const(t) => t.dims.len(),
            _ => self.shape(&self.act(n, 0)?)?.rank() + 1,
        };
        let perm = a
            .ints("perm")
            .unwrap_or_else(|| (0..rank as i64).rev().collect());
        let out = match v {
            Val::View(v) => view_transpose(v, &perm).map_err(|e| err(e.to_string()))?,
            Val::Const(t) => Val::Const(Rc::new(
                transpose_const(&t, &perm).map_err(|e| err(e.to_string()))?,
            )),
            Val::Ir(x) if perm.iter().copied().eq(0..rank as i64) => Val::Ir(x),
            Val::Ir(x) if perm == [1, 0, 2] => View {
                ir: x,
                axes: vec![Ax::T, Ax::B, Ax::F],
                dirs: 1,
                hidden: 0,
            }
            .settle(),
            _ => {
                return Err(err(format!(
                    "Transpose with perm {perm:?}: the IR has no transpose; only the \
                     batch/time swaps around LSTM and GRU layers are supported"
                )));
            }
        };
        self.define(n, out);
        Ok(())
    }

    /// `Concat` of activations.
    pub(super) fn concat(&mut self, _i: usize, n: &NodeProto, a: &Attrs) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let xs = (0..n.input.len())
            .map(|p| self.act(n, p))
            .collect::<Result<Vec<_>, _>>()?;
        if xs.len() == 1 {
            self.define(n, Val::Ir(xs[0].clone()));
        } else {
            let axis = a
                .get("axis")
                .map(|v| v.i)
                .ok_or_else(|| err("Concat needs an axis".into()))?;
            let refs: Vec<&str> = xs.iter().map(String::as_str).collect();
            self.emit(n, Op::Concat { axis }, &refs)?;
        }
        Ok(())
    }
}

/// A constant with its axes permuted (old exports transpose weights in the graph).
/// The values of a `float`/`double` tensor move with its axes (as `float`, the
/// trained weights' type); those of other types of rank 2 or more are dropped,
/// as no op reads them as attributes.
pub(super) fn transpose_const(t: &TensorProto, perm: &[i64]) -> Result<TensorProto, LayoutError> {
    let rank = t.dims.len();
    let order = permutation(perm, rank)?;
    let dims: Vec<i64> = order.iter().map(|&p| t.dims[p]).collect();
    if rank <= 1 {
        return Ok(t.clone());
    }
    let values = tensor_f32(t).and_then(|v| {
        let sizes = positive(&t.dims)?;
        Some(permute(&v, &sizes, &order))
    });
    Ok(match values {
        Some(float_data) => TensorProto {
            dims,
            data_type: DataType::Float as i32,
            name: t.name.clone(),
            float_data,
            ..Default::default()
        },
        None => TensorProto {
            dims,
            data_type: t.data_type,
            name: t.name.clone(),
            ..Default::default()
        },
    })
}

/// Row-major `values` of shape `dims` with the axes reordered: output axis `k` is input axis `perm[k]`.
pub(super) fn permute(values: &[f32], dims: &[usize], perm: &[usize]) -> Vec<f32> {
    let rank = dims.len();
    let mut strides = vec![1usize; rank];
    for d in (0..rank.saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * dims[d + 1];
    }
    let out_dims: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
    let in_strides: Vec<usize> = perm.iter().map(|&p| strides[p]).collect();
    let mut out = Vec::with_capacity(values.len());
    let mut idx = vec![0usize; rank];
    for _ in 0..values.len() {
        out.push(
            values[idx
                .iter()
                .zip(&in_strides)
                .map(|(i, s)| i * s)
                .sum::<usize>()],
        );
        for d in (0..rank).rev() {
            idx[d] += 1;
            if idx[d] < out_dims[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}
