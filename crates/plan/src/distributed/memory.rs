//! Memory of one device: communication buffers and the sharded model states in the plan.

use super::*;
use serde::Serialize;

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
pub(super) fn chunks(total: u64, cap: u64) -> Vec<u64> {
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
    pub(super) fn delta(&self) -> i128 {
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
