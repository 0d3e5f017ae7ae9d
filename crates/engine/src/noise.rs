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
    let mut est = NoiseEstimator::new(cfg.beta);
    let mut history = Vec::with_capacity(cfg.steps);
    for step in 0..cfg.steps {
        let idx = batcher.next(big);
        let mut sum: Vec<f64> = Vec::new();
        let mut small_sq = 0.0;
        let mut loss = 0.0;
        for chunk in idx.chunks(cfg.b_small) {
            let batch = from_rows(data, graph, chunk, &trainer.device);
            let (l, grads) = trainer.gradients(&batch);
            let g = trainer.grad_vector(&grads);
            small_sq += g.iter().map(|x| x * x).sum::<f64>();
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
        est.push(two_batch(
            cfg.b_small as f64,
            small_sq / k,
            big as f64,
            big_sq,
        ));
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
            epoch: batcher.epoch,
        };
        on_step(&rec);
        history.push(rec);
    }
    Ok((history, est))
}
