//! The recommendation for one device, from its measured throughput curve, its
//! largest batch and the noise scale: which batch, why, with which learning
//! rate, and with gradient accumulation where memory caps the batch below the
//! critical batch. Pure: it takes measurements, never runs anything.

use crate::diagnose::StepPoint;
use crate::lr::{LrRule, scale};
use crate::target::{TrainingOption, updates_vs_min};
use serde::Serialize;

/// Where a device's largest batch comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum MaxBatchSource {
    /// Measured by the max-batch search under `--memory-limit`.
    #[serde(rename = "measured")]
    Measured,
    /// The plan's limit for this machine's RAM (CPU).
    #[serde(rename = "predicted for this machine's RAM")]
    PredictedForRam,
    /// Unknown: nothing bounded it.
    #[serde(rename = "not searched: give --memory-limit")]
    NotSearched,
}

impl MaxBatchSource {
    /// How reports say it.
    pub fn describe(self) -> &'static str {
        match self {
            MaxBatchSource::Measured => "measured",
            MaxBatchSource::PredictedForRam => "predicted for this machine's RAM",
            MaxBatchSource::NotSearched => "not searched: give --memory-limit",
        }
    }
}

/// What to do on one device.
#[derive(Clone, Debug, Serialize)]
pub struct Recommendation {
    pub device: String,
    /// Largest batch that fits, and whether it was measured or predicted by the plan.
    pub max_batch: Option<u64>,
    pub max_batch_source: MaxBatchSource,
    pub knee_batch: Option<u64>,
    pub recommended_batch: Option<u64>,
    /// Why this batch.
    pub reason: String,
    /// Learning rate for the recommended batch, when a reference was given.
    pub learning_rate: Option<f64>,
    /// How to state the learning rate without a reference.
    pub learning_rate_rule: String,
    /// Gradient accumulation when memory caps the batch below the critical batch.
    pub accumulation: Option<Accumulation>,
}

/// Micro-batches accumulated into one update.
#[derive(Clone, Debug, Serialize)]
pub struct Accumulation {
    pub micro_batch: u64,
    pub steps: u64,
    pub effective_batch: u64,
    /// Measured seconds of one micro-batch step x steps (predicted update time).
    pub update_s: f64,
}

/// What is known of one device.
#[derive(Clone, Debug)]
pub struct DeviceEvidence<'a> {
    pub device: &'a str,
    /// Measured (batch, median step seconds) of the batches that ran.
    pub points: &'a [StepPoint],
    pub knee_batch: Option<u64>,
    /// The share of the best throughput that defines the knee.
    pub efficiency: f64,
    pub max_batch: Option<u64>,
    pub max_batch_source: MaxBatchSource,
    /// How the user gets the noise scale, said when there is none.
    pub noise_hint: &'static str,
}

/// The learning-rate side of the advice.
#[derive(Clone, Copy, Debug)]
pub struct LrAdviceInput {
    pub rule: LrRule,
    /// The user's tuned (batch, learning rate), when given.
    pub reference: Option<(u64, f64)>,
}

/// The recommendation for one device, and its training options for the
/// time-to-target table (every measured batch that fits, plus the
/// accumulation option when memory caps the batch below B_noise).
///
/// With a noise scale, the batch with the lowest predicted time to target,
/// (1 + B_noise/B) x step time; without one, the knee.
pub fn recommend(
    e: &DeviceEvidence,
    b_noise: Option<f64>,
    lr: LrAdviceInput,
) -> (Recommendation, Vec<TrainingOption>) {
    let fits = |b: u64| e.max_batch.is_none_or(|m| b <= m);
    let mut options: Vec<TrainingOption> = e
        .points
        .iter()
        .filter(|q| fits(q.batch))
        .map(|q| TrainingOption {
            device: e.device.to_string(),
            micro_batch: q.batch,
            accumulation: 1,
            micro_step_s: q.step_s,
        })
        .collect();
    let (recommended, reason) = match b_noise {
        Some(bn) => {
            let time =
                |o: &TrainingOption| updates_vs_min(bn, o.micro_batch as f64) * o.micro_step_s;
            match options.iter().min_by(|a, b| time(a).total_cmp(&time(b))) {
                Some(o) => (
                    Some(o.micro_batch),
                    format!(
                        "fastest predicted time to target among the measured batches: (1 + B_noise/B) x step time is lowest at B = {} (B_noise ≈ {:.0}, step {:.2} ms measured)",
                        o.micro_batch,
                        bn,
                        o.micro_step_s * 1e3
                    ),
                ),
                None => (None, "no batch size could be measured".into()),
            }
        }
        None => (
            e.knee_batch,
            format!(
                "the smallest batch reaching {:.0} % of the best measured throughput (the noise scale is unknown, so steps needed are not weighed: {})",
                e.efficiency * 100.0,
                e.noise_hint
            ),
        ),
    };
    // Accumulation where memory caps the batch below the critical batch.
    let accumulation = match (b_noise, e.max_batch) {
        (Some(bn), Some(m)) if (m as f64) < bn => e
            .points
            .iter()
            .filter(|q| q.batch <= m)
            .max_by_key(|q| q.batch)
            .map(|q| {
                let steps = (bn / q.batch as f64).ceil().max(2.0) as u64;
                options.push(TrainingOption {
                    device: e.device.to_string(),
                    micro_batch: q.batch,
                    accumulation: steps,
                    micro_step_s: q.step_s,
                });
                Accumulation {
                    micro_batch: q.batch,
                    steps,
                    effective_batch: q.batch * steps,
                    update_s: q.step_s * steps as f64,
                }
            }),
        _ => None,
    };
    let learning_rate = match (lr.reference, recommended) {
        (Some((rb, rl)), Some(b)) => Some(scale(lr.rule, rb, rl, b)),
        _ => None,
    };
    let rule_text = match lr.rule {
        LrRule::Sqrt => {
            "learning rate: your tuned lr x sqrt(B / your batch), square-root rule for Adam (Malladi et al. 2022); give --ref-batch/--ref-lr for a number"
        }
        _ => {
            "learning rate: your tuned lr x B / your batch, linear rule with warm-up for SGD (Goyal et al. 2017); give --ref-batch/--ref-lr for a number"
        }
    };
    (
        Recommendation {
            device: e.device.to_string(),
            max_batch: e.max_batch,
            max_batch_source: e.max_batch_source,
            knee_batch: e.knee_batch,
            recommended_batch: recommended,
            reason,
            learning_rate,
            learning_rate_rule: rule_text.to_string(),
            accumulation,
        },
        options,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::rank;

    fn pts(v: &[(u64, f64)]) -> Vec<StepPoint> {
        v.iter()
            .map(|&(batch, step_s)| StepPoint { batch, step_s })
            .collect()
    }

    fn evidence<'a>(points: &'a [StepPoint], max: Option<u64>) -> DeviceEvidence<'a> {
        DeviceEvidence {
            device: "cpu",
            points,
            knee_batch: Some(64),
            efficiency: 0.9,
            max_batch: max,
            max_batch_source: if max.is_some() {
                MaxBatchSource::Measured
            } else {
                MaxBatchSource::NotSearched
            },
            noise_hint: "add --data",
        }
    }

    const ADAM: LrAdviceInput = LrAdviceInput {
        rule: LrRule::Sqrt,
        reference: None,
    };

    #[test]
    fn with_a_noise_scale_the_fastest_predicted_time_wins() {
        // Step time 1 ms + 0.01 ms per sample; B_noise = 400.
        // (1 + 400/B)(1 + 0.01 B) ms: B=16: 26 x 1.16 = 30.2; 64: 7.25 x 1.64 = 11.9;
        // 256: 2.5625 x 3.56 = 9.1; 1024: 1.39 x 11.24 = 15.6. 256 wins.
        let p = pts(&[
            (16, 1.16e-3),
            (64, 1.64e-3),
            (256, 3.56e-3),
            (1024, 11.24e-3),
        ]);
        let (rec, options) = recommend(&evidence(&p, None), Some(400.0), ADAM);
        assert_eq!(rec.recommended_batch, Some(256));
        assert_eq!(options.len(), 4);
        assert!(rec.accumulation.is_none());
        let table = rank(&options, 400.0, None);
        assert_eq!(table[0].option.micro_batch, 256);
        assert!(
            (table[1].vs_best - 11.89 / 9.1225).abs() < 1e-2,
            "{table:?}"
        );
    }

    #[test]
    fn without_data_the_knee_is_recommended() {
        let p = pts(&[(16, 1e-3), (64, 2e-3)]);
        let (rec, _) = recommend(&evidence(&p, None), None, ADAM);
        assert_eq!(rec.recommended_batch, Some(64));
        assert!(rec.reason.contains("90 %"), "{}", rec.reason);
    }

    #[test]
    fn memory_below_the_critical_batch_adds_accumulation() {
        // The device fits 32 at most; B_noise = 250: accumulate ceil(250/32) = 8.
        let p = pts(&[(8, 1e-3), (32, 2e-3), (128, 6e-3)]);
        let (rec, options) = recommend(&evidence(&p, Some(32)), Some(250.0), ADAM);
        let acc = rec.accumulation.expect("accumulation advised");
        assert_eq!(
            (acc.micro_batch, acc.steps, acc.effective_batch),
            (32, 8, 256)
        );
        assert!((acc.update_s - 16e-3).abs() < 1e-12);
        // 128 does not fit: not an option; the accumulation option is.
        assert!(options.iter().all(|o| o.micro_batch <= 32));
        assert!(options.iter().any(|o| o.accumulation == 8));
        assert_eq!(rec.max_batch_source, MaxBatchSource::Measured);
    }

    #[test]
    fn a_reference_learning_rate_is_scaled_to_the_recommendation() {
        let p = pts(&[(16, 1e-3), (64, 1e-3)]);
        let lr = LrAdviceInput {
            rule: LrRule::Sqrt,
            reference: Some((16, 1e-3)),
        };
        let (rec, _) = recommend(&evidence(&p, None), Some(100.0), lr);
        assert_eq!(rec.recommended_batch, Some(64));
        assert!((rec.learning_rate.unwrap() - 2e-3).abs() < 1e-12);
    }

    #[test]
    fn the_source_serialises_as_before() {
        let s = serde_json::to_string(&MaxBatchSource::PredictedForRam).unwrap();
        assert_eq!(s, "\"predicted for this machine's RAM\"");
    }
}
