//! Random masks written out as ops, as `torch.onnx.export` writes torchvision's
//! stochastic depth in training mode: `ConstantOfShape([B, 1, 1, 1])`,
//! `RandomUniformLike`, `Less(keep)`, `Cast`, `Div(keep)`, then `x * mask`.
//! The mask is followed as a [`Val::Mask`] until it multiplies an activation,
//! which becomes one IR op: [`Op::DropPath`] for a mask of one value per sample,
//! [`Op::Dropout`] for a mask of the activation's shape.

use crate::error::GraphError;
use crate::onnx::decode::{Attrs, is_int_type, tensor_floats, tensor_ints};
use crate::onnx::import::{Importer, label};
use crate::onnx::proto::{DataType, NodeProto, TensorProto};
use crate::onnx::sym::Sym;
use crate::onnx::view::{Mask, Val};
use crate::op::Op;
use crate::shape::Dim;
use std::rc::Rc;

impl Importer {
    /// `ConstantOfShape`: the start of a random mask when the shape holds the batch,
    /// else a constant.
    pub(super) fn constant_of_shape(
        &mut self,
        _i: usize,
        n: &NodeProto,
        a: &Attrs,
    ) -> Result<(), GraphError> {
        let (shape, _) = self.ints_of(n, 0, "ConstantOfShape shape")?;
        let fixed: Option<Vec<i64>> = shape
            .iter()
            .map(|s| match s {
                Sym::N(k) if *k >= 0 => Some(*k),
                _ => None,
            })
            .collect();
        // Of a shape with the batch in it: a random mask being built. Of fixed sizes: a
        // constant (a zero tensor, a mask's ones) folded where it is used.
        if let Some(dims) = &fixed
            && dims
                .iter()
                .try_fold(1u64, |p, &d| p.checked_mul(d as u64))
                .is_none_or(|total| total > crate::onnx::MAX_ELEMENTS)
        {
            return Err(GraphError::node(
                label(n),
                format!("ConstantOfShape of {dims:?}: more elements than any model holds"),
            ));
        }
        let value = a.get("value").and_then(|v| v.t.as_ref());
        let int_value = value.is_some_and(|t| is_int_type(t.data_type));
        let val = match fixed {
            // A vector of integers: a shape value (`expand`'s -1 replaced by 1).
            Some(dims) if int_value && dims.len() == 1 => {
                let fill = value.map_or(Ok(vec![0]), tensor_ints).map_err(|e| {
                    GraphError::node(label(n), format!("ConstantOfShape value: {e}"))
                })?;
                Val::Ints {
                    v: vec![Sym::N(fill.first().copied().unwrap_or(0)); dims[0] as usize],
                    scalar: false,
                }
            }
            Some(dims) => {
                let fill = value
                    .and_then(|t| tensor_floats(t).ok())
                    .and_then(|v| v.first().copied())
                    .unwrap_or(0.0) as f32;
                let len = dims.iter().product::<i64>() as usize;
                Val::Const(Rc::new(TensorProto {
                    name: n.output.first().cloned().unwrap_or_default(),
                    dims,
                    data_type: DataType::Float as i32,
                    float_data: vec![fill; len],
                    ..Default::default()
                }))
            }
            None => Val::Mask(Mask {
                shape,
                uniform: false,
                keep: None,
                scale: 1.0,
            }),
        };
        self.define(n, val);
        Ok(())
    }

    /// `RandomUniformLike` over [0, 1) of a filled tensor.
    pub(super) fn random_uniform_like(
        &mut self,
        _i: usize,
        n: &NodeProto,
        a: &Attrs,
    ) -> Result<(), GraphError> {
        let mask = match self.val(n, 0)? {
            Val::Mask(m) if !m.uniform => m.clone(),
            // A model exported at a fixed batch: the filled tensor was folded.
            Val::Const(t) if !t.dims.is_empty() => Mask {
                shape: t.dims.iter().map(|&d| Sym::N(d)).collect(),
                uniform: false,
                keep: None,
                scale: 1.0,
            },
            _ => {
                return Err(GraphError::node(
                    label(n),
                    format!(
                        "RandomUniformLike of `{}`: only the uniform noise of a dropout or \
                         stochastic-depth mask (from ConstantOfShape) is supported",
                        n.input[0]
                    ),
                ));
            }
        };
        let (low, high) = (a.float("low", 0.0), a.float("high", 1.0));
        if (low, high) != (0.0, 1.0) {
            return Err(GraphError::node(
                label(n),
                format!("RandomUniformLike over [{low}, {high}): only [0, 1) makes a mask"),
            ));
        }
        self.define(
            n,
            Val::Mask(Mask {
                uniform: true,
                ..mask
            }),
        );
        Ok(())
    }

    /// `Less(uniform noise, keep)`: ones with probability `keep`.
    pub(super) fn less(&mut self, _i: usize, n: &NodeProto, _a: &Attrs) -> Result<(), GraphError> {
        let mask = match self.val(n, 0)? {
            Val::Mask(m) if m.uniform && m.keep.is_none() => m.clone(),
            _ => {
                return Err(GraphError::node(
                    label(n),
                    "Less: only comparing uniform noise with a constant (a dropout or \
                     stochastic-depth mask) is supported",
                ));
            }
        };
        let keep = self.const_scalar(n, 1, "Less threshold")?;
        self.define(
            n,
            Val::Mask(Mask {
                keep: Some(keep),
                ..mask
            }),
        );
        Ok(())
    }

    /// A mask scaled by a constant (`Div` when `divide`, else `Mul`).
    pub(super) fn scale_mask(
        &mut self,
        n: &NodeProto,
        mask: Mask,
        const_pos: usize,
        divide: bool,
    ) -> Result<(), GraphError> {
        let c = self.const_scalar(n, const_pos, "mask scale")?;
        if divide && c == 0.0 {
            return Err(GraphError::node(label(n), "Div of a mask by zero"));
        }
        let scale = if divide {
            mask.scale / c
        } else {
            mask.scale * c
        };
        self.define(n, Val::Mask(Mask { scale, ..mask }));
        Ok(())
    }

    /// `x * mask`: an inverted dropout, per sample or per element.
    pub(super) fn apply_mask(
        &mut self,
        n: &NodeProto,
        mask: Mask,
        x_pos: usize,
    ) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let x = self.act(n, x_pos)?;
        let Some(keep) = mask.keep.filter(|k| *k > 0.0 && *k <= 1.0) else {
            return Err(err(
                "a mask multiplied before it is a 0/1 Bernoulli mask".into()
            ));
        };
        if ((mask.scale * keep) - 1.0).abs() > 1e-4 {
            return Err(err(format!(
                "a mask kept with probability {keep} and scaled by {}: only the inverted \
                 scaling 1 / keep is supported",
                mask.scale
            )));
        }
        let p = (1.0 - keep) as f32;
        let shape = self.shape(&x)?;
        let sample: Vec<Sym> = shape
            .0
            .iter()
            .map(|d| match d {
                Dim::Seq => Sym::Seq,
                Dim::Fixed(k) => Sym::N(*k as i64),
            })
            .collect();
        let op = match mask.shape.split_first() {
            Some((Sym::Batch, rest)) if rest.iter().all(|s| *s == Sym::N(1)) => Op::DropPath { p },
            Some((Sym::Batch, rest)) if rest == sample.as_slice() => Op::Dropout { p },
            _ => {
                return Err(err(format!(
                    "a random mask of shape {:?} on an activation of shape {shape}: only one \
                     value per sample (stochastic depth) or per element (dropout) is supported",
                    mask.shape
                )));
            }
        };
        self.emit(n, op, &[&x])?;
        Ok(())
    }
}
