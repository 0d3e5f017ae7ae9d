//! Past one device: memory per device under data parallelism with sharded model states
//! (DDP, ZeRO stages 1–3, FSDP), and the communication time of one step.
//!
//! Pure arithmetic. Sources and what is left out: `docs/scale.md`.
//!
//! * Model states (Rajbhandari et al. 2020, "ZeRO", §3 and §5): per parameter, the
//!   working parameters, the gradients and K bytes of optimizer state (fp32 master
//!   weights under mixed precision, plus the optimizer's fp32 tensors). Stage 1 shards
//!   the K bytes over the N_d devices, stage 2 also the gradients, stage 3 also the
//!   parameters. FSDP's FULL_SHARD shards as stage 3 (that is what `fsdp` models).
//! * Communication (Thakur, Rabenseifner and Gropp 2005, "Optimization of Collective
//!   Communication Operations in MPICH"; the ring algorithms NCCL uses): with W devices
//!   and a message of S bytes, a ring reduce-scatter or all-gather moves (W-1)/W x S
//!   bytes per device in W-1 steps, an all-reduce twice that in 2(W-1) steps; time =
//!   bytes / bandwidth + steps x latency (the alpha-beta model).

use crate::options::{Precision, TrainOptions};
use crate::plan::Plan;
use crate::units::Bytes;
use serde::Serialize;

/// How the model states are spread over the data-parallel devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// PyTorch DistributedDataParallel: every device keeps every state.
    #[cfg_attr(feature = "clap", value(name = "ddp"))]
    Ddp,
    /// ZeRO stage 1: optimizer states sharded.
    #[cfg_attr(feature = "clap", value(name = "zero1"))]
    Zero1,
    /// ZeRO stage 2: optimizer states and gradients sharded.
    #[cfg_attr(feature = "clap", value(name = "zero2"))]
    Zero2,
    /// ZeRO stage 3: optimizer states, gradients and parameters sharded.
    #[cfg_attr(feature = "clap", value(name = "zero3"))]
    Zero3,
    /// PyTorch FSDP with `ShardingStrategy.FULL_SHARD`: stage 3's sharding.
    #[cfg_attr(feature = "clap", value(name = "fsdp"))]
    Fsdp,
}

impl Strategy {
    /// Every strategy, in order of how much they shard.
    pub const ALL: [Strategy; 5] = [
        Strategy::Ddp,
        Strategy::Zero1,
        Strategy::Zero2,
        Strategy::Zero3,
        Strategy::Fsdp,
    ];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Ddp => "ddp",
            Strategy::Zero1 => "zero1",
            Strategy::Zero2 => "zero2",
            Strategy::Zero3 => "zero3",
            Strategy::Fsdp => "fsdp",
        }
    }

    /// The ZeRO stage whose sharding it has (DDP: 0).
    pub fn stage(self) -> u8 {
        match self {
            Strategy::Ddp => 0,
            Strategy::Zero1 => 1,
            Strategy::Zero2 => 2,
            Strategy::Zero3 | Strategy::Fsdp => 3,
        }
    }
}

/// Unsharded bytes per parameter of the three model states, as ZeRO counts them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct StateBytes {
    /// The working parameters (the compute dtype: fp32, or fp16/bf16 under mixed precision).
    pub params: u64,
    /// The gradients (the compute dtype, as the working parameters).
    pub gradients: u64,
    /// ZeRO's K: the fp32 master weights under mixed precision plus the optimizer's state.
    pub optimizer: u64,
}

impl StateBytes {
    /// Per-parameter bytes under `opts`, from the plan's own precision and optimizer facts:
    /// the working copy is an activation-sized element, the master copy is what the plan's
    /// weights hold beyond it (nothing under fp32), the state is the optimizer's.
    pub fn of(opts: &TrainOptions) -> StateBytes {
        let working = opts.precision.activation_bytes();
        let master = opts.precision.weight_bytes() - working;
        StateBytes {
            params: working,
            gradients: working,
            optimizer: master + opts.optimizer.state_bytes(),
        }
    }

    /// All three, unsharded: 2 + 2 + 12 = 16 for mixed-precision Adam.
    pub fn total(&self) -> u64 {
        self.params + self.gradients + self.optimizer
    }
}

/// The model states one device keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ModelStates {
    /// Working parameters on the device.
    pub params: Bytes,
    /// Gradients on the device.
    pub gradients: Bytes,
    /// Optimizer state (and master weights) on the device.
    pub optimizer: Bytes,
}

impl ModelStates {
    /// The sum of the three.
    pub fn total(&self) -> Bytes {
        self.params + self.gradients + self.optimizer
    }
}

/// `parameters x bytes / world`, rounded up: a shard as the largest device holds it.
fn shard(parameters: u64, bytes: u64, world: u64, sharded: bool) -> Bytes {
    let all = parameters as u128 * bytes as u128;
    let n = if sharded { world.max(1) as u128 } else { 1 };
    Bytes(all.div_ceil(n) as u64)
}

/// Model states per device: stage >= 1 shards K, >= 2 the gradients, 3 the parameters.
pub fn model_states(
    parameters: u64,
    per: StateBytes,
    strategy: Strategy,
    world: u64,
) -> ModelStates {
    let stage = strategy.stage();
    ModelStates {
        params: shard(parameters, per.params, world, stage >= 3),
        gradients: shard(parameters, per.gradients, world, stage >= 2),
        optimizer: shard(parameters, per.optimizer, world, stage >= 1),
    }
}

/// PyTorch DDP's `bucket_cap_mb` default: 25 MiB per gradient bucket.
pub const DDP_BUCKET_CAP: Bytes = Bytes(25 * Bytes::MIB);
/// PyTorch DDP's first bucket (`torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`): 1 MiB, so
/// the first all-reduce starts early in the backward.
pub const DDP_FIRST_BUCKET: Bytes = Bytes(Bytes::MIB);
/// DeepSpeed's `reduce_bucket_size` and `allgather_bucket_size` defaults (ZeRO stages 1
/// and 2): 5e8 elements.
pub const DEEPSPEED_BUCKET_ELEMENTS: u64 = 500_000_000;

/// DDP's gradient buckets, in the order the backward fills them: layers from the last
/// (`layer_bytes` is in forward order), closing a bucket once it reaches its cap (1 MiB for
/// the first, 25 MiB after), as `compute_bucket_assignment_by_size` does per tensor; here
/// per layer.
pub fn ddp_buckets(layer_bytes: &[u64]) -> Vec<u64> {
    let mut buckets = Vec::new();
    let mut open = 0u64;
    for &b in layer_bytes.iter().rev().filter(|&&b| b > 0) {
        open += b;
        let cap = if buckets.is_empty() {
            DDP_FIRST_BUCKET
        } else {
            DDP_BUCKET_CAP
        };
        if open >= cap.0 {
            buckets.push(open);
            open = 0;
        }
    }
    if open > 0 {
        buckets.push(open);
    }
    buckets
}

/// Messages of at most `cap` bytes that carry `total` bytes.
fn chunks(total: u64, cap: u64) -> Vec<u64> {
    let mut out = vec![cap; (total / cap) as usize];
    if !total.is_multiple_of(cap) {
        out.push(total % cap);
    }
    out
}

/// Communication buffers one device holds beside its model states.
///
/// DDP: its buckets, one more copy of every gradient (the default
/// `gradient_as_bucket_view=False`). ZeRO-1/2: DeepSpeed's reduce bucket, at most
/// `reduce_bucket_size` gradient elements. ZeRO-3/FSDP: the gathered parameters of the
/// largest layer and of one prefetched layer (the two largest, as a bound) and the full
/// gradient of the largest layer before its reduce-scatter.
pub fn comm_buffers(layer_params: &[u64], per: StateBytes, strategy: Strategy) -> Bytes {
    let parameters: u64 = layer_params.iter().sum();
    match strategy {
        Strategy::Ddp => Bytes(parameters * per.gradients),
        Strategy::Zero1 | Strategy::Zero2 => {
            Bytes(parameters.min(DEEPSPEED_BUCKET_ELEMENTS) * per.gradients)
        }
        Strategy::Zero3 | Strategy::Fsdp => {
            let mut sorted: Vec<u64> = layer_params.to_vec();
            sorted.sort_unstable_by(|a, b| b.cmp(a));
            let largest = sorted.first().copied().unwrap_or(0);
            let next = sorted.get(1).copied().unwrap_or(0);
            Bytes((largest + next) * per.params + largest * per.gradients)
        }
    }
}

/// One device's memory under a strategy: the plan's activations and other fixed parts, with
/// the model states replaced by the device's shards and the communication buffers added.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceMemory {
    /// The strategy.
    pub strategy: Strategy,
    /// Devices sharing the model states (GPUs per node x nodes).
    pub world_size: u64,
    /// Model-state bytes per parameter on one device (16/N for mixed-precision Adam at stage 3).
    pub model_state_bytes_per_param: f64,
    /// The model states on one device.
    pub model_states: ModelStates,
    /// Their sum.
    pub model_state_bytes: Bytes,
    /// Communication buffers ([`comm_buffers`]).
    pub comm_buffer_bytes: Bytes,
    /// What the single-device plan holds besides the model states (runtime, buffers,
    /// optimizer temporaries) at batch 0 of its peak line.
    pub other_fixed_bytes: Bytes,
    /// Planned bytes per sample of the micro-batch (as on one device).
    pub per_sample_bytes: Bytes,
    /// The plan's model states, which this device's replace.
    #[serde(skip)]
    plan_states: Bytes,
}

impl DeviceMemory {
    /// `plan` (PyTorch's rules: one fixed part for every moment, so the model states can be
    /// swapped exactly) spread over `world` devices with `strategy`.
    pub fn new(plan: &Plan, strategy: Strategy, world: u64) -> DeviceMemory {
        let per = StateBytes::of(&plan.options);
        let layer_params: Vec<u64> = plan.layers.iter().map(|l| l.parameters).collect();
        let model_states = model_states(plan.parameters, per, strategy, world);
        let f = &plan.fixed;
        let plan_states = f.weights + f.gradients + f.optimizer_state;
        DeviceMemory {
            strategy,
            world_size: world,
            model_state_bytes_per_param: model_states.total().as_f64()
                / plan.parameters.max(1) as f64,
            model_states,
            model_state_bytes: model_states.total(),
            comm_buffer_bytes: comm_buffers(&layer_params, per, strategy),
            other_fixed_bytes: plan.memory.fixed_bytes - plan_states.min(plan.memory.fixed_bytes),
            per_sample_bytes: plan.memory.per_sample_bytes,
            plan_states,
        }
    }

    /// What this device holds beyond the plan's own memory (negative: less).
    fn delta(&self) -> i128 {
        (self.model_states.total() + self.comm_buffer_bytes).0 as i128 - self.plan_states.0 as i128
    }

    /// Planned peak on one device at micro-batch `micro` (plan the `plan` without a micro-batch).
    pub fn bytes_at(&self, plan: &Plan, micro: u64) -> Bytes {
        let b = plan.bytes_at(micro).0 as i128 + self.delta();
        Bytes(b.max(0) as u64)
    }

    /// The largest micro-batch whose planned peak on one device fits `budget`.
    pub fn max_micro_batch(&self, plan: &Plan, budget: Bytes) -> Option<u64> {
        let room = budget.0 as i128 - self.delta();
        if room <= 0 {
            return None;
        }
        plan.max_batch(Bytes(room.min(u64::MAX as i128) as u64))
    }
}

/// A link between devices: bandwidth per direction and the fixed cost of one ring step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Link {
    /// Preset name, or `custom`.
    pub name: String,
    /// Bytes per second one device sends (and receives) at once.
    pub bytes_per_s: f64,
    /// Seconds of one ring step's fixed cost (alpha).
    pub latency_s: f64,
}

/// Named links (`--link`). Bandwidths are nominal per direction, no efficiency factor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum LinkPreset {
    /// NVLink 3 on an A100 SXM: 12 links x 25 GB/s = 300 GB/s per direction per GPU.
    #[cfg_attr(feature = "clap", value(name = "nvlink"))]
    Nvlink,
    /// PCIe 4.0 x16: 16 GT/s x 16 lanes x 128/130 / 8 = 31.5 GB/s per direction.
    #[cfg_attr(feature = "clap", value(name = "pcie4"))]
    Pcie4,
    /// InfiniBand EDR, 100 Gb/s data rate: 12.5 GB/s.
    #[cfg_attr(feature = "clap", value(name = "ib100"))]
    Ib100,
    /// InfiniBand HDR, 200 Gb/s: 25 GB/s.
    #[cfg_attr(feature = "clap", value(name = "ib200"))]
    Ib200,
    /// InfiniBand NDR, 400 Gb/s: 50 GB/s.
    #[cfg_attr(feature = "clap", value(name = "ib400"))]
    Ib400,
    /// 25 Gigabit Ethernet: 3.125 GB/s.
    #[cfg_attr(feature = "clap", value(name = "eth25"))]
    Eth25,
}

/// Latency of one ring step inside a node and over RDMA (order of magnitude of a
/// small-message NCCL step; see `docs/scale.md`).
const LOCAL_LATENCY_S: f64 = 5e-6;
/// Latency of one ring step over TCP sockets (NCCL's socket transport).
const SOCKET_LATENCY_S: f64 = 25e-6;

impl LinkPreset {
    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            LinkPreset::Nvlink => "nvlink",
            LinkPreset::Pcie4 => "pcie4",
            LinkPreset::Ib100 => "ib100",
            LinkPreset::Ib200 => "ib200",
            LinkPreset::Ib400 => "ib400",
            LinkPreset::Eth25 => "eth25",
        }
    }

    /// The link's figures.
    pub fn link(self) -> Link {
        let gbit = |g: f64| g * 1e9 / 8.0;
        let (bytes_per_s, latency_s) = match self {
            LinkPreset::Nvlink => (12.0 * 25e9, LOCAL_LATENCY_S),
            LinkPreset::Pcie4 => (16e9 * 16.0 * 128.0 / 130.0 / 8.0, LOCAL_LATENCY_S),
            LinkPreset::Ib100 => (gbit(100.0), LOCAL_LATENCY_S),
            LinkPreset::Ib200 => (gbit(200.0), LOCAL_LATENCY_S),
            LinkPreset::Ib400 => (gbit(400.0), LOCAL_LATENCY_S),
            LinkPreset::Eth25 => (gbit(25.0), SOCKET_LATENCY_S),
        };
        Link {
            name: self.name().to_string(),
            bytes_per_s,
            latency_s,
        }
    }
}

impl Link {
    /// A link of `gbps` gigabits per second with the latency of RDMA or a local link.
    pub fn gbps(gbps: f64) -> Link {
        Link {
            name: "custom".to_string(),
            bytes_per_s: gbps * 1e9 / 8.0,
            latency_s: LOCAL_LATENCY_S,
        }
    }

    /// The ring's link over `nodes` nodes: one flat ring through every device crosses each
    /// node boundary, and every hop carries the same bytes, so the slowest hop sets the
    /// bandwidth and the largest latency the step cost.
    pub fn ring(intra: &Link, inter: Option<&Link>) -> Link {
        match inter {
            None => intra.clone(),
            Some(x) => Link {
                name: format!("{} between nodes, {} within", x.name, intra.name),
                bytes_per_s: x.bytes_per_s.min(intra.bytes_per_s),
                latency_s: x.latency_s.max(intra.latency_s),
            },
        }
    }
}

/// A collective operation of the ring algorithms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Collective {
    /// Every device ends with the sum: a reduce-scatter then an all-gather.
    AllReduce,
    /// Every device ends with the sum of its shard.
    ReduceScatter,
    /// Every device ends with every shard.
    AllGather,
}

impl Collective {
    /// (bytes moved per device, ring steps) for a message of `bytes` over `world` devices.
    pub fn volume(self, bytes: u64, world: u64) -> (f64, u64) {
        if world <= 1 {
            return (0.0, 0);
        }
        let share = (world - 1) as f64 / world as f64 * bytes as f64;
        match self {
            Collective::AllReduce => (2.0 * share, 2 * (world - 1)),
            Collective::ReduceScatter | Collective::AllGather => (share, world - 1),
        }
    }

    /// Seconds for a message of `bytes` on `link` (alpha-beta: steps x alpha + volume / beta).
    pub fn seconds(self, bytes: u64, world: u64, link: &Link) -> f64 {
        let (moved, steps) = self.volume(bytes, world);
        moved / link.bytes_per_s + steps as f64 * link.latency_s
    }
}

/// Communication of one update (all its micro-steps) and what of it the compute does not hide.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CommTime {
    /// Bytes one device sends per update.
    pub bytes_per_device: f64,
    /// Collectives per update.
    pub collectives: u64,
    /// Seconds of all collectives per update, if none overlapped.
    pub seconds: f64,
    /// Seconds per update not hidden behind compute (`None` without a compute time).
    pub exposed_s: Option<f64>,
}

/// The collectives of one phase, in issue order, each as (kind, message bytes).
type Phase = Vec<(Collective, u64)>;

/// Exposed seconds of a phase overlapped with `compute_s`: the last collective cannot
/// start before the compute that produces its data ends (`first_exposed`: the first one
/// cannot start before it is needed), the rest hide behind the compute up to its length.
fn exposed(times: &[f64], compute_s: f64, tail_exposed: bool) -> f64 {
    let Some(edge) = (if tail_exposed {
        times.last()
    } else {
        times.first()
    }) else {
        return 0.0;
    };
    let rest: f64 = times.iter().sum::<f64>() - edge;
    edge + (rest - compute_s).max(0.0)
}

/// What the communication of a step depends on besides the strategy and the world.
#[derive(Clone, Copy, Debug)]
pub struct CommModel<'a> {
    /// Parameters of each layer, in forward order.
    pub layer_params: &'a [u64],
    /// Bytes per parameter of the states.
    pub per: StateBytes,
    /// The forward's share of a micro-step's compute (the plan's forward / training FLOPs).
    pub forward_share: f64,
}

impl<'a> CommModel<'a> {
    /// The model of `plan`'s layers and options.
    pub fn of(plan: &Plan, layer_params: &'a [u64]) -> CommModel<'a> {
        CommModel {
            layer_params,
            per: StateBytes::of(&plan.options),
            forward_share: plan.forward_flops_per_sample.0
                / plan.train_flops_per_sample.0.max(f64::MIN_POSITIVE),
        }
    }
}

/// The step's communication under `strategy`; `micro_step_s`: one device's forward +
/// backward of one micro-batch.
///
/// Overlap rules: DDP all-reduces its buckets once per update (`no_sync` on the other
/// micro-steps) while the last micro-step's backward runs, all but the last bucket hidden.
/// ZeRO-1 reduce-scatters the gradients once per update, ZeRO-2 at every micro-step (its
/// gradient shard cannot hold an unreduced full gradient), both in DeepSpeed's buckets and
/// without overlap (`overlap_comm` defaults to false for stages 1 and 2); both all-gather
/// the updated parameters after the optimizer step. ZeRO-3 and FSDP all-gather each
/// layer's parameters in the forward (hidden behind the forward but the first layer's) and
/// again in the backward with its gradient's reduce-scatter (hidden behind the backward
/// but the first layer's reduce-scatter, which comes last), at every micro-step.
pub fn comm_time(
    model: &CommModel,
    strategy: Strategy,
    world: u64,
    accumulation: u64,
    micro_step_s: Option<f64>,
    link: &Link,
) -> CommTime {
    let CommModel {
        layer_params,
        per,
        forward_share,
    } = *model;
    let a = accumulation.max(1);
    let parameters: u64 = layer_params.iter().sum();
    let grads: Vec<u64> = layer_params.iter().map(|p| p * per.gradients).collect();
    let fwd_s = micro_step_s.map(|s| s * forward_share);
    let bwd_s = micro_step_s.map(|s| s * (1.0 - forward_share));
    let time = |phase: &Phase| -> Vec<f64> {
        phase
            .iter()
            .map(|&(c, b)| c.seconds(b, world, link))
            .collect()
    };
    let deepspeed = |total: u64, dtype: u64| chunks(total, DEEPSPEED_BUCKET_ELEMENTS * dtype);
    // (phase, times it runs per update, compute it overlaps with, whether its last
    // (else first) collective is exposed).
    let mut phases: Vec<(Phase, u64, Option<f64>, bool)> = Vec::new();
    match strategy {
        Strategy::Ddp => {
            let buckets = ddp_buckets(&grads);
            let phase = buckets
                .iter()
                .map(|&b| (Collective::AllReduce, b))
                .collect();
            phases.push((phase, 1, bwd_s, true));
        }
        Strategy::Zero1 | Strategy::Zero2 => {
            let reduce: Phase = deepspeed(parameters * per.gradients, per.gradients)
                .into_iter()
                .map(|b| (Collective::ReduceScatter, b))
                .collect();
            let gather: Phase = deepspeed(parameters * per.params, per.params)
                .into_iter()
                .map(|b| (Collective::AllGather, b))
                .collect();
            let reduces = if strategy == Strategy::Zero2 { a } else { 1 };
            phases.push((reduce, reduces, Some(0.0), true));
            phases.push((gather, 1, Some(0.0), true));
        }
        Strategy::Zero3 | Strategy::Fsdp => {
            let with: Vec<u64> = layer_params.iter().copied().filter(|&p| p > 0).collect();
            let forward: Phase = with
                .iter()
                .map(|&p| (Collective::AllGather, p * per.params))
                .collect();
            let backward: Phase = with
                .iter()
                .rev()
                .flat_map(|&p| {
                    [
                        (Collective::AllGather, p * per.params),
                        (Collective::ReduceScatter, p * per.gradients),
                    ]
                })
                .collect();
            phases.push((forward, a, fwd_s, false));
            phases.push((backward, a, bwd_s, true));
        }
    }
    let mut out = CommTime {
        bytes_per_device: 0.0,
        collectives: 0,
        seconds: 0.0,
        exposed_s: micro_step_s.map(|_| 0.0),
    };
    for (phase, times, compute, tail) in &phases {
        let t = time(phase);
        let k = *times as f64;
        out.bytes_per_device += k * phase
            .iter()
            .map(|&(c, b)| c.volume(b, world).0)
            .sum::<f64>();
        out.collectives += times * phase.len() as u64;
        out.seconds += k * t.iter().sum::<f64>();
        if let (Some(e), Some(c)) = (out.exposed_s.as_mut(), compute) {
            *e += k * exposed(&t, *c, *tail);
        }
    }
    if world <= 1 {
        out.collectives = 0;
    }
    out
}

/// Precision of a step, for launch configurations: whether fp16 or bf16 is enabled.
pub fn half_kind(precision: Precision) -> Option<&'static str> {
    match precision {
        Precision::Fp32 => None,
        Precision::Fp16Mixed => Some("fp16"),
        Precision::Bf16Mixed => Some("bf16"),
    }
}

/// Micro-batch and accumulation reaching `global` on `world` devices with micro-batches of
/// at most `max_micro`: the fewest accumulation steps, then the smallest micro-batch with
/// `world x micro x accumulation >= global`.
pub fn split_global_batch(global: u64, world: u64, max_micro: u64) -> (u64, u64) {
    let world = world.max(1);
    let max_micro = max_micro.max(1);
    let per_device = global.div_ceil(world).max(1);
    let accumulation = per_device.div_ceil(max_micro);
    (per_device.div_ceil(accumulation), accumulation)
}

/// The training options the distributed plan is made under: PyTorch's rules on a GPU (DDP,
/// DeepSpeed and FSDP are PyTorch's; under its rules every moment of a step holds the same
/// model states, so they can be swapped for a device's shards exactly), activations for one
/// micro-batch (no micro-batch option: the table's micro-batch is the batch planned).
pub fn plan_options(opts: &TrainOptions) -> TrainOptions {
    TrainOptions {
        runtime: crate::options::Runtime::Pytorch,
        gpu: true,
        micro_batch: None,
        ..opts.clone()
    }
}

/// Where one device's compute time per micro-step comes from.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(tag = "source", rename_all = "kebab-case")]
pub enum Compute {
    /// Not known: no step or update times.
    Unknown,
    /// Given: `seconds` for one micro-step of `micro_batch` samples; other micro-batches
    /// scale in proportion (no fixed cost per step is modelled).
    StepTime {
        /// Seconds of one forward and backward.
        seconds: f64,
        /// At this micro-batch.
        micro_batch: u64,
    },
    /// Predicted: the plan's training FLOPs per sample x micro-batch / (tflops x 1e12).
    Flops {
        /// Sustained TFLOP/s of one device.
        tflops: f64,
    },
}

impl Compute {
    /// Seconds of one micro-step of `micro` samples under `plan`.
    pub fn micro_step_s(&self, plan: &Plan, micro: u64) -> Option<f64> {
        match *self {
            Compute::Unknown => None,
            Compute::StepTime {
                seconds,
                micro_batch,
            } => Some(seconds * micro as f64 / micro_batch.max(1) as f64),
            Compute::Flops { tflops } => {
                Some(plan.train_flops_per_sample.0 * micro as f64 / (tflops * 1e12))
            }
        }
    }
}

/// What to tabulate: world sizes, strategies, the budget and the batch asked for.
#[derive(Clone, Debug, Serialize)]
pub struct ScaleRequest {
    /// GPUs per node, one row set per value.
    pub gpus_per_node: Vec<u64>,
    /// Nodes (world size = GPUs per node x nodes).
    pub nodes: u64,
    /// Strategies, one row per value and world size.
    pub strategies: Vec<Strategy>,
    /// Memory of one device.
    pub budget_bytes: Option<Bytes>,
    /// Micro-batch per device, if fixed (else the largest that fits).
    pub micro_batch: Option<u64>,
    /// Global batch to reach with accumulation.
    pub global_batch: Option<u64>,
    /// The ring's link ([`Link::ring`]).
    pub link: Link,
    /// One device's compute time.
    pub compute: Compute,
}

/// One (world size, strategy) row.
#[derive(Clone, Debug, Serialize)]
pub struct ScaleRow {
    /// GPUs per node.
    pub gpus_per_node: u64,
    /// Nodes.
    pub nodes: u64,
    /// The ZeRO stage of the strategy's sharding.
    pub stage: u8,
    /// Memory of one device.
    #[serde(flatten)]
    pub memory: DeviceMemory,
    /// Largest micro-batch whose planned peak fits the budget (`None`: no budget, or none fits).
    pub max_micro_batch: Option<u64>,
    /// The micro-batch per device used (`None` when nothing fits or nothing decides it).
    pub micro_batch: Option<u64>,
    /// Micro-batches per update.
    pub accumulation: Option<u64>,
    /// World size x micro-batch x accumulation.
    pub global_batch: Option<u64>,
    /// Planned peak on one device at `micro_batch`.
    pub peak_bytes: Option<Bytes>,
    /// Compute seconds of one update (accumulation x one micro-step).
    pub compute_s: Option<f64>,
    /// Communication of one update.
    pub comm: CommTime,
    /// Seconds of one update: compute plus exposed communication.
    pub step_s: Option<f64>,
}

/// The table: every (GPUs per node, strategy) of `req` over `plan` (made with
/// [`plan_options`]).
pub fn scale_table(plan: &Plan, req: &ScaleRequest) -> Vec<ScaleRow> {
    let layer_params: Vec<u64> = plan.layers.iter().map(|l| l.parameters).collect();
    let model = CommModel::of(plan, &layer_params);
    let mut rows = Vec::new();
    for &gpus in &req.gpus_per_node {
        let world = gpus * req.nodes.max(1);
        for &strategy in &req.strategies {
            let memory = DeviceMemory::new(plan, strategy, world);
            let max_micro = req
                .budget_bytes
                .and_then(|b| memory.max_micro_batch(plan, b));
            // A fixed micro-batch is used as given, fitting or not (the peak says).
            let cap = req.micro_batch.or(max_micro);
            let (micro, accumulation) = match (cap, req.global_batch) {
                (Some(m), Some(g)) => {
                    let (m, a) = split_global_batch(g, world, m);
                    (Some(m), Some(a))
                }
                (Some(m), None) => (Some(m), Some(1)),
                (None, _) => (None, None),
            };
            let micro_step = micro.and_then(|m| req.compute.micro_step_s(plan, m));
            let a = accumulation.unwrap_or(1);
            let comm = comm_time(&model, strategy, world, a, micro_step, &req.link);
            let compute_s = micro_step.map(|s| s * a as f64);
            rows.push(ScaleRow {
                gpus_per_node: gpus,
                nodes: req.nodes.max(1),
                stage: strategy.stage(),
                max_micro_batch: max_micro,
                micro_batch: micro,
                accumulation,
                global_batch: micro.map(|m| m * a * world),
                peak_bytes: micro.map(|m| memory.bytes_at(plan, m)),
                step_s: compute_s.zip(comm.exposed_s).map(|(c, e)| c + e),
                compute_s,
                comm,
                memory,
            });
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::Optimizer;

    fn opts(precision: Precision, optimizer: Optimizer) -> TrainOptions {
        TrainOptions {
            precision,
            optimizer,
            ..TrainOptions::default()
        }
    }

    /// ZeRO's Table 1 setting: mixed-precision Adam, K = 12, 2 + 2 + K = 16 bytes.
    #[test]
    fn state_bytes_follow_zero_for_mixed_adam_and_the_plan_otherwise() {
        let mixed = StateBytes::of(&opts(Precision::Fp16Mixed, Optimizer::Adam));
        assert_eq!(
            mixed,
            StateBytes {
                params: 2,
                gradients: 2,
                optimizer: 12
            }
        );
        assert_eq!(mixed.total(), 16);
        // fp32 Adam: 4 + 4 + two fp32 moments; fp32 SGD: no state at all.
        let fp32 = StateBytes::of(&opts(Precision::Fp32, Optimizer::Adam));
        assert_eq!((fp32.params, fp32.gradients, fp32.optimizer), (4, 4, 8));
        assert_eq!(
            StateBytes::of(&opts(Precision::Fp32, Optimizer::Sgd)).total(),
            8
        );
        // Mixed SGD still keeps fp32 master weights: K = 4.
        assert_eq!(
            StateBytes::of(&opts(Precision::Bf16Mixed, Optimizer::Sgd)).optimizer,
            4
        );
    }

    /// ZeRO §5: with Psi = 7.5e9 and N_d = 64, 120 GB (DDP), 31.4 GB (P_os), 16.6 GB
    /// (P_os+g), 1.9 GB (P_os+g+p).
    #[test]
    fn zero_paper_figure_one() {
        let per = StateBytes {
            params: 2,
            gradients: 2,
            optimizer: 12,
        };
        let psi = 7_500_000_000u64;
        let gb = |s: Strategy| model_states(psi, per, s, 64).total().as_f64() / 1e9;
        assert!((gb(Strategy::Ddp) - 120.0).abs() < 1e-9);
        assert!((gb(Strategy::Zero1) - 31.40625).abs() < 1e-6);
        assert!((gb(Strategy::Zero2) - 16.640625).abs() < 1e-6);
        assert!((gb(Strategy::Zero3) - 1.875).abs() < 1e-6);
        assert_eq!(
            model_states(psi, per, Strategy::Fsdp, 64),
            model_states(psi, per, Strategy::Zero3, 64)
        );
        // One device shards nothing.
        assert_eq!(
            model_states(psi, per, Strategy::Zero3, 1).total(),
            Bytes(16 * psi)
        );
    }

    #[test]
    fn ddp_buckets_fill_from_the_last_layer() {
        let mib = Bytes::MIB;
        // Backward order: 2 MiB (first bucket, over 1 MiB), then 10 + 20 MiB close the second
        // at 30 MiB, then 5 MiB is left open.
        let layers = [5 * mib, 20 * mib, 10 * mib, 0, 2 * mib];
        assert_eq!(ddp_buckets(&layers), vec![2 * mib, 30 * mib, 5 * mib]);
        assert!(ddp_buckets(&[]).is_empty());
    }

    #[test]
    fn comm_buffers_by_hand() {
        let per = StateBytes {
            params: 2,
            gradients: 2,
            optimizer: 12,
        };
        let layers = [100, 400, 300];
        assert_eq!(comm_buffers(&layers, per, Strategy::Ddp), Bytes(1600));
        assert_eq!(comm_buffers(&layers, per, Strategy::Zero2), Bytes(1600));
        // Gathered: the two largest layers (400 + 300) x 2 B; the largest's gradient 400 x 2 B.
        assert_eq!(comm_buffers(&layers, per, Strategy::Zero3), Bytes(2200));
    }

    #[test]
    fn ring_collectives_by_hand() {
        let link = Link {
            name: "test".into(),
            bytes_per_s: 1e9,
            latency_s: 1e-5,
        };
        // 4 devices, 1 GB: all-reduce moves 2 x 3/4 GB = 1.5 s plus 6 steps x 10 us.
        let t = Collective::AllReduce.seconds(1_000_000_000, 4, &link);
        assert!((t - (1.5 + 6e-5)).abs() < 1e-12);
        let t = Collective::AllGather.seconds(1_000_000_000, 4, &link);
        assert!((t - (0.75 + 3e-5)).abs() < 1e-12);
        assert_eq!(Collective::ReduceScatter.seconds(1000, 1, &link), 0.0);
    }

    #[test]
    fn link_presets_and_the_slowest_hop() {
        assert_eq!(LinkPreset::Ib200.link().bytes_per_s, 25e9);
        assert_eq!(LinkPreset::Nvlink.link().bytes_per_s, 300e9);
        assert!((LinkPreset::Pcie4.link().bytes_per_s - 31.507_692e9).abs() < 1e3);
        let ring = Link::ring(&LinkPreset::Nvlink.link(), Some(&LinkPreset::Eth25.link()));
        assert_eq!(ring.bytes_per_s, 3.125e9);
        assert_eq!(ring.latency_s, SOCKET_LATENCY_S);
        assert_eq!(Link::gbps(100.0).bytes_per_s, 12.5e9);
    }

    fn unit_link() -> Link {
        Link {
            name: "unit".into(),
            bytes_per_s: 1e6,
            latency_s: 0.0,
        }
    }

    /// DDP on 2 devices, fp32 gradients: one bucket of 4 MB all-reduced = 2 x 1/2 x 4 MB / 1 MB/s
    /// = 4 s, all exposed (the last bucket is the only one).
    #[test]
    fn ddp_comm_by_hand() {
        let per = StateBytes {
            params: 4,
            gradients: 4,
            optimizer: 8,
        };
        let c = comm_time(
            &CommModel {
                layer_params: &[1_000_000],
                per,
                forward_share: 1.0 / 3.0,
            },
            Strategy::Ddp,
            2,
            4,
            Some(1.0),
            &unit_link(),
        );
        assert_eq!(c.collectives, 1);
        assert!((c.seconds - 4.0).abs() < 1e-9);
        assert!((c.exposed_s.unwrap() - 4.0).abs() < 1e-9);
        // Two buckets (2 MiB from the last layer first, then 30 MiB): the first hides behind
        // the 20 s backward, the last is exposed.
        let mib = Bytes::MIB;
        let c = comm_time(
            &CommModel {
                layer_params: &[30 * mib, 2 * mib],
                per: StateBytes {
                    params: 1,
                    gradients: 1,
                    optimizer: 0,
                },
                forward_share: 1.0 / 3.0,
            },
            Strategy::Ddp,
            2,
            1,
            Some(30.0),
            &unit_link(),
        );
        assert_eq!(c.collectives, 2);
        assert!((c.exposed_s.unwrap() - 30.0 * mib as f64 / 1e6).abs() < 1e-9);
        assert!((c.seconds - 32.0 * mib as f64 / 1e6).abs() < 1e-9);
    }

    /// ZeRO-3 on 4 devices, two layers of 1e6 parameters at 2 bytes: each all-gather or
    /// reduce-scatter moves 3/4 x 2 MB = 1.5 s; forward 2 gathers, backward 2 gathers + 2
    /// reduce-scatters; ZeRO paper: 3 Psi per step.
    #[test]
    fn zero3_comm_by_hand() {
        let per = StateBytes {
            params: 2,
            gradients: 2,
            optimizer: 12,
        };
        let c = comm_time(
            &CommModel {
                layer_params: &[1_000_000, 1_000_000],
                per,
                forward_share: 1.0 / 3.0,
            },
            Strategy::Zero3,
            4,
            2,
            Some(3.0),
            &unit_link(),
        );
        assert_eq!(c.collectives, 2 * 6);
        assert!((c.bytes_per_device - 2.0 * 6.0 * 1.5e6).abs() < 1e-3);
        assert!((c.seconds - 2.0 * 9.0).abs() < 1e-9);
        // Forward: first gather 1.5 s exposed, the other 1.5 s under the 1 s forward: 0.5 s
        // more. Backward: last reduce-scatter 1.5 s, the other 4.5 s under 2 s: 2.5 s more.
        // Per micro-step 6 s, two micro-steps.
        assert!((c.exposed_s.unwrap() - 12.0).abs() < 1e-9);
        // ZeRO-1 moves the gradients once and the parameters once per update: 2 Psi.
        let z1 = comm_time(
            &CommModel {
                layer_params: &[1_000_000, 1_000_000],
                per,
                forward_share: 1.0 / 3.0,
            },
            Strategy::Zero1,
            4,
            2,
            None,
            &unit_link(),
        );
        assert!((z1.bytes_per_device - 2.0 * 0.75 * 4e6).abs() < 1e-3);
        assert_eq!(z1.exposed_s, None);
        let z2 = comm_time(
            &CommModel {
                layer_params: &[1_000_000, 1_000_000],
                per,
                forward_share: 1.0 / 3.0,
            },
            Strategy::Zero2,
            4,
            2,
            Some(1.0),
            &unit_link(),
        );
        // Two reduce-scatters (one per micro-step) and one all-gather, 3 s each, exposed.
        assert!((z2.exposed_s.unwrap() - 9.0).abs() < 1e-9);
    }

    #[test]
    fn one_device_communicates_nothing() {
        let per = StateBytes {
            params: 4,
            gradients: 4,
            optimizer: 8,
        };
        for s in Strategy::ALL {
            let c = comm_time(
                &CommModel {
                    layer_params: &[10, 20],
                    per,
                    forward_share: 0.5,
                },
                s,
                1,
                3,
                Some(1.0),
                &unit_link(),
            );
            assert_eq!(c.seconds, 0.0);
            assert_eq!(c.exposed_s, Some(0.0));
            assert_eq!(c.collectives, 0);
        }
    }

    #[test]
    fn global_batch_split() {
        // 1000 over 8 devices, micro at most 32: 125 per device, 4 steps of 32.
        assert_eq!(split_global_batch(1000, 8, 32), (32, 4));
        // 512 over 8 with room for 100: one step of 64.
        assert_eq!(split_global_batch(512, 8, 100), (64, 1));
        // Fewer samples than devices: one each.
        assert_eq!(split_global_batch(3, 8, 10), (1, 1));
    }

    #[test]
    fn device_memory_swaps_the_model_states() {
        let g = batchfit_graph::zoo::build("mnist-mlp").unwrap();
        let o = TrainOptions {
            precision: Precision::Fp16Mixed,
            runtime: crate::options::Runtime::Pytorch,
            gpu: true,
            ..TrainOptions::default()
        };
        let p = crate::plan::plan(&g, &o);
        let one = DeviceMemory::new(&p, Strategy::Ddp, 1);
        let z3 = DeviceMemory::new(&p, Strategy::Zero3, 8);
        // DDP: the plan's 6 + 4 + 8 = 18 bytes become 16, plus one gradient copy (2 B).
        assert_eq!(
            one.bytes_at(&p, 10).0 as i128 - p.bytes_at(10).0 as i128,
            one.delta()
        );
        assert_eq!(one.delta(), 0);
        assert!(z3.bytes_at(&p, 10) < one.bytes_at(&p, 10));
        let budget = Bytes(600 * Bytes::MIB);
        let m = z3.max_micro_batch(&p, budget).unwrap();
        assert!(z3.bytes_at(&p, m) <= budget && z3.bytes_at(&p, m + 1) > budget);
        assert_eq!(z3.max_micro_batch(&p, Bytes(1)), None);
    }

    #[test]
    fn compute_times_by_hand() {
        let g = batchfit_graph::zoo::build("mnist-mlp").unwrap();
        let p = crate::plan::plan(&g, &plan_options(&TrainOptions::default()));
        let given = Compute::StepTime {
            seconds: 0.2,
            micro_batch: 32,
        };
        // In proportion to the micro-batch: 64 samples take twice 32's time.
        assert!((given.micro_step_s(&p, 64).unwrap() - 0.4).abs() < 1e-12);
        let flops = Compute::Flops { tflops: 10.0 };
        let want = p.train_flops_per_sample.0 * 100.0 / 1e13;
        assert!((flops.micro_step_s(&p, 100).unwrap() - want).abs() < 1e-18);
        assert_eq!(Compute::Unknown.micro_step_s(&p, 1), None);
    }

    /// The table: a global batch split over world sizes, update = compute + exposed.
    #[test]
    fn scale_table_rows() {
        let g = batchfit_graph::zoo::build("mnist-mlp").unwrap();
        let p = crate::plan::plan(&g, &plan_options(&TrainOptions::default()));
        let req = ScaleRequest {
            gpus_per_node: vec![1, 4],
            nodes: 2,
            strategies: vec![Strategy::Ddp, Strategy::Zero3],
            budget_bytes: Some(Bytes(2 * Bytes::GIB)),
            micro_batch: Some(50),
            global_batch: Some(1000),
            link: LinkPreset::Ib100.link(),
            compute: Compute::StepTime {
                seconds: 0.1,
                micro_batch: 50,
            },
        };
        let rows = scale_table(&p, &req);
        assert_eq!(rows.len(), 4);
        // 2 devices: 500 each, 10 steps of 50; 8 devices: 125 each, 3 steps of 42.
        let r = &rows[0];
        assert_eq!(r.memory.world_size, 2);
        assert_eq!((r.micro_batch, r.accumulation), (Some(50), Some(10)));
        assert_eq!(r.global_batch, Some(1000));
        assert!((r.compute_s.unwrap() - 1.0).abs() < 1e-12);
        let r = &rows[3];
        assert_eq!((r.memory.world_size, r.stage), (8, 3));
        assert_eq!((r.micro_batch, r.accumulation), (Some(42), Some(3)));
        assert_eq!(r.global_batch, Some(8 * 42 * 3));
        for r in &rows {
            let step = r.step_s.unwrap();
            assert!((step - r.compute_s.unwrap() - r.comm.exposed_s.unwrap()).abs() < 1e-12);
            assert!(r.max_micro_batch.unwrap() >= 50);
        }
    }
}
