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

use super::decode::Attrs;
use super::import::{Importer, label};
use super::proto::NodeProto;
use crate::error::GraphError;

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
    ("Div", Importer::div),
    ("Dropout", Importer::dropout),
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
    ("LayerNormalization", Importer::layer_norm),
    ("LogSoftmax", Importer::softmax),
    ("Less", Importer::less),
    ("LRN", Importer::lrn),
    ("LSTM", Importer::rnn),
    ("MatMul", Importer::matmul),
    ("MaxPool", Importer::pool),
    ("Mean", Importer::sum_mean),
    ("Mul", Importer::add_mul),
    ("RandomUniformLike", Importer::random_uniform_like),
    ("ReduceMax", Importer::reduce),
    ("ReduceMean", Importer::reduce),
    ("ReduceSum", Importer::reduce),
    ("Relu", Importer::activation),
    ("Reshape", Importer::reshape),
    ("Shape", Importer::shapes_only),
    ("Sigmoid", Importer::activation),
    ("Slice", Importer::slice),
    ("Softmax", Importer::softmax),
    ("Squeeze", Importer::squeeze),
    ("Sum", Importer::sum_mean),
    ("Tanh", Importer::activation),
    ("Transpose", Importer::transpose),
    ("Unsqueeze", Importer::squeeze),
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

/// The error for an op type the IR does not know (`op_type` may carry a domain).
pub(super) fn unsupported(n: &NodeProto, op_type: String) -> GraphError {
    GraphError::Unsupported {
        node: label(n),
        op_type,
        supported: super::SUPPORTED_ONNX_OPS,
    }
}

impl Importer {
    /// Imports node `i`: shape arithmetic first (it may take any op type that
    /// computes on shape values), then the op's family.
    pub(super) fn node(&mut self, i: usize, n: &NodeProto) -> Result<(), GraphError> {
        let a = Attrs(&n.attribute);
        if self.shape_op(n, &a)? || self.fold(n, &a)? {
            return Ok(());
        }
        match OPS.iter().find(|(op, _)| *op == n.op_type) {
            Some((_, import)) => import(self, i, n, &a),
            None => Err(unsupported(n, n.op_type.clone())),
        }
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
