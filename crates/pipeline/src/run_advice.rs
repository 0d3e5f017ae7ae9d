//! What `run` concludes from its trials: the gradient noise scale of the
//! user's own training (from the noise measurements the Python helper prints),
//! the recommendation, the time-to-target table and the diagnosis, with the
//! same rules `advise` uses (`batchfit_tune::{noise, advice, target, diagnose}`).

use batchfit_exec::{Outcome, StepReport, TrialResult};
use batchfit_report::probe::DeviceProbe;
use batchfit_report::run::{RunNoise, RunTrial};
use batchfit_tune::advice::{
    DeviceEvidence, LrAdviceInput, MaxBatchSource, NoiseBand, Recommendation, recommend,
};
use batchfit_tune::diagnose::{self, Finding};
use batchfit_tune::lr::LrRule;
use batchfit_tune::noise::{NoiseEstimator, two_batch};
use batchfit_tune::target::{StepsCurve, TimeToTarget, rank};

/// Smoothing of the noise estimates: `noise`'s default for a training run.
const BETA: f64 = 0.95;

/// B_simple of one trial with its 90 % band and the number of measurements.
#[derive(Clone, Copy)]
struct TrialNoise {
    b_simple: f64,
    low: f64,
    high: f64,
    measurements: usize,
}

/// B_simple of one trial's noise measurements, in the order it made them;
/// `None` without a usable estimate.
fn trial_noise(reports: &[StepReport]) -> Option<TrialNoise> {
    let mut est = NoiseEstimator::new(Some(BETA));
    let mut n = 0;
    for r in reports {
        if let Some(m) = r.noise.filter(|m| m.is_valid()) {
            est.push(two_batch(m.b_small, m.g_small_sq, m.b_big, m.g_big_sq));
            n += 1;
        }
    }
    let e = est.estimate()?;
    Some(TrialNoise {
        b_simple: e.b_simple,
        low: e.low,
        high: e.high,
        measurements: n,
    })
}

/// Optimizer steps a trial reported: the highest `step` (steps count from 1,
/// as the helper and the examples number them), at least the lines reported.
fn steps_taken(reports: &[StepReport]) -> usize {
    let highest = reports.iter().filter_map(|r| r.step).max().unwrap_or(0);
    (highest as usize).max(reports.len())
}

/// The noise scale of the trials: each trial that reported noise gets its
/// B_simple; the one with the most measurements (the larger batch on a tie)
/// stands for the command. Its final loss (the mean of its last 10 % of
/// reported losses) is the target, and S_min is S(B) through its steps.
pub fn noise_of(trials: &[RunTrial]) -> (Option<RunNoise>, Option<f64>) {
    let per: Vec<(&TrialResult, TrialNoise)> = trials
        .iter()
        .map(|t| &t.result)
        .filter(|r| r.outcome == Outcome::Ran)
        .filter_map(|r| trial_noise(&r.reports).map(|n| (r, n)))
        .collect();
    let Some(&(best, noise)) = per.iter().max_by_key(|(r, n)| (n.measurements, r.batch)) else {
        return (None, None);
    };
    let losses: Vec<f64> = best
        .reports
        .iter()
        .filter_map(|r| r.loss)
        .filter(|l| l.is_finite())
        .collect();
    let target_loss = (!losses.is_empty()).then(|| {
        let tail = &losses[losses.len() * 9 / 10..];
        tail.iter().sum::<f64>() / tail.len().max(1) as f64
    });
    let steps = steps_taken(&best.reports);
    let s_min = target_loss
        .map(|_| StepsCurve::through(steps as f64, best.batch as f64, noise.b_simple).s_min);
    let mut per_trial: Vec<(u64, f64)> = per.iter().map(|(r, n)| (r.batch, n.b_simple)).collect();
    per_trial.sort_by_key(|p| p.0);
    (
        Some(RunNoise {
            batch: best.batch,
            b_simple: noise.b_simple,
            b_simple_low: noise.low,
            b_simple_high: noise.high.is_finite().then_some(noise.high),
            measurements: noise.measurements,
            steps,
            s_min,
            per_trial,
        }),
        target_loss,
    )
}

/// The advice of a run: as `advise` gives it for one device.
pub struct RunAdvice {
    pub recommendation: Option<Recommendation>,
    pub time_to_target: Vec<TimeToTarget>,
    pub findings: Vec<Finding>,
}

/// The recommendation, the ranked options and the findings for the measured
/// curve `device` and the noise scale, when there is one.
pub fn advise_run(
    device: &DeviceProbe,
    trials: &[RunTrial],
    noise: Option<&RunNoise>,
    rule: LrRule,
) -> RunAdvice {
    let points = crate::advise::step_points(device);
    if points.is_empty() {
        return RunAdvice {
            recommendation: None,
            time_to_target: Vec::new(),
            findings: Vec::new(),
        };
    }
    let b_noise = noise.map(|n| n.b_simple);
    let (rec, options) = recommend(
        &DeviceEvidence {
            device: &device.device,
            points: &points,
            knee_batch: device.knee_batch,
            efficiency: device.efficiency,
            max_batch: device.max_batch,
            max_batch_source: if device.max_batch.is_some() {
                MaxBatchSource::Measured
            } else {
                MaxBatchSource::NotSearched
            },
            noise_hint: "report it from your training loop with the Python helper, docs/run.md",
        },
        noise.map(|n| NoiseBand {
            b_noise: n.b_simple,
            low: n.b_simple_low,
            high: n.b_simple_high,
        }),
        LrAdviceInput {
            rule,
            reference: None,
        },
    );
    let mut findings = Vec::new();
    findings.extend(crate::advise::curve_findings(device, &points, b_noise));
    if let Some(b) = rec.recommended_batch
        && let Some(util) = trials
            .iter()
            .rev()
            .find(|t| t.result.batch == b && t.result.outcome == Outcome::Ran)
            .and_then(|t| t.result.gpu_util_mean_pct)
    {
        findings.extend(diagnose::gpu_idle(util, b, &device.device));
    }
    RunAdvice {
        time_to_target: b_noise
            .map(|bn| rank(&options, bn, noise.and_then(|n| n.s_min)))
            .unwrap_or_default(),
        recommendation: Some(rec),
        findings,
    }
}
