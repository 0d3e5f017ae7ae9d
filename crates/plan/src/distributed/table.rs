//! The table over world sizes and strategies: micro-batch, accumulation, update time.

use super::*;
use serde::Serialize;

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
