//! Linear layers: `Gemm`, `MatMul` (folding a following bias `Add`) and
//! `Gather` embedding lookups; their weights move to the IR's `[out, in]` layout.

use crate::error::GraphError;
use crate::onnx::decode::{Attrs, dims2, tensor_f32};
use crate::onnx::fold::permute;
use crate::onnx::import::{Importer, label};
use crate::onnx::proto::{NodeProto, TensorProto};
use crate::onnx::view::Val;
use crate::op::Op;
use std::rc::Rc;

impl Importer {
    /// `Gemm`: a linear layer; `alpha` and `beta` scale its trained weights.
    pub(super) fn gemm(&mut self, i: usize, n: &NodeProto, a: &Attrs) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let x = self.act(n, 0)?;
        if a.int("transA", 0) != 0 {
            return Err(err("Gemm with transA = 1 is not supported".into()));
        }
        let s = self.shape(&x)?;
        // Aligned to a layout that merged the batch ([T·B, features]) it is [B, T, features];
        // a table computed once per step has its rows ([rows, features]: Swin V2-CR's
        // relative coordinates into its meta MLP).
        let table = self.b.is_shared(&x) && s.rank() == 2;
        if s.rank() != 1 && self.wrap.is_none_or(|l| l.b_alone) && !table {
            return Err(err(format!("Gemm needs a [B, features] input, got {s}")));
        }
        let w = self.konst(n, 1, "Gemm weight B")?;
        let [d0, d1] = dims2(&w.dims)
            .ok_or_else(|| err(format!("Gemm weight B must be 2-D, got {:?}", w.dims)))?;
        let trans_b = a.int("transB", 0) != 0;
        let (k, out) = if trans_b { (d1, d0) } else { (d0, d1) };
        // IR layout [out, in]: B itself with transB = 1, else its transpose.
        let weight = tensor_f32(&w).map(|v| {
            let v = if trans_b { v } else { transpose2(&v, d0, d1) };
            scaled(v, a.float("alpha", 1.0))
        });
        let beta = a.float("beta", 1.0);
        let bias = if Self::has_input(n, 2) && beta != 0.0 {
            Some((self.konst(n, 2, "Gemm bias C")?, beta))
        } else {
            None
        };
        self.linear(i, n, &x, k, out, weight, bias)?;
        Ok(())
    }

    /// `MatMul`: a linear layer with a constant right operand, else a product of activations.
    pub(super) fn matmul(&mut self, i: usize, n: &NodeProto, _a: &Attrs) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        match (self.val(n, 0)?, self.val(n, 1)?) {
            (_, Val::Const(w)) => {
                let x = self.act(n, 0)?;
                let [k, out] = dims2(&w.dims).ok_or_else(|| {
                    err(format!(
                        "MatMul with a constant right operand needs a 2-D weight, got {:?}",
                        w.dims
                    ))
                })?;
                // ONNX [in, out] -> IR [out, in].
                let weight = tensor_f32(w).map(|v| transpose2(&v, k, out));
                self.linear(i, n, &x, k, out, weight, None)?;
            }
            (Val::Const(_), _) => {
                return Err(err(
                    "MatMul with a constant left operand is not supported".into()
                ));
            }
            _ => {
                let (x, y) = (self.act(n, 0)?, self.act(n, 1)?);
                self.emit(n, Op::MatMul, &[&x, &y])?;
            }
        }
        Ok(())
    }

    /// `Gather` of ids from a constant table: an embedding lookup (or indexing an
    /// activation, [`Importer::gather_activation`]).
    pub(super) fn gather(&mut self, _i: usize, n: &NodeProto, a: &Attrs) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let table = match self.val(n, 0)? {
            Val::Const(t) => t.clone(),
            _ => return self.gather_activation(n, a),
        };
        let [vocab, dim] = dims2(&table.dims)
            .ok_or_else(|| err(format!("embedding table must be 2-D, got {:?}", table.dims)))?;
        if a.int("axis", 0) != 0 {
            return Err(err(
                "Gather on an axis other than 0 is not an embedding".into()
            ));
        }
        let ids = self.act(n, 1)?;
        let name = self.emit(n, Op::Embedding { vocab, dim }, &[&ids])?;
        self.attach(&name, vec![tensor_f32(&table)]);
        Ok(())
    }

    /// A linear layer `k -> out` on `x`, folding a following bias `Add` when there is no bias.
    /// `weight` holds the trained values in IR layout `[out, k]` when readable; `bias` is
    /// the constant bias with the factor it is scaled by (Gemm's `beta`).
    #[allow(clippy::too_many_arguments)] // the layer's sizes and its two weights
    pub(super) fn linear(
        &mut self,
        i: usize,
        n: &NodeProto,
        x: &str,
        k: usize,
        out: usize,
        weight: Option<Vec<f32>>,
        bias: Option<(Rc<TensorProto>, f32)>,
    ) -> Result<(), GraphError> {
        let have = self.last_dim(n, x)?;
        if have != k {
            return Err(GraphError::node(
                label(n),
                format!(
                    "the weight maps {k} features to {out} but the input {} has {have}",
                    self.shape(x)?
                ),
            ));
        }
        let folded = if bias.is_some() {
            None
        } else {
            self.bias_fold(i, |d| {
                d.last() == Some(&(out as i64)) && d.iter().rev().skip(1).all(|&v| v == 1)
            })
        };
        let bias = bias.or_else(|| folded.as_ref().map(|(_, t)| (Rc::clone(t), 1.0)));
        let op = Op::Linear {
            in_features: k,
            out_features: out,
            bias: bias.is_some(),
        };
        let name = self.emit(n, op, &[x])?;
        if let Some((f, _)) = folded {
            // The folded `Add`'s output is what the layer's output is (maybe a layout view).
            let v = self.vals[&n.output[0]].clone();
            self.vals.insert(f, v);
        }
        let mut weights = vec![weight];
        if let Some((t, beta)) = bias {
            weights.push(bias_values(&t, out).map(|v| scaled(v, beta)));
        }
        self.attach(&name, weights);
        Ok(())
    }
}

/// The transpose of a row-major `[rows, cols]` matrix.
pub(super) fn transpose2(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    permute(values, &[rows, cols], &[1, 0])
}

/// The values times `factor`.
pub(super) fn scaled(mut v: Vec<f32>, factor: f32) -> Vec<f32> {
    if factor != 1.0 {
        v.iter_mut().for_each(|x| *x *= factor);
    }
    v
}

/// A bias constant broadcast to `[out]` (it may be `[out]`, `[1, out]`, `[1, out, 1, 1]`, a scalar, ...).
pub(super) fn bias_values(t: &TensorProto, out: usize) -> Option<Vec<f32>> {
    let v = tensor_f32(t)?;
    match v.len() {
        n if n == out => Some(v),
        1 => Some(vec![v[0]; out]),
        _ => None,
    }
}
