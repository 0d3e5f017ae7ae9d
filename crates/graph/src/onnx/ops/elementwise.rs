//! Activations and element-wise ops: the nonlinearities, `Clip`, `Softmax`,
//! `Dropout`, and `Add`/`Mul` of activations (or of neutral constants).

use crate::error::GraphError;
use crate::graph::LossKind;
use crate::onnx::decode::{Attrs, positive, tensor_floats};
use crate::onnx::import::{Importer, auto_loss, label};
use crate::onnx::proto::{NodeProto, TensorProto};
use crate::onnx::view::Val;
use crate::op::Op;
use crate::shape::Shape;

impl Importer {
    /// `Relu`, `Gelu`, `Tanh`, `Sigmoid`, `HardSigmoid` and `HardSwish`.
    pub(super) fn activation(
        &mut self,
        _i: usize,
        n: &NodeProto,
        a: &Attrs,
    ) -> Result<(), GraphError> {
        let x = self.act(n, 0)?;
        let op = match n.op_type.as_str() {
            "Relu" => Op::Relu,
            "Gelu" => Op::Gelu,
            "Tanh" => Op::Tanh,
            "HardSigmoid" => Op::HardSigmoid {
                alpha: a.float("alpha", 0.2),
                beta: a.float("beta", 0.5),
            },
            "HardSwish" => Op::HardSwish,
            _ => Op::Sigmoid,
        };
        self.emit(n, op, &[&x])?;
        Ok(())
    }

    /// `Clip` to `[0, max]`: a (clipped) ReLU.
    pub(super) fn clip(&mut self, _i: usize, n: &NodeProto, a: &Attrs) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let x = self.act(n, 0)?;
        let bound = |pos: usize, attr: &str| -> Result<Option<f64>, GraphError> {
            if Self::has_input(n, pos) {
                Ok(Some(self.const_scalar(n, pos, &format!("Clip {attr}"))?))
            } else {
                Ok(a.get(attr).map(|v| v.f as f64))
            }
        };
        let (min, max) = (bound(1, "min")?, bound(2, "max")?);
        let op = match (min, max) {
            (Some(0.0), None) => Op::Relu,
            (Some(lo), Some(hi)) if lo == 0.0 && hi > 0.0 => Op::ClippedRelu { max: hi as f32 },
            _ => {
                return Err(err(format!(
                    "Clip to [{}, {}]: only a ReLU clipped at 0 (min 0, max > 0) is \
                     supported",
                    min.map_or("-inf".into(), |v| v.to_string()),
                    max.map_or("inf".into(), |v| v.to_string())
                )));
            }
        };
        self.emit(n, op, &[&x])?;
        Ok(())
    }

    /// `Softmax` and `LogSoftmax`; a final one before a classification loss is removed.
    pub(super) fn softmax(
        &mut self,
        _i: usize,
        n: &NodeProto,
        a: &Attrs,
    ) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let x = self.act(n, 0)?;
        let shape = self.shape(&x)?.clone();
        let default_axis = if self.opset < 13 { 1 } else { -1 };
        let axis = a.int("axis", default_axis);
        let full = shape.rank() as i64 + 1;
        let last = axis == -1 || axis == full - 1;
        let is_loss_input =
            n.output.first() == self.outputs.first() && !self.consumers.contains_key(&n.output[0]);
        let classify = match self.loss {
            Some(LossKind::Mse) => false,
            Some(_) => true,
            None => auto_loss(&shape) != LossKind::Mse,
        };
        // Keep a softmax applied straight to an input: the loss needs a node.
        let from_node = !self.graph_inputs.contains(&x);
        if is_loss_input && last && classify && from_node {
            // Cross-entropy takes logits: drop the final softmax.
            self.define(n, Val::Ir(x));
        } else if n.op_type == "LogSoftmax" {
            return Err(err(
                "LogSoftmax is only supported as the model's final op, after a layer \
                 and over the class axis, before a classification loss (where it is \
                 removed)"
                    .into(),
            ));
        } else {
            self.emit(n, Op::Softmax { axis }, &[&x])?;
        }
        Ok(())
    }

    /// `Add` and `Mul` of two activations, or of an activation and a neutral constant;
    /// `Mul` by a scalar constant.
    pub(super) fn add_mul(
        &mut self,
        _i: usize,
        n: &NodeProto,
        _a: &Attrs,
    ) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let (p, q) = (self.val(n, 0)?, self.val(n, 1)?);
        match (p, q) {
            (Val::Mask(m), other) | (other, Val::Mask(m)) if n.op_type == "Mul" => {
                let (m, other_pos) = (m.clone(), usize::from(matches!(p, Val::Mask(_))));
                if matches!(other, Val::Const(_)) {
                    self.scale_mask(n, m, other_pos, false)?;
                } else {
                    self.apply_mask(n, m, other_pos)?;
                }
            }
            (Val::Const(c), _) | (_, Val::Const(c)) => {
                let c = c.clone();
                let pos = usize::from(matches!(p, Val::Const(_)));
                let x = self.act(n, pos)?;
                let neutral = if n.op_type == "Add" { 0.0 } else { 1.0 };
                let scalar = scalar_value(&c);
                if self.neutral(&x, &c, neutral)? {
                    self.define(n, Val::Ir(x));
                } else if let (Some(factor), "Mul") = (scalar, n.op_type.as_str()) {
                    self.emit(n, Op::Scale { factor }, &[&x])?;
                } else {
                    return Err(err(format!(
                        "{} of activation `{}` and constant `{}` {:?}: only a bias right \
                         after MatMul/Gemm/Conv (folded into that layer) or two \
                         activations are supported",
                        n.op_type, n.input[pos], c.name, c.dims
                    )));
                }
            }
            _ => {
                let (x, y) = (self.act(n, 0)?, self.act(n, 1)?);
                let op = if n.op_type == "Add" { Op::Add } else { Op::Mul };
                self.emit(n, op, &[&x, &y])?;
            }
        }
        Ok(())
    }

    /// `Div` of an activation by a scalar constant (attention's `1 / sqrt(d)`).
    pub(super) fn div(&mut self, _i: usize, n: &NodeProto, _a: &Attrs) -> Result<(), GraphError> {
        if let Val::Mask(m) = self.val(n, 0)? {
            let m = m.clone();
            return self.scale_mask(n, m, 1, true);
        }
        let x = self.act(n, 0)?;
        let divisor = match self.val(n, 1)? {
            Val::Const(c) => scalar_value(c).filter(|&d| d != 0.0),
            _ => None,
        };
        let Some(divisor) = divisor else {
            return Err(GraphError::node(
                label(n),
                format!(
                    "Div of activation `{}` by `{}`: only a division by a nonzero scalar \
                     constant is supported",
                    n.input[0], n.input[1]
                ),
            ));
        };
        self.emit(
            n,
            Op::Scale {
                factor: 1.0 / divisor,
            },
            &[&x],
        )?;
        Ok(())
    }

    /// Variadic `Sum` and `Mean` of activations: a chain of `Add`s (then a scale).
    pub(super) fn sum_mean(
        &mut self,
        _i: usize,
        n: &NodeProto,
        _a: &Attrs,
    ) -> Result<(), GraphError> {
        let xs = (0..n.input.len())
            .map(|p| self.act(n, p))
            .collect::<Result<Vec<_>, _>>()?;
        let mean = n.op_type == "Mean" && xs.len() > 1;
        let Some((first, rest)) = xs.split_first() else {
            return Err(GraphError::node(
                label(n),
                format!("{} needs inputs", n.op_type),
            ));
        };
        if rest.is_empty() {
            self.define(n, Val::Ir(first.clone()));
            return Ok(());
        }
        let mut acc = first.clone();
        for (k, x) in rest.iter().enumerate() {
            if k + 1 == rest.len() && !mean {
                self.emit(n, Op::Add, &[&acc, x])?;
                return Ok(());
            }
            let name = self.fresh(n);
            acc = self.b.push(&name, Op::Add, &[&acc, x])?;
        }
        let factor = 1.0 / xs.len() as f32;
        self.emit(n, Op::Scale { factor }, &[&acc])?;
        Ok(())
    }

    /// `Dropout` with its ratio from the input or the attribute.
    pub(super) fn dropout(
        &mut self,
        _i: usize,
        n: &NodeProto,
        a: &Attrs,
    ) -> Result<(), GraphError> {
        let x = self.act(n, 0)?;
        let p = if Self::has_input(n, 1) {
            self.const_scalar(n, 1, "Dropout ratio")?
        } else {
            a.get("ratio").map_or(0.5, |v| v.f as f64)
        };
        self.emit(n, Op::Dropout { p: p as f32 }, &[&x])?;
        Ok(())
    }

    /// Whether adding (or multiplying by) constant `c` leaves `x` unchanged.
    fn neutral(&self, x: &str, c: &TensorProto, neutral: f64) -> Result<bool, GraphError> {
        let Ok(values) = tensor_floats(c) else {
            return Ok(false);
        };
        if values.iter().any(|&v| v != neutral) {
            return Ok(false);
        }
        let s = self.shape(x)?;
        let Some(mut dims) = positive(&c.dims) else {
            return Ok(false);
        };
        if dims.len() > s.rank() + 1 {
            return Ok(false);
        }
        if dims.len() == s.rank() + 1 {
            if dims[0] != 1 {
                return Ok(false);
            }
            dims.remove(0);
        }
        Ok(Op::Add.infer(&[s, &Shape::fixed(&dims)]).as_ref() == Ok(s))
    }
}

/// The value of a constant holding exactly one number (any rank).
fn scalar_value(c: &TensorProto) -> Option<f32> {
    match tensor_floats(c).ok()?[..] {
        [v] => Some(v as f32),
        _ => None,
    }
}
