//! Activations and element-wise ops: the nonlinearities, `Clip`, `Softmax`,
//! `Dropout`, and `Add`/`Mul` of activations (or of neutral constants).

use crate::error::GraphError;
use crate::graph::LossKind;
use crate::loss::by_layout;
use crate::onnx::decode::{Attrs, positive, tensor_f32, tensor_floats};
use crate::onnx::import::{Importer, label};
use crate::onnx::proto::{NodeProto, TensorProto};
use crate::onnx::view::Val;
use crate::op::{Op, sample_axis};
use crate::shape::{Dim, Shape};

impl Importer {
    /// `Relu`, `LeakyRelu`, `Gelu`, `Tanh`, `Sigmoid`, `HardSigmoid` and `HardSwish`.
    pub(super) fn activation(
        &mut self,
        _i: usize,
        n: &NodeProto,
        a: &Attrs,
    ) -> Result<(), GraphError> {
        let x = self.act(n, 0)?;
        let op = match n.op_type.as_str() {
            "Relu" => Op::Relu,
            "LeakyRelu" => Op::LeakyRelu {
                alpha: a.float("alpha", 0.01),
            },
            "Gelu" => Op::Gelu,
            "Tanh" => Op::Tanh,
            "HardSigmoid" => Op::HardSigmoid {
                alpha: a.float("alpha", 0.2),
                beta: a.float("beta", 0.5),
            },
            "HardSwish" => Op::HardSwish,
            "Exp" => Op::Exp,
            _ => Op::Sigmoid,
        };
        self.emit(n, op, &[&x])?;
        Ok(())
    }

    /// `PRelu` with a learned slope (an initializer, as `nn.PReLU` exports it: `[1]`, or
    /// `[C, 1, 1]` per channel) broadcast against the sample.
    pub(super) fn prelu(&mut self, _i: usize, n: &NodeProto, _a: &Attrs) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let x = self.act(n, 0)?;
        // The initializer itself, or all of it reshaped (`nn.PReLU`'s `[C]` unsqueezed).
        let learned = |name: &str| {
            self.initializers.contains(name)
                || self.read_from.get(name).is_some_and(|r| r.is_whole())
        };
        let slope = match n
            .input
            .get(1)
            .and_then(|s| self.vals.get(s).map(|v| (s, v)))
        {
            Some((name, Val::Const(t))) if learned(name) => t.clone(),
            _ => {
                return Err(err(
                    "PRelu whose slope is not an initializer: only a learned slope (nn.PReLU) \
                     is supported"
                        .into(),
                ));
            }
        };
        let s = self.shape(&x)?;
        let mut dims = positive(&slope.dims)
            .ok_or_else(|| err(format!("PRelu slope of dims {:?}", slope.dims)))?;
        if dims.len() == s.rank() + 1 && dims[0] == 1 {
            dims.remove(0);
        }
        if dims.is_empty() {
            dims.push(1);
        }
        let op = Op::PRelu { shape: dims };
        if let Err(e) = op.infer(&[s]) {
            return Err(err(format!(
                "PRelu slope of dims {:?} does not broadcast against `{}` {s}: {e}",
                slope.dims, n.input[0]
            )));
        }
        let name = self.emit(n, op, &[&x])?;
        self.attach(&name, vec![tensor_f32(&slope)]);
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
            (lo, hi) => {
                // A missing bound is the largest float, as the fold reads it (the graph
                // travels as JSON, which has no infinity).
                let (lo, hi) = (lo.unwrap_or(f32::MIN.into()), hi.unwrap_or(f32::MAX.into()));
                if lo.is_nan() || hi.is_nan() || lo > hi {
                    return Err(err(format!("Clip to [{lo}, {hi}]: an empty range")));
                }
                Op::Clamp {
                    min: (lo as f32).max(f32::MIN),
                    max: (hi as f32).min(f32::MAX),
                }
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
        // A final softmax over another axis than the last names the class axis
        // (Wav2Letter's `log_softmax(dim=1)` of `[B, C, T]`, a segmentation's `[B, C, H, W]`).
        let class_axis = match (last, sample_axis(&shape, axis)) {
            (false, Ok(k)) if shape.0[k].fixed().is_some_and(|c| c > 1) => Some(k),
            _ => None,
        };
        let classify = match self.loss {
            Some(LossKind::Mse) => false,
            Some(_) => true,
            None => class_axis.is_some() || by_layout(&shape) != LossKind::Mse,
        };
        // Keep a softmax applied straight to an input: the loss needs a node.
        let from_node = !self.graph_inputs.contains(&x);
        if is_loss_input && last && classify && from_node {
            // Cross-entropy takes logits: drop the final softmax.
            self.define(n, Val::Ir(x));
        } else if let (true, true, true, Some(k)) = (is_loss_input, classify, from_node, class_axis)
        {
            // Dropped as above; the class axis moves last and the positions become rows
            // `[positions, C]`, the per-position loss's layout (as PyTorch's
            // `CrossEntropyLoss` reads `[B, C, d1, ...]`).
            let rank = shape.rank();
            let perm: Vec<usize> = (0..rank).filter(|&a| a != k).chain([k]).collect();
            let classes = shape.0[k].fixed().unwrap_or(1) as i64;
            let mut ops = vec![Op::Transpose { perm }];
            if rank > 2 {
                ops.push(Op::Reshape {
                    shape: vec![-1, classes],
                });
            }
            self.emit_chain(n, x, ops)?;
        } else if n.op_type == "LogSoftmax" {
            return Err(err(
                "LogSoftmax is only supported as the model's final op, after a layer, \
                 before a classification loss (where it is removed and its axis is the \
                 class axis)"
                    .into(),
            ));
        } else {
            self.emit(n, Op::Softmax { axis }, &[&x])?;
        }
        Ok(())
    }

    /// `Add` and `Mul` of two activations, of an activation and a learned tensor (an
    /// initializer) or a neutral constant; `Mul` by a scalar constant.
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
                // A float initializer an activation reads is a parameter (as PyTorch
                // trains it), even while it holds its initial zeros or ones.
                // So is one read from an initializer by folded indexing (a table looked up
                // at constant indices).
                let read = self.read_from.get(&c.name).cloned();
                let learned = match self.initializers.contains(&c.name) || read.is_some() {
                    true => self.learned_shape(&x, &c)?,
                    false => None,
                };
                let table = read.filter(|r| !r.is_whole());
                if let (Some(shape), Some(r)) = (&learned, table) {
                    if n.op_type != "Add" {
                        return Err(err(format!(
                            "Mul of activation `{}` by parameter `{}` read at constant \
                             indices: only adding such a table is supported",
                            n.input[pos], r.table
                        )));
                    }
                    let values = match self.vals.get(&r.table) {
                        Some(Val::Const(t)) => tensor_f32(t),
                        _ => None,
                    };
                    let op = Op::AddTable {
                        shape: shape.clone(),
                        table: r.len,
                        index: r.index,
                    };
                    let name = self.emit(n, op, &[&x])?;
                    self.attach(&name, vec![values]);
                } else if let Some(shape) = learned {
                    let op = match n.op_type.as_str() {
                        "Add" => Op::AddParam { shape },
                        _ => Op::MulParam { shape },
                    };
                    let name = self.emit(n, op, &[&x])?;
                    self.attach(&name, vec![tensor_f32(&c)]);
                } else if self.neutral(&x, &c, neutral)? {
                    self.define(n, Val::Ir(x));
                } else if let (Some(factor), "Mul") = (scalar, n.op_type.as_str()) {
                    self.emit(n, Op::Scale { factor }, &[&x])?;
                } else if n.op_type == "Add" && is_causal_mask(&c, self.shape(&x)?) {
                    self.emit(n, Op::CausalMask, &[&x])?;
                } else if let Some(op) = self.constant_operand(&n.op_type, &x, &c)? {
                    self.emit(n, op, &[&x])?;
                } else {
                    return Err(err(format!(
                        "{} of activation `{}` and constant `{}` {:?}: only a bias right \
                         after MatMul/Gemm/Conv (folded into that layer), a learned \
                         tensor (an initializer, like a positional embedding or a layer \
                         scale), a causal attention mask or two activations are supported",
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

    /// `Neg` of an activation (rotary embeddings' `rotate_half`): a scale by -1.
    pub(super) fn neg(&mut self, _i: usize, n: &NodeProto, _a: &Attrs) -> Result<(), GraphError> {
        let x = self.act(n, 0)?;
        self.emit(n, Op::Scale { factor: -1.0 }, &[&x])?;
        Ok(())
    }

    /// `Sub` of two activations: the sum with the second negated (`x - mixer(x)`); of a
    /// constant zero, the activation itself.
    pub(super) fn sub(&mut self, _i: usize, n: &NodeProto, _a: &Attrs) -> Result<(), GraphError> {
        // A constant minus an activation (ConViT's `1 - sigmoid(gating)`): its negation
        // plus the constant.
        if let (Val::Const(c), Val::Ir(_) | Val::View(_)) = (self.val(n, 0)?, self.val(n, 1)?) {
            let c = c.clone();
            let y = self.act(n, 1)?;
            let negated = self.fresh(n);
            let negated = self.b.push(&negated, Op::Scale { factor: -1.0 }, &[&y])?;
            let Some(op) = self.constant_operand("Add", &negated, &c)? else {
                return Err(GraphError::node(
                    label(n),
                    format!(
                        "Sub of `{}` from constant `{}`: the constant does not broadcast \
                         onto it",
                        n.input[1], n.input[0]
                    ),
                ));
            };
            self.emit(n, op, &[&negated])?;
            return Ok(());
        }
        let x = self.act(n, 0)?;
        if let Val::Const(c) = self.val(n, 1)? {
            let c = c.clone();
            if self.neutral(&x, &c, 0.0)? {
                self.define(n, Val::Ir(x));
                return Ok(());
            }
        }
        let y = self.act(n, 1)?;
        let negated = self.fresh(n);
        let negated = self.b.push(&negated, Op::Scale { factor: -1.0 }, &[&y])?;
        self.emit(n, Op::Add, &[&x, &negated])?;
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
            // Two activations: their quotient, broadcast.
            Val::Ir(_) | Val::View(_) => {
                let y = self.act(n, 1)?;
                self.emit(n, Op::Div, &[&x, &y])?;
                return Ok(());
            }
            _ => None,
        };
        let Some(divisor) = divisor else {
            return Err(GraphError::node(
                label(n),
                format!(
                    "Div of activation `{}` by `{}`: only a division by a nonzero scalar \
                     constant or by an activation is supported",
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
        if p == 0.0 {
            // `nn.Dropout(0.0)` (ViT's default) returns its input in PyTorch and here.
            self.define(n, Val::Ir(x));
        } else {
            self.emit(n, Op::Dropout { p: p as f32 }, &[&x])?;
        }
        Ok(())
    }

    /// The IR parameter shape of initializer `c` added to or multiplying `x`: a tensor
    /// (not one number) the same for every sample (a leading batch axis of 1 dropped),
    /// finite, broadcasting against the sample.
    fn learned_shape(&self, x: &str, c: &TensorProto) -> Result<Option<Vec<usize>>, GraphError> {
        let s = self.shape(x)?;
        let (Some(mut dims), Some(values)) = (positive(&c.dims), tensor_f32(c)) else {
            return Ok(None);
        };
        // One number added is a constant offset the IR does not model, not a tensor.
        if values.len() < 2 || values.iter().any(|v| !v.is_finite()) || dims.len() > s.rank() + 1 {
            return Ok(None);
        }
        if dims.len() == s.rank() + 1 {
            if dims[0] != 1 {
                return Ok(None);
            }
            dims.remove(0);
        }
        let op = Op::AddParam { shape: dims };
        Ok(match (op.infer(&[s]), op) {
            (Ok(_), Op::AddParam { shape }) => Some(shape),
            _ => None,
        })
    }

    /// `x + c` or `x * c` for a constant tensor `c` (not a learned one) that broadcasts
    /// onto the sample without enlarging it (a leading batch axis of 1 dropped): an
    /// attention mask folded from constants, a rotary embedding's cosines and sines, an
    /// epsilon added before a division.
    /// `None` for anything else.
    fn constant_operand(
        &self,
        op_type: &str,
        x: &str,
        c: &TensorProto,
    ) -> Result<Option<Op>, GraphError> {
        if op_type != "Add" && op_type != "Mul" {
            return Ok(None);
        }
        let s = self.shape(x)?;
        let (Some(mut dims), Some(values)) = (positive(&c.dims), tensor_f32(c)) else {
            return Ok(None);
        };
        if values.is_empty() || dims.len() > s.rank() + 1 {
            return Ok(None);
        }
        if dims.len() == s.rank() + 1 {
            if dims[0] != 1 {
                return Ok(None);
            }
            dims.remove(0);
        }
        let op = match op_type {
            "Add" => Op::AddConst {
                shape: dims,
                values,
            },
            _ => Op::MulConst {
                shape: dims,
                values,
            },
        };
        Ok(op.infer(&[s]).is_ok().then_some(op))
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

/// Whether constant `c` is a causal attention mask for scores of sample shape `s`:
/// `[.., T, T]` (leading axes of 1), 0 on and below the diagonal and -inf (or a large
/// negative number, as some exports write it) above.
fn is_causal_mask(c: &TensorProto, s: &Shape) -> bool {
    let (Some(dims), Some(values)) = (positive(&c.dims), tensor_f32(c)) else {
        return false;
    };
    let r = dims.len();
    if r < 2 || dims[r - 1] != dims[r - 2] || dims[..r - 2].iter().any(|&d| d != 1) {
        return false;
    }
    let t = dims[r - 1];
    let square =
        s.rank() >= 2 && s.0[s.rank() - 1] == Dim::Fixed(t) && s.0[s.rank() - 2] == Dim::Fixed(t);
    square
        && values.iter().enumerate().all(|(i, &v)| {
            let (row, col) = (i / t, i % t);
            if col > row { v <= -1e4 } else { v == 0.0 }
        })
}

/// The value of a constant holding exactly one number (any rank).
fn scalar_value(c: &TensorProto) -> Option<f32> {
    match tensor_floats(c).ok()?[..] {
        [v] => Some(v as f32),
        _ => None,
    }
}
