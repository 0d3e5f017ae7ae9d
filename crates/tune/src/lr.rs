//! Learning-rate scaling with the batch size.

use serde::Serialize;

/// A scaling rule and where it comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum LrRule {
    /// lr proportional to B, with gradual warm-up (Goyal et al. 2017, "Accurate,
    /// Large Minibatch SGD"): for SGD and momentum.
    Linear,
    /// lr proportional to sqrt(B) (Malladi et al. 2022, "On the SDEs and Scaling
    /// Rules for Adaptive Gradient Algorithms"): for Adam-family optimizers.
    Sqrt,
    /// Keep the reference learning rate.
    Fixed,
}

impl LrRule {
    /// The rule that suits an optimizer.
    pub fn for_optimizer(adaptive: bool) -> LrRule {
        if adaptive {
            LrRule::Sqrt
        } else {
            LrRule::Linear
        }
    }

    /// Human-readable rule and source.
    pub fn source(self) -> &'static str {
        match self {
            LrRule::Linear => "linear scaling with warm-up (Goyal et al. 2017)",
            LrRule::Sqrt => "square-root scaling (Malladi et al. 2022)",
            LrRule::Fixed => "fixed learning rate",
        }
    }

    pub fn parse(s: &str) -> Option<LrRule> {
        Some(match s {
            "linear" => LrRule::Linear,
            "sqrt" => LrRule::Sqrt,
            "fixed" => LrRule::Fixed,
            _ => return None,
        })
    }
}

/// The learning rate for `batch`, given a tuned reference pair.
pub fn scale(rule: LrRule, ref_batch: u64, ref_lr: f64, batch: u64) -> f64 {
    let k = batch as f64 / ref_batch as f64;
    match rule {
        LrRule::Linear => ref_lr * k,
        LrRule::Sqrt => ref_lr * k.sqrt(),
        LrRule::Fixed => ref_lr,
    }
}

/// Warm-up steps Goyal et al. use when scaling up: 5 epochs' worth, only when the
/// batch grows beyond the reference; 0 otherwise.
pub fn warmup_steps(ref_batch: u64, batch: u64, samples_per_epoch: u64) -> u64 {
    if batch <= ref_batch {
        0
    } else {
        5 * samples_per_epoch.div_ceil(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_and_sqrt_rules() {
        assert!((scale(LrRule::Linear, 32, 1e-3, 256) - 8e-3).abs() < 1e-15);
        assert!((scale(LrRule::Sqrt, 32, 1e-3, 128) - 2e-3).abs() < 1e-15);
        assert_eq!(scale(LrRule::Fixed, 32, 1e-3, 128), 1e-3);
        assert_eq!(LrRule::for_optimizer(true), LrRule::Sqrt);
        assert_eq!(warmup_steps(32, 256, 2560), 50);
        assert_eq!(warmup_steps(32, 16, 2560), 0);
    }
}
