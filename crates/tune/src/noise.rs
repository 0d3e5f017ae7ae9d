//! The gradient noise scale of McCandlish et al. 2018, "An Empirical Model of
//! Large-Batch Training", appendix A: unbiased estimates of |G|^2 and tr(Sigma)
//! from gradient norms at two batch sizes, smoothed, and their ratio B_simple.

use crate::lr::{LrRule, scale};
use crate::target::Rows;
use batchfit_plan::Optimizer;
use serde::Serialize;

/// The two raw estimates from one measurement.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct RawEstimate {
    /// Unbiased estimate of the true gradient's squared norm |G|^2.
    pub g2: f64,
    /// Unbiased estimate of the trace of the per-sample gradient covariance.
    pub trace: f64,
}

/// Unbiased estimates from squared gradient norms at a small and a big batch:
/// `|G|^2 ~ (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)` and
/// `tr(Sigma) ~ (|G_small|^2 - |G_big|^2) / (1/B_small - 1/B_big)`.
pub fn two_batch(b_small: f64, g_small_sq: f64, b_big: f64, g_big_sq: f64) -> RawEstimate {
    assert!(b_big > b_small && b_small > 0.0, "need B_big > B_small > 0");
    RawEstimate {
        g2: (b_big * g_big_sq - b_small * g_small_sq) / (b_big - b_small),
        trace: (g_small_sq - g_big_sq) / (1.0 / b_small - 1.0 / b_big),
    }
}

/// [`two_batch`] for micro-batches drawn without replacement from a data set
/// of `rows` (disjoint micro-batches of distinct rows, as batchfit draws
/// them). A mean of n of N rows strays from the full data's gradient by the
/// finite-population share (N - n) / (N - 1) of the with-replacement
/// variance, which leaves the |G|^2 estimate low by S^2 / N in expectation
/// (S^2 the per-sample gradients' variance, which the trace estimates without
/// bias). Added back, |G|^2 is unbiased for the full data's gradient, and
/// B_simple can no longer exceed about the data's rows (full-batch steps have
/// no noise). On a plateau of a small data set the shortfall alone reads as a
/// negative |G|^2: 944 rows, a trace of 3.1, |G|^2 -0.003 stretch after stretch.
pub fn without_replacement(est: RawEstimate, rows: f64) -> RawEstimate {
    RawEstimate {
        g2: est.g2 + est.trace / rows,
        trace: est.trace,
    }
}

/// Bias-corrected exponential moving average (as Adam's moments); `beta = 0`
/// would keep only the last value, `None` is a plain running mean.
#[derive(Clone, Debug)]
pub struct Ema {
    beta: Option<f64>,
    value: f64,
    steps: u32,
}

impl Ema {
    pub fn new(beta: Option<f64>) -> Ema {
        Ema {
            beta,
            value: 0.0,
            steps: 0,
        }
    }

    pub fn push(&mut self, x: f64) {
        self.steps += 1;
        match self.beta {
            Some(b) => self.value = b * self.value + (1.0 - b) * x,
            None => self.value += (x - self.value) / self.steps as f64,
        }
    }

    /// The bias-corrected average, `None` before the first value.
    pub fn get(&self) -> Option<f64> {
        if self.steps == 0 {
            return None;
        }
        Some(match self.beta {
            Some(b) => self.value / (1.0 - b.powi(self.steps as i32)),
            None => self.value,
        })
    }

    /// Number of values an average of this kind effectively holds.
    pub fn effective_window(&self) -> usize {
        match self.beta {
            Some(b) => ((1.0 + b) / (1.0 - b)).round().max(2.0) as usize,
            None => self.steps as usize,
        }
    }
}

/// B_simple with an uncertainty band.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct NoiseScale {
    /// tr(Sigma) / |G|^2 from the smoothed estimates.
    pub b_simple: f64,
    /// 90 % band from the spread of the raw estimates in the smoothing window
    /// (delta method on the ratio of means); `high` is infinite when |G|^2 could be zero.
    pub low: f64,
    pub high: f64,
    pub g2: f64,
    pub trace: f64,
}

/// Running estimator over many measurements.
#[derive(Clone, Debug)]
pub struct NoiseEstimator {
    g2: Ema,
    trace: Ema,
    raw: Vec<RawEstimate>,
}

impl NoiseEstimator {
    /// `beta = Some(0.9)` smooths over about 19 measurements; `None` averages all
    /// (right when the weights do not move, `--lr 0`).
    pub fn new(beta: Option<f64>) -> NoiseEstimator {
        NoiseEstimator {
            g2: Ema::new(beta),
            trace: Ema::new(beta),
            raw: Vec::new(),
        }
    }

    pub fn push(&mut self, r: RawEstimate) {
        self.g2.push(r.g2);
        self.trace.push(r.trace);
        self.raw.push(r);
    }

    /// The current estimate, `None` before any measurement or while |G|^2 <= 0.
    pub fn estimate(&self) -> Option<NoiseScale> {
        let g2 = self.g2.get()?;
        let trace = self.trace.get()?;
        if g2 <= 0.0 || trace <= 0.0 {
            return None;
        }
        let b = trace / g2;
        let w = self.g2.effective_window().min(self.raw.len());
        let tail = &self.raw[self.raw.len() - w..];
        let (low, high) = if w >= 2 {
            let n = w as f64;
            let mg = tail.iter().map(|r| r.g2).sum::<f64>() / n;
            let ms = tail.iter().map(|r| r.trace).sum::<f64>() / n;
            let vg = tail.iter().map(|r| (r.g2 - mg).powi(2)).sum::<f64>() / (n - 1.0) / n;
            let vs = tail.iter().map(|r| (r.trace - ms).powi(2)).sum::<f64>() / (n - 1.0) / n;
            let cov = tail
                .iter()
                .map(|r| (r.g2 - mg) * (r.trace - ms))
                .sum::<f64>()
                / (n - 1.0)
                / n;
            // Relative variance of S/G: var_S/S^2 + var_G/G^2 - 2 cov/(S G).
            let rel = (vs / (trace * trace) + vg / (g2 * g2) - 2.0 * cov / (trace * g2)).max(0.0);
            let half = 1.645 * rel.sqrt();
            let g_rel = 1.645 * vg.sqrt() / g2;
            let high = if g_rel >= 1.0 {
                f64::INFINITY
            } else {
                b * (1.0 + half)
            };
            ((b * (1.0 - half)).max(0.0), high)
        } else {
            (0.0, f64::INFINITY)
        };
        Some(NoiseScale {
            b_simple: b,
            low,
            high,
            g2,
            trace,
        })
    }
}

/// The estimate after one step.
#[derive(Clone, Debug, Serialize)]
pub struct NoiseRecord {
    pub step: usize,
    /// Mean training loss of the step's micro-batches.
    pub loss: f64,
    /// The loss on a fixed subset of up to 1,024 training rows, the loss a
    /// sweep's target is judged by; evaluated at the first and last
    /// measurements and about as often as a sweep evaluates (null between).
    pub train_loss: Option<f64>,
    pub b_simple: Option<f64>,
    pub b_simple_low: Option<f64>,
    pub b_simple_high: Option<f64>,
    pub g2: Option<f64>,
    pub trace: Option<f64>,
    /// This measurement's own unbiased estimates (not smoothed): what
    /// [`crate::trajectory`] sums stretch by stretch.
    pub g2_raw: f64,
    pub trace_raw: f64,
    /// The same estimates in Adam's geometry (each coordinate weighted by
    /// 1 / (sqrt(v) + ε)², v Adam's second moment); adaptive optimizers only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub g2_raw_preconditioned: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_raw_preconditioned: Option<f64>,
    pub epoch: usize,
}

/// What a batch size costs relative to the ideal, from the noise scale:
/// steps `S(B) = S_min (1 + B_noise / B)`, samples `E(B) = E_min (1 + B / B_noise)`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct BatchPrediction {
    pub batch: u64,
    /// Steps needed relative to the minimum (infinitely large batch): `1 + B_noise/B`.
    pub steps_vs_min: f64,
    /// Samples (hence epochs) needed relative to the minimum (batch 1): `1 + B/B_noise`.
    pub samples_vs_min: f64,
}

/// Predictions for each batch, its batches drawn from `rows` training rows
/// without replacement ([`crate::target::noise_batch`]; `None`: unlimited):
/// S(B) / S_min = 1 + B_noise (1/B - 1/N), and the samples B S(B) over their
/// small-batch limit S_min B_noise, 1 + B (1/B_noise - 1/N).
pub fn predict(b_noise: f64, batches: &[u64], rows: Option<Rows>) -> Vec<BatchPrediction> {
    batches
        .iter()
        .map(|&b| {
            let steps_vs_min = crate::target::updates_vs_min_on(b_noise, b as f64, rows);
            BatchPrediction {
                batch: b,
                steps_vs_min,
                samples_vs_min: steps_vs_min * b as f64 / b_noise,
            }
        })
        .collect()
}

/// The critical batch: where steps and samples both sit at twice their minimum,
/// `B_crit ~ B_noise` (McCandlish et al. use B_simple as its estimate).
pub fn critical_batch(b_noise: f64) -> u64 {
    b_noise.round().max(1.0) as u64
}

/// The noise run's measurements by default (`noise --steps`, `advise --noise-steps`,
/// and a sweep's runs): 200 resolve the growth of the noise scale over a short
/// run on the shipped examples in seconds.
pub const DEFAULT_STEPS: usize = 200;

/// `advise`'s noise runs: two seeds pooled halve the variance of every
/// step's estimate and show whether a second run agrees, for twice the noise
/// run's cost (a fraction of `advise`'s).
pub const DEFAULT_NOISE_SEEDS: usize = 2;

/// The estimator's small batch by default: 16 samples, the batch a per-sample
/// gradient's noise is seen through at small batches.
pub const DEFAULT_B_SMALL: usize = 16;

/// Small batches per measurement by default (B_big = 8 x 16 = 128): B_big far
/// enough above B_small that the two norms differ by more than their noise.
pub const DEFAULT_K: usize = 8;

/// Learning rates scaled from a tuned reference.
#[derive(Clone, Debug, Serialize)]
pub struct LrAdvice {
    pub rule: LrRule,
    /// The rule's name and source ([`LrRule::source`]).
    pub source: &'static str,
    pub ref_batch: u64,
    pub ref_lr: f64,
    /// (batch, learning rate)
    pub per_batch: Vec<(u64, f64)>,
}

/// A noise run on the user's data: what was trained and measured, step by step,
/// and what it concludes (B_simple with its band, the critical batch, steps and
/// samples per batch, learning rates per batch).
#[derive(Clone, Debug, Serialize)]
pub struct NoiseRun {
    pub model: String,
    pub data: String,
    pub rows: usize,
    pub b_small: usize,
    pub b_big: usize,
    pub lr: f64,
    pub optimizer: Optimizer,
    pub steps: usize,
    /// B_simple = tr(Sigma) / |G|^2 at the end of the run (measured).
    pub b_simple: Option<f64>,
    /// 90 % band of B_simple.
    pub b_simple_low: Option<f64>,
    pub b_simple_high: Option<f64>,
    /// Critical batch, taken as B_simple (McCandlish et al.) (predicted).
    pub critical_batch: Option<u64>,
    /// One record per measurement step.
    pub history: Vec<NoiseRecord>,
    /// Steps and samples relative to their minimum, per batch (predicted).
    pub predictions: Vec<BatchPrediction>,
    pub lr_advice: Option<LrAdvice>,
}

/// What was trained in a noise run, before its conclusions.
#[derive(Clone, Debug)]
pub struct NoiseRunSetup {
    pub model: String,
    pub data: String,
    pub rows: usize,
    pub b_small: usize,
    /// B_big = k x B_small.
    pub k: usize,
    pub lr: f64,
    pub optimizer: Optimizer,
    pub steps: usize,
    /// Batches to predict steps and epochs for (empty: powers of two up to the rows).
    pub batches: Vec<u64>,
    /// The user's tuned (batch, learning rate), for the learning-rate table.
    pub reference: Option<(u64, f64)>,
}

impl NoiseRun {
    /// Several runs of the same settings (other seeds: data order, initial
    /// weights) as one: their raw estimates and losses averaged step by step,
    /// which is as many measurements per step as there are runs, and the
    /// smoothed estimates and the conclusions made again from those.
    pub fn pool(runs: &[NoiseRun]) -> Option<NoiseRun> {
        let first = runs.first()?;
        if runs.len() == 1 {
            return Some(first.clone());
        }
        let steps = runs.iter().map(|r| r.history.len()).min().unwrap_or(0);
        let n = runs.len() as f64;
        let mean = |f: &dyn Fn(&NoiseRecord) -> f64, i: usize| {
            runs.iter().map(|r| f(&r.history[i])).sum::<f64>() / n
        };
        let mean_opt = |f: &dyn Fn(&NoiseRecord) -> Option<f64>, i: usize| {
            let v: Vec<f64> = runs.iter().filter_map(|r| f(&r.history[i])).collect();
            (v.len() == runs.len()).then(|| v.iter().sum::<f64>() / n)
        };
        let beta = (first.lr > 0.0).then_some(0.95);
        let mut est = NoiseEstimator::new(beta);
        let history: Vec<NoiseRecord> = (0..steps)
            .map(|i| {
                let (g2_raw, trace_raw) = (mean(&|r| r.g2_raw, i), mean(&|r| r.trace_raw, i));
                est.push(RawEstimate {
                    g2: g2_raw,
                    trace: trace_raw,
                });
                let e = est.estimate();
                NoiseRecord {
                    step: first.history[i].step,
                    loss: mean(&|r| r.loss, i),
                    train_loss: mean_opt(&|r| r.train_loss, i),
                    b_simple: e.map(|e| e.b_simple),
                    b_simple_low: e.map(|e| e.low),
                    b_simple_high: e.map(|e| e.high).filter(|h| h.is_finite()),
                    g2: e.map(|e| e.g2),
                    trace: e.map(|e| e.trace),
                    g2_raw,
                    trace_raw,
                    g2_raw_preconditioned: mean_opt(&|r| r.g2_raw_preconditioned, i),
                    trace_raw_preconditioned: mean_opt(&|r| r.trace_raw_preconditioned, i),
                    epoch: first.history[i].epoch,
                }
            })
            .collect();
        let batches: Vec<u64> = first.predictions.iter().map(|p| p.batch).collect();
        let reference = first.lr_advice.as_ref().map(|a| (a.ref_batch, a.ref_lr));
        Some(NoiseRun::conclude(
            NoiseRunSetup {
                model: first.model.clone(),
                data: first.data.clone(),
                rows: first.rows,
                b_small: first.b_small,
                k: first.b_big / first.b_small.max(1),
                lr: first.lr,
                optimizer: first.optimizer,
                steps: first.steps,
                batches,
                reference,
            },
            history,
            est.estimate(),
        ))
    }

    /// The run's conclusions from its history and final estimate: B_simple with
    /// its band, predictions per batch, learning rates per batch when a
    /// reference was given.
    pub fn conclude(
        setup: NoiseRunSetup,
        history: Vec<NoiseRecord>,
        estimate: Option<NoiseScale>,
    ) -> NoiseRun {
        let batches: Vec<u64> = if setup.batches.is_empty() {
            std::iter::successors(Some(1u64), |b| Some(b * 2))
                .take_while(|&b| b <= setup.rows as u64)
                .collect()
        } else {
            setup.batches.clone()
        };
        let (b_simple, low, high) = match estimate {
            Some(e) => (
                Some(e.b_simple),
                Some(e.low),
                e.high.is_finite().then_some(e.high),
            ),
            None => (None, None, None),
        };
        let rule = LrRule::for_optimizer(setup.optimizer.is_adaptive());
        let lr_advice = setup.reference.map(|(rb, rl)| LrAdvice {
            rule,
            source: rule.source(),
            ref_batch: rb,
            ref_lr: rl,
            per_batch: batches
                .iter()
                .map(|&b| (b, scale(rule, rb, rl, b)))
                .collect(),
        });
        NoiseRun {
            model: setup.model,
            data: setup.data,
            rows: setup.rows,
            b_small: setup.b_small,
            b_big: setup.b_small * setup.k,
            lr: setup.lr,
            optimizer: setup.optimizer,
            steps: setup.steps,
            b_simple,
            b_simple_low: low,
            b_simple_high: high,
            critical_batch: b_simple.map(critical_batch),
            history,
            predictions: b_simple
                .map(|b| {
                    predict(
                        b,
                        &batches,
                        crate::target::rows_drawn_from(setup.rows, setup.optimizer),
                    )
                })
                .unwrap_or_default(),
            lr_advice,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small data set's per-sample gradients, micro-batches drawn without
    /// replacement many times: the plain estimator's |G|^2 averages
    /// |G|^2 - S^2/N, the corrected one |G|^2; the trace S^2 either way.
    #[test]
    fn without_replacement_the_corrected_estimate_is_unbiased() {
        use rand::SeedableRng;
        use rand::seq::SliceRandom;
        let rows: Vec<[f64; 2]> = (0..12)
            .map(|i| {
                let t = i as f64;
                [0.3 + (t * 1.7).sin(), -0.2 + (t * 0.9).cos() * 2.0]
            })
            .collect();
        let n = rows.len() as f64;
        let mean = [0, 1].map(|c| rows.iter().map(|r| r[c]).sum::<f64>() / n);
        let g2 = mean[0].powi(2) + mean[1].powi(2);
        let s2 = rows
            .iter()
            .map(|r| (r[0] - mean[0]).powi(2) + (r[1] - mean[1]).powi(2))
            .sum::<f64>()
            / (n - 1.0);
        let (b_small, k, draws) = (2usize, 3usize, 200_000);
        let mut order: Vec<usize> = (0..rows.len()).collect();
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let norm = |idx: &[usize]| {
            let m = [0, 1].map(|c| idx.iter().map(|&i| rows[i][c]).sum::<f64>() / idx.len() as f64);
            m[0] * m[0] + m[1] * m[1]
        };
        let (mut plain, mut corrected, mut trace) = (0.0, 0.0, 0.0);
        for _ in 0..draws {
            order.shuffle(&mut rng);
            let big = &order[..b_small * k];
            let small = big.chunks(b_small).map(norm).sum::<f64>() / k as f64;
            let raw = two_batch(b_small as f64, small, big.len() as f64, norm(big));
            plain += raw.g2;
            corrected += without_replacement(raw, n).g2;
            trace += raw.trace;
        }
        let d = draws as f64;
        let (plain, corrected, trace) = (plain / d, corrected / d, trace / d);
        // Standard errors here are about 0.005 (|G|^2) and 0.01 (trace).
        assert!((corrected - g2).abs() < 0.02, "{corrected} vs {g2}");
        assert!(
            (plain - (g2 - s2 / n)).abs() < 0.02,
            "{plain} vs {}",
            g2 - s2 / n
        );
        assert!(
            s2 / n > 0.1,
            "the bias is well above the tolerance: {}",
            s2 / n
        );
        assert!((trace - s2).abs() < 0.05 * s2, "{trace} vs {s2}");
    }

    /// Gradients with known |G|^2 and tr(Sigma): E|G_B|^2 = |G|^2 + tr(Sigma)/B.
    #[test]
    fn two_batch_estimator_is_exact_on_expected_norms() {
        let (g2, tr) = (2.0, 300.0);
        let at = |b: f64| g2 + tr / b;
        let r = two_batch(8.0, at(8.0), 64.0, at(64.0));
        assert!((r.g2 - g2).abs() < 1e-9);
        assert!((r.trace - tr).abs() < 1e-9);
    }

    #[test]
    fn ema_bias_correction_recovers_a_constant() {
        let mut e = Ema::new(Some(0.9));
        e.push(5.0);
        assert!((e.get().unwrap() - 5.0).abs() < 1e-12);
        e.push(5.0);
        assert!((e.get().unwrap() - 5.0).abs() < 1e-12);
        let mut m = Ema::new(None);
        for x in [1.0, 2.0, 3.0] {
            m.push(x);
        }
        assert_eq!(m.get(), Some(2.0));
    }

    #[test]
    fn band_contains_the_estimate_and_shrinks_with_data() {
        let mut est = NoiseEstimator::new(None);
        let mut seed = 1u64;
        let mut noise = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 33) as f64 / (1u64 << 31) as f64) - 0.5
        };
        for _ in 0..10 {
            est.push(RawEstimate {
                g2: 1.0 + 0.5 * noise(),
                trace: 100.0 + 50.0 * noise(),
            });
        }
        let a = est.estimate().unwrap();
        for _ in 0..990 {
            est.push(RawEstimate {
                g2: 1.0 + 0.5 * noise(),
                trace: 100.0 + 50.0 * noise(),
            });
        }
        let b = est.estimate().unwrap();
        assert!(a.low <= a.b_simple && a.b_simple <= a.high);
        assert!(b.high - b.low < a.high - a.low);
        assert!((b.b_simple - 100.0).abs() < 5.0);
    }

    #[test]
    fn predictions_follow_the_formulas() {
        let p = predict(100.0, &[10, 100, 1000], None);
        assert_eq!(p[0].steps_vs_min, 11.0);
        assert_eq!(p[1].steps_vs_min, 2.0);
        assert_eq!(p[1].samples_vs_min, 2.0);
        assert_eq!(p[2].samples_vs_min, 11.0);
        // From 1,000 rows: 1,000 is the full gradient, S_min updates.
        let p = predict(100.0, &[100, 1000], crate::target::sgd_rows(1000.0));
        assert!((p[0].steps_vs_min - 1.9).abs() < 1e-12);
        assert!((p[0].samples_vs_min - 1.9).abs() < 1e-12);
        assert_eq!(p[1].steps_vs_min, 1.0);
        assert!((p[1].samples_vs_min - 10.0).abs() < 1e-12);
        assert_eq!(critical_batch(99.6), 100);
    }
}
