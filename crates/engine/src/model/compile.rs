//! The graph compiled onto a device: one kernel per node, reading its inputs
//! from numbered slots and its parameters from [`Params`].

use super::kernel::Kernel;
use super::params::{Init, Params, compile_params};
use super::pool::avg_pool_matrix;
use super::prod;
pub use super::unsupported::Unsupported;
use batchfit_graph::{Graph, LossKind, Op, PoolKind};
use burn::tensor::{Device, Tensor, TensorData};
use std::collections::HashMap;

/// The graph compiled onto a device.
#[derive(Clone, Debug)]
pub struct Program {
    pub(super) kernels: Vec<Kernel>,
    /// Slot of each graph input, then one per node.
    pub(super) input_slots: usize,
    pub(super) output_slot: usize,
    pub(super) loss: LossKind,
    /// Sequence length, or 1 for models without one.
    pub seq_len: usize,
    /// Sample shape of the model output, resolved.
    pub out_dims: Vec<usize>,
}

impl Program {
    /// Compiles `graph` and creates its parameters on `device`, from the graph's
    /// trained values or randomly as `init` says.
    pub fn new(
        graph: &Graph,
        seq_len: usize,
        init: Init,
        device: &Device,
    ) -> Result<(Program, Params), Unsupported> {
        let mut params = Params {
            r1: Vec::new(),
            r2: Vec::new(),
            r3: Vec::new(),
            r4: Vec::new(),
        };
        let mut slot_of: HashMap<&str, usize> = Default::default();
        let shared: std::collections::HashSet<&str> = graph
            .nodes
            .iter()
            .filter(|n| n.shared)
            .map(|n| n.name.as_str())
            .collect();
        for (i, input) in graph.inputs.iter().enumerate() {
            slot_of.insert(&input.name, i);
        }
        let mut kernels = Vec::with_capacity(graph.nodes.len());
        for (k, node) in graph.nodes.iter().enumerate() {
            let inputs: Vec<usize> = node.inputs.iter().map(|n| slot_of[n.as_str()]).collect();
            let in_dims: Vec<Vec<usize>> = node
                .inputs
                .iter()
                .map(|n| graph.shape_of(n).expect("shapes checked").resolve(seq_len))
                .collect();
            let p = compile_params(node, init, &mut params, device)?;
            let out_dims = node.shape.resolve(seq_len);
            let pool_matrix = match &node.op {
                Op::Pool {
                    pool: PoolKind::Avg,
                    window,
                } => avg_pool_matrix(&in_dims[0][1..], &out_dims[1..], window).map(|m| {
                    let shape = [m.len() / prod(&out_dims[1..]), prod(&out_dims[1..])];
                    Tensor::from_data(TensorData::new(m, shape), device)
                }),
                _ => None,
            };
            kernels.push(Kernel {
                op: node.op.clone(),
                inputs,
                params: p,
                in_dims,
                out_dims,
                pool_matrix,
                shared: node.shared,
                in_shared: node
                    .inputs
                    .iter()
                    .map(|n| shared.contains(n.as_str()))
                    .collect(),
            });
            slot_of.insert(&node.name, graph.inputs.len() + k);
        }
        let out = graph.output();
        Ok((
            Program {
                kernels,
                input_slots: graph.inputs.len(),
                output_slot: slot_of[out.name.as_str()],
                loss: graph.loss.kind,
                seq_len,
                out_dims: out.shape.resolve(seq_len),
            },
            params,
        ))
    }
}

/// Checks that burn's GPU kernels (wgpu, CUDA) can train every node of `graph`, beyond
/// [`check_trainable`]: they have no backward for linear or cubic interpolation.
pub fn check_trainable_on_gpu(graph: &Graph) -> Result<(), Unsupported> {
    check_trainable(graph)?;
    for node in &graph.nodes {
        if let Op::Resize { mode, .. } = &node.op
            && *mode != batchfit_graph::ResizeMode::Nearest
        {
            return Err(Unsupported {
                node: node.name.clone(),
                what: "linear or cubic resizing on a GPU (burn's GPU kernels have no backward \
                       for it; nearest resizing trains)"
                    .into(),
            });
        }
    }
    Ok(())
}

/// Checks, without allocating anything, that the engine can train every node of `graph`.
pub fn check_trainable(graph: &Graph) -> Result<(), Unsupported> {
    for node in &graph.nodes {
        let what = match &node.op {
            Op::Conv { window, .. } if window.spatial() > 2 => Some("3-d convolution"),
            Op::ConvTranspose { window, .. } => super::conv::transpose_unsupported(window),
            Op::Pool { window, .. } if window.spatial() > 2 => Some("3-d pooling"),
            Op::Resize { size, .. } if size.len() != 2 => {
                Some("resizing other than 2 spatial dimensions")
            }
            Op::Add
            | Op::Mul
            | Op::Div
            | Op::AddConst { .. }
            | Op::MulConst { .. }
            | Op::Expand { .. }
                if node.shape.rank() > 5 =>
            {
                Some("broadcasting over more than 5 dimensions")
            }
            // Axes that move together are one (`reshape::merged_transpose`).
            Op::Transpose { perm }
                if 1 + perm.windows(2).filter(|w| w[1] != w[0] + 1).count() > 5 =>
            {
                Some("transposing more than 5 sample dimensions that do not move together")
            }
            Op::AddParam { shape }
            | Op::MulParam { shape }
            | Op::PRelu { shape }
            | Op::AddTable { shape, .. } => {
                let sample = node.shape.all_fixed().unwrap_or_default();
                (super::elementwise::broadcast_run(&sample, shape).is_none()).then_some(
                    "a learned tensor whose broadcast axes are not one run of the sample's",
                )
            }
            _ => None,
        };
        if let Some(what) = what {
            return Err(Unsupported {
                node: node.name.clone(),
                what: format!("{what} ({})", node.op.name()),
            });
        }
    }
    Ok(())
}
