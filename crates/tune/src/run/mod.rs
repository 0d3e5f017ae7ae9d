//! What `run` concludes from the trials of the user's own command: the
//! gradient noise scale of its training (from the noise measurements the
//! Python helper prints), the recommendation, the time-to-target table and the
//! diagnosis, with the same rules `advise` uses ([`crate::advice`],
//! [`crate::target`], [`crate::decide::curve_findings`]).

use crate::advice::{
    DeviceEvidence, LrAdviceInput, MaxBatchSource, NoiseBand, NoiseHint, Recommendation, recommend,
};
use crate::decide::curve_findings;
use crate::diagnose::{self, Finding};
use crate::lr::{LrRule, LrScaling};
use crate::probe::DeviceProbe;
use crate::search::TrialReason;
use crate::stability::{failed_from, unreached_to};
use crate::target::{RateModel, TimeToTarget, rank_at};
use crate::trial::{RunTrial, StepReport, TrialResult};
use serde::{Deserialize, Serialize};

mod noise;
pub use noise::{NOISE_TRIAL_BATCH, RunNoise, noise_of, noise_trial_batch};

/// How `run`'s trials got their learning rate.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum RunRate {
    /// Each trial was handed `scaling.at(batch)`: where the command has
    /// `{lr}` (`in_command`), and as `BATCHFIT_LR`.
    Handed {
        scaling: LrScaling,
        in_command: bool,
    },
    /// The command sets its own rate, one rate at every batch: the
    /// recommendation assumes `assumed_rule`, which such a command does not
    /// follow; the time-to-target table predicts for the fixed rate, the best
    /// at `tuned_at` (`--ref-batch`) where the user said where it was tuned.
    CommandsOwn {
        assumed_rule: LrRule,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tuned_at: Option<u64>,
    },
}

impl RunRate {
    /// The rule the prediction assumes.
    pub fn rule(&self) -> LrRule {
        match self {
            RunRate::Handed { scaling, .. } => scaling.rule,
            RunRate::CommandsOwn { assumed_rule, .. } => *assumed_rule,
        }
    }

    /// How the predicted updates follow the batch: under the rule when each
    /// trial was handed its rate; when the command sets its own, at that one
    /// rate for every batch, taken as the best rate at `tuned_at` (the
    /// user's `--ref-batch`), else at the batch of the trial that measured
    /// the noise (`noise_batch`: there the two counts agree, and the curve
    /// is drawn through that trial's steps).
    pub fn rate_model(&self, noise_batch: Option<u64>) -> RateModel {
        match self {
            RunRate::Handed { .. } => RateModel::Scaled,
            RunRate::CommandsOwn { tuned_at, .. } => RateModel::Fixed {
                best_at: tuned_at.or(noise_batch).unwrap_or(1).max(1) as f64,
            },
        }
    }

    /// The tuned (batch, rate) the rule scales from, when the trials had one.
    pub fn reference(&self) -> Option<(u64, f64)> {
        match self {
            RunRate::Handed { scaling, .. } => Some((scaling.ref_batch, scaling.ref_lr)),
            RunRate::CommandsOwn { .. } => None,
        }
    }
}

/// When a training has reached the target loss, read from the losses its
/// step lines report. Where the command reports the loss on fixed training
/// rows (`train_loss`, the helper's; [`LossTarget::fixed_rows`]) the target
/// is on that loss, as `advise`'s is: the first point of that curve at the
/// target, interpolated between evaluations. Else the mean of the last
/// `window` step losses is at most `target`. `run`'s target is the noise
/// trial's own level on the same statistic: the mean of its evaluations in
/// its last tenth of steps, or of its last tenth of step losses, so a run is
/// held to the statistic that set it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct LossTarget {
    pub target: f64,
    pub window: usize,
    /// The target is on the loss of the fixed training rows.
    pub fixed_rows: bool,
}

impl LossTarget {
    /// The target of a run whose noise trial took `steps` steps to `target`,
    /// on the window of step losses.
    pub fn of_run(target: f64, steps: usize) -> LossTarget {
        LossTarget {
            target,
            window: (steps - steps * 9 / 10).max(1),
            fixed_rows: false,
        }
    }

    /// The same on the fixed rows' loss when `fixed_rows`.
    pub fn on(self, fixed_rows: bool) -> LossTarget {
        LossTarget { fixed_rows, ..self }
    }

    /// Whether the losses so far (in step order) have reached the target.
    pub fn reached(&self, losses: &[f64]) -> bool {
        losses.len() >= self.window
            && losses[losses.len() - self.window..].iter().sum::<f64>() / self.window as f64
                <= self.target
    }

    /// A trial's loss curve (step, loss) on this target's statistic: its
    /// fixed rows' evaluations, or the mean of each window of step losses at
    /// the window's middle step.
    pub fn curve(&self, reports: &[StepReport]) -> Vec<(f64, f64)> {
        if self.fixed_rows {
            fixed_row_losses(reports)
        } else {
            window_means(reports, self.window)
        }
    }

    /// Steps and seconds to the target in a trial's reports: on the fixed
    /// rows, where their loss curve first reaches it (interpolated); else the
    /// first window whose mean is at the target, counted to its middle (a
    /// window's mean is the loss about half a window back). The seconds are
    /// the reported seconds of the steps up to it, the first `warmup` counted
    /// at the median of the rest (a framework's first steps compile and warm
    /// caches once per process: Keras's first takes a second; the predicted
    /// step time leaves them out too). `None` if it was not reached.
    pub fn steps_to(&self, reports: &[StepReport], warmup: usize) -> Option<(f64, f64)> {
        let times: Vec<f64> = rank0(reports).map(|r| r.seconds).collect();
        let at = if self.fixed_rows {
            crate::trajectory::reach(&fixed_row_losses(reports), self.target)?
        } else {
            let losses: Vec<f64> = rank0_losses(reports).map(|s| s.0).collect();
            let end = (self.window..=losses.len()).find(|&n| self.reached(&losses[..n]))?;
            (end - (self.window - 1) / 2) as f64
        };
        let times = &times[..(at.round() as usize).max(1).min(times.len())];
        let seconds = if warmup > 0 && times.len() > warmup {
            let median = crate::stats::summarize(&times[warmup..]).median;
            times[warmup..].iter().sum::<f64>() + warmup as f64 * median
        } else {
            times.iter().sum()
        };
        Some((at, seconds))
    }

    /// Whether the reports so far have reached the target: rank 0's last
    /// fixed-rows evaluation, or [`LossTarget::reached`] on its last
    /// `window` losses, read from the end (a trial checks this at every line
    /// it prints).
    pub fn reached_by(&self, reports: &[StepReport]) -> bool {
        let mut reports = reports.iter().rev().filter(|r| r.rank.unwrap_or(0) == 0);
        if self.fixed_rows {
            return reports
                .find_map(|r| r.train_loss.filter(|l| l.is_finite()))
                .is_some_and(|l| l <= self.target);
        }
        let last: Vec<f64> = reports
            .filter_map(|r| r.loss.filter(|l| l.is_finite()))
            .take(self.window)
            .collect();
        self.reached(&last)
    }
}

/// Rank 0's lines.
fn rank0(reports: &[StepReport]) -> impl Iterator<Item = &StepReport> + '_ {
    reports.iter().filter(|r| r.rank.unwrap_or(0) == 0)
}

/// (loss, seconds) of the steps rank 0 reported a finite loss for, in order.
pub(crate) fn rank0_losses(reports: &[StepReport]) -> impl Iterator<Item = (f64, f64)> + '_ {
    rank0(reports).filter_map(|r| r.loss.filter(|l| l.is_finite()).map(|l| (l, r.seconds)))
}

/// Rank 0's evaluations of the loss on fixed training rows: (step, loss), a
/// line without `step` counted by its position.
pub(crate) fn fixed_row_losses(reports: &[StepReport]) -> Vec<(f64, f64)> {
    rank0(reports)
        .enumerate()
        .filter_map(|(i, r)| {
            let l = r.train_loss.filter(|l| l.is_finite())?;
            Some((r.step.unwrap_or(i as u64 + 1) as f64, l))
        })
        .collect()
}

/// The mean of each window of `window` consecutive losses rank 0 reported,
/// at the window's middle step (as [`LossTarget::steps_to`] counts it). A
/// step's own loss is one batch's and noisy; the window's mean is the
/// statistic the target is set and checked with.
pub(crate) fn window_means(reports: &[StepReport], window: usize) -> Vec<(f64, f64)> {
    let losses: Vec<f64> = rank0_losses(reports).map(|l| l.0).collect();
    if window == 0 || losses.len() < window {
        return Vec::new();
    }
    let mut sum: f64 = losses[..window].iter().sum();
    let mut out = Vec::with_capacity(losses.len() - window + 1);
    for end in window..=losses.len() {
        if end > window {
            sum += losses[end - 1] - losses[end - 1 - window];
        }
        out.push(((end - (window - 1) / 2) as f64, sum / window as f64));
    }
    out
}

/// The advice of a run: as `advise` gives it for one device.
#[derive(Clone, Debug)]
pub struct RunAdvice {
    pub recommendation: Option<Recommendation>,
    pub time_to_target: Vec<TimeToTarget>,
    pub findings: Vec<Finding>,
}

/// The recommendation, the ranked options and the findings for the measured
/// curve `device` and the noise scale, when there is one. `limit_found`: a
/// trial ran out of memory above `device.max_batch`, so it is the limit; else
/// it is only the largest batch tried.
pub fn advise_run(
    device: &DeviceProbe,
    limit_found: bool,
    trials: &[RunTrial],
    noise: Option<&RunNoise>,
    rate: &RunRate,
) -> RunAdvice {
    let points = device.step_points();
    // Time to target is a total: one update at the mean of its trial's steps
    // (slow steps count), as `advise` reads its probe and as `run --verify`
    // sums a training's steps; the median stays the curve's (knee, findings).
    let updates = device.update_points(&|_| None);
    if points.is_empty() {
        return RunAdvice {
            recommendation: None,
            time_to_target: Vec::new(),
            findings: Vec::new(),
        };
    }
    let b_noise = noise.map(|n| n.b_noise);
    let (rec, options) = recommend(
        &DeviceEvidence {
            device: device.device,
            points: &updates,
            knee_batch: device.knee_batch,
            efficiency: device.efficiency,
            max_batch: device.max_batch,
            max_batch_source: match device.max_batch {
                Some(_) if limit_found => MaxBatchSource::Measured,
                Some(_) => MaxBatchSource::LargestTried,
                None => MaxBatchSource::NotSearched,
            },
            noise_hint: NoiseHint::PythonHelper,
            rate_failed_from: noise.and_then(|n| failed_from(&n.checks)),
            rate_unreached_to: noise.and_then(|n| unreached_to(&n.checks)),
            rows: noise.and_then(|n| n.data_rows),
        },
        noise.map(|n| NoiseBand {
            b_noise: n.b_noise,
            low: n.b_noise_low,
            high: n.b_noise_high,
        }),
        LrAdviceInput {
            rule: rate.rule(),
            reference: rate.reference(),
        },
    );
    let mut findings = curve_findings(device, &points, b_noise, noise.and_then(|n| n.data_rows));
    if let Some(b) = rec.recommended_batch
        && let Some(util) = trials
            .iter()
            .rev()
            .filter(|t| t.reason != TrialReason::Noise)
            .find(|t| t.result.batch == b && t.result.outcome.ran())
            .and_then(|t| t.result.gpu_util_mean_pct)
    {
        findings.extend(diagnose::gpu_idle(util, b, device.device));
    }
    let model = rate.rate_model(noise.map(|n| n.batch));
    let mut time_to_target: Vec<TimeToTarget> = b_noise
        .map(|bn| {
            let rows = noise.and_then(|n| n.data_rows);
            rank_at(&options, bn, noise.and_then(|n| n.s_min), rows, model)
        })
        .unwrap_or_default();
    if let RunRate::Handed { scaling, .. } = rate {
        for t in &mut time_to_target {
            t.learning_rate = Some(scaling.at(t.option.effective_batch()));
        }
    }
    RunAdvice {
        time_to_target,
        recommendation: Some(rec),
        findings,
    }
}

/// Everything `run` measured and concluded.
#[derive(Clone, Debug)]
pub struct RunSummary {
    /// The command as given, with its `{batch}` placeholder.
    pub command: String,
    /// What was run under `--launcher`: the launcher around the command.
    pub launch_command: Option<String>,
    /// Data-parallel workers (1 without a launcher); `batch` is per worker.
    pub world_size: u32,
    /// The same shape as `probe`'s (where the command ran).
    pub device: DeviceProbe,
    /// Every trial in the order it ran.
    pub trials: Vec<RunTrial>,
    /// Largest batch that ran (measured), exact when `smallest_failure` = it + 1.
    pub max_batch: Option<u64>,
    /// Smallest batch that ran out of memory (measured).
    pub smallest_failure: Option<u64>,
    /// A crash or time-out that stopped the search, if one did.
    pub stopped_at: Option<u64>,
    /// The search reached --max-batch still running.
    pub capped: bool,
    /// Trials the max-batch search took (knee refinements not counted).
    pub search_trials: usize,
    /// `--memory-limit`: each process of a trial could map at most this (RLIMIT_AS).
    pub memory_limit_bytes: Option<batchfit_plan::Bytes>,
    /// `--margin`: the largest batch leaving that share of the limit free (predicted).
    pub batch_with_margin: Option<u64>,
    pub seconds: f64,
    /// The gradient noise scale of the command's own training, when it reported one.
    pub noise: Option<RunNoise>,
    pub advice: RunAdvice,
    /// The loss the noise trial reached; seconds are predicted for it.
    pub target_loss: Option<f64>,
    /// How the trials' learning rate was set.
    pub learning_rate: RunRate,
}

/// The largest batch that leaves `margin` of the memory free: on the line
/// through the measured peaks of the two largest batches that ran when a limit
/// was given, else `max_batch` shrunk by the margin.
pub fn batch_with_margin(
    trials: &[RunTrial],
    limit: Option<batchfit_plan::Bytes>,
    max: u64,
    margin: f64,
) -> u64 {
    let mut peaks: Vec<(u64, f64)> = trials
        .iter()
        // The noise trial keeps more gradients than the command's own step.
        .filter(|t| t.result.outcome.ran() && t.reason != TrialReason::Noise)
        .filter_map(|t| {
            let r = &t.result;
            r.peak_vm_bytes
                .or(r.peak_host_bytes)
                .map(|p| (r.batch, p as f64))
        })
        .collect();
    peaks.sort_by_key(|p| p.0);
    peaks.dedup_by_key(|p| p.0);
    let fitted = match (limit, peaks.as_slice()) {
        (Some(l), [.., a, b]) => crate::search::Line::through(*a, *b)
            .map(|line| line.max_batch(batchfit_plan::Bytes((l.as_f64() * (1.0 - margin)) as u64))),
        _ => None,
    };
    fitted
        .unwrap_or(((max as f64) * (1.0 - margin)).floor() as u64)
        .clamp(1, max)
}

/// One trial of a user's command as a point of the throughput curve.
pub fn trial_point(r: &TrialResult) -> crate::probe::ProbePoint {
    use crate::probe::ProbePoint;
    use batchfit_plan::Bytes;
    match &r.steps {
        Some(s) if r.outcome.ran() => {
            let mut p = ProbePoint::measured(
                r.batch,
                &s.step_time,
                r.peak_gpu_bytes.or(r.peak_host_bytes),
                r.peak_host_bytes,
                None,
            );
            // Commands report samples per step; they may differ from the batch.
            p.samples_per_s = s.samples_per_s;
            p
        }
        None if r.outcome.ran() => ProbePoint::untimed(
            r.batch,
            r.peak_gpu_bytes.or(r.peak_host_bytes).map(Bytes),
            r.peak_host_bytes.map(Bytes),
        ),
        _ => ProbePoint::ended(r.batch, None, &r.outcome),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(loss: f64) -> StepReport {
        StepReport {
            step: None,
            samples: None,
            seconds: 0.01,
            loss: Some(loss),
            train_loss: None,
            noise: None,
            rank: None,
        }
    }

    fn slow_seconds(t: &LossTarget, reports: &[StepReport], warmup: usize) -> f64 {
        t.steps_to(reports, warmup).unwrap().1
    }

    /// A loss falling by 0.1 a step from 2.0, target 1.0 over windows of 5:
    /// the mean of steps 9-13 (1.2 .. 0.8) is 1.0 first, at step 13; its
    /// middle is step 11, where the loss itself is 1.0.
    #[test]
    fn the_target_is_reached_where_a_window_of_losses_is_at_it() {
        let reports: Vec<StepReport> = (0..30).map(|i| report(2.0 - 0.1 * i as f64)).collect();
        let t = LossTarget {
            target: 1.0 + 1e-9,
            window: 5,
            fixed_rows: false,
        };
        let (steps, seconds) = t.steps_to(&reports, 0).unwrap();
        assert_eq!(steps, 11.0);
        assert!((seconds - 0.11).abs() < 1e-12);
        // A first step 100x slower (a graph compiled) counts as a typical one.
        let mut slow = reports.clone();
        slow[0].seconds = 1.0;
        assert!((slow_seconds(&t, &slow, 1) - 0.11).abs() < 1e-12);
        assert!((slow_seconds(&t, &slow, 0) - 1.10).abs() < 1e-12);
        assert!(t.reached(&[1.2, 1.1, 1.0, 0.9, 0.8]));
        assert!(!t.reached(&[1.0, 0.9]));
        let never = LossTarget {
            target: -1.0,
            window: 5,
            fixed_rows: false,
        };
        assert_eq!(never.steps_to(&reports, 0), None);
        // 200 steps: the last 20 set the target, so 20 make the window.
        assert_eq!(LossTarget::of_run(0.3, 200).window, 20);
    }

    /// On the fixed rows' loss the target is where that curve first reaches
    /// it, interpolated between evaluations; the step losses (noisier, with
    /// dropout on) play no part, and the seconds count the steps up to it.
    #[test]
    fn on_fixed_rows_the_evaluated_curve_decides() {
        // Evaluations after steps 1, 2, 4, 8, 16 of 1.0 / step; step losses 5.
        let reports: Vec<StepReport> = (1..=20u64)
            .map(|i| StepReport {
                step: Some(i),
                train_loss: i.is_power_of_two().then(|| 1.0 / i as f64),
                ..report(5.0)
            })
            .collect();
        let t = LossTarget::of_run(0.1875, 20).on(true);
        // 0.25 at 4, 0.125 at 8: 0.1875 halfway, at step 6.
        let (steps, seconds) = t.steps_to(&reports, 0).unwrap();
        assert!((steps - 6.0).abs() < 1e-12, "{steps}");
        assert!((seconds - 0.06).abs() < 1e-12, "{seconds}");
        assert_eq!(t.curve(&reports).len(), 5);
        assert!(t.reached_by(&reports));
        assert!(
            !t.reached_by(&reports[..7]),
            "the last evaluation, at 4, is 0.25"
        );
        assert!(t.reached_by(&reports[..8]));
        // The same target on the step losses is never reached.
        assert_eq!(LossTarget::of_run(0.1875, 20).steps_to(&reports, 0), None);
    }
}
