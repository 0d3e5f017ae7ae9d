//! Weight standardisation written into the graph: timm's `StdConv2d` and
//! `ScaledStdConv2d` (BiT, NFNet, the ResNet stems of hybrid ViTs) export
//! `F.batch_norm(w.reshape(1, O, -1), training=True)` of the convolution's own weight,
//! reshaped back and read by the `Conv` as its weight. The three nodes become one
//! [`Op::Conv`] with [`Standardize`]: the raw weight stays the parameter and the
//! engine standardises it every step, as PyTorch does. (Folded, the weight would be a
//! constant and the gain uncounted.)

use crate::error::GraphError;
use crate::onnx::decode::{Attrs, numel, tensor_f32, tensor_floats, tensor_ints};
use crate::onnx::import::{Importer, label};
use crate::onnx::proto::{NodeProto, TensorProto};
use crate::onnx::sym::Sym;
use crate::onnx::view::Val;
use crate::op::Standardize;
use std::rc::Rc;

/// A convolution weight on its way to being standardised (between the
/// `BatchNormalization` and the `Conv`).
#[derive(Clone, Debug)]
pub(in crate::onnx) struct StdWeight {
    /// The raw weight's initializer.
    pub(in crate::onnx) weight: Rc<TensorProto>,
    pub(in crate::onnx) standardize: Standardize,
    /// The learned gain's values, when the scale is one.
    pub(in crate::onnx) gain: Option<Vec<f32>>,
}

/// Ops that keep a tensor's elements in their order: a learned tensor read through
/// them is still all of it.
const ORDER_KEEPING: [&str; 5] = ["Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"];

/// How many nodes back a learned tensor is looked for (an export takes two or three).
const MAX_HOPS: usize = 8;

impl Importer {
    /// Takes `n` when it is a step of weight standardisation: the `BatchNormalization`
    /// of a weight (recorded, not emitted) or the `Reshape` back to the weight's shape.
    /// `false` for anything else.
    pub(super) fn weight_standardization(
        &mut self,
        n: &NodeProto,
        a: &Attrs,
    ) -> Result<bool, GraphError> {
        // A malformed node (no input or output) is left to the op's import to refuse.
        let (Some(x), Some(_)) = (n.input.first(), n.output.first()) else {
            return Ok(false);
        };
        match n.op_type.as_str() {
            "BatchNormalization" if matches!(self.vals.get(x), Some(Val::Const(_))) => {
                self.standardized_weight(n, a)
            }
            "Reshape" if self.standardizing.contains_key(x) => {
                let w = self.standardizing[x].clone();
                let target = self.target_ints(n);
                if target.as_deref() != Some(&w.weight.dims[..]) {
                    return Err(GraphError::node(
                        label(n),
                        format!(
                            "a standardised convolution weight reshaped to {target:?}, not \
                             back to its shape {:?}",
                            w.weight.dims
                        ),
                    ));
                }
                self.hold(n, w);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// `BatchNormalization` in training mode of a whole weight `[O, ...]` seen as
    /// `[1, O, fan_in]`, its scale ones or a learned gain (times a constant), its shift
    /// zeros, its running statistics unread.
    fn standardized_weight(&mut self, n: &NodeProto, a: &Attrs) -> Result<bool, GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let Some(weight) = self.learned_whole(&n.input[0]).map(|(w, _)| w) else {
            // A constant that is not a learned tensor: the op's import refuses it.
            return Ok(false);
        };
        let Some(Val::Const(w)) = self.vals.get(weight.as_str()).cloned() else {
            return Ok(false);
        };
        let Some(Val::Const(x)) = self.vals.get(n.input[0].as_str()) else {
            return Ok(false);
        };
        // A convolution's weight `[O, I, kernel..]`, seen as `[1, O, fan_in]`.
        let conv_weight = (3..=5).contains(&w.dims.len()) && w.dims.iter().all(|&d| d > 0);
        let out_channels = w.dims.first().copied().unwrap_or(0);
        let fan_in = numel(w.dims.get(1..).unwrap_or_default()).unwrap_or(0) as i64;
        if !conv_weight || a.int("training_mode", 0) != 1 || x.dims != [1, out_channels, fan_in] {
            return Err(err(format!(
                "BatchNormalization of parameter `{weight}` {:?}: only weight \
                 standardisation (training mode over `[1, out_channels, fan_in]`) is supported",
                x.dims
            )));
        }
        let running_stats_read =
            n.output.iter().skip(1).any(|o| {
                !o.is_empty() && (self.consumers.contains_key(o) || self.outputs.contains(o))
            });
        let shift_zero = self
            .const_f32(n, 2)
            .is_some_and(|b| b.len() == out_channels as usize && b.iter().all(|&v| v == 0.0));
        if running_stats_read || !shift_zero {
            return Err(err(format!(
                "standardisation of `{weight}` with a shift or read running statistics"
            )));
        }
        let (gain, scale) = self.standardize_gain(n, out_channels as usize)?;
        let held = StdWeight {
            weight: w,
            standardize: Standardize {
                eps: a.float("epsilon", 1e-5),
                gain: gain.is_some(),
                scale,
            },
            gain,
        };
        // The weight is read only through the `Reshape`s back to its shape.
        let out = &n.output[0];
        let uses = self.consumers.get(out).map_or(&[][..], Vec::as_slice);
        if uses.is_empty()
            || uses
                .iter()
                .any(|&(k, _)| self.nodes[k].op_type != "Reshape")
        {
            return Err(err(format!(
                "standardised weight `{weight}` read by something other than a Reshape"
            )));
        }
        self.hold(n, held);
        Ok(true)
    }

    /// The standardisation's scale (input 1): ones, or a learned gain of one element per
    /// output channel, optionally times a constant number: `(gain, constant)`.
    fn standardize_gain(
        &self,
        n: &NodeProto,
        channels: usize,
    ) -> Result<(Option<Vec<f32>>, f32), GraphError> {
        let scale = n.input.get(1).map_or("", String::as_str);
        if let Some((gain, factor)) = self.learned_whole(scale) {
            let values = match self.vals.get(gain.as_str()) {
                Some(Val::Const(t)) => tensor_f32(t).filter(|v| v.len() == channels),
                _ => None,
            };
            return match values {
                Some(v) => Ok((Some(v), factor)),
                None => Err(GraphError::node(
                    label(n),
                    format!("gain `{gain}` does not hold one value per output channel"),
                )),
            };
        }
        match self.const_f32(n, 1) {
            Some(v) if v.len() == channels && v.iter().all(|&s| s == v[0]) => Ok((None, v[0])),
            _ => Err(GraphError::node(
                label(n),
                format!("weight standardisation with a constant scale `{scale}` that varies"),
            )),
        }
    }

    /// The initializer `name` is all of (read through [`ORDER_KEEPING`] ops), with the
    /// constant number a `Mul` on the way multiplies it by; `None` when it is not one.
    fn learned_whole(&self, name: &str) -> Option<(String, f32)> {
        self.learned_within(name, MAX_HOPS)
    }

    /// [`Importer::learned_whole`] at most `hops` nodes back (a malformed graph may
    /// loop).
    fn learned_within(&self, name: &str, hops: usize) -> Option<(String, f32)> {
        if self.initializers.contains(name) {
            return Some((name.to_string(), 1.0));
        }
        let hops = hops.checked_sub(1)?;
        let n = self
            .nodes
            .iter()
            .find(|m| m.output.iter().any(|o| o == name))?;
        match n.op_type.as_str() {
            op if ORDER_KEEPING.contains(&op) => self.learned_within(n.input.first()?, hops),
            "Mul" if n.input.len() == 2 => (0..2).find_map(|k| {
                let factor = match self.vals.get(n.input[1 - k].as_str())? {
                    Val::Const(t) => match tensor_floats(t).ok()?[..] {
                        [v] => v as f32,
                        _ => return None,
                    },
                    _ => return None,
                };
                let (init, f) = self.learned_within(&n.input[k], hops)?;
                Some((init, f * factor))
            }),
            _ => None,
        }
    }

    /// The fixed target of `Reshape` `n`, when its input 1 is known.
    fn target_ints(&self, n: &NodeProto) -> Option<Vec<i64>> {
        match self.vals.get(n.input.get(1)?.as_str())? {
            Val::Const(t) => tensor_ints(t).ok(),
            Val::Ints { v, .. } => v
                .iter()
                .map(|s| match s {
                    Sym::N(k) => Some(*k),
                    _ => None,
                })
                .collect(),
            _ => None,
        }
    }

    /// Records output 0 of `n` as `w` on its way; read by anything but the next step
    /// it is refused.
    fn hold(&mut self, n: &NodeProto, w: StdWeight) {
        let why = format!(
            "`{}` is a convolution weight being standardised; only a Reshape back to its \
             shape and a Conv may read it",
            n.output[0]
        );
        self.define(n, Val::Unusable(why));
        self.standardizing.insert(n.output[0].clone(), w);
    }
}
