//! The plan: memory and FLOPs of one training step as `fixed + per_sample x B`.

use crate::options::{Runtime, TrainOptions};
use crate::rules::{self, Sizes};
use crate::units::{Bytes, Flops};
use batchfit_graph::{Graph, LossKind};
use serde::Serialize;
use std::collections::HashSet;

/// One node's share of the plan.
#[derive(Clone, Debug, Serialize)]
pub struct LayerPlan {
    pub name: String,
    pub op: &'static str,
    /// Output shape of one sample, batch shown as `B`.
    pub output_shape: String,
    pub parameters: u64,
    /// Bytes this node keeps for backward per sample (tensors already kept by an
    /// earlier node are not counted twice).
    pub saved_bytes_per_sample: Bytes,
    pub forward_flops_per_sample: Flops,
}

/// Fixed memory: what does not grow with the batch.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FixedMemory {
    pub weights: Bytes,
    pub gradients: Bytes,
    pub optimizer_state: Bytes,
    /// Non-trainable state such as BatchNorm running statistics.
    pub buffers: Bytes,
    /// The optimizer's temporaries while it updates the largest parameter tensor.
    pub optimizer_transient: Bytes,
    /// Gradient accumulation buffer (burn keeps one beside the step's gradients).
    pub accumulation: Bytes,
    /// The runtime's own share: CUDA context, allocator pool segments.
    pub runtime: Bytes,
}

impl FixedMemory {
    pub fn total(&self) -> Bytes {
        self.weights
            + self.gradients
            + self.optimizer_state
            + self.buffers
            + self.optimizer_transient
            + self.accumulation
            + self.runtime
    }
}

/// Per-sample memory at the step's peak.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PerSampleMemory {
    /// The batch itself: inputs and targets.
    pub data: Bytes,
    /// All tensors saved for backward (what is alive when backward starts).
    pub activations: Bytes,
    /// What the peak adds on top: gradients of the node being differentiated,
    /// its workspace, minus what backward already freed.
    pub transient_at_peak: Bytes,
    /// Largest kernel workspace (im2col) of any node.
    pub workspace: Bytes,
    /// Total at the peak (data + activations + transient at peak, never less than the forward peak).
    pub total: Bytes,
}

/// `memory(B) = fixed + per_sample x B`.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct MemoryLine {
    pub fixed_bytes: Bytes,
    pub per_sample_bytes: Bytes,
}

/// The static plan of a model under some training options.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    pub model: String,
    pub parameters: u64,
    pub seq_len: Option<usize>,
    pub options: TrainOptions,
    pub layers: Vec<LayerPlan>,
    pub fixed: FixedMemory,
    pub per_sample: PerSampleMemory,
    pub memory: MemoryLine,
    /// Name of the node whose backward sets the peak.
    pub peak_at: String,
    pub forward_flops_per_sample: Flops,
    /// Forward + backward: about 3x the forward FLOPs (backward computes two
    /// products per forward product: input and weight gradients).
    pub train_flops_per_sample: Flops,
}

/// PyTorch's CUDA context (driver, cuBLAS and cuDNN handles) as seen in
/// `nvidia-smi` before any tensor: 300-800 MiB depending on versions; 500 MiB taken.
pub const PYTORCH_CUDA_CONTEXT: Bytes = Bytes(500 * Bytes::MIB);
/// PyTorch's caching allocator serves tensors of at most 1 MiB from 2 MiB segments.
pub const PYTORCH_SMALL_SEGMENT: Bytes = Bytes(2 * Bytes::MIB);
/// PyTorch rounds every allocation up to a multiple of 512 bytes.
pub const PYTORCH_BLOCK: u64 = 512;

impl Plan {
    /// Planned peak memory at batch `b` (activations at the micro-batch if one is set).
    pub fn bytes_at(&self, batch: u64) -> Bytes {
        let b = self.options.micro_batch.map_or(batch, |m| m.min(batch));
        let linear = self.memory.fixed_bytes + self.memory.per_sample_bytes * b;
        match self.options.runtime {
            Runtime::Burn => linear,
            // Rounding each of the step's tensors up to 512 bytes costs at most 511
            // bytes a tensor; about 4 tensors per node are live at the peak.
            Runtime::Pytorch => linear + Bytes(PYTORCH_BLOCK * 4 * self.layers.len() as u64),
        }
    }

    /// The largest batch whose planned peak fits `budget`, or `None` if not even one sample fits.
    /// With a micro-batch this is the largest micro-batch (any accumulation count fits).
    pub fn max_batch(&self, budget: Bytes) -> Option<u64> {
        let fits = |b: u64| {
            let mut p = self.clone();
            p.options.micro_batch = None;
            p.bytes_at(b) <= budget
        };
        if !fits(1) {
            return None;
        }
        // Exponential then binary search over the exact planned function.
        let mut lo = 1u64;
        let mut hi = 2u64;
        while fits(hi) {
            lo = hi;
            hi = match hi.checked_mul(2) {
                Some(h) if h < (1 << 48) => h,
                _ => return Some(lo),
            };
        }
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Some(lo)
    }
}

/// Builds the plan of `graph` under `opts`.
pub fn plan(graph: &Graph, opts: &TrainOptions) -> Plan {
    let seq = opts
        .seq_len
        .or(graph.default_seq_len)
        .unwrap_or(batchfit_graph::DEFAULT_SEQ_LEN);
    let act = opts.precision.activation_bytes();
    let elems =
        |tensor: &str| -> u64 { graph.shape_of(tensor).map(|s| s.elements(seq)).unwrap_or(0) };

    // Forward pass: what each node saves, counting each tensor once (at its first saver,
    // whose backward comes last and frees it).
    let mut kept: HashSet<&str> = HashSet::new();
    let mut layers = Vec::with_capacity(graph.nodes.len());
    let mut saved = Vec::with_capacity(graph.nodes.len()); // per-sample bytes by node
    let mut grads_at = Vec::with_capacity(graph.nodes.len()); // grad in + grad out + workspace
    let mut forward_live = Vec::with_capacity(graph.nodes.len());
    let mut workspace_max = 0u64;
    let mut flops = 0.0;
    for node in &graph.nodes {
        let in_elems: Vec<u64> = node.inputs.iter().map(|i| elems(i)).collect();
        let in_dims = graph
            .shape_of(&node.inputs[0])
            .map(|s| s.resolve(seq))
            .unwrap_or_default();
        let out_dims = node.shape.resolve(seq);
        let out = node.shape.elements(seq);
        let sizes = Sizes {
            inputs: &in_elems,
            output: out,
            out_dims: &out_dims,
            in_dims: &in_dims,
        };
        let rule = rules::saved(&node.op, &sizes, opts.runtime);
        let mut bytes = rule.extra_elems * act + rule.extra_bytes;
        if rule.inputs {
            for (name, e) in node.inputs.iter().zip(&in_elems) {
                if kept.insert(name.as_str()) {
                    bytes += e * act;
                }
            }
        }
        if rule.output && kept.insert(node.name.as_str()) {
            bytes += out * act;
        }
        let ws = rules::workspace_elems(&node.op, &sizes) * act;
        workspace_max = workspace_max.max(ws);
        let f = rules::forward_flops(&node.op, &sizes);
        flops += f;
        saved.push(bytes);
        grads_at.push((out + in_elems.iter().sum::<u64>()) * act + ws);
        forward_live.push((out + in_elems.iter().sum::<u64>()) * act + ws);
        layers.push(LayerPlan {
            name: node.name.clone(),
            op: node.op.name(),
            output_shape: node.shape.to_string(),
            parameters: node.op.param_count(),
            saved_bytes_per_sample: Bytes(bytes),
            forward_flops_per_sample: Flops(f),
        });
    }

    // The loss keeps its own tensors (fp32 even under mixed precision) until backward starts.
    let logits = graph.output().shape.elements(seq);
    let steps = if graph.has_seq() { seq as u64 } else { 1 };
    let loss_bytes = rules::loss_saved_elems(graph.loss.kind, logits, steps) * 4;
    flops += 4.0 * logits as f64;

    // Checkpointing: keep only segment outputs, recompute one segment at a time.
    let n = saved.len();
    let (resident, segment_of) = if opts.checkpointing && n > 1 {
        let k = (n as f64).sqrt().ceil() as usize;
        let len = n.div_ceil(k);
        let boundaries: u64 = (0..n)
            .filter(|i| (i + 1) % len == 0 && i + 1 < n)
            .map(|i| graph.nodes[i].shape.elements(seq) * act)
            .sum();
        (boundaries, Some(len))
    } else {
        (0, None)
    };

    // Backward, in reverse: at node i the live set is everything saved by nodes <= i
    // (in its segment, under checkpointing) plus node i's gradients and workspace.
    let mut peak = 0u64;
    let mut peak_at = graph.loss.input.clone();
    let total_saved: u64 = saved.iter().sum();
    let mut prefix = total_saved;
    for i in (0..n).rev() {
        let alive = match segment_of {
            None => prefix,
            Some(len) => {
                let start = (i / len) * len;
                resident + saved[start..=i].iter().sum::<u64>()
            }
        };
        let live = alive + grads_at[i];
        if live > peak {
            peak = live;
            peak_at = graph.nodes[i].name.clone();
        }
        prefix -= saved[i];
    }
    // Start of backward: everything saved plus the loss's tensors.
    let at_loss = match segment_of {
        None => total_saved,
        Some(_) => resident,
    } + loss_bytes
        + logits * act;
    if at_loss > peak {
        peak = at_loss;
        peak_at = format!("{} (loss)", graph.loss.input);
    }
    // Forward peak: saved so far plus the node's input, output and workspace.
    let mut so_far = 0u64;
    for (i, f) in forward_live.iter().enumerate() {
        let live = match segment_of {
            None => so_far,
            Some(_) => resident,
        } + f;
        if live > peak {
            peak = live;
            peak_at = format!("{} (forward)", graph.nodes[i].name);
        }
        so_far += saved[i];
    }

    let data: u64 = graph
        .inputs
        .iter()
        .map(|i| i.shape.elements(seq) * 4)
        .sum::<u64>()
        + target_bytes(graph, seq);
    let activations = match segment_of {
        None => total_saved,
        Some(_) => resident,
    } + loss_bytes;
    let per_sample = PerSampleMemory {
        data: Bytes(data),
        activations: Bytes(activations),
        transient_at_peak: Bytes(peak.saturating_sub(activations)),
        workspace: Bytes(workspace_max),
        total: Bytes(data + peak.max(activations)),
    };

    let params = graph.param_count();
    let largest_param = graph
        .nodes
        .iter()
        .flat_map(|n| n.op.params())
        .map(|p| p.elements())
        .max()
        .unwrap_or(0);
    let state = opts.optimizer.state_per_param();
    let fixed = FixedMemory {
        weights: Bytes(params * opts.precision.weight_bytes()),
        gradients: Bytes(params * 4),
        optimizer_state: Bytes(params * 4 * state),
        buffers: Bytes(
            graph
                .nodes
                .iter()
                .map(|n| n.op.buffer_elements())
                .sum::<u64>()
                * 4,
        ),
        // The update of one tensor allocates its new value and new state before the
        // old ones are dropped (burn's functional update; PyTorch's foreach temporaries).
        optimizer_transient: Bytes(largest_param * 4 * (state + 1)),
        accumulation: match (opts.micro_batch, opts.runtime) {
            (Some(_), Runtime::Burn) => Bytes(params * 4),
            _ => Bytes(0),
        },
        runtime: match (opts.runtime, opts.gpu) {
            (Runtime::Pytorch, true) => PYTORCH_CUDA_CONTEXT + PYTORCH_SMALL_SEGMENT,
            (Runtime::Pytorch, false) => PYTORCH_SMALL_SEGMENT,
            (Runtime::Burn, _) => Bytes(0),
        },
    };
    let memory = MemoryLine {
        fixed_bytes: fixed.total(),
        per_sample_bytes: per_sample.total,
    };
    Plan {
        model: graph.name.clone(),
        parameters: params,
        seq_len: graph.has_seq().then_some(seq),
        options: opts.clone(),
        layers,
        fixed,
        per_sample,
        memory,
        peak_at,
        forward_flops_per_sample: Flops(flops),
        train_flops_per_sample: Flops(3.0 * flops),
    }
}

/// Bytes of one sample's target: the output's shape for MSE, one int64 class per
/// sample or frame for cross-entropy, a label sequence of up to T int64 for CTC.
fn target_bytes(graph: &Graph, seq: usize) -> u64 {
    match graph.loss.kind {
        LossKind::Mse => graph.output().shape.elements(seq) * 4,
        LossKind::CrossEntropy => 8,
        LossKind::CrossEntropyPerFrame | LossKind::Ctc { .. } => 8 * seq as u64,
    }
}
