//! What a finished sweep concludes from its runs: the target they are
//! compared at, steps and seconds to it per batch and device, S(B) fitted to
//! them, the noise scale's prediction beside it, and whether the batch changed
//! final quality. Pure: the pipeline trains the runs, this reads their records.

use super::{
    QualityVerdict, RunRecord, RunStatus, StepsFit, first_reach, fit_s_min, fit_steps, mean_std,
    quality,
};
use crate::device::{DeviceSpec, comma_separated};
use crate::lr::LrRule;
use crate::schedule::Schedule;
use crate::target::StepsCurve;
use batchfit_plan::Optimizer;
use serde::{Deserialize, Serialize};

/// What a sweep was asked to do; stored as `sweep.json` in `--out` so a
/// `--resume` can check it continues the same experiment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SweepSettings {
    pub model: String,
    pub data: String,
    /// The devices every run trained on, in the order trained (JSON: one
    /// comma-separated string).
    #[serde(rename = "device", with = "comma_separated", default = "cpu")]
    pub devices: Vec<DeviceSpec>,
    pub train_rows: usize,
    pub val_rows: usize,
    pub val_split: f64,
    pub split_seed: u64,
    pub batches: Vec<u64>,
    pub seeds: Vec<u64>,
    pub optimizer: Optimizer,
    pub lr_rule: LrRule,
    pub ref_batch: u64,
    pub ref_lr: f64,
    /// Batches above this train at its learning rate (null: no cap).
    #[serde(default)]
    pub lr_cap: Option<u64>,
    /// `--schedule`: `ramp` or the schedule file (null: fixed batches only).
    #[serde(default)]
    pub schedule: Option<String>,
    pub warmup_epochs: f64,
    pub target_loss: Option<f64>,
    pub max_epochs: u32,
}

fn cpu() -> Vec<DeviceSpec> {
    vec![DeviceSpec::Cpu]
}

impl SweepSettings {
    /// The device the steps, fits and quality are the runs of.
    pub fn first_device(&self) -> DeviceSpec {
        self.devices.first().copied().unwrap_or(DeviceSpec::Cpu)
    }

    /// The training rows each epoch's batches are drawn from without
    /// replacement, as S(B) counts them ([`crate::target::noise_batch`]).
    pub fn rows_drawn_from(&self) -> Option<crate::target::Rows> {
        crate::target::rows_drawn_from(self.train_rows, self.optimizer)
    }
}

/// One run as the report shows it.
#[derive(Clone, Debug, Serialize)]
pub struct SweepRun {
    /// The device it trained on.
    pub device: DeviceSpec,
    /// Read back from `--out` instead of trained in this invocation.
    pub resumed: bool,
    /// Steps, seconds and samples to the sweep's target (interpolated; measured).
    pub steps_to_target: Option<f64>,
    pub seconds_to_target: Option<f64>,
    pub samples_to_target: Option<f64>,
    pub record: RunRecord,
}

impl SweepRun {
    /// A run as trained (or read back), before the sweep's target is known.
    pub fn new(record: RunRecord, device: DeviceSpec, resumed: bool) -> SweepRun {
        SweepRun {
            device,
            resumed,
            steps_to_target: None,
            seconds_to_target: None,
            samples_to_target: None,
            record,
        }
    }

    /// It did not diverge.
    pub fn finished(&self) -> bool {
        !matches!(self.record.status, RunStatus::Diverged { .. })
    }
}

/// Per batch, over seeds.
#[derive(Clone, Debug, Serialize)]
pub struct BatchSummary {
    pub batch: u64,
    pub lr: f64,
    pub runs: usize,
    pub reached: usize,
    pub diverged: usize,
    /// Mean and standard deviation over the runs that reached the target (measured).
    pub steps_mean: Option<f64>,
    pub steps_std: Option<f64>,
    pub seconds_mean: Option<f64>,
    pub epochs_mean: Option<f64>,
    /// S(B) from the fitted S_min and B_noise, and its error vs measured, percent.
    pub steps_fitted: Option<f64>,
    pub fitted_error_pct: Option<f64>,
    /// S(B) from `noise`'s B_simple (S_min scaled to the runs), and its error.
    pub steps_from_noise: Option<f64>,
    pub noise_error_pct: Option<f64>,
    /// Final validation figures, mean and spread over seeds (measured).
    pub val_loss_mean: Option<f64>,
    pub val_loss_std: Option<f64>,
    pub val_accuracy_mean: Option<f64>,
    pub val_accuracy_std: Option<f64>,
}

/// Seconds to target per batch on one device (measured).
#[derive(Clone, Debug, Serialize)]
pub struct DeviceTimes {
    pub device: DeviceSpec,
    pub per_batch: Vec<DeviceBatchTimes>,
    /// The batch with the fewest mean seconds to target among those every seed reached.
    pub fastest: Option<u64>,
}

/// One batch on one device, over seeds (measured).
#[derive(Clone, Debug, Serialize)]
pub struct DeviceBatchTimes {
    pub batch: u64,
    pub runs: usize,
    pub reached: usize,
    pub steps_mean: Option<f64>,
    pub seconds_mean: Option<f64>,
    pub seconds_std: Option<f64>,
}

/// The noise scale measured on the training split, for comparison.
#[derive(Clone, Debug, Serialize)]
pub struct MeasuredNoise {
    pub b_simple: f64,
    pub low: f64,
    pub high: Option<f64>,
    /// S_min that best scales (1 + B_simple/B) to the measured steps.
    pub s_min: Option<f64>,
}

/// Where the loss every run is compared at comes from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TargetSource {
    /// `--target-loss` (or the advice `--verify` checks).
    Given,
    /// The lowest loss every run that did not diverge reached within `max_epochs`.
    LowestReached { max_epochs: u32 },
}

impl TargetSource {
    /// The machine-readable code.
    pub fn code(self) -> &'static str {
        match self {
            TargetSource::Given => "given",
            TargetSource::LowestReached { .. } => "lowest_reached",
        }
    }
}

impl Serialize for TargetSource {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.code())
    }
}

/// A sweep's runs and what they conclude.
#[derive(Clone, Debug, Serialize)]
pub struct SweepSummary {
    pub settings: SweepSettings,
    /// The target every comparison uses, and where it came from.
    pub target_loss: Option<f64>,
    #[serde(rename = "target_source_code")]
    pub target_source: TargetSource,
    /// The first device's fixed batches, then the other devices', then the schedule's.
    pub runs: Vec<SweepRun>,
    /// Per batch over seeds, on the first device.
    pub per_batch: Vec<BatchSummary>,
    /// Steps and seconds to target on each device.
    pub by_device: Vec<DeviceTimes>,
    /// S_min and B_noise fitted to the measured steps to target.
    pub fit: Option<StepsFit>,
    pub noise: Option<MeasuredNoise>,
    pub quality_loss: Option<QualityVerdict>,
    pub quality_accuracy: Option<QualityVerdict>,
    /// `--verify`: the advice's prediction beside these trainings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verify: Option<crate::verify::VerifyReport>,
    /// `--schedule`: the batch-size schedule trained beside the fixed batches.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schedule: Option<ScheduleSummary>,
    pub seconds: f64,
}

/// The runs of a sweep in training order, as (device, batch or `None` for the
/// schedule, seed): device-major, then seed-major, so an interrupted sweep has
/// whole comparisons across batches (and the schedule, after them), on the
/// first device first.
pub fn run_order(
    settings: &SweepSettings,
    with_schedule: bool,
) -> Vec<(DeviceSpec, Option<u64>, u64)> {
    let mut order = Vec::new();
    for &d in &settings.devices {
        for &s in &settings.seeds {
            order.extend(settings.batches.iter().map(|&b| (d, Some(b), s)));
            if with_schedule {
                order.push((d, None, s));
            }
        }
    }
    order
}

/// Steps of linear warm-up for a run at `batch` above the reference batch:
/// `warmup_epochs` epochs of its steps (none at or below the reference).
pub fn warmup_steps(warmup_epochs: f64, train_rows: usize, batch: u64, ref_batch: u64) -> u64 {
    if batch > ref_batch {
        (warmup_epochs * (train_rows as u64 / batch) as f64).round() as u64
    } else {
        0
    }
}

/// The loss every run is compared at, and where it comes from: `--target-loss`,
/// else the lowest loss every run that did not diverge reached.
pub fn common_target(settings: &SweepSettings, runs: &[&RunRecord]) -> (Option<f64>, TargetSource) {
    match settings.target_loss {
        Some(t) => (Some(t), TargetSource::Given),
        None => {
            let t = runs
                .iter()
                .filter(|r| !matches!(r.status, RunStatus::Diverged { .. }))
                .map(|r| r.curve.iter().map(|p| p.loss).fold(f64::INFINITY, f64::min))
                .fold(f64::NEG_INFINITY, f64::max);
            (
                t.is_finite().then_some(t),
                TargetSource::LowestReached {
                    max_epochs: settings.max_epochs,
                },
            )
        }
    }
}

/// Target, steps to it, fits and the quality verdicts. The steps, fits and
/// quality are the first device's runs'; seconds to target are compared across
/// every device. `noise` is B_simple with its band measured on the training
/// split; `seconds` the sweep's wall time.
pub fn summarize(
    settings: SweepSettings,
    mut runs: Vec<SweepRun>,
    noise: Option<(f64, f64, f64)>,
    seconds: f64,
) -> SweepSummary {
    let first = settings.first_device();
    let records: Vec<&RunRecord> = runs.iter().map(|r| &r.record).collect();
    let (target, source) = common_target(&settings, &records);
    for r in &mut runs {
        if let Some(t) = target
            && r.finished()
            && let Some((steps, seconds, samples)) = first_reach(&r.record.curve, t)
        {
            r.steps_to_target = Some(steps);
            r.seconds_to_target = Some(seconds);
            r.samples_to_target = Some(samples);
        }
    }
    // The schedule's runs share the target; the fits, tables and verdicts are the fixed batches'.
    let (scheduled, runs): (Vec<SweepRun>, Vec<SweepRun>) =
        runs.into_iter().partition(|r| r.record.schedule.is_some());
    let by_device = by_device(&settings, &runs);
    let (runs, others): (Vec<SweepRun>, Vec<SweepRun>) =
        runs.into_iter().partition(|r| r.device == first);
    let points: Vec<(f64, f64)> = runs
        .iter()
        .filter_map(|r| r.steps_to_target.map(|s| (r.record.batch as f64, s)))
        .collect();
    let rows = settings.rows_drawn_from();
    let fit = fit_steps(&points, rows);
    let noise = noise.map(|(b, low, high)| MeasuredNoise {
        b_simple: b,
        low,
        high: high.is_finite().then_some(high),
        s_min: fit_s_min(b, &points, rows),
    });
    let per_batch = per_batch(&settings, &runs, fit.as_ref(), noise.as_ref());
    let groups = |f: fn(&RunRecord) -> Option<f64>| -> Vec<(u64, Vec<f64>)> {
        settings
            .batches
            .iter()
            .map(|&b| {
                (
                    b,
                    runs.iter()
                        .filter(|r| r.record.batch == b)
                        .filter_map(|r| f(&r.record))
                        .collect(),
                )
            })
            .collect()
    };
    let quality_loss = quality(&groups(|r| r.final_val_loss), false);
    let quality_accuracy = quality(&groups(|r| r.final_val_accuracy), true);
    SweepSummary {
        settings,
        target_loss: target,
        target_source: source,
        runs: runs.into_iter().chain(others).chain(scheduled).collect(),
        per_batch,
        by_device,
        fit,
        noise,
        quality_loss,
        quality_accuracy,
        verify: None,
        schedule: None,
        seconds,
    }
}

/// Mean and standard deviation, `None` without values.
fn stat(v: &[f64]) -> (Option<f64>, Option<f64>) {
    if v.is_empty() {
        (None, None)
    } else {
        let (m, s) = mean_std(v);
        (Some(m), Some(s))
    }
}

/// The first device's runs per batch over seeds, beside the fitted and the
/// noise scale's S(B).
fn per_batch(
    settings: &SweepSettings,
    runs: &[SweepRun],
    fit: Option<&StepsFit>,
    noise: Option<&MeasuredNoise>,
) -> Vec<BatchSummary> {
    let steps_per_epoch = |b: u64| (settings.train_rows as u64 / b).max(1) as f64;
    settings
        .batches
        .iter()
        .map(|&b| {
            let of_b: Vec<&SweepRun> = runs.iter().filter(|r| r.record.batch == b).collect();
            let steps: Vec<f64> = of_b.iter().filter_map(|r| r.steps_to_target).collect();
            let (steps_mean, steps_std) = stat(&steps);
            let err = |pred: Option<f64>| pred.zip(steps_mean).map(|(p, m)| 100.0 * (p - m) / m);
            let steps_fitted = fit.map(|f| f.steps(b as f64));
            let steps_from_noise = noise.and_then(|n| {
                n.s_min.map(|s_min| {
                    StepsCurve {
                        s_min,
                        b_noise: n.b_simple,
                        rows: settings.rows_drawn_from(),
                    }
                    .steps(b as f64)
                })
            });
            let of = |f: fn(&RunRecord) -> Option<f64>| -> Vec<f64> {
                of_b.iter().filter_map(|r| f(&r.record)).collect()
            };
            let (val_loss_mean, val_loss_std) = stat(&of(|r| r.final_val_loss));
            let (val_accuracy_mean, val_accuracy_std) = stat(&of(|r| r.final_val_accuracy));
            let seconds: Vec<f64> = of_b.iter().filter_map(|r| r.seconds_to_target).collect();
            BatchSummary {
                batch: b,
                lr: of_b.first().map_or(f64::NAN, |r| r.record.lr),
                runs: of_b.len(),
                reached: steps.len(),
                diverged: of_b.iter().filter(|r| !r.finished()).count(),
                steps_mean,
                steps_std,
                seconds_mean: stat(&seconds).0,
                epochs_mean: steps_mean.map(|s| s / steps_per_epoch(b)),
                steps_fitted,
                fitted_error_pct: err(steps_fitted),
                steps_from_noise,
                noise_error_pct: err(steps_from_noise),
                val_loss_mean,
                val_loss_std,
                val_accuracy_mean,
                val_accuracy_std,
            }
        })
        .collect()
}

/// Steps and seconds to target per batch on each device.
fn by_device(settings: &SweepSettings, runs: &[SweepRun]) -> Vec<DeviceTimes> {
    settings
        .devices
        .iter()
        .map(|&device| {
            let per_batch: Vec<DeviceBatchTimes> = settings
                .batches
                .iter()
                .map(|&batch| {
                    let of: Vec<&SweepRun> = runs
                        .iter()
                        .filter(|r| r.device == device && r.record.batch == batch)
                        .collect();
                    let stat = |v: Vec<f64>| (!v.is_empty()).then(|| mean_std(&v));
                    let steps = stat(of.iter().filter_map(|r| r.steps_to_target).collect());
                    let seconds = stat(of.iter().filter_map(|r| r.seconds_to_target).collect());
                    DeviceBatchTimes {
                        batch,
                        runs: of.len(),
                        reached: of.iter().filter(|r| r.seconds_to_target.is_some()).count(),
                        steps_mean: steps.map(|s| s.0),
                        seconds_mean: seconds.map(|s| s.0),
                        seconds_std: seconds.map(|s| s.1),
                    }
                })
                .collect();
            let fastest = per_batch
                .iter()
                .filter(|b| b.reached == b.runs && b.runs > 0)
                .filter_map(|b| b.seconds_mean.map(|s| (b.batch, s)))
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .map(|(b, _)| b);
            DeviceTimes {
                device,
                per_batch,
                fastest,
            }
        })
        .collect()
}

/// The first device's runs of each batch the summary has, as a verify check
/// reads them.
pub fn measured_for_verify(summary: &SweepSummary) -> Vec<crate::verify::Measured> {
    let first = summary.settings.first_device();
    summary
        .per_batch
        .iter()
        .map(|b| {
            let of: Vec<&SweepRun> = summary
                .runs
                .iter()
                .filter(|r| r.device == first && r.record.batch == b.batch)
                .collect();
            crate::verify::Measured {
                batch: b.batch,
                runs: of.len(),
                steps: of.iter().filter_map(|r| r.steps_to_target).collect(),
                seconds: of.iter().filter_map(|r| r.seconds_to_target).collect(),
            }
        })
        .collect()
}

/// S(B) fitted to a finished sweep's steps to its target (the first device's
/// fixed batches), for `advise --from-sweep`.
#[derive(Clone, Debug)]
pub struct MeasuredSteps {
    pub target_loss: f64,
    pub curve: StepsCurve,
    /// Runs whose steps the fit used, and their batches.
    pub runs: usize,
    pub batches: Vec<u64>,
}

/// Why a finished sweep's steps give no S(B).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum MeasuredStepsError {
    #[error("no finished runs to take steps to a target from")]
    NoTarget,
    #[error(
        "the steps to target of its {0} runs do not follow S(B) = S_min (1 + B_noise/B) (they need two or more batches whose steps fall with the batch no faster than 1/B)"
    )]
    NoFit(usize),
}

/// S(B) through the records of a finished sweep.
pub fn measured_steps(
    settings: &SweepSettings,
    records: &[RunRecord],
) -> Result<MeasuredSteps, MeasuredStepsError> {
    let refs: Vec<&RunRecord> = records.iter().collect();
    let (target, _) = common_target(settings, &refs);
    let target = target.ok_or(MeasuredStepsError::NoTarget)?;
    let points: Vec<(f64, f64)> = records
        .iter()
        .filter(|r| !matches!(r.status, RunStatus::Diverged { .. }))
        .filter_map(|r| first_reach(&r.curve, target).map(|(s, _, _)| (r.batch as f64, s)))
        .collect();
    let curve = fit_steps(&points, settings.rows_drawn_from())
        .ok_or(MeasuredStepsError::NoFit(points.len()))?;
    let mut batches: Vec<u64> = points.iter().map(|p| p.0 as u64).collect();
    batches.sort_unstable();
    batches.dedup();
    Ok(MeasuredSteps {
        target_loss: target,
        curve,
        runs: points.len(),
        batches,
    })
}

/// Where a trained schedule came from.
#[derive(Clone, Debug, PartialEq)]
pub enum ScheduleSource {
    /// The ramp from the noise scale along a noise run on the training split.
    Ramp,
    /// A schedule file, as named.
    File(String),
}

impl ScheduleSource {
    /// The machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            ScheduleSource::Ramp => "ramp",
            ScheduleSource::File(_) => "file",
        }
    }
}

impl Serialize for ScheduleSource {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.code())
    }
}

/// The schedule's runs (first device) beside the fastest fixed batch.
#[derive(Clone, Debug, Serialize)]
pub struct ScheduleSummary {
    /// Where the schedule came from (`source` in words is the report's).
    #[serde(rename = "source_code")]
    pub source: ScheduleSource,
    pub schedule: Schedule,
    /// Updates and samples to the target (predicted from the noise run's
    /// stretches; null when that run did not reach the target).
    pub predicted_steps: Option<f64>,
    pub predicted_samples: Option<f64>,
    /// The noise run's prediction for the fastest fixed batch, for scale.
    pub predicted_steps_best_fixed: Option<f64>,
    pub runs: usize,
    pub reached: usize,
    pub steps_mean: Option<f64>,
    pub steps_std: Option<f64>,
    pub samples_mean: Option<f64>,
    pub seconds_mean: Option<f64>,
    pub seconds_std: Option<f64>,
    /// (predicted - measured) / measured steps, percent.
    pub steps_error_pct: Option<f64>,
    pub val_loss_mean: Option<f64>,
    pub val_accuracy_mean: Option<f64>,
    pub val_accuracy_std: Option<f64>,
    /// The fixed batch with the fewest mean seconds to target (every run reached it).
    pub best_fixed: Option<u64>,
    /// Schedule over that batch: mean seconds and steps, with z = difference
    /// over its standard error (seed to seed).
    pub seconds_ratio: Option<f64>,
    pub seconds_z: Option<f64>,
    pub steps_ratio: Option<f64>,
    pub steps_z: Option<f64>,
    /// Faster than the best fixed batch by more than two standard errors.
    pub beats_best_fixed: bool,
}
