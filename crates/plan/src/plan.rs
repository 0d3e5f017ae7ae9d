//! The plan: memory and FLOPs of one training step as `fixed + per_sample x B`.

use crate::options::{Runtime, TrainOptions};
use crate::rules::{self, BurnCpu, Sizes};
use crate::units::{Bytes, Flops};
use batchfit_graph::{Graph, LossKind, Op};
use serde::Serialize;
use std::collections::{HashMap, HashSet};

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
    /// The optimizer's temporaries while it updates the largest parameter tensor; burn:
    /// also a parameter gradient's second copy while it is made (see `docs/plan.md`).
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
    /// Burn: the peak of every moment of the step (each node's forward and backward, the
    /// loss, the optimizer) as its own line; the planned bytes at a batch are the largest.
    /// `memory` is the line that is largest at large batches. Empty for PyTorch, whose
    /// plan is the single line `memory`.
    #[serde(skip)]
    pub peaks: Vec<MemoryLine>,
    /// Burn on a CPU: gemm's packing buffer, counted in `fixed.runtime`, and the smallest
    /// batch at which it exists (2 when every product at batch 1 is matrix-vector).
    #[serde(skip)]
    pub gemm_buffer: (Bytes, u64),
}

/// PyTorch's CUDA context (driver, cuBLAS and cuDNN handles) as seen in
/// `nvidia-smi` before any tensor: 300-800 MiB depending on versions; 500 MiB taken.
pub const PYTORCH_CUDA_CONTEXT: Bytes = Bytes(500 * Bytes::MIB);
/// PyTorch's caching allocator serves tensors of at most 1 MiB from 2 MiB segments.
pub const PYTORCH_SMALL_SEGMENT: Bytes = Bytes(2 * Bytes::MIB);
/// PyTorch rounds every allocation up to a multiple of 512 bytes.
pub const PYTORCH_BLOCK: u64 = 512;

/// This machine as burn's CPU backend (flex) sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuHost {
    /// Threads of rayon's global pool: `RAYON_NUM_THREADS`, else the available parallelism.
    pub threads: u64,
    /// L2 cache bytes per core as gemm reads them (sysfs `size` over the CPUs sharing it;
    /// gemm's default 256 KiB when unknown).
    pub l2_bytes: u64,
}

impl CpuHost {
    /// Reads rayon's thread count and the L2 size the way rayon and gemm do.
    pub fn detect() -> CpuHost {
        let threads = std::env::var("RAYON_NUM_THREADS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|&n| n > 0)
            .or_else(|| {
                std::thread::available_parallelism()
                    .ok()
                    .map(|n| n.get() as u64)
            })
            .unwrap_or(1);
        CpuHost {
            threads,
            l2_bytes: l2_per_core().unwrap_or(256 * 1024),
        }
    }

    /// gemm's packing buffer (gemm-common `L2_SLAB`): an L2-sized thread-local buffer that
    /// each thread allocates the first time it packs a matrix product, and keeps. Which
    /// threads pack depends on every product's shape (gemm-common `gemm_basic_generic`:
    /// matrix-vector products pack nothing, flex runs products under 192^3 multiply-adds
    /// on the calling thread and larger ones on the pool), so a step holds 0 to
    /// threads + 1 of them; the plan counts one.
    pub fn gemm_slabs(&self) -> Bytes {
        Bytes(self.l2_bytes)
    }
}

/// sysfs's level-2 cache of cpu0 divided by the CPUs that share it, as gemm-common's
/// `cache_info` computes it.
fn l2_per_core() -> Option<u64> {
    let dir = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        let read = |f: &str| std::fs::read_to_string(path.join(f)).ok();
        let (Some(level), Some(kind), Some(size)) = (read("level"), read("type"), read("size"))
        else {
            continue;
        };
        if level.trim() != "2" || kind.trim() == "Instruction" {
            continue;
        }
        let size = size.trim();
        let (digits, unit) = match size.char_indices().last()? {
            (i, 'K') => (&size[..i], 1024),
            (i, 'M') => (&size[..i], 1024 * 1024),
            (i, 'G') => (&size[..i], 1024 * 1024 * 1024),
            _ => (size, 1),
        };
        let bytes = digits.parse::<u64>().ok()? * unit;
        let shared = read("shared_cpu_list").map_or(1, |l| cpu_count(l.trim()));
        return Some(bytes / shared.max(1));
    }
    None
}

/// CPUs in a sysfs list such as `0-3,8`.
fn cpu_count(list: &str) -> u64 {
    list.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('-') {
            Some((a, b)) => match (a.parse::<u64>(), b.parse::<u64>()) {
                (Ok(a), Ok(b)) if b >= a => b - a + 1,
                _ => 1,
            },
            None => 1,
        })
        .sum()
}

impl Plan {
    /// Planned peak memory at batch `b` (activations at the micro-batch if one is set).
    pub fn bytes_at(&self, batch: u64) -> Bytes {
        let b = self.options.micro_batch.map_or(batch, |m| m.min(batch));
        let linear = self.memory.fixed_bytes + self.memory.per_sample_bytes * b;
        match self.options.runtime {
            Runtime::Burn => {
                let peak = self
                    .peaks
                    .iter()
                    .map(|l| l.fixed_bytes + l.per_sample_bytes * b)
                    .fold(linear, Bytes::max);
                let (buffer, from) = self.gemm_buffer;
                if b < from {
                    Bytes(peak.0.saturating_sub(buffer.0))
                } else {
                    peak
                }
            }
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

/// Builds the plan of `graph` under `opts` (burn on a CPU: for this machine's threads and L2).
pub fn plan(graph: &Graph, opts: &TrainOptions) -> Plan {
    let host = match (opts.runtime, opts.gpu) {
        (Runtime::Burn, false) => CpuHost::detect(),
        _ => CpuHost {
            threads: 1,
            l2_bytes: 0,
        },
    };
    plan_on(graph, opts, host)
}

/// [`plan`] for a given CPU (only burn on a CPU reads it).
pub fn plan_on<'g>(graph: &'g Graph, opts: &TrainOptions, host: CpuHost) -> Plan {
    let burn = opts.runtime == Runtime::Burn;
    let cpu = BurnCpu {
        threads: host.threads.max(1),
        gemm_slab: host.gemm_slabs().0,
    };
    let seq = opts
        .seq_len
        .or(graph.default_seq_len)
        .unwrap_or(batchfit_graph::DEFAULT_SEQ_LEN);
    let act = opts.precision.activation_bytes();
    let elems =
        |tensor: &str| -> u64 { graph.shape_of(tensor).map(|s| s.elements(seq)).unwrap_or(0) };

    // Forward pass: what each node saves, counting each tensor once (at its first saver,
    // whose backward comes last and frees it). Burn's batch tensors are the very tensors
    // the first layers keep, so they are counted once, as data.
    let mut kept: HashSet<&str> = HashSet::new();
    // Burn: whether a tensor needs a gradient (batch inputs do not).
    let mut tracked: HashMap<&str, bool> = HashMap::new();
    // Burn: the tensor whose buffer a view shares.
    let mut alias: HashMap<&str, &str> = HashMap::new();
    if burn {
        for input in &graph.inputs {
            kept.insert(input.name.as_str());
            tracked.insert(input.name.as_str(), false);
        }
    }
    let n = graph.nodes.len();
    let mut layers = Vec::with_capacity(n);
    let mut saved = Vec::with_capacity(n); // per-sample bytes by node
    let mut grads_at = Vec::with_capacity(n); // grad in + grad out + workspace
    let mut forward_live = Vec::with_capacity(n);
    // Burn: each node's backward moments, own extra kept bytes, forward per-thread buffers.
    let mut moments = Vec::with_capacity(n);
    let mut extras = Vec::with_capacity(n);
    let mut forward_ws = Vec::with_capacity(n);
    let mut param_bytes = Vec::with_capacity(n);
    let mut workspace_max = 0u64;
    let mut packs_at_one = false; // burn: a matrix-matrix product at batch 1
    let mut flops = 0.0;
    for node in &graph.nodes {
        let in_elems: Vec<u64> = node.inputs.iter().map(|i| elems(i)).collect();
        let in_dims = graph
            .shape_of(&node.inputs[0])
            .map(|s| s.resolve(seq))
            .unwrap_or_default();
        let out_dims = node.shape.resolve(seq);
        let out = node.shape.elements(seq);
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
        // Burn: a view (flatten, reshape) shares its input's buffer; a layer keeping the
        // view keeps that buffer, counted under the input's name.
        if burn && matches!(node.op, Op::Flatten | Op::Reshape { .. }) {
            let base_name = alias.get(node.inputs[0].as_str()).copied();
            alias.insert(
                node.name.as_str(),
                base_name.unwrap_or(node.inputs[0].as_str()),
            );
        }
        let rule = rules::saved(&node.op, &sizes, opts.runtime);
        let extra = rule.extra_elems * act + rule.extra_bytes;
        // Inputs alive at this node's forward that no earlier node keeps.
        let storage = |name: &'g str| -> &'g str { alias.get(name).copied().unwrap_or(name) };
        let loose: u64 = node
            .inputs
            .iter()
            .zip(&in_elems)
            .filter(|(name, _)| !kept.contains(storage(name.as_str())))
            .map(|(_, e)| e * act)
            .sum();
        let mut bytes = extra;
        if rule.inputs {
            for (name, e) in node.inputs.iter().zip(&in_elems) {
                if kept.insert(storage(name.as_str())) {
                    bytes += e * act;
                }
            }
        }
        if rule.output && kept.insert(node.name.as_str()) {
            bytes += out * act;
        }
        let f = rules::forward_flops(&node.op, &sizes);
        flops += f;
        saved.push(bytes);
        param_bytes.push(node.op.param_count() * 4);
        if burn {
            tracked.insert(
                node.name.as_str(),
                node.op.param_count() > 0 || in_tracked.iter().any(|&t| t),
            );
            let m = rules::burn_backward(&node.op, &sizes, &in_tracked, cpu, act);
            grads_at.push(m.iter().map(|m| m.bytes).max().unwrap_or(0));
            moments.push(m);
            extras.push(extra);
            forward_live
                .push(loose + out * act + extra + rules::burn_forward(&node.op, &sizes, act));
            forward_ws.push(rules::burn_forward_workspace(&node.op, &sizes, cpu, act));
            packs_at_one |= rules::burn_packs_at_batch_one(&node.op, &sizes);
        } else {
            let ws = rules::workspace_elems(&node.op, &sizes) * act;
            workspace_max = workspace_max.max(ws);
            grads_at.push((out + in_elems.iter().sum::<u64>()) * act + ws);
            forward_live.push((out + in_elems.iter().sum::<u64>()) * act + ws);
        }
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

    let data = data_bytes(graph, seq, opts.runtime);
    let params = graph.param_count();
    let largest_param = graph
        .nodes
        .iter()
        .flat_map(|n| n.op.params())
        .map(|p| p.elements())
        .max()
        .unwrap_or(0);
    let state = opts.optimizer.state_per_param();
    let weights = Bytes(params * opts.precision.weight_bytes());
    let optimizer_state = Bytes(params * 4 * state);
    let buffers = Bytes(
        graph
            .nodes
            .iter()
            .map(|n| n.op.buffer_elements())
            .sum::<u64>()
            * 4,
    );
    let accumulation = match (opts.micro_batch, opts.runtime) {
        (Some(_), Runtime::Burn) => Bytes(params * 4),
        _ => Bytes(0),
    };
    let runtime = match (opts.runtime, opts.gpu) {
        (Runtime::Pytorch, true) => PYTORCH_CUDA_CONTEXT + PYTORCH_SMALL_SEGMENT,
        (Runtime::Pytorch, false) => PYTORCH_SMALL_SEGMENT,
        (Runtime::Burn, false) => host.gemm_slabs(),
        (Runtime::Burn, true) => Bytes(0),
    };
    // What every moment of a burn step holds besides gradients and kernel buffers.
    let base = FixedMemory {
        weights,
        optimizer_state,
        buffers,
        accumulation,
        runtime,
        ..FixedMemory::default()
    };

    // Backward, in reverse: at node i the live set is everything saved by nodes <= i
    // (in its segment, under checkpointing) plus node i's gradients and workspace.
    // Burn: each moment is its own line, with the parameter gradients alive then.
    let mut lines: Vec<(FixedMemory, u64, String)> = Vec::new();
    let mut peak = 0u64;
    let mut peak_at = graph.loss.input.clone();
    let total_saved: u64 = saved.iter().sum();
    let mut prefix = total_saved;
    let mut grads_after = 0u64; // burn: parameter gradients of the nodes after i
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
        if burn {
            // Each moment of the node's backward, with the parameter gradients of the nodes
            // after it (already made) and its own (finished or being made, twins included).
            for m in &moments[i] {
                let own = (m.param_elems * 4).min(param_bytes[i]);
                let kept = if m.extras_freed {
                    alive - extras[i].min(alive)
                } else {
                    alive
                };
                lines.push((
                    FixedMemory {
                        gradients: Bytes(grads_after + own),
                        optimizer_transient: Bytes(m.param_elems * 4 - own),
                        runtime: base.runtime + Bytes(m.fixed_workspace),
                        ..base.clone()
                    },
                    data + kept + m.bytes,
                    graph.nodes[i].name.clone(),
                ));
            }
            grads_after += param_bytes[i];
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
    if burn {
        let at_loss =
            at_loss - logits * act + rules::burn_loss_backward_elems(graph.loss.kind, logits) * act;
        lines.push((
            base.clone(),
            data + at_loss,
            format!("{} (loss)", graph.loss.input),
        ));
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
        if burn {
            lines.push((
                FixedMemory {
                    runtime: base.runtime + Bytes(forward_ws[i]),
                    ..base.clone()
                },
                data + live,
                format!("{} (forward)", graph.nodes[i].name),
            ));
        }
        so_far += saved[i];
    }
    if burn {
        // The optimizer: all gradients, and one tensor's update temporaries (burn-optim
        // `AdaptiveMomentum::transform` and `Momentum::transform` clone the gradient or a
        // moment into a new tensor; plain SGD updates in place).
        lines.push((
            FixedMemory {
                gradients: Bytes(params * 4),
                optimizer_transient: Bytes(if state > 0 { largest_param * 4 } else { 0 }),
                ..base.clone()
            },
            data,
            "optimizer".to_string(),
        ));
    }

    let activations = match segment_of {
        None => total_saved,
        Some(_) => resident,
    } + loss_bytes;
    let (fixed, per_sample, peaks) = if burn {
        // The line that is largest at large batches: the most per sample, then the most fixed.
        let (f, p, at) = lines
            .iter()
            .max_by_key(|(f, p, _)| (*p, f.total()))
            .cloned()
            .expect("a step has an optimizer moment");
        peak_at = at;
        let peaks = lines
            .iter()
            .map(|(f, p, _)| MemoryLine {
                fixed_bytes: f.total(),
                per_sample_bytes: Bytes(*p),
            })
            .collect();
        let per_sample = PerSampleMemory {
            data: Bytes(data),
            activations: Bytes(activations),
            transient_at_peak: Bytes(p.saturating_sub(data + activations)),
            workspace: Bytes(workspace_max),
            total: Bytes(p),
        };
        (f, per_sample, peaks)
    } else {
        let per_sample = PerSampleMemory {
            data: Bytes(data),
            activations: Bytes(activations),
            transient_at_peak: Bytes(peak.saturating_sub(activations)),
            workspace: Bytes(workspace_max),
            total: Bytes(data + peak.max(activations)),
        };
        let fixed = FixedMemory {
            gradients: Bytes(params * 4),
            // The update of one tensor allocates its new value and new state before the
            // old ones are dropped (PyTorch's foreach temporaries).
            optimizer_transient: Bytes(largest_param * 4 * (state + 1)),
            ..base
        };
        (fixed, per_sample, Vec::new())
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
        peaks,
        gemm_buffer: match (opts.runtime, opts.gpu) {
            (Runtime::Burn, false) => (host.gemm_slabs(), if packs_at_one { 1 } else { 2 }),
            _ => (Bytes(0), 0),
        },
    }
}

/// Bytes of one sample of the batch: the inputs (fp32; burn converts token ids to its
/// device's i32, `Tensor::from_data`) and the target.
fn data_bytes(graph: &Graph, seq: usize, runtime: Runtime) -> u64 {
    let inputs: u64 = graph.inputs.iter().map(|i| i.shape.elements(seq) * 4).sum();
    inputs + target_bytes(graph, seq, runtime)
}

/// Bytes of one sample's target: the output's shape for MSE, one int64 class per
/// sample or frame for cross-entropy, a label sequence of up to T int64 for CTC.
/// Burn's engine feeds cross-entropy one-hot fp32 rows (`data::one_hot`): the logits' size.
fn target_bytes(graph: &Graph, seq: usize, runtime: Runtime) -> u64 {
    match (graph.loss.kind, runtime) {
        (LossKind::Mse, _) => graph.output().shape.elements(seq) * 4,
        (LossKind::CrossEntropy | LossKind::CrossEntropyPerFrame, Runtime::Burn) => {
            graph.output().shape.elements(seq) * 4
        }
        (LossKind::CrossEntropy, Runtime::Pytorch) => 8,
        (LossKind::CrossEntropyPerFrame, Runtime::Pytorch) | (LossKind::Ctc { .. }, _) => {
            8 * seq as u64
        }
    }
}
