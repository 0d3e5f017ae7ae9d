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
use batchfit_tune::noise::{NoiseEstimator, NoiseRecord, two_batch, without_replacement};

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
        // Per coordinate, the micro-batches' squared gradients summed: Adam's
        // weights depend on this step's own gradient, known only after the last.
        let mut small_sq_by_coord: Vec<f64> = Vec::new();
        let mut loss = 0.0;
        for chunk in idx.chunks(cfg.b_small) {
            let batch = from_rows(data, graph, chunk, &trainer.device);
            let (l, grads) = trainer.gradients(&batch);
            let g = trainer.grad_vector(&grads);
            small_sq += g.iter().map(|x| x * x).sum::<f64>();
            if moments.is_some() {
                if small_sq_by_coord.is_empty() {
                    small_sq_by_coord = vec![0.0; g.len()];
                }
                small_sq_by_coord
                    .iter_mut()
                    .zip(&g)
                    .for_each(|(s, x)| *s += x * x);
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
        let rows = data.rows as f64;
        let raw = without_replacement(
            two_batch(cfg.b_small as f64, small_sq / k, big as f64, big_sq),
            rows,
        );
        est.push(raw);
        let preconditioned = moments.as_mut().map(|m| {
            // In place: the big batch's gradient and the micro-batches' mean
            // square, per coordinate (no more parameter-sized copies).
            sum.iter_mut().for_each(|s| *s /= k);
            small_sq_by_coord.iter_mut().for_each(|s| *s /= k);
            let (small_sq_p, big_sq_p) = m.weighted_norms(&small_sq_by_coord, &sum);
            m.push(&sum);
            without_replacement(
                two_batch(cfg.b_small as f64, small_sq_p, big as f64, big_sq_p),
                rows,
            )
        });
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
/// preconditioned value and not the raw one.
///
/// v includes the step's own gradients, as Adam's update does (it folds g²
/// into v before dividing), taken as the micro-batches' mean g² rather than the
/// big batch's: without the step's term a coordinate that no earlier step
/// moved (a rarely active unit, a weight on a mostly-zero input) has v near 0
/// and a weight near 1/ε² = 1e16, and one micro-batch that touches it reads as
/// a noise scale of 1e10; with the big batch's g², a coordinate whose
/// micro-batches cancel has the same problem. The micro-batches' mean square
/// bounds each coordinate's share (at most k where it is the whole of v) while
/// the weights stay what Adam divides by once v has a history.
#[derive(Default)]
struct SecondMoments {
    v: Vec<f64>,
    steps: i32,
}

impl SecondMoments {
    const BETA2: f64 = 0.999;
    const EPSILON: f64 = 1e-8;

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

    /// The weight 1 / (sqrt(v_hat) + ε)² of coordinate `i` for a step whose
    /// squared gradient there is `g_sq`: v folds it in before dividing, as
    /// Adam's update does, and v_hat is bias corrected (v_hat = g_sq at the
    /// first step).
    fn weigher(&self) -> impl Fn(usize, f64) -> f64 + '_ {
        let correction = 1.0 - Self::BETA2.powi(self.steps + 1);
        move |i, g_sq| {
            let v = self.v.get(i).copied().unwrap_or(0.0);
            let folded = Self::BETA2 * v + (1.0 - Self::BETA2) * g_sq;
            1.0 / ((folded / correction).sqrt() + Self::EPSILON).powi(2)
        }
    }

    /// The micro-batches' mean squared norm and the big batch's squared norm
    /// in Adam's geometry: Σ w_i g_sq_i and Σ w_i g_i², the weights folding
    /// in `g_sq`, the micro-batches' mean square of this step.
    fn weighted_norms(&self, g_sq: &[f64], g: &[f64]) -> (f64, f64) {
        let weight = self.weigher();
        g_sq.iter()
            .zip(g)
            .enumerate()
            .fold((0.0, 0.0), |(small, big), (i, (&q, &x))| {
                let w = weight(i, q);
                (small + w * q, big + w * x * x)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::SecondMoments;

    /// A coordinate no earlier step moved, touched now by one micro-batch of k:
    /// v has no history, so without the step's own term its weight is 1/ε² and
    /// its share of the preconditioned norms 1e16 times its gradient². Folded
    /// in, its share of the micro-batches' mean squared norm is bounded by what
    /// Adam's own step on it is, (1 - β2^t) / (1 - β2) at step t; a coordinate
    /// with a steady gradient has a share of 1.
    #[test]
    fn an_untouched_coordinate_weighs_what_adam_divides_it_by() {
        let mut m = SecondMoments::default();
        for _ in 0..50 {
            m.push(&[0.5, 0.0]);
        }
        let k = 8.0;
        let touched = 3e-4; // one micro-batch's gradient on the second coordinate
        let mean_sq = [0.25, touched * touched / k];
        let weight = m.weigher();
        assert!((weight(0, 0.25) * 0.25 - 1.0).abs() < 1e-3);
        let share = weight(1, mean_sq[1]) * mean_sq[1];
        let fifty_one = 1.0 - SecondMoments::BETA2.powi(51);
        assert!(share > 1.0 && share < 1.0001 * fifty_one / (1.0 - SecondMoments::BETA2));
        // The first step divides by the step's own size: every share is 1.
        let first = SecondMoments::default();
        let weight = first.weigher();
        for (i, g2) in mean_sq.into_iter().enumerate() {
            assert!(
                (weight(i, g2) * g2 - 1.0).abs() < 1e-3,
                "{}",
                weight(i, g2) * g2
            );
        }
        // The two norms weigh every coordinate so: both shares of 1 at step 1.
        let (small, big) = first.weighted_norms(&mean_sq, &[0.5, touched / k]);
        assert!((small - 2.0).abs() < 2e-3, "{small}");
        assert!(big > 1.0 && big < small, "{big}");
    }
}
