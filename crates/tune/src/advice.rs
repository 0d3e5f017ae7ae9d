//! The recommendation for one device, from its measured throughput curve, its
//! largest batch and the noise scale: which batch, why, with which learning
//! rate, and with gradient accumulation where memory caps the batch below the
//! critical batch. Pure: it takes measurements, never runs anything.

use crate::device::DeviceSpec;
use crate::diagnose::StepPoint;
use crate::lr::{LrRule, scale};
use crate::step_times::{REPEATABILITY, local_line, smoothed};
pub use crate::step_times::{smoothed_step_times, step_time_line};
use crate::target::{Rows, TrainingOption, critical_batch_on, updates_vs_min_on};
use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};

/// Where a device's largest batch comes from. JSON writes it as
/// `max_batch_source` (the label reports print) and `max_batch_source_code`,
/// flattened into its recommendation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaxBatchSource {
    /// Measured by the max-batch search under `--memory-limit`.
    Measured,
    /// The plan's limit for this machine's RAM (CPU).
    PredictedForRam,
    /// Unknown: nothing bounded it.
    NotSearched,
    /// The largest batch `run` tried, none of which ran out of memory: a
    /// lower bound, not a limit, so nothing is accumulated for it.
    LargestTried,
}

impl MaxBatchSource {
    /// How reports (and earlier JSON documents) say it.
    pub fn label(self) -> &'static str {
        match self {
            MaxBatchSource::Measured => "measured",
            MaxBatchSource::PredictedForRam => "predicted for this machine's RAM",
            MaxBatchSource::NotSearched => "not searched: give --memory-limit",
            MaxBatchSource::LargestTried => "the largest tried; none ran out of memory",
        }
    }

    /// The machine-readable code.
    pub fn code(self) -> &'static str {
        match self {
            MaxBatchSource::Measured => "measured",
            MaxBatchSource::PredictedForRam => "predicted_for_ram",
            MaxBatchSource::NotSearched => "not_searched",
            MaxBatchSource::LargestTried => "largest_tried",
        }
    }
}

impl Serialize for MaxBatchSource {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry("max_batch_source", self.label())?;
        m.serialize_entry("max_batch_source_code", self.code())?;
        m.end()
    }
}

/// Why a batch is recommended (the report says it in words).
#[derive(Clone, Debug, PartialEq)]
pub enum Reason {
    /// The lowest predicted time to target, (1 + B_noise/B) x step time, within
    /// the measurement's noise.
    TimeToTarget {
        /// The batches that cannot be told apart, ascending.
        tied: Vec<u64>,
        band: NoiseBand,
        /// The fastest point estimate: its batch and measured step.
        fastest_batch: u64,
        fastest_step_s: f64,
        /// The line `(fixed, per_sample)` in seconds whose step times the tie
        /// was judged on, where it replaced the single medians
        /// ([`crate::step_times::smoothed_step_times`]); `None`: the medians.
        step_line: Option<(f64, f64)>,
        /// How the tie was broken.
        tie_break: TieBreak,
    },
    /// Without a noise scale: the knee, the smallest batch reaching `efficiency`
    /// of the best measured throughput.
    Knee { efficiency: f64, hint: NoiseHint },
    /// No batch size could be measured.
    NothingMeasured,
}

impl Reason {
    /// The machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            Reason::TimeToTarget { .. } => "time_to_target",
            Reason::Knee { .. } => "knee",
            Reason::NothingMeasured => "nothing_measured",
        }
    }
}

impl Serialize for Reason {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.code())
    }
}

/// How the user gets the noise scale, said when there is none.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum NoiseHint {
    /// `advise` without `--data`.
    GiveData,
    /// `run` of a command that reported none.
    PythonHelper,
    /// A noise run on the data that gave no noise scale.
    NoneFromTheRun,
    /// A noise run whose loss ended no lower than ignoring the inputs would
    /// ([`crate::decide::Learning`]).
    NotLearning { run_loss: f64, prior_loss: f64 },
}

/// What to do on one device.
#[derive(Clone, Debug, Serialize)]
pub struct Recommendation {
    pub device: DeviceSpec,
    /// Largest batch that fits, and whether it was measured or predicted by the plan.
    pub max_batch: Option<u64>,
    #[serde(flatten)]
    pub max_batch_source: MaxBatchSource,
    pub knee_batch: Option<u64>,
    pub recommended_batch: Option<u64>,
    /// Why this batch (`reason` in words is the report's).
    #[serde(rename = "reason_code")]
    pub reason: Reason,
    /// Learning rate for the recommended batch, when a reference was given.
    pub learning_rate: Option<f64>,
    /// The rule the rate follows (`learning_rate_rule` in words is the report's).
    #[serde(rename = "learning_rate_rule_code")]
    pub lr_rule: LrRule,
    /// Gradient accumulation when memory caps the batch below the critical batch.
    pub accumulation: Option<Accumulation>,
    /// The batches whose predicted time to target cannot be told apart from the
    /// fastest, given the step times' errors and B_noise's band: the one
    /// recommended first (see [`TIE_BREAK`]), then the others ascending.
    pub tied_batches: Vec<u64>,
}

/// How the recommended batch was picked from a tie ([`TIE_BREAK`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TieBreak {
    /// The tied batch nearest the optimum B* of the fitted step-time line.
    Optimum(f64),
    /// The line's optimum B* pointed at a tied batch that the measured step
    /// times put slower than this one beyond both their errors.
    Measured { optimum: f64 },
    /// B_noise's band moves the line's optimum B* (`low`..`high`) across the
    /// geometric midpoint of the two tied powers of two around it, so the
    /// line cannot say which is nearer: the one of the two whose measured
    /// step time gives the lower time to target.
    Midpoint {
        optimum: f64,
        low: f64,
        high: Option<f64>,
    },
    /// No line fits the step times around the tie: the tied batch (among
    /// the tied powers of two and full batch where there are any) whose measured step time
    /// gives the lowest time to target.
    MeasuredFastest,
    /// No line, and a tied batch not measured: the smallest tied batch.
    Smallest,
}

/// How a recommendation picks among batches that tie (none is measurably
/// faster to the target): the one nearest the optimum of the curve fitted to
/// all measured step times, B* = sqrt(B_noise x fixed / per_sample), which a
/// second run reproduces because it rests on every point rather than on which
/// single point measured fastest; among the tied powers of two and the full batch
/// where there are any (the ladder every run measures; the batches refined between them
/// vary from run to run); unless the measured step times themselves put
/// another tied power of two faster beyond both errors (a line drawn through
/// a floor and a rise, under wide between-process errors, can put its
/// optimum where no measurement does); where B_noise's band moves the
/// optimum across the midpoint of the tied powers of two around it, the one
/// of those two the measured step times put faster; without a fitted curve
/// (step times that bend at a hinge), the one of the tied powers of two the
/// measured step times put fastest.
pub const TIE_BREAK: &str = "of the batches whose predicted time to target cannot be told apart from the fastest (step-time errors and B_noise's 90 % band), the one nearest the fitted curve's optimum (sqrt(B_noise x fixed / per_sample) on unlimited data), among the tied powers of two and full batch where there are any, unless the measured step times put another of those faster beyond both their errors (then that one); where B_noise's band moves the optimum across the midpoint of the two tied powers of two around it, the one of those two the measured step times put faster; without a fitted curve, the one of the tied powers of two and full batch (where any) the measured step times put fastest";

/// The tied batch nearest `optimum` (in ratio), of `ladder` ([`ladder_of`]:
/// the tied powers of two and full batch): those are measured in every run,
/// the batches refined between them vary with the run's timings, so a tie
/// broken among those would name a different batch when asked twice.
fn nearest_tied(ladder: &[u64], optimum: f64) -> Option<u64> {
    let distance = |b: u64| (b as f64 / optimum).ln().abs();
    ladder
        .iter()
        .copied()
        .min_by(|&a, &b| distance(a).total_cmp(&distance(b)))
}

/// The batch where S(B) / S_min x (fixed + per_sample B), the time to target
/// of a step-time line, is least. SGD on N rows, (1 + B_noise (1/B - 1/N)):
/// B* = sqrt(B_noise fixed / (per_sample (1 - B_noise/N))), and where
/// B_noise reaches N the time falls all the way to a full batch: B* = N.
/// sqrt(B_noise fixed / per_sample) on unlimited data. Adam's form on N rows
/// ([`crate::target::noise_batch`]) has no closed form: the least of a
/// log-spaced grid from 1 to N, where the time first stops falling (else N).
/// Its noise term falls steeply into N (a full batch has no noise), so the
/// time can dip again at N below the minimum before it; which of the two is
/// lower turns on a few percent of the fitted line, and the tie-break would
/// swing between them from run to run. The first minimum is SGD's B*'s
/// counterpart; a full batch is B* where the time falls all the way to it.
fn optimum_batch(b_noise: f64, fixed: f64, per_sample: f64, rows: Option<Rows>) -> f64 {
    match rows {
        Some(Rows { n, adaptive: true }) => {
            const GRID: usize = 2000;
            let time = |b: f64| updates_vs_min_on(b_noise, b, rows) * (fixed + per_sample * b);
            let grid: Vec<f64> = (0..=GRID).map(|i| n.powf(i as f64 / GRID as f64)).collect();
            grid.windows(2)
                .find(|w| time(w[1]) > time(w[0]))
                .map_or(n, |w| w[0])
        }
        Some(Rows { n, adaptive: false }) if b_noise >= n => n,
        Some(Rows { n, adaptive: false }) => {
            (b_noise * fixed / (per_sample * (1.0 - b_noise / n))).sqrt()
        }
        None => (b_noise * fixed / per_sample).sqrt(),
    }
}

/// The tied batches of the ladder every run measures: the powers of two and
/// the full batch (`full`, the training rows, the ladder's top where the data
/// is smaller than it), or every tied batch where none is one.
fn ladder_of(tied: &[u64], full: Option<u64>) -> Vec<u64> {
    let ladder: Vec<u64> = tied
        .iter()
        .copied()
        .filter(|&b| b.is_power_of_two() || Some(b) == full)
        .collect();
    if ladder.is_empty() {
        tied.to_vec()
    } else {
        ladder
    }
}

/// The tied batch (among the tied powers of two and full batch where there are any) whose
/// measured time to target at B_noise, (1 + B_noise/B) x step, is lowest,
/// when it is lower than `near`'s beyond both step times' errors (the ratio's
/// upper one-sided 95 % bound below 1); `None` when no measurement
/// contradicts `near`.
fn measured_faster(
    points: &[StepPoint],
    ladder: &[u64],
    near: u64,
    b_noise: f64,
    rows: Option<Rows>,
) -> Option<u64> {
    let point = |b: u64| points.iter().find(|q| q.batch == b);
    let time = |q: &StepPoint| updates_vs_min_on(b_noise, q.batch as f64, rows) * q.step_s;
    let err = |q: &StepPoint| {
        if q.rel_err.is_finite() {
            q.rel_err.max(REPEATABILITY)
        } else {
            1.0
        }
    };
    let at_near = point(near)?;
    ladder
        .iter()
        .filter_map(|&b| point(b))
        .filter(|q| {
            let ratio = time(q) / time(at_near);
            let e = (err(q).powi(2) + err(at_near).powi(2)).sqrt();
            ratio * (1.0 + Z * e) < 1.0
        })
        .min_by(|a, b| time(a).total_cmp(&time(b)))
        .map(|q| q.batch)
}

/// The two tied batches (among the tied powers of two and full batch where there are any)
/// on either side of `optimum`, when the optimum's band (`low`..`high`,
/// `None`: unbounded) holds their geometric midpoint: which of the two the
/// optimum is nearer to is then down to where in its band B_noise is.
fn straddled(ladder: &[u64], optimum: f64, low: f64, high: Option<f64>) -> Option<(u64, u64)> {
    let below = ladder
        .iter()
        .copied()
        .filter(|&b| b as f64 <= optimum)
        .max()?;
    let above = ladder
        .iter()
        .copied()
        .filter(|&b| b as f64 > optimum)
        .min()?;
    let midpoint = (below as f64 * above as f64).sqrt();
    (low <= midpoint && high.is_none_or(|h| midpoint <= h)).then_some((below, above))
}

/// Of `batches`, the one whose measured step time gives the lowest time to
/// target at B_noise (the first of equals); `None` where one was not measured.
fn measured_fastest_of(
    points: &[StepPoint],
    batches: &[u64],
    b_noise: f64,
    rows: Option<Rows>,
) -> Option<u64> {
    let time = |b: u64| {
        points
            .iter()
            .find(|q| q.batch == b)
            .map(|q| updates_vs_min_on(b_noise, b as f64, rows) * q.step_s)
    };
    let times: Option<Vec<(u64, f64)>> = batches.iter().map(|&b| Some((b, time(b)?))).collect();
    times?
        .into_iter()
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(b, _)| b)
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
    pub device: DeviceSpec,
    /// Measured (batch, median step seconds) of the batches that ran.
    pub points: &'a [StepPoint],
    pub knee_batch: Option<u64>,
    /// The share of the best throughput that defines the knee.
    pub efficiency: f64,
    pub max_batch: Option<u64>,
    pub max_batch_source: MaxBatchSource,
    /// How the user gets the noise scale, said when there is none.
    pub noise_hint: NoiseHint,
    /// The smallest batch at which no rate tried made the predicted progress
    /// on the data ([`crate::stability`]): only smaller batches are recommended.
    pub rate_failed_from: Option<u64>,
    /// The largest batch whose check did not reach the target, slower than
    /// predicted ([`crate::stability::unreached_to`]): only larger batches
    /// are recommended.
    pub rate_unreached_to: Option<u64>,
    /// The training rows each epoch's batches are drawn from without
    /// replacement ([`noise_batch`](crate::target::noise_batch)); `None`: unlimited (a user's script that
    /// does not say).
    pub rows: Option<Rows>,
}

/// The noise scale with its 90 % band.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct NoiseBand {
    pub b_noise: f64,
    pub low: f64,
    /// `None`: unbounded above.
    pub high: Option<f64>,
}

impl NoiseBand {
    /// A noise scale known exactly (tests, or a band not measured).
    pub fn exact(b_noise: f64) -> NoiseBand {
        NoiseBand {
            b_noise,
            low: b_noise,
            high: Some(b_noise),
        }
    }
}

/// One-sided 95 % normal quantile: a ratio counts as a tie while its lower
/// 95 % bound (step-time errors combined) does not exceed 1.
const Z: f64 = 1.645;

/// B_noise values across its band at which the tie is judged: the fastest
/// batch moves with B_noise, so a batch that is fastest only inside the band
/// (not at its ends or centre) would be missed by fewer; 16 steps put
/// neighbours 10 % apart over a band of 5x.
const BAND_STEPS: usize = 16;

/// The batches whose predicted time to target cannot be told apart from the
/// fastest: for B_noise anywhere in its band (its centre and `BAND_STEPS`
/// ratio steps from end to end; an open band ends at 4x its centre), a batch
/// ties when its time ratio to that B_noise's fastest option, less Z
/// standard errors of the two measured step times, is not above 1. Each
/// error is at least `REPEATABILITY`: the ratio of two step times moves
/// between runs by more than one run's repeats show (digits, 256 against
/// 128: 1.69 to 1.76 in five runs); where the probe measured how far two
/// processes stray, the errors include that already
/// ([`crate::probe::DeviceProbe::step_points`]). Ascending.
pub fn tied_batches(options: &[(u64, f64, f64)], band: NoiseBand, rows: Option<Rows>) -> Vec<u64> {
    let rel = |e: f64| {
        if e.is_finite() {
            e.clamp(REPEATABILITY, 1.0)
        } else {
            1.0
        }
    };
    let low = band.low.max(1e-9).min(band.b_noise);
    let high = band.high.unwrap_or(band.b_noise * 4.0).max(band.b_noise);
    let across = (0..=BAND_STEPS).map(|i| low * (high / low).powf(i as f64 / BAND_STEPS as f64));
    let mut tied: Vec<u64> = Vec::new();
    for bn in across.chain([band.b_noise]) {
        let time = |o: &(u64, f64, f64)| updates_vs_min_on(bn, o.0 as f64, rows) * o.1;
        let Some(best) = options.iter().min_by(|a, b| time(a).total_cmp(&time(b))) else {
            return tied;
        };
        for o in options {
            let ratio = time(o) / time(best);
            let err = (rel(o.2).powi(2) + rel(best.2).powi(2)).sqrt();
            if ratio * (1.0 - Z * err) <= 1.0 && !tied.contains(&o.0) {
                tied.push(o.0);
            }
        }
    }
    tied.sort_unstable();
    tied
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
/// accumulation option when memory caps the batch below the critical batch,
/// [`critical_batch_on`]).
///
/// With a noise scale, the batch with the lowest predicted time to target,
/// (1 + B_noise/B) x step time; without one, the knee.
pub fn recommend(
    e: &DeviceEvidence,
    noise: Option<NoiseBand>,
    lr: LrAdviceInput,
) -> (Recommendation, Vec<TrainingOption>) {
    let b_noise = noise.map(|n| n.b_noise);
    let fits = |b: u64| e.max_batch.is_none_or(|m| b <= m);
    let mut options: Vec<TrainingOption> = e
        .points
        .iter()
        .filter(|q| fits(q.batch))
        .map(|q| TrainingOption {
            device: e.device,
            micro_batch: q.batch,
            accumulation: 1,
            micro_step_s: q.step_s,
        })
        .collect();
    let mut tied = Vec::new();
    let (recommended, reason) = match noise {
        Some(band) => {
            let bn = band.b_noise;
            let candidate = |b: u64| {
                fits(b)
                    && e.rate_failed_from.is_none_or(|f| b < f)
                    && e.rate_unreached_to.is_none_or(|u| b > u)
            };
            let fitting: Vec<StepPoint> = e
                .points
                .iter()
                .filter(|q| candidate(q.batch))
                .copied()
                .collect();
            let (times, line) = smoothed(&fitting);
            tied = tied_batches(&times, band, e.rows);
            // Within the tie, the batch nearest the optimum of the fitted curve,
            // (1 + B_noise/B)(fixed + per_sample B): B* = sqrt(B_noise fixed / per_sample).
            // Where the whole curve is not a line (per-step overheads at tiny
            // batches bend it), the line through the tied batches' neighbourhood.
            let fitted_line = line
                .or_else(|| local_line(&fitting, &tied))
                .filter(|(f, p)| *f > 0.0 && *p > 0.0);
            let optimum_at =
                |b_noise: f64| fitted_line.map(|(f, p)| optimum_batch(b_noise, f, p, e.rows));
            let optimum = optimum_at(bn);
            let ladder = ladder_of(&tied, e.rows.map(|r| r.n as u64));
            let mut tie_break = TieBreak::Smallest;
            if let Some((opt, near)) =
                optimum.and_then(|opt| nearest_tied(&ladder, opt).map(|near| (opt, near)))
            {
                // B* moves with B_noise across its band (as its square root
                // on unlimited data).
                let (low, high) = (
                    optimum_at(band.low).unwrap_or(opt),
                    band.high.and_then(optimum_at),
                );
                let midpoint = straddled(&ladder, opt, low, high)
                    .and_then(|(a, b)| measured_fastest_of(&fitting, &[a, b], bn, e.rows));
                let named = match (
                    measured_faster(&fitting, &ladder, near, bn, e.rows),
                    midpoint,
                ) {
                    (Some(faster), _) => {
                        tie_break = TieBreak::Measured { optimum: opt };
                        faster
                    }
                    (None, Some(side)) => {
                        tie_break = TieBreak::Midpoint {
                            optimum: opt,
                            low,
                            high,
                        };
                        side
                    }
                    (None, None) => {
                        tie_break = TieBreak::Optimum(opt);
                        near
                    }
                };
                tied.retain(|&b| b != named);
                tied.insert(0, named);
            } else if let Some(named) = measured_fastest_of(&fitting, &ladder, bn, e.rows) {
                // No line around the tie (a hinge in the step times): the
                // measurements themselves. Where step time is flat up to a
                // hinge the largest batch before it is fastest, and the
                // smallest of the tie the slowest.
                tie_break = TieBreak::MeasuredFastest;
                tied.retain(|&b| b != named);
                tied.insert(0, named);
            }
            let time = |o: &TrainingOption| {
                updates_vs_min_on(bn, o.micro_batch as f64, e.rows) * o.micro_step_s
            };
            let fastest = options
                .iter()
                .filter(|o| candidate(o.micro_batch))
                .min_by(|a, b| time(a).total_cmp(&time(b)));
            match (tied.first(), fastest) {
                (Some(&b), Some(f)) => (
                    Some(b),
                    Reason::TimeToTarget {
                        tied: {
                            let mut all = tied.clone();
                            all.sort_unstable();
                            all
                        },
                        band,
                        fastest_batch: f.micro_batch,
                        fastest_step_s: f.micro_step_s,
                        step_line: line,
                        tie_break,
                    },
                ),
                _ => (None, Reason::NothingMeasured),
            }
        }
        None => (
            e.knee_batch,
            Reason::Knee {
                efficiency: e.efficiency,
                hint: e.noise_hint,
            },
        ),
    };
    // Accumulation where memory caps the batch below the critical batch; the
    // largest batch a user listed is not a cap (it may well have room above).
    let capped_by_memory = e.max_batch_source != MaxBatchSource::LargestTried;
    // The critical batch counts a finite data set's rows: on N rows the
    // update that is as noisy as B_noise with replacement is B_noise N / (N + B_noise).
    let critical = b_noise.map(|bn| critical_batch_on(bn, e.rows));
    let accumulation = match (critical, e.max_batch) {
        (Some(bc), Some(m)) if capped_by_memory && (m as f64) < bc => e
            .points
            .iter()
            .filter(|q| q.batch <= m)
            .max_by_key(|q| q.batch)
            .map(|q| {
                let steps = (bc / q.batch as f64).ceil().max(2.0) as u64;
                options.push(TrainingOption {
                    device: e.device,
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
    (
        Recommendation {
            device: e.device,
            max_batch: e.max_batch,
            max_batch_source: e.max_batch_source,
            knee_batch: e.knee_batch,
            recommended_batch: recommended,
            reason,
            learning_rate,
            lr_rule: lr.rule,
            accumulation,
            tied_batches: tied,
        },
        options,
    )
}

#[cfg(test)]
mod tests;
