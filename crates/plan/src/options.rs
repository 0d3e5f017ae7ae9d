//! Training options that change the memory a step needs.

use serde::{Deserialize, Serialize};

/// The optimizer, which decides the state kept per parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Optimizer {
    Sgd,
    Momentum,
    Adam,
    Adamw,
}

impl Optimizer {
    /// Names accepted on the command line.
    pub const NAMES: &'static [&'static str] = &["sgd", "momentum", "adam", "adamw"];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Optimizer::Sgd => "sgd",
            Optimizer::Momentum => "momentum",
            Optimizer::Adam => "adam",
            Optimizer::Adamw => "adamw",
        }
    }

    /// fp32 state tensors per parameter: none for SGD, one velocity for momentum,
    /// first and second moments for Adam and AdamW.
    pub fn state_per_param(self) -> u64 {
        match self {
            Optimizer::Sgd => 0,
            Optimizer::Momentum => 1,
            Optimizer::Adam | Optimizer::Adamw => 2,
        }
    }

    /// Whether the learning rate scales like Adam's (square root) rather than SGD's (linear).
    pub fn is_adaptive(self) -> bool {
        matches!(self, Optimizer::Adam | Optimizer::Adamw)
    }

    pub fn parse(s: &str) -> Option<Optimizer> {
        Some(match s {
            "sgd" => Optimizer::Sgd,
            "momentum" => Optimizer::Momentum,
            "adam" => Optimizer::Adam,
            "adamw" => Optimizer::Adamw,
            _ => return None,
        })
    }
}

/// Numeric precision of the training step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Precision {
    Fp32,
    Fp16Mixed,
    Bf16Mixed,
}

impl Precision {
    pub const NAMES: &'static [&'static str] = &["fp32", "fp16-mixed", "bf16-mixed"];

    /// Bytes of one saved activation element.
    pub fn activation_bytes(self) -> u64 {
        match self {
            Precision::Fp32 => 4,
            Precision::Fp16Mixed | Precision::Bf16Mixed => 2,
        }
    }

    /// Bytes of weights per parameter: fp32 master weights, plus a half-precision
    /// working copy under mixed precision (PyTorch autocast caches one per step).
    pub fn weight_bytes(self) -> u64 {
        match self {
            Precision::Fp32 => 4,
            Precision::Fp16Mixed | Precision::Bf16Mixed => 4 + 2,
        }
    }

    pub fn parse(s: &str) -> Option<Precision> {
        Some(match s {
            "fp32" => Precision::Fp32,
            "fp16-mixed" => Precision::Fp16Mixed,
            "bf16-mixed" => Precision::Bf16Mixed,
            _ => return None,
        })
    }
}

/// The framework whose allocator and autograd the plan models.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    /// batchfit's own engine (burn).
    Burn,
    /// PyTorch: CUDA context on GPUs, caching-allocator rounding.
    Pytorch,
}

impl Runtime {
    pub const NAMES: &'static [&'static str] = &["burn", "pytorch"];

    pub fn parse(s: &str) -> Option<Runtime> {
        Some(match s {
            "burn" => Runtime::Burn,
            "pytorch" => Runtime::Pytorch,
            _ => return None,
        })
    }
}

/// Everything besides the graph that the plan depends on.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TrainOptions {
    pub optimizer: Optimizer,
    pub precision: Precision,
    /// Recompute activations in about sqrt(layers) segments instead of keeping them.
    pub checkpointing: bool,
    /// Samples per forward/backward when accumulating gradients (`None`: the whole batch).
    pub micro_batch: Option<u64>,
    pub runtime: Runtime,
    /// Sequence length for recurrent models (`None`: the model's default).
    pub seq_len: Option<usize>,
    /// Whether the step runs on a GPU (adds the runtime's device context).
    pub gpu: bool,
}

impl Default for TrainOptions {
    fn default() -> Self {
        TrainOptions {
            optimizer: Optimizer::Adam,
            precision: Precision::Fp32,
            checkpointing: false,
            micro_batch: None,
            runtime: Runtime::Burn,
            seq_len: None,
            gpu: false,
        }
    }
}
