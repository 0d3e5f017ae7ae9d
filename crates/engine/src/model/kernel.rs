//! One node of a compiled program: its op, where its inputs and parameters
//! are, and its resolved sample shapes.

use super::params::P;
use super::prod;
use batchfit_graph::Op;
use burn::tensor::Tensor;

/// One node, compiled: where its inputs and parameters are.
#[derive(Clone, Debug)]
pub(super) struct Kernel {
    pub(super) op: Op,
    /// Slots of the inputs.
    pub(super) inputs: Vec<usize>,
    pub(super) params: Vec<P>,
    /// Sample shape of each input, resolved.
    pub(super) in_dims: Vec<Vec<usize>>,
    /// Sample shape of the output, resolved.
    pub(super) out_dims: Vec<usize>,
    /// An average pool's window as a matrix (see [`super::pool::avg_pool_matrix`]).
    pub(super) pool_matrix: Option<Tensor<2>>,
    /// The output is computed once per step, not per sample (`Node::shared`): the
    /// kernel runs at a batch of 1.
    pub(super) shared: bool,
    /// Per input, whether it is shared: a batch of 1 broadcast against the batch.
    pub(super) in_shared: Vec<bool>,
}

impl Kernel {
    /// Elements of one output sample.
    pub(super) fn out_elems(&self) -> usize {
        prod(&self.out_dims)
    }
}
