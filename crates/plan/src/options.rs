//! Training options that change the memory a step needs.

use serde::{Deserialize, Serialize};

/// Bytes of one fp32 element: master weights, optimizer state, and gradients as the
/// single-device plan counts them (PyTorch's AMP keeps fp32 gradients).
pub const FP32_BYTES: u64 = 4;

/// Bytes of one fp16 or bf16 element: the working copy under mixed precision.
pub const HALF_BYTES: u64 = 2;

/// The optimizer, which decides the state kept per parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Optimizer {
    /// Plain SGD: no state.
    #[cfg_attr(feature = "clap", value(name = "sgd"))]
    Sgd,
    /// SGD with momentum: one velocity per parameter.
    #[cfg_attr(feature = "clap", value(name = "momentum"))]
    Momentum,
    /// Adam: first and second moments per parameter.
    #[cfg_attr(feature = "clap", value(name = "adam"))]
    Adam,
    /// AdamW: Adam's state, decoupled weight decay.
    #[cfg_attr(feature = "clap", value(name = "adamw"))]
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

    /// Bytes of optimizer state per parameter: [`Optimizer::state_per_param`] fp32 tensors.
    pub fn state_bytes(self) -> u64 {
        self.state_per_param() * FP32_BYTES
    }

    /// Whether the learning rate scales like Adam's (square root) rather than SGD's (linear).
    pub fn is_adaptive(self) -> bool {
        matches!(self, Optimizer::Adam | Optimizer::Adamw)
    }

    /// The optimizer called `s` (one of [`Optimizer::NAMES`]).
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
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum Precision {
    /// fp32 everywhere.
    #[cfg_attr(feature = "clap", value(name = "fp32"))]
    Fp32,
    /// fp16 activations, fp32 master weights.
    #[cfg_attr(feature = "clap", value(name = "fp16-mixed"))]
    Fp16Mixed,
    /// bf16 activations, fp32 master weights.
    #[cfg_attr(feature = "clap", value(name = "bf16-mixed"))]
    Bf16Mixed,
}

impl Precision {
    /// Names accepted on the command line.
    pub const NAMES: &'static [&'static str] = &["fp32", "fp16-mixed", "bf16-mixed"];

    /// Bytes of one saved activation element.
    pub fn activation_bytes(self) -> u64 {
        match self {
            Precision::Fp32 => FP32_BYTES,
            Precision::Fp16Mixed | Precision::Bf16Mixed => HALF_BYTES,
        }
    }

    /// Bytes of weights per parameter: fp32 master weights, plus a half-precision
    /// working copy under mixed precision (PyTorch autocast caches one per step).
    pub fn weight_bytes(self) -> u64 {
        match self {
            Precision::Fp32 => FP32_BYTES,
            Precision::Fp16Mixed | Precision::Bf16Mixed => FP32_BYTES + HALF_BYTES,
        }
    }

    /// The precision called `s` (one of [`Precision::NAMES`]).
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
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    /// batchfit's own engine (burn).
    #[cfg_attr(feature = "clap", value(name = "burn"))]
    Burn,
    /// PyTorch: CUDA context on GPUs, caching-allocator rounding.
    #[cfg_attr(feature = "clap", value(name = "pytorch"))]
    Pytorch,
}

impl Runtime {
    /// Names accepted on the command line.
    pub const NAMES: &'static [&'static str] = &["burn", "pytorch"];

    /// The runtime called `s` (one of [`Runtime::NAMES`]).
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
    /// The optimizer, which decides the state kept per parameter.
    pub optimizer: Optimizer,
    /// Numeric precision of weights and activations.
    pub precision: Precision,
    /// Recompute activations in about sqrt(layers) segments instead of keeping them.
    pub checkpointing: bool,
    /// Samples per forward/backward when accumulating gradients (`None`: the whole batch).
    pub micro_batch: Option<u64>,
    /// Whose allocator and autograd the plan models.
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

/// With the `clap` feature, the command-line names are exactly `NAMES`, each meaning
/// what `parse` makes of it.
#[cfg(all(test, feature = "clap"))]
mod clap_tests {
    use super::*;
    use clap::ValueEnum;

    fn same<T: ValueEnum + PartialEq + std::fmt::Debug>(
        names: &[&str],
        parse: fn(&str) -> Option<T>,
    ) {
        let values: Vec<String> = T::value_variants()
            .iter()
            .map(|v| v.to_possible_value().unwrap().get_name().to_string())
            .collect();
        assert_eq!(values, names);
        for name in names {
            assert_eq!(T::from_str(name, false).ok(), parse(name), "{name}");
        }
    }

    #[test]
    fn value_enums_accept_the_names() {
        same(Optimizer::NAMES, Optimizer::parse);
        same(Precision::NAMES, Precision::parse);
        same(Runtime::NAMES, Runtime::parse);
    }
}
