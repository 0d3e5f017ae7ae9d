//! Measuring the gradient noise scale during a short real training run.
//!
//! Each measurement draws `k` micro-batches of `b_small` samples, takes the
//! gradient of each and of their average (the gradient at `B_big = k b_small`),
//! and feeds the squared norms to the unbiased two-batch estimator of
//! McCandlish et al. 2018 (appendix A). With a learning rate above zero the
//! model then takes one optimizer step on the big batch, so the estimate
//! follows the training run; at `lr = 0` the weights stay fixed.

use crate::data::from_rows;
use crate::trainer::Trainer;
use batchfit_data::{Batcher, Dataset};
use batchfit_graph::Graph;
use batchfit_tune::noise::{NoiseEstimator, NoiseRecord, two_batch};

/// How to measure.
#[derive(Clone, Debug)]
pub struct NoiseConfig {
    /// Samples per micro-batch.
    pub b_small: usize,
    /// Micro-batches per measurement: `B_big = k x b_small`.
    pub k: usize,
    /// Measurements to make.
    pub steps: usize,
    /// Smoothing of the estimates (`None`: plain mean, right for fixed weights).
    pub beta: Option<f64>,
    /// Seeds the order the data is drawn in.
    pub seed: u64,
}

/// Why a run stopped.
#[derive(Debug, thiserror::Error)]
pub enum NoiseError {
    /// The mean loss of a measurement was NaN or infinite.
    #[error("the loss became {loss} at step {step}; lower --lr or check the data")]
    NonFiniteLoss {
        /// The measurement, from 0.
        step: usize,
        /// Its mean loss over the micro-batches.
        loss: f64,
    },
    /// The data has fewer rows than one big batch.
    #[error("B_big = {big} exceeds the {rows} rows of the data; lower --b-small or --k")]
    TooFewRows {
        /// `B_big = k x b_small`.
        big: usize,
        /// Rows of the data.
        rows: usize,
    },
}

/// Runs the measurement; `on_step` sees each record as it is made (progress).
pub fn measure_noise(
    trainer: &mut Trainer,
    graph: &Graph,
    data: &Dataset,
    cfg: &NoiseConfig,
    mut on_step: impl FnMut(&NoiseRecord),
) -> Result<(Vec<NoiseRecord>, NoiseEstimator), NoiseError> {
    let big = cfg.b_small * cfg.k;
    if big > data.rows {
        return Err(NoiseError::TooFewRows {
            big,
            rows: data.rows,
        });
    }
    let mut batcher = Batcher::new(data.rows, cfg.seed);
    let target_rows = crate::sweep::target_rows(data.rows);
    let mut checks = crate::sweep::Checks::new(data.rows, big);
    let mut est = NoiseEstimator::new(cfg.beta);
    let mut history = Vec::with_capacity(cfg.steps);
    let mut moments = trainer
        .config
        .optimizer
        .is_adaptive()
        .then(SecondMoments::default);
    for step in 0..cfg.steps {
        let idx = batcher.next(big);
        let mut sum: Vec<f64> = Vec::new();
        let mut small_sq = 0.0;
        let mut small_sq_p = 0.0;
        let mut weights: Option<Vec<f64>> = None;
        let mut loss = 0.0;
        for chunk in idx.chunks(cfg.b_small) {
            let batch = from_rows(data, graph, chunk, &trainer.device);
            let (l, grads) = trainer.gradients(&batch);
            let g = trainer.grad_vector(&grads);
            small_sq += g.iter().map(|x| x * x).sum::<f64>();
            if let Some(m) = &moments {
                let w = weights.get_or_insert_with(|| m.weights(&g));
                small_sq_p += g.iter().zip(w.iter()).map(|(x, w)| w * x * x).sum::<f64>();
            }
            if sum.is_empty() {
                sum = g;
            } else {
                sum.iter_mut().zip(&g).for_each(|(s, x)| *s += x);
            }
            loss += f64::from(l);
        }
        let k = cfg.k as f64;
        loss /= k;
        if !loss.is_finite() {
            return Err(NoiseError::NonFiniteLoss { step, loss });
        }
        let big_sq = sum.iter().map(|s| (s / k) * (s / k)).sum::<f64>();
        let raw = two_batch(cfg.b_small as f64, small_sq / k, big as f64, big_sq);
        est.push(raw);
        let preconditioned = match (&mut moments, &weights) {
            (Some(m), Some(w)) => {
                let mean: Vec<f64> = sum.iter().map(|s| s / k).collect();
                let big_sq_p = mean.iter().zip(w).map(|(x, w)| w * x * x).sum::<f64>();
                m.push(&mean);
                Some(two_batch(
                    cfg.b_small as f64,
                    small_sq_p / k,
                    big as f64,
                    big_sq_p,
                ))
            }
            _ => None,
        };
        // The loss a sweep targets, at the weights this measurement saw.
        let train_loss = (step == 0 || checks.due(step as u64) || step + 1 == cfg.steps)
            .then(|| crate::sweep::training_loss(trainer, graph, data, &target_rows));
        if trainer.config.lr > 0.0 {
            let batch = from_rows(data, graph, &idx, &trainer.device);
            trainer.step(&batch);
        }
        let e = est.estimate();
        let rec = NoiseRecord {
            step,
            loss,
            b_simple: e.map(|e| e.b_simple),
            b_simple_low: e.map(|e| e.low),
            b_simple_high: e.map(|e| e.high).filter(|h| h.is_finite()),
            g2: e.map(|e| e.g2),
            trace: e.map(|e| e.trace),
            train_loss,
            g2_raw: raw.g2,
            trace_raw: raw.trace,
            g2_raw_preconditioned: preconditioned.map(|r| r.g2),
            trace_raw_preconditioned: preconditioned.map(|r| r.trace),
            epoch: batcher.epoch,
        };
        on_step(&rec);
        history.push(rec);
    }
    Ok((history, est))
}

/// Adam's second-moment estimate v of the step's gradients (β2 = 0.999, bias
/// corrected), kept beside the run so the noise can also be measured on what
/// Adam steps along: the gradient divided by sqrt(v) + ε, coordinate by
/// coordinate. Its squared norm weights each coordinate by 1 / (sqrt(v) + ε)².
/// The raw gradient's noise scale undercounts Adam's: Adam lifts the
/// small-gradient coordinates, whose share of the noise is large. On digits
/// and MNIST the steps of Adam trainings from batch 16 to 1,024 follow the
/// preconditioned value (within 18 %) and not the raw one (up to 34 % off).
#[derive(Default)]
struct SecondMoments {
    v: Vec<f64>,
    steps: i32,
}

impl SecondMoments {
    const BETA2: f64 = 0.999;
    const EPSILON: f64 = 1e-8;

    /// The weights 1 / (sqrt(v_hat) + ε)² from the updates so far; before the
    /// first, from `g` itself (Adam's first step divides by |g|).
    fn weights(&self, g: &[f64]) -> Vec<f64> {
        let w = |v: f64| 1.0 / (v.sqrt() + Self::EPSILON).powi(2);
        if self.steps == 0 {
            return g.iter().map(|x| w(x * x)).collect();
        }
        let correction = 1.0 - Self::BETA2.powi(self.steps);
        self.v.iter().map(|v| w(v / correction)).collect()
    }

    /// One update's gradient.
    fn push(&mut self, g: &[f64]) {
        if self.v.is_empty() {
            self.v = vec![0.0; g.len()];
        }
        for (v, x) in self.v.iter_mut().zip(g) {
            *v = Self::BETA2 * *v + (1.0 - Self::BETA2) * x * x;
        }
        self.steps += 1;
    }
}
