//! One file per op family; [`OPS`] maps each ONNX op type to the function that
//! imports it. A new op is a function in its family's file plus one line here.

mod conv;
mod elementwise;
mod index;
mod linear;
mod norm;
mod random;
mod recurrent;
mod reshape;
mod shared;
mod standardize;

pub(super) use standardize::StdWeight;

use super::decode::{Attrs, positive, tensor_f32};
use super::import::{Importer, label, unsupported};
use super::proto::NodeProto;
use super::view::Val;
use crate::error::GraphError;
use crate::op::Op;

/// Imports one node of the default domain; `usize` is its index in node order.
type Import = fn(&mut Importer, usize, &NodeProto, &Attrs) -> Result<(), GraphError>;

/// Every supported op type and its import, sorted by name (the order
/// [`super::SUPPORTED_ONNX_OPS`] lists them in error messages).
const OPS: &[(&str, Import)] = &[
    ("Add", Importer::add_mul),
    ("AveragePool", Importer::pool),
    ("BatchNormalization", Importer::batch_norm),
    ("Cast", Importer::alias),
    ("Clip", Importer::clip),
    ("Concat", Importer::concat),
    ("Constant", Importer::constant),
    ("ConstantOfShape", Importer::constant_of_shape),
    ("Conv", Importer::conv),
    ("ConvTranspose", Importer::conv_transpose),
    ("Div", Importer::div),
    ("Dropout", Importer::dropout),
    ("Expand", Importer::expand),
    ("Flatten", Importer::flatten),
    ("Gather", Importer::gather),
    ("Gelu", Importer::activation),
    ("Gemm", Importer::gemm),
    ("GlobalAveragePool", Importer::global_pool),
    ("GlobalMaxPool", Importer::global_pool),
    ("GRU", Importer::rnn),
    ("HardSigmoid", Importer::activation),
    ("HardSwish", Importer::activation),
    ("Identity", Importer::alias),
    ("InstanceNormalization", Importer::instance_norm),
    ("LayerNormalization", Importer::layer_norm),
    ("RMSNormalization", Importer::rms_norm),
    ("LeakyRelu", Importer::activation),
    ("LogSoftmax", Importer::softmax),
    ("Less", Importer::less),
    ("LRN", Importer::lrn),
    ("LSTM", Importer::rnn),
    ("MatMul", Importer::matmul),
    ("MaxPool", Importer::pool),
    ("Neg", Importer::neg),
    ("Pad", Importer::pad),
    ("Mean", Importer::sum_mean),
    ("Mul", Importer::add_mul),
    ("RandomUniformLike", Importer::random_uniform_like),
    ("ReduceL2", Importer::reduce),
    ("ReduceMax", Importer::reduce),
    ("ReduceMean", Importer::reduce),
    ("ReduceSum", Importer::reduce),
    ("PRelu", Importer::prelu),
    ("Relu", Importer::activation),
    ("RNN", Importer::rnn),
    ("Reshape", Importer::reshape),
    ("Resize", Importer::resize),
    ("Shape", Importer::shapes_only),
    ("Sigmoid", Importer::activation),
    ("Exp", Importer::activation),
    ("Slice", Importer::slice),
    ("Softmax", Importer::softmax),
    ("Split", Importer::split),
    ("Squeeze", Importer::squeeze),
    ("Sub", Importer::sub),
    ("Sum", Importer::sum_mean),
    ("Tanh", Importer::activation),
    ("Transpose", Importer::transpose),
    ("Unsqueeze", Importer::squeeze),
    ("Upsample", Importer::resize),
];

/// Ops that read a layout view themselves (see [`crate::onnx::view`]).
const LAYOUT_OPS: &[&str] = &[
    "Cast",
    "Flatten",
    "Gather",
    "GRU",
    "Identity",
    "LSTM",
    "Reshape",
    "Shape",
    "Slice",
    "Split",
    "Squeeze",
    "Transpose",
    "Unsqueeze",
];

/// The op types of [`OPS`], for [`super::SUPPORTED_ONNX_OPS`].
pub(super) const NAMES: [&str; OPS.len()] = {
    let mut names = [""; OPS.len()];
    let mut k = 0;
    while k < OPS.len() {
        names[k] = OPS[k].0;
        k += 1;
    }
    names
};

impl Importer {
    /// Imports node `i`: shape arithmetic first (it may take any op type that
    /// computes on shape values), then the op's family.
    pub(super) fn node(&mut self, i: usize, n: &NodeProto) -> Result<(), GraphError> {
        let a = Attrs(&n.attribute);
        self.learned_computed_on(n)?;
        if self.learned_concat(n, &a)?
            || self.weight_standardization(n, &a)?
            || self.shape_op(n, &a)?
            || self.fold(n, &a)?
            || self.shared_node(i, n, &a)?
        {
            return Ok(());
        }
        let Some((_, import)) = OPS.iter().find(|(op, _)| *op == n.op_type) else {
            return Err(unsupported(n, n.op_type.clone()));
        };
        if n.op_type != "Concat" {
            self.repeat_learned(n)?;
        }
        if LAYOUT_OPS.contains(&n.op_type.as_str()) {
            return import(self, i, n, &a);
        }
        let touched = self.axes_touched(n, &a);
        let restore = self.prepare_views(n, touched)?;
        let done = import(self, i, n, &a);
        self.wrap = None;
        for (name, v) in restore {
            self.vals.insert(name, v);
        }
        done
    }

    /// For an op that computes the same on any layout of the axes it does not touch:
    /// how many trailing ONNX axes it touches (for an element-wise op, a constant
    /// operand's rank).
    /// `None` for the rest, which need their inputs batch-first.
    fn axes_touched(&self, n: &NodeProto, a: &Attrs) -> Option<usize> {
        // Leading axes of size 1 broadcast like missing ones: they touch nothing.
        // A shared tensor (computed once per step) broadcasts like a constant.
        let const_rank = (0..n.input.len())
            .filter_map(|p| match self.vals.get(n.input[p].as_str()) {
                Some(Val::Const(t)) => Some(t.dims.iter().skip_while(|&&d| d == 1).count()),
                Some(Val::Ir(x)) if self.b.is_shared(x) => self.b.shape(x).ok().map(|s| s.rank()),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        Some(match n.op_type.as_str() {
            "Relu" | "Gelu" | "Tanh" | "Sigmoid" | "Exp" | "HardSigmoid" | "HardSwish" | "Clip"
            | "Dropout" | "Neg" => 0,
            // A constant operand broadcasts against the trailing axes.
            "Add" | "Mul" | "Div" | "Sum" | "Mean" | "PRelu" => const_rank,
            // A negative axis names the same axis once the batch is pulled out.
            "Softmax" if a.int("axis", if self.opset < 13 { 1 } else { -1 }) < 0 => {
                (-a.int("axis", -1)) as usize
            }
            "LayerNormalization" | "RMSNormalization" if a.int("axis", -1) < 0 => {
                (-a.int("axis", -1)) as usize
            }
            "Gemm" => 1,
            // The channels and spatial axes (the IR's transposed convolution takes more
            // batch axes before them).
            "ConvTranspose" => match self.vals.get(n.input.get(1)?.as_str()) {
                Some(Val::Const(w)) => w.dims.len().checked_sub(1)?,
                _ => return None,
            },
            "Pad" => self.pad_touched(n, a)?,
            "Expand" => self.expand_touched(n)?,
            "MatMul" => match self.vals.get(n.input.get(1)?.as_str()) {
                Some(Val::Const(_)) => 1,
                _ => 2,
            },
            _ => return None,
        })
    }

    /// Inputs that are initializers expanded over the batch, read by an op that
    /// computes on them (an attention pool's latent query into its linear layer), become
    /// one IR tensor each: the learned tensor repeated over the batch, as PyTorch's
    /// `expand` feeds the op every sample's copy. (`Concat` takes them as they are.)
    fn repeat_learned(&mut self, n: &NodeProto) -> Result<(), GraphError> {
        for name in &n.input {
            let Some(Val::Broadcast(t)) = self.vals.get(name.as_str()).cloned() else {
                continue;
            };
            let batch_of = self
                .any_model_input()
                .ok_or_else(|| GraphError::node(label(n), "the model has no input"))?;
            let shape = positive(&t.dims).unwrap_or_default()[1..].to_vec();
            let ir = self.fresh_from(format!("{name}/repeated"));
            self.b
                .push(&ir, Op::BroadcastParam { shape }, &[&batch_of])?;
            self.sources.insert(ir.clone(), vec![t.name.clone()]);
            self.attach(&ir, vec![tensor_f32(&t)]);
            self.vals.insert(name.clone(), Val::Ir(ir));
        }
        Ok(())
    }

    /// `Constant`: already evaluated before the nodes are imported.
    fn constant(&mut self, _i: usize, _n: &NodeProto, _a: &Attrs) -> Result<(), GraphError> {
        Ok(())
    }

    /// `Identity` and `Cast`: the output names the input's value.
    fn alias(&mut self, _i: usize, n: &NodeProto, _a: &Attrs) -> Result<(), GraphError> {
        let v = self.val(n, 0)?.clone();
        self.define(n, v);
        Ok(())
    }

    /// `Shape` and `Slice`, which [`Importer::shape_op`] takes when they compute
    /// on shape values; anything else they could do the IR does not model.
    fn shapes_only(&mut self, _i: usize, n: &NodeProto, _a: &Attrs) -> Result<(), GraphError> {
        Err(unsupported(n, n.op_type.clone()))
    }
}
