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

mod comm;
mod memory;
mod table;
#[cfg(test)]
mod tests;

pub use comm::*;
pub use memory::*;
pub use table::*;

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
pub(super) fn shard(parameters: u64, bytes: u64, world: u64, sharded: bool) -> Bytes {
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
