//! The plan: memory and FLOPs of one training step.
//!
//! The memory is a maximum over the step's moments (each node's forward and backward, the
//! loss, the optimizer), each a line `fixed + per_sample x B`; see [`Memory`].

pub use crate::host::{CpuHost, GemmCall, GemmKernel};
pub use crate::rules::pytorch::{PYTORCH_BLOCK, PYTORCH_CUDA_CONTEXT, PYTORCH_SMALL_SEGMENT};

use crate::accuracy::{self, MeasuredError};
use crate::fused::{Fused, fused_parts};
use crate::options::{Runtime, TrainOptions};
use crate::pages::{DevicePages, PageMoment, WGPU_OUTSIDE_POOLS, pieces};
use crate::rules::{self, RuntimeRules, Sizes};
use crate::units::{Bytes, Flops};
use batchfit_graph::{Graph, InputKind, LossKind, Node, Op, PoolKind};
use serde::Serialize;
use std::collections::{HashMap, HashSet};

pub use memory::{Memory, Moment};

/// One node's share of the plan.
#[derive(Clone, Debug, Serialize)]
pub struct LayerPlan {
    /// The node's name.
    pub name: String,
    /// The op's name (`conv2d`, `linear`, ...).
    pub op: &'static str,
    /// Output shape of one sample, batch shown as `B`.
    pub output_shape: String,
    /// Trainable parameters of the node.
    pub parameters: u64,
    /// Bytes this node keeps for backward per sample (tensors already kept by an
    /// earlier node are not counted twice).
    pub saved_bytes_per_sample: Bytes,
    /// Forward FLOPs of one sample through this node.
    pub forward_flops_per_sample: Flops,
}

/// Fixed memory: what does not grow with the batch.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FixedMemory {
    /// Parameters (fp32, plus a half-precision copy under mixed precision).
    pub weights: Bytes,
    /// Parameter gradients alive at this moment (PyTorch: all of them).
    pub gradients: Bytes,
    /// The optimizer's state tensors.
    pub optimizer_state: Bytes,
    /// Non-trainable state such as BatchNorm running statistics.
    pub buffers: Bytes,
    /// The optimizer's temporaries while it updates the largest parameter tensor; burn:
    /// also a parameter gradient's second copy while it is made (see `docs/plan.md`).
    pub optimizer_transient: Bytes,
    /// Gradient accumulation buffer (burn keeps one beside the step's gradients).
    pub accumulation: Bytes,
    /// The runtime's own share: CUDA context, allocator pool segments.
    pub runtime: Bytes,
    /// What tensors computed once per step from constants and parameters (a
    /// relative-position MLP's table; `Node::shared`) keep for the backward.
    #[serde(skip_serializing_if = "Bytes::is_zero")]
    pub shared: Bytes,
}

impl FixedMemory {
    /// The sum of all parts.
    pub fn total(&self) -> Bytes {
        self.weights
            + self.gradients
            + self.optimizer_state
            + self.buffers
            + self.optimizer_transient
            + self.accumulation
            + self.runtime
            + self.shared
    }
}

/// Per-sample memory of the moment that is largest at large batches.
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

/// The static plan of a model under some training options.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    /// The graph's name.
    pub model: String,
    /// Trainable parameters.
    pub parameters: u64,
    /// The sequence length T used for recurrent models.
    pub seq_len: Option<usize>,
    /// The loss the step trains (an imported model's is chosen from its output).
    pub loss: LossKind,
    /// The options planned for.
    pub options: TrainOptions,
    /// One entry per node, in execution order.
    pub layers: Vec<LayerPlan>,
    /// Fixed memory of the moment that is largest at large batches.
    pub fixed: FixedMemory,
    /// Per-sample memory of that moment.
    pub per_sample: PerSampleMemory,
    /// The memory as a function of the batch: every moment's line.
    pub memory: Memory,
    /// Name of the moment that is largest at large batches.
    pub peak_at: String,
    /// Forward FLOPs of one sample.
    pub forward_flops_per_sample: Flops,
    /// Forward + backward: about 3x the forward FLOPs (backward computes two
    /// products per forward product: input and weight gradients).
    pub train_flops_per_sample: Flops,
    /// How far this runtime's plan has been from the runtime's own count on bench/'s
    /// corpus; `None` where it has not been measured.
    pub measured_error: Option<MeasuredError>,
}

impl Plan {
    /// Planned peak memory at batch `batch` (activations at the micro-batch if one is set):
    /// the largest moment at that batch (see [`Memory`]).
    pub fn bytes_at(&self, batch: u64) -> Bytes {
        let b = self.options.micro_batch.map_or(batch, |m| m.min(batch));
        self.bytes_at_samples(b)
    }

    /// Planned peak memory with `b` samples per forward and backward pass.
    fn bytes_at_samples(&self, b: u64) -> Bytes {
        let m = &self.memory;
        let peak = m
            .moments
            .iter()
            .map(|l| l.bytes_at(b))
            .fold(m.fixed_bytes + m.per_sample_bytes * b, Bytes::max)
            + m.rounding_bytes;
        // The pages hold every live byte, so they are never below the live peak.
        match &m.device_pages {
            Some(pages) => pages.reserved_at(b).max(peak),
            None => peak,
        }
    }

    /// The largest batch whose planned peak fits `budget`, or `None` if not even one sample fits.
    /// With a micro-batch this is the largest micro-batch (any accumulation count fits).
    pub fn max_batch(&self, budget: Bytes) -> Option<u64> {
        let fits = |b: u64| self.bytes_at_samples(b) <= budget;
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

/// The parameters `runtime` holds for `node`: PyTorch holds a tied tensor (and its
/// gradient and optimizer state) once; batchfit's engine gives every node its own copy.
fn held_params(node: &Node, runtime: Runtime) -> u64 {
    match runtime {
        Runtime::Pytorch => node.own_param_count(),
        Runtime::Burn => node.op.param_count(),
    }
}

/// Builds the plan of `graph` under `opts` (burn on a CPU: for this machine's threads and L2).
pub fn plan(graph: &Graph, opts: &TrainOptions) -> Plan {
    let host = match (opts.runtime, opts.gpu) {
        (Runtime::Burn, false) => CpuHost::detect(),
        _ => CpuHost {
            threads: 1,
            l2_bytes: 0,
            l2_ways: 8,
            gemm_kernel: GemmKernel::AVX2,
        },
    };
    plan_on(graph, opts, host)
}

/// [`plan`] for a given CPU (only burn's rules read it).
pub fn plan_on<'g>(graph: &'g Graph, opts: &TrainOptions, host: CpuHost) -> Plan {
    let rules = rules::for_runtime(opts.runtime, host, opts.gpu);
    let rules: &dyn RuntimeRules = rules.as_ref();
    let seq = opts
        .seq_len
        .or(graph.default_seq_len)
        .unwrap_or(batchfit_graph::DEFAULT_SEQ_LEN);
    let act = opts.precision.activation_bytes();
    // Shared tensors (computed once per step) hold no per-sample bytes; they are fixed
    // memory (`FixedMemory::shared`).
    let shared: HashSet<&str> = graph
        .nodes
        .iter()
        .filter(|n| n.shared)
        .map(|n| n.name.as_str())
        .collect();
    let elems = |tensor: &str| -> u64 {
        if shared.contains(tensor) {
            return 0;
        }
        graph.shape_of(tensor).map(|s| s.elements(seq)).unwrap_or(0)
    };

    let fused = if rules.fuses_silu_and_attention() {
        fused_parts(graph, seq)
    } else {
        HashMap::new()
    };
    // Forward pass: what each node saves, counting each tensor once (at its first saver,
    // whose backward comes last and frees it).
    let mut kept: HashSet<&str> = HashSet::new();
    // Whether a tensor needs a gradient (batch inputs do not).
    let mut tracked: HashMap<&str, bool> = HashMap::new();
    // The tensor whose buffer a view shares, where the runtime counts views so.
    let mut alias: HashMap<&str, &str> = HashMap::new();
    // Tensors in a product's own layout (`RuntimeRules::output_in_product_layout`).
    let mut product_layout: HashSet<&str> = HashSet::new();
    for input in &graph.inputs {
        tracked.insert(input.name.as_str(), false);
        if rules.keeps_batch_as_data() {
            kept.insert(input.name.as_str());
        }
    }
    let n = graph.nodes.len();
    let mut layers = Vec::with_capacity(n);
    let mut saved = Vec::with_capacity(n); // per-sample bytes by node
    let mut forward_live = Vec::with_capacity(n);
    // Each node's backward moments, own extra kept bytes, forward per-thread buffers.
    let mut moments = Vec::with_capacity(n);
    let mut extras = Vec::with_capacity(n);
    let mut forward_ws = Vec::with_capacity(n);
    let mut param_bytes = Vec::with_capacity(n);
    let mut workspace_max = 0u64;
    let mut flops = 0.0;
    // Per-sample bytes of each tensor each node keeps for backward (its extra first),
    // for the device's pages.
    let mut node_kept: Vec<Vec<u64>> = Vec::with_capacity(n);
    // Per-sample bytes of each node's largest input or output: what its gradients and
    // copies are sized like.
    let mut node_largest: Vec<u64> = Vec::with_capacity(n);
    // What shared nodes and standardised weights keep for the backward, by the runtime's
    // own rules at a batch of one: fixed memory (`FixedMemory::shared`).
    let mut shared_kept = shared::standardized_weights(graph, rules, act);
    for node in &graph.nodes {
        if node.shared {
            shared_kept += shared::kept_bytes(graph, node, &shared, rules, seq, act);
            layers.push(LayerPlan {
                name: node.name.clone(),
                op: node.op.name(),
                output_shape: format!("{:?} once per step", node.shape.resolve(seq)),
                parameters: node.own_param_count(),
                saved_bytes_per_sample: Bytes(0),
                forward_flops_per_sample: Flops(0.0),
            });
            node_kept.push(Vec::new());
            node_largest.push(0);
            saved.push(0);
            param_bytes.push(held_params(node, opts.runtime) * 4);
            let needs_grad = !matches!(node.op, Op::Constant { .. })
                && (node.op.param_count() > 0
                    || node
                        .inputs
                        .iter()
                        .any(|i| tracked.get(i.as_str()).copied().unwrap_or(true)));
            tracked.insert(node.name.as_str(), needs_grad);
            moments.push(Vec::new());
            forward_live.push(0);
            extras.push(0);
            forward_ws.push(0);
            continue;
        }
        let in_elems: Vec<u64> = node.inputs.iter().map(|i| elems(i)).collect();
        let in_dims = graph
            .shape_of(&node.inputs[0])
            .map(|s| s.resolve(seq))
            .unwrap_or_default();
        let out_dims = node.shape.resolve(seq);
        let out = elems(&node.name);
        let in_tracked: Vec<bool> = node
            .inputs
            .iter()
            .map(|i| tracked.get(i.as_str()).copied().unwrap_or(true))
            .collect();
        let sizes = Sizes {
            inputs: &in_elems,
            output: out,
            out_dims: &out_dims,
            in_dims: &in_dims,
            input_tracked: in_tracked.first().copied().unwrap_or(true),
        };
        // An input in a product's layout reaches an element-wise op as it is and any
        // other op as a copy in the graph's order, a tensor of its own (kept where the
        // op keeps its inputs, beside the product the element-wise ops kept). An
        // average pool may pool the product's rows itself: neither is assumed.
        let keeps_layout = node.op.is_activation();
        let copies: HashSet<&str> = if keeps_layout
            || matches!(
                node.op,
                Op::Pool {
                    pool: PoolKind::Avg,
                    ..
                }
            ) {
            HashSet::new()
        } else {
            node.inputs
                .iter()
                .map(String::as_str)
                .filter(|i| product_layout.contains(i))
                .collect()
        };
        let copied = |name: &str| copies.contains(name);
        if rules.output_in_product_layout(&node.op, &sizes)
            || (keeps_layout && product_layout.contains(node.inputs[0].as_str()))
        {
            product_layout.insert(node.name.as_str());
        }
        // A view (flatten, reshape; a slice or transpose where the runtime's are views) sharing
        // its input's buffer: a layer keeping the view keeps that whole buffer, counted
        // under the input's name. A view of a copy is the copy.
        let view = !copied(node.inputs[0].as_str())
            && matches!(node.op, Op::Flatten | Op::Reshape { .. })
            || (rules.strided_views_share_buffers()
                && matches!(
                    node.op,
                    Op::Slice { .. } | Op::Transpose { .. } | Op::Expand { .. }
                ));
        if rules.views_share_buffers() && view {
            let base_name = alias.get(node.inputs[0].as_str()).copied();
            alias.insert(
                node.name.as_str(),
                base_name.unwrap_or(node.inputs[0].as_str()),
            );
        }
        // Ops the runtime runs as one kernel (a SiLU, an attention): what that kernel reads
        // and keeps.
        let part = fused.get(node.name.as_str());
        let rule = match part {
            Some(Fused::Inner) => rules::Saved::default(),
            Some(Fused::Attention { lse_elems, .. }) => rules::Saved {
                inputs: true,
                output: true,
                extra_elems: *lse_elems,
                ..rules::Saved::default()
            },
            None => rules.saved(&node.op, &sizes),
        };
        let reads: Vec<&'g str> = match part {
            Some(Fused::Attention { reads, .. }) => reads.to_vec(),
            _ => node
                .inputs
                .iter()
                .map(String::as_str)
                .filter(|i| fused.get(i) != Some(&Fused::Inner))
                .collect(),
        };
        let extra = rule.extra_elems * act + rule.extra_bytes;
        // Inputs alive at this node's forward that no earlier node keeps.
        let storage = |name: &'g str| -> &'g str { alias.get(name).copied().unwrap_or(name) };
        let loose: u64 = reads
            .iter()
            .filter(|name| copied(name) || !kept.contains(storage(name)))
            .map(|name| elems(name) * act)
            .sum();
        let mut bytes = extra;
        let mut kept_tensors = vec![extra];
        if rule.inputs {
            for &name in &reads {
                if copied(name) {
                    bytes += elems(name) * act;
                    kept_tensors.push(elems(name) * act);
                    continue;
                }
                let base = storage(name);
                if kept.insert(base) {
                    bytes += elems(base) * act;
                    kept_tensors.push(elems(base) * act);
                }
            }
        }
        if rule.output && kept.insert(node.name.as_str()) {
            bytes += out * act;
            kept_tensors.push(out * act);
        }
        node_kept.push(kept_tensors);
        node_largest.push(in_elems.iter().copied().chain([out]).max().unwrap_or(0) * act);
        let f = rules::forward_flops(&node.op, &sizes);
        flops += f;
        saved.push(bytes);
        param_bytes.push(held_params(node, opts.runtime) * 4);
        tracked.insert(
            node.name.as_str(),
            node.op.param_count() > 0 || in_tracked.iter().any(|&t| t),
        );
        match part {
            // Nothing of an inner op exists as a tensor of its own.
            Some(Fused::Inner) => {
                moments.push(Vec::new());
                forward_live.push(0);
            }
            // The fused attention's backward: its output's gradient and each input's.
            Some(Fused::Attention { .. }) => {
                let read: u64 = reads.iter().map(|name| elems(name)).sum();
                moments.push(vec![rules::BackwardMoment {
                    bytes: (out + read) * act,
                    ..rules::BackwardMoment::default()
                }]);
                forward_live.push(out * act + loose + extra);
            }
            None => {
                moments.push(rules.backward(&node.op, &sizes, &in_tracked, act));
                forward_live.push(rules.forward_live(&node.op, &sizes, act, loose, extra));
            }
        }
        extras.push(extra);
        forward_ws.push(rules.forward_workspace(&node.op, &sizes, act));
        workspace_max = workspace_max.max(rules.workspace(&node.op, &sizes, act));
        layers.push(LayerPlan {
            name: node.name.clone(),
            op: node.op.name(),
            output_shape: node.shape.to_string(),
            parameters: node.own_param_count(),
            saved_bytes_per_sample: Bytes(bytes),
            forward_flops_per_sample: Flops(f),
        });
    }

    // The loss keeps its own tensors (fp32 even under mixed precision) until backward starts.
    let logits = graph.output().shape.elements(seq);
    let frames = rules::loss_frames(graph, seq);
    let loss_bytes = rules.loss_saved_bytes(graph.loss.kind, logits, frames as u64);
    flops += 4.0 * logits as f64;

    // Checkpointing: keep only segment outputs, recompute one segment at a time.
    let (resident, segment_of) = if opts.checkpointing && n > 1 {
        let k = (n as f64).sqrt().ceil() as usize;
        let len = n.div_ceil(k);
        let boundaries: u64 = (0..n)
            .filter(|i| (i + 1) % len == 0 && i + 1 < n)
            .map(|i| elems(&graph.nodes[i].name) * act)
            .sum();
        (boundaries, Some(len))
    } else {
        (0, None)
    };

    // Bytes of one sample of the batch: the inputs (fp32; token ids as the runtime holds
    // them: burn converts them to its device's i32, `Tensor::from_data`) and the target.
    let data = graph
        .inputs
        .iter()
        .map(|i| {
            i.shape.elements(seq)
                * match i.kind {
                    InputKind::Float => 4,
                    InputKind::Tokens { .. } => rules.token_bytes(),
                }
        })
        .sum::<u64>()
        + rules.target_bytes(graph.loss.kind, logits, frames);
    let params: u64 = graph
        .nodes
        .iter()
        .map(|n| held_params(n, opts.runtime))
        .sum();
    let largest_param = graph
        .nodes
        .iter()
        .flat_map(|n| n.op.params())
        .map(|p| p.elements())
        .max()
        .unwrap_or(0);
    let state = opts.optimizer.state_per_param();
    // What every moment of a step holds besides gradients and kernel buffers.
    let base = FixedMemory {
        weights: Bytes(params * opts.precision.weight_bytes()),
        optimizer_state: Bytes(params * opts.optimizer.state_bytes()),
        buffers: Bytes(
            graph
                .nodes
                .iter()
                .map(|n| {
                    n.op.buffer_elements() * 4
                        + if rules.holds_op_constants() {
                            n.op.constant_bytes()
                        } else {
                            0
                        }
                })
                .sum::<u64>(),
        ),
        accumulation: rules.accumulation(opts.micro_batch, params),
        runtime: rules.runtime_bytes(),
        // What shared nodes keep for the backward, all step (their gradients are
        // transient and a batch of one: left out).
        shared: Bytes(shared_kept),
        ..FixedMemory::default()
    };
    // The optimizer's moment: all gradients, and one tensor's update temporaries. Where
    // the runtime holds every gradient all step, this is every moment's fixed memory.
    let at_update = FixedMemory {
        gradients: Bytes(params * 4),
        optimizer_transient: rules.optimizer_transient(largest_param, params, opts.optimizer),
        ..base.clone()
    };
    let held = rules.gradients_held_all_step();
    let fixed_at = |fixed: FixedMemory| if held { at_update.clone() } else { fixed };

    // Every moment of the step as (fixed, per-sample bytes, name), in step order.
    let mut lines: Vec<(FixedMemory, u64, String)> = Vec::new();
    // The lines during a product whose packing buffers gemm allocates per call.
    let mut line_calls: HashMap<usize, GemmCall> = HashMap::new();
    // For each line, the tensors the device's pages hold then: the nodes whose kept
    // tensors are alive (`0..k`), whether the last one's extra is freed, and the
    // moment's own per-sample tensors.
    let mut line_tensors: Vec<(usize, bool, Vec<u64>)> = Vec::new();
    // Backward, in reverse: at node i the live set is everything saved by nodes <= i
    // (in its segment, under checkpointing) plus what the node's backward holds, with the
    // parameter gradients of the nodes after it (already made) and its own (finished or
    // being made, twins included).
    let total_saved: u64 = saved.iter().sum();
    let mut prefix = total_saved;
    let mut grads_after = 0u64; // parameter gradients of the nodes after i
    for i in (0..n).rev() {
        let alive = match segment_of {
            None => prefix,
            Some(len) => {
                let start = (i / len) * len;
                resident + saved[start..=i].iter().sum::<u64>()
            }
        };
        for m in &moments[i] {
            let own = (m.param_elems * 4).min(param_bytes[i]);
            let kept = if m.extras_freed {
                alive - extras[i].min(alive)
            } else {
                alive
            };
            lines.push((
                fixed_at(FixedMemory {
                    gradients: Bytes(grads_after + own),
                    optimizer_transient: Bytes(m.param_elems * 4 - own),
                    runtime: base.runtime + Bytes(m.fixed_workspace),
                    ..base.clone()
                }),
                data + kept + m.bytes,
                graph.nodes[i].name.clone(),
            ));
            line_tensors.push((i + 1, m.extras_freed, pieces(m.bytes, node_largest[i])));
            if let Some(call) = m.gemm_call {
                line_calls.insert(lines.len() - 1, call);
            }
        }
        grads_after += param_bytes[i];
        prefix -= saved[i];
    }
    // Start of backward: everything saved plus the loss's tensors and its backward's.
    let at_loss = match segment_of {
        None => total_saved,
        Some(_) => resident,
    } + loss_bytes
        + rules.loss_backward_elems(graph.loss.kind, logits) * act;
    lines.push((
        fixed_at(base.clone()),
        data + at_loss,
        format!("{} (loss)", graph.loss.input),
    ));
    let loss_backward = rules.loss_backward_elems(graph.loss.kind, logits) * act;
    line_tensors.push((
        n,
        false,
        // burn's loss backward makes its logits-sized gradients one after another.
        std::iter::once(loss_bytes)
            .chain(std::iter::repeat_n(
                logits * act,
                (loss_backward / (logits * act).max(1)) as usize,
            ))
            .collect(),
    ));
    // Forward: saved so far plus what the node's forward holds.
    let mut so_far = 0u64;
    for (i, f) in forward_live.iter().enumerate() {
        let live = match segment_of {
            None => so_far,
            Some(_) => resident,
        } + f;
        lines.push((
            fixed_at(FixedMemory {
                runtime: base.runtime + Bytes(forward_ws[i]),
                ..base.clone()
            }),
            data + live,
            format!("{} (forward)", graph.nodes[i].name),
        ));
        line_tensors.push((i, false, pieces(*f, node_largest[i])));
        so_far += saved[i];
    }
    lines.push((at_update.clone(), data, "optimizer".to_string()));
    line_tensors.push((0, false, Vec::new()));

    let activations = match segment_of {
        None => total_saved,
        Some(_) => resident,
    } + loss_bytes;
    let keys: Vec<(u64, Bytes)> = lines.iter().map(|(f, p, _)| (*p, f.total())).collect();
    let peak_line = rules.peak_index(&keys);
    let (fixed, p, peak_at) = lines[peak_line].clone();
    let per_sample = PerSampleMemory {
        data: Bytes(data),
        activations: Bytes(activations),
        transient_at_peak: Bytes(p.saturating_sub(data + activations)),
        workspace: Bytes(workspace_max),
        total: Bytes(p),
    };
    let device_pages = (opts.gpu && opts.runtime == Runtime::Burn).then(|| {
        let transient = rules.optimizer_transient(largest_param, params, opts.optimizer);
        let params: Vec<u64> = graph
            .nodes
            .iter()
            .flat_map(|n| n.op.params())
            .map(|p| p.elements() * 4)
            .collect();
        let batch_tensors: Vec<u64> = graph
            .inputs
            .iter()
            .map(|i| i.shape.elements(seq) * 4)
            .chain([rules.target_bytes(graph.loss.kind, logits, rules::loss_frames(graph, seq))])
            .collect();
        // The tensors of a line: the parameters with their state (and half copies),
        // the gradients from backward on, the optimizer's copy of the largest at the
        // update; the batch, the kept tensors alive then, the moment's own.
        let moment = |line: usize| -> PageMoment {
            let (alive, extras_freed, ref own) = line_tensors[line];
            let from_backward = lines[line].0.gradients.0 > 0 || line == lines.len() - 1;
            let copies =
                1 + state + u64::from(from_backward) + u64::from(opts.micro_batch.is_some());
            let mut fixed_tensors: Vec<u64> = params
                .iter()
                .flat_map(|&p| std::iter::repeat_n(p, copies as usize))
                .collect();
            if opts.precision.weight_bytes() > 4 {
                fixed_tensors.extend(params.iter().map(|p| p / 2));
            }
            if line == lines.len() - 1 {
                fixed_tensors.push(transient.0);
            }
            let kept = node_kept[..alive].iter().enumerate().flat_map(|(i, t)| {
                let freed = extras_freed && i + 1 == alive;
                t.iter().skip(usize::from(freed))
            });
            PageMoment {
                moment: lines[line].2.clone(),
                fixed_tensors,
                per_sample_tensors: batch_tensors
                    .iter()
                    .chain(kept)
                    .chain(own)
                    .copied()
                    .filter(|&t| t > 0)
                    .collect(),
            }
        };
        let loss_line = lines.iter().position(|l| l.2.ends_with("(loss)"));
        let mut candidates: Vec<usize> = [Some(peak_line), loss_line, Some(lines.len() - 1)]
            .into_iter()
            .flatten()
            .collect();
        candidates.dedup();
        DevicePages {
            moments: candidates.into_iter().map(moment).collect(),
            weights: params,
            outside_pools: WGPU_OUTSIDE_POOLS,
        }
    });
    let memory = Memory {
        fixed_bytes: fixed.total(),
        per_sample_bytes: per_sample.total,
        moments: lines
            .into_iter()
            .enumerate()
            .map(|(line, (f, p, moment))| Moment {
                moment,
                fixed_bytes: f.total(),
                per_sample_bytes: Bytes(p),
                gemm_call: line_calls.get(&line).copied(),
            })
            .collect(),
        rounding_bytes: rules.rounding_bytes(n),
        device_pages,
    };
    Plan {
        model: graph.name.clone(),
        parameters: graph.param_count(),
        seq_len: graph.has_seq().then_some(seq),
        loss: graph.loss.kind,
        options: opts.clone(),
        layers,
        fixed,
        per_sample,
        memory,
        peak_at,
        forward_flops_per_sample: Flops(flops),
        train_flops_per_sample: Flops(3.0 * flops),
        measured_error: accuracy::measured_error(opts.runtime, opts.gpu),
    }
}

mod memory;
mod shared;
#[cfg(test)]
mod tests;
