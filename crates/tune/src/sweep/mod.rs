//! Real short trainings at several batch sizes: the records they produce, the
//! fit of S(B) = S_min (1 + B_noise / B) to the measured steps to target, and
//! whether final validation figures differ by more than the seeds do.

pub mod schedule;
pub mod summary;

pub use schedule::schedule_summary;
pub use summary::{
    BatchSummary, DeviceBatchTimes, DeviceTimes, MeasuredNoise, MeasuredSteps, MeasuredStepsError,
    ScheduleSource, ScheduleSummary, SweepRun, SweepSettings, SweepSummary, TargetSource,
    measured_steps, summarize,
};

use crate::target::{Rows, noise_batch};
use serde::{Deserialize, Serialize};

/// How a training run ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum RunStatus {
    /// The training loss reached the target.
    Reached,
    /// The epoch budget ended first.
    Budget,
    /// The loss became NaN or infinite at `step` (`loss` null for NaN, as JSON has no NaN).
    Diverged { step: u64, loss: Option<f64> },
}

/// One evaluation of the training loss on the fixed training subset.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CurvePoint {
    pub step: u64,
    /// Seconds of training steps so far (evaluations not counted).
    pub seconds: f64,
    pub samples: u64,
    pub loss: f64,
}

/// The end of one epoch.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct EpochRecord {
    pub epoch: u32,
    pub step: u64,
    pub seconds: f64,
    /// Mean minibatch loss over the epoch's steps.
    pub train_loss: f64,
    pub val_loss: f64,
    /// Share of validation rows classified right (classification only).
    pub val_accuracy: Option<f64>,
}

/// Everything one run of a sweep records (written as one JSON file).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub batch: u64,
    pub seed: u64,
    pub lr: f64,
    pub warmup_steps: u64,
    /// The loss the run trained towards (null: an epoch budget only).
    pub target_loss: Option<f64>,
    #[serde(flatten)]
    pub status: RunStatus,
    /// Steps, epochs (fractional), samples and seconds to the target loss,
    /// interpolated between evaluations; null when not reached.
    pub steps_to_target: Option<f64>,
    pub epochs_to_target: Option<f64>,
    pub samples_to_target: Option<f64>,
    pub seconds_to_target: Option<f64>,
    pub steps: u64,
    pub seconds: f64,
    /// Training loss on the fixed training subset, about ten times an epoch and
    /// at least 5 % of the steps so far apart.
    pub curve: Vec<CurvePoint>,
    pub epochs: Vec<EpochRecord>,
    pub final_val_loss: Option<f64>,
    pub final_val_accuracy: Option<f64>,
    /// The batch-size schedule the run followed (`batch` and `lr` are its
    /// first stage's); absent for a fixed batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<crate::schedule::Schedule>,
}

/// Where a curve first reaches `target`, interpolated linearly in the loss
/// between the evaluation above it and the one at or below it:
/// (step, seconds, samples).
pub fn first_reach(curve: &[CurvePoint], target: f64) -> Option<(f64, f64, f64)> {
    let i = curve.iter().position(|p| p.loss <= target)?;
    let p = curve[i];
    if i == 0 {
        return Some((p.step as f64, p.seconds, p.samples as f64));
    }
    let q = curve[i - 1];
    let t = ((q.loss - target) / (q.loss - p.loss)).clamp(0.0, 1.0);
    let lerp = |a: f64, b: f64| a + t * (b - a);
    Some((
        lerp(q.step as f64, p.step as f64),
        lerp(q.seconds, p.seconds),
        lerp(q.samples as f64, p.samples as f64),
    ))
}

/// S_min and B_noise fitted to measured (batch, steps to target): S(B) itself.
pub type StepsFit = crate::target::StepsCurve;

/// Fits S = S_min + (S_min B_noise) / B, a line in 1/B (B noise-effective on
/// `rows` training rows: [`crate::target::noise_batch`]), by least squares on
/// relative errors (weights 1/S^2: step counts scatter in proportion to their
/// size). Needs two distinct batches; `None` when the fit has no positive
/// S_min or B_noise (steps that do not fall with the batch, or fall faster
/// than 1/B), which the report says in words.
pub fn fit_steps(points: &[(f64, f64)], rows: Option<Rows>) -> Option<StepsFit> {
    let pts: Vec<(f64, f64, f64)> = points
        .iter()
        .filter(|p| p.0 > 0.0 && p.1 > 0.0 && p.1.is_finite())
        .map(|&(b, s)| (1.0 / noise_batch(b, rows), s, 1.0 / (s * s)))
        .collect();
    let distinct = pts.iter().any(|p| (p.0 - pts[0].0).abs() > 1e-15);
    if pts.len() < 2 || !distinct {
        return None;
    }
    let w: f64 = pts.iter().map(|p| p.2).sum();
    let mx = pts.iter().map(|p| p.2 * p.0).sum::<f64>() / w;
    let my = pts.iter().map(|p| p.2 * p.1).sum::<f64>() / w;
    let sxx: f64 = pts.iter().map(|p| p.2 * (p.0 - mx).powi(2)).sum();
    let sxy: f64 = pts.iter().map(|p| p.2 * (p.0 - mx) * (p.1 - my)).sum();
    let slope = sxy / sxx;
    let s_min = my - slope * mx;
    (s_min > 0.0 && slope > 0.0).then(|| StepsFit {
        s_min,
        b_noise: slope / s_min,
        rows,
    })
}

/// S_min for a given B_noise (from `noise`): the weighted least-squares scale
/// of (1 + B_noise/B) to the measured steps, so a measured noise scale can be
/// turned into step predictions and checked against the runs (batches drawn
/// from `rows`).
pub fn fit_s_min(b_noise: f64, points: &[(f64, f64)], rows: Option<Rows>) -> Option<f64> {
    // minimise sum ((S_i - a f_i) / S_i)^2 with f_i = 1 + B_noise/B_i.
    let (mut num, mut den) = (0.0, 0.0);
    for &(b, s) in points.iter().filter(|p| p.0 > 0.0 && p.1 > 0.0) {
        let f = crate::target::updates_vs_min_on(b_noise, b, rows);
        num += f / s;
        den += (f / s).powi(2);
    }
    (den > 0.0).then(|| num / den)
}

/// Mean and sample standard deviation (0 for one value).
pub fn mean_std(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = if xs.len() > 1 {
        xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

/// Two groups of per-seed values compared: (mean of `a` over mean of `b`,
/// their difference, its standard error from each group's own spread).
/// `None` when either group is empty.
pub fn difference(a: &[f64], b: &[f64]) -> Option<(f64, f64, f64)> {
    if a.is_empty() || b.is_empty() {
        return None;
    }
    let ((ma, sa), (mb, sb)) = (mean_std(a), mean_std(b));
    let se = (sa * sa / a.len() as f64 + sb * sb / b.len() as f64).sqrt();
    Some((ma / mb, ma - mb, se))
}

/// Does the batch size change a final figure by more than the seeds do?
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct QualityVerdict {
    /// Batches with the highest and lowest mean.
    pub best_batch: u64,
    pub worst_batch: u64,
    /// Difference of those means.
    pub difference: f64,
    /// Seed-to-seed standard deviation pooled over batches.
    pub pooled_std: f64,
    /// Standard error of a difference of two means at this number of seeds.
    pub std_err: f64,
    /// difference / std_err.
    pub z: f64,
    /// |z| > 2: the difference exceeds what the seeds alone produce.
    pub exceeds_seed_noise: bool,
}

/// Compares per-batch groups of a final figure (one value per seed);
/// `higher_is_better` for accuracy, not for loss. `None` without two batches
/// with at least two seeds each.
pub fn quality(groups: &[(u64, Vec<f64>)], higher_is_better: bool) -> Option<QualityVerdict> {
    let g: Vec<(u64, f64, f64, usize)> = groups
        .iter()
        .filter(|(_, v)| v.len() >= 2)
        .map(|(b, v)| {
            let (m, s) = mean_std(v);
            (*b, m, s, v.len())
        })
        .collect();
    if g.len() < 2 {
        return None;
    }
    let dof: usize = g.iter().map(|x| x.3 - 1).sum();
    let pooled_var = g.iter().map(|x| (x.3 - 1) as f64 * x.2 * x.2).sum::<f64>() / dof as f64;
    let better = |a: f64, b: f64| if higher_is_better { a > b } else { a < b };
    let best = g
        .iter()
        .fold(g[0], |acc, x| if better(x.1, acc.1) { *x } else { acc });
    let worst = g
        .iter()
        .fold(g[0], |acc, x| if better(acc.1, x.1) { *x } else { acc });
    let std_err = (pooled_var * (1.0 / best.3 as f64 + 1.0 / worst.3 as f64)).sqrt();
    let difference = (best.1 - worst.1).abs();
    let z = if std_err > 0.0 {
        difference / std_err
    } else if difference > 0.0 {
        f64::INFINITY
    } else {
        0.0
    };
    Some(QualityVerdict {
        best_batch: best.0,
        worst_batch: worst.0,
        difference,
        pooled_std: pooled_var.sqrt(),
        std_err,
        z,
        exceeds_seed_noise: z > 2.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator for multiplicative noise.
    fn noise(i: u64) -> f64 {
        let x = (i
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407)
            >> 33) as f64
            / (1u64 << 31) as f64;
        x - 0.5
    }

    #[test]
    fn fit_recovers_s_min_and_b_noise_from_noisy_points() {
        // Batches of distinct rows from 2,000: 1,024 is half the data.
        let rows = crate::target::sgd_rows(2000.0);
        let truth = StepsFit {
            s_min: 400.0,
            b_noise: 300.0,
            rows,
        };
        let batches = [16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0];
        let mut points = Vec::new();
        for seed in 0..3u64 {
            for (i, &b) in batches.iter().enumerate() {
                // +-5 % multiplicative noise.
                let s = truth.steps(b) * (1.0 + 0.1 * noise(seed * 100 + i as u64));
                points.push((b, s));
            }
        }
        let fit = fit_steps(&points, rows).unwrap();
        assert!((fit.s_min / truth.s_min - 1.0).abs() < 0.08, "{fit:?}");
        assert!((fit.b_noise / truth.b_noise - 1.0).abs() < 0.15, "{fit:?}");
        // Exact points give the exact answer.
        let exact: Vec<(f64, f64)> = batches.iter().map(|&b| (b, truth.steps(b))).collect();
        let fit = fit_steps(&exact, rows).unwrap();
        assert!((fit.s_min - 400.0).abs() < 1e-6 && (fit.b_noise - 300.0).abs() < 1e-6);
        assert_eq!(fit.rows, rows);
        assert!((fit_s_min(300.0, &exact, rows).unwrap() - 400.0).abs() < 1e-9);
        // Read as unlimited data, the same steps give a different curve.
        let unlimited = fit_steps(&exact, None).unwrap();
        assert!((unlimited.b_noise - 300.0).abs() > 10.0, "{unlimited:?}");
    }

    #[test]
    fn fit_refuses_what_the_formula_cannot_explain() {
        assert!(fit_steps(&[(32.0, 100.0)], None).is_none());
        assert!(fit_steps(&[(32.0, 100.0), (32.0, 120.0)], None).is_none());
        // Steps rising with the batch: no positive B_noise.
        assert!(fit_steps(&[(32.0, 100.0), (64.0, 150.0)], None).is_none());
    }

    #[test]
    fn reaching_the_target_is_interpolated() {
        let c = |step, loss| CurvePoint {
            step,
            seconds: step as f64 * 0.01,
            samples: step * 32,
            loss,
        };
        let curve = [c(0, 2.0), c(10, 1.0), c(20, 0.5)];
        let (s, t, n) = first_reach(&curve, 0.75).unwrap();
        assert!((s - 15.0).abs() < 1e-12 && (t - 0.15).abs() < 1e-12 && (n - 480.0).abs() < 1e-9);
        assert_eq!(first_reach(&curve, 2.5).unwrap().0, 0.0);
        assert!(first_reach(&curve, 0.1).is_none());
    }

    #[test]
    fn quality_compares_batches_with_seed_noise() {
        let clear = [
            (16, vec![0.95, 0.96, 0.955]),
            (512, vec![0.90, 0.905, 0.91]),
        ];
        let q = quality(&clear, true).unwrap();
        assert_eq!((q.best_batch, q.worst_batch), (16, 512));
        assert!(q.exceeds_seed_noise && (q.difference - 0.05).abs() < 1e-9);
        let murky = [(16, vec![0.95, 0.90]), (512, vec![0.93, 0.91])];
        let q = quality(&murky, true).unwrap();
        assert!(!q.exceeds_seed_noise, "{q:?}");
        assert!(quality(&[(16, vec![0.9])], true).is_none());
        // Lower loss is better.
        let q = quality(&[(16, vec![0.2, 0.21]), (64, vec![0.3, 0.31])], false).unwrap();
        assert_eq!(q.best_batch, 16);
    }
}
