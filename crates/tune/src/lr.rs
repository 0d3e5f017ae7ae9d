//! Learning-rate scaling with the batch size.

use serde::{Deserialize, Serialize};

/// A scaling rule and where it comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
    /// The name `--lr-rule` takes and JSON writes.
    pub fn name(self) -> &'static str {
        match self {
            LrRule::Linear => "linear",
            LrRule::Sqrt => "sqrt",
            LrRule::Fixed => "fixed",
        }
    }

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

/// A rule with its reference pair, and the batch above which the rate stops
/// growing. S(B) = S_min (1 + B_noise / B) assumes each batch trains at its
/// best rate, and that rate stops growing near B_noise: for SGD McCandlish et
/// al. 2018 (eq. 2.6: ε_opt = ε_max / (1 + B_noise / B)); for Adam Li et al.
/// 2024 ("Surge phenomenon": it peaks there, then falls). Holding the rate
/// there is what keeps predicted and trained steps the same; a larger rate
/// past it may train faster or diverge, which the prediction cannot say.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LrScaling {
    pub rule: LrRule,
    pub ref_batch: u64,
    pub ref_lr: f64,
    /// Batches above this train at this batch's rate (`None`: no cap).
    pub cap_batch: Option<u64>,
}

impl LrScaling {
    /// Why a rule read from a file cannot train (the flags that set one
    /// refuse the same): a rate that is not positive, a batch of 0.
    pub fn invalid(&self) -> Option<String> {
        if !(self.ref_lr.is_finite() && self.ref_lr > 0.0) {
            Some(format!("ref_lr {} is not a positive rate", self.ref_lr))
        } else if self.ref_batch == 0 || self.cap_batch == Some(0) {
            Some("a batch of 0 (ref_batch, cap_batch)".to_string())
        } else {
            None
        }
    }

    /// The learning rate at `batch`.
    pub fn at(&self, batch: u64) -> f64 {
        let b = self.cap_batch.map_or(batch, |c| batch.min(c));
        scale(self.rule, self.ref_batch, self.ref_lr, b)
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

    /// A rule read from a file is held to what the flags take.
    #[test]
    fn a_rule_that_cannot_train_says_why() {
        let ok = LrScaling {
            rule: LrRule::Sqrt,
            ref_batch: 16,
            ref_lr: 1e-3,
            cap_batch: Some(256),
        };
        assert_eq!(ok.invalid(), None);
        for lr in [0.0, -5.0, f64::NAN, f64::INFINITY] {
            let why = LrScaling { ref_lr: lr, ..ok }.invalid().unwrap();
            assert!(why.contains("ref_lr"), "{why}");
        }
        assert!(LrScaling { ref_batch: 0, ..ok }.invalid().is_some());
        assert!(
            LrScaling {
                cap_batch: Some(0),
                ..ok
            }
            .invalid()
            .is_some()
        );
    }

    #[test]
    fn linear_and_sqrt_rules() {
        assert!((scale(LrRule::Linear, 32, 1e-3, 256) - 8e-3).abs() < 1e-15);
        assert!((scale(LrRule::Sqrt, 32, 1e-3, 128) - 2e-3).abs() < 1e-15);
        assert_eq!(scale(LrRule::Fixed, 32, 1e-3, 128), 1e-3);
        assert_eq!(LrRule::for_optimizer(true), LrRule::Sqrt);
        assert_eq!(warmup_steps(32, 256, 2560), 50);
        assert_eq!(warmup_steps(32, 16, 2560), 0);
    }

    #[test]
    fn a_capped_rule_holds_the_rate_above_its_cap() {
        let s = LrScaling {
            rule: LrRule::Sqrt,
            ref_batch: 16,
            ref_lr: 1e-3,
            cap_batch: Some(64),
        };
        assert!((s.at(32) - 1e-3 * 2f64.sqrt()).abs() < 1e-15);
        assert_eq!(s.at(64), s.at(1024));
        assert!((s.at(64) - 2e-3).abs() < 1e-15);
    }
}
