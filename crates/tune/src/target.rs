//! Predicted time to a target loss: steps from the noise scale times measured
//! step time. The one home of S(B) = S_min (1 + B_noise / B) (McCandlish et
//! al. 2018, eq. 2.11): `advise`, `sweep` and the fits all use [`StepsCurve`]
//! and [`updates_vs_min`].

use serde::Serialize;

/// Updates needed at batch `batch` relative to the minimum S_min: `1 + B_noise / B`.
pub fn updates_vs_min(b_noise: f64, batch: f64) -> f64 {
    1.0 + b_noise / batch
}

/// Updates to a target as a function of the batch: S(B) = S_min (1 + B_noise / B).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct StepsCurve {
    /// Fewest updates any batch can reach the target in (the large-batch limit).
    pub s_min: f64,
    pub b_noise: f64,
}

impl StepsCurve {
    /// Predicted updates at `batch`.
    pub fn steps(&self, batch: f64) -> f64 {
        self.s_min * updates_vs_min(self.b_noise, batch)
    }

    /// The curve through one run that took `steps` updates at `batch`.
    pub fn through(steps: f64, batch: f64, b_noise: f64) -> StepsCurve {
        StepsCurve {
            s_min: steps / updates_vs_min(b_noise, batch),
            b_noise,
        }
    }

    /// Predicted seconds at `batch` when one update takes `update_s`.
    pub fn seconds(&self, batch: f64, update_s: f64) -> f64 {
        self.steps(batch) * update_s
    }
}

/// One way to train: a device, a micro-batch, and how many micro-batches are accumulated.
#[derive(Clone, Debug, Serialize)]
pub struct TrainingOption {
    pub device: String,
    pub micro_batch: u64,
    pub accumulation: u64,
    /// Measured seconds of one micro-batch step (forward + backward; the
    /// optimizer's share is counted once per update below).
    pub micro_step_s: f64,
}

impl TrainingOption {
    /// The batch one update sees.
    pub fn effective_batch(&self) -> u64 {
        self.micro_batch * self.accumulation
    }

    /// Seconds of one update.
    pub fn update_s(&self) -> f64 {
        self.micro_step_s * self.accumulation as f64
    }
}

/// Predicted time to target of one option.
#[derive(Clone, Debug, Serialize)]
pub struct TimeToTarget {
    #[serde(flatten)]
    pub option: TrainingOption,
    /// Updates needed relative to the minimum: `1 + B_noise / B_eff`.
    pub steps_vs_min: f64,
    /// Predicted seconds when `S_min` is known, else `None`.
    pub seconds: Option<f64>,
    /// Time relative to the fastest option (1.0 = the winner).
    pub vs_best: f64,
}

/// Ranks options by predicted time: `S_min (1 + B_noise/B) x update time`.
/// `s_min` is the minimum number of updates, when known (from a sweep or a run).
pub fn rank(options: &[TrainingOption], b_noise: f64, s_min: Option<f64>) -> Vec<TimeToTarget> {
    let mut out: Vec<TimeToTarget> = options
        .iter()
        .map(|o| {
            let steps_vs_min = updates_vs_min(b_noise, o.effective_batch() as f64);
            TimeToTarget {
                option: o.clone(),
                steps_vs_min,
                seconds: s_min.map(|s| s * steps_vs_min * o.update_s()),
                vs_best: steps_vs_min * o.update_s(),
            }
        })
        .collect();
    let best = out.iter().map(|t| t.vs_best).fold(f64::INFINITY, f64::min);
    for t in &mut out {
        t.vs_best /= best;
    }
    out.sort_by(|a, b| a.vs_best.total_cmp(&b.vs_best));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opt(device: &str, micro: u64, acc: u64, s: f64) -> TrainingOption {
        TrainingOption {
            device: device.into(),
            micro_batch: micro,
            accumulation: acc,
            micro_step_s: s,
        }
    }

    /// The 6 GB card question by hand: B_noise = 250. GPU at 25 takes 10 ms a
    /// step, CPU at 250 takes 400 ms.
    #[test]
    fn gpu_at_25_vs_cpu_at_250_by_hand() {
        let options = [
            opt("gpu", 25, 1, 0.010),
            opt("cpu", 250, 1, 0.400),
            opt("gpu", 25, 10, 0.010),
        ];
        let r = rank(&options, 250.0, Some(1000.0));
        // GPU at 25: 1000 x (1 + 10) x 0.010 = 110 s; GPU 25x10: 1000 x 2 x 0.1 = 200 s;
        // CPU at 250: 1000 x 2 x 0.4 = 800 s.
        assert_eq!(r[0].option.accumulation, 1);
        assert!((r[0].seconds.unwrap() - 110.0).abs() < 1e-9);
        assert!((r[1].seconds.unwrap() - 200.0).abs() < 1e-9);
        assert!((r[2].seconds.unwrap() - 800.0).abs() < 1e-9);
        assert!((r[2].vs_best - 800.0 / 110.0).abs() < 1e-9);
        assert_eq!(r[1].option.effective_batch(), 250);
    }

    #[test]
    fn steps_curve_through_one_run() {
        // 300 updates at B = 128 with B_noise = 256: S_min = 300 / 3 = 100.
        let c = StepsCurve::through(300.0, 128.0, 256.0);
        assert!((c.s_min - 100.0).abs() < 1e-12);
        assert!((c.steps(256.0) - 200.0).abs() < 1e-12);
        assert!((c.seconds(256.0, 0.5) - 100.0).abs() < 1e-12);
        assert!((updates_vs_min(100.0, 25.0) - 5.0).abs() < 1e-12);
    }
}
