//! The recommendation for one device, from its measured throughput curve, its
//! largest batch and the noise scale: which batch, why, with which learning
//! rate, and with gradient accumulation where memory caps the batch below the
//! critical batch. Pure: it takes measurements, never runs anything.

use crate::device::DeviceSpec;
use crate::diagnose::StepPoint;
use crate::lr::{LrRule, scale};
use crate::step_times::{REPEATABILITY, local_line, smoothed};
pub use crate::step_times::{smoothed_step_times, step_time_line};
use crate::target::{TrainingOption, updates_vs_min};
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
    /// No line fits the step times: the smallest tied batch.
    Smallest,
}

/// How a recommendation picks among batches that tie (none is measurably
/// faster to the target): the one nearest the optimum of the curve fitted to
/// all measured step times, B* = sqrt(B_noise x fixed / per_sample), which a
/// second run reproduces because it rests on every point rather than on which
/// single point measured fastest; among the tied powers of two where there
/// are any (the ladder every run measures; the batches refined between them
/// vary from run to run); unless the measured step times themselves put
/// another tied power of two faster beyond both errors (a line drawn through
/// a floor and a rise, under wide between-process errors, can put its
/// optimum where no measurement does); without a fitted curve, the smallest
/// (the most memory free and updates per epoch).
pub const TIE_BREAK: &str = "of the batches whose predicted time to target cannot be told apart from the fastest (step-time errors and B_noise's 90 % band), the one nearest the fitted curve's optimum sqrt(B_noise x fixed / per_sample), among the tied powers of two where there are any, unless the measured step times put another of those faster beyond both their errors (then that one); without a fitted curve, the smallest";

/// The tied batch nearest `optimum` (in ratio), among the tied powers of two
/// where there are any: the ladder's powers of two are measured in every run,
/// the batches refined between them vary with the run's timings, so a tie
/// broken among those would name a different batch when asked twice.
fn nearest_tied(tied: &[u64], optimum: f64) -> Option<u64> {
    let distance = |b: u64| (b as f64 / optimum).ln().abs();
    ladder_of(tied)
        .into_iter()
        .min_by(|&a, &b| distance(a).total_cmp(&distance(b)))
}

/// The tied powers of two, or every tied batch where none is one.
fn ladder_of(tied: &[u64]) -> Vec<u64> {
    let ladder: Vec<u64> = tied
        .iter()
        .copied()
        .filter(|b| b.is_power_of_two())
        .collect();
    if ladder.is_empty() {
        tied.to_vec()
    } else {
        ladder
    }
}

/// The tied batch (among the tied powers of two where there are any) whose
/// measured time to target at B_noise, (1 + B_noise/B) x step, is lowest,
/// when it is lower than `near`'s beyond both step times' errors (the ratio's
/// upper one-sided 95 % bound below 1); `None` when no measurement
/// contradicts `near`.
fn measured_faster(points: &[StepPoint], tied: &[u64], near: u64, b_noise: f64) -> Option<u64> {
    let point = |b: u64| points.iter().find(|q| q.batch == b);
    let time = |q: &StepPoint| updates_vs_min(b_noise, q.batch as f64) * q.step_s;
    let err = |q: &StepPoint| {
        if q.rel_err.is_finite() {
            q.rel_err.max(REPEATABILITY)
        } else {
            1.0
        }
    };
    let at_near = point(near)?;
    ladder_of(tied)
        .into_iter()
        .filter_map(point)
        .filter(|q| {
            let ratio = time(q) / time(at_near);
            let e = (err(q).powi(2) + err(at_near).powi(2)).sqrt();
            ratio * (1.0 + Z * e) < 1.0
        })
        .min_by(|a, b| time(a).total_cmp(&time(b)))
        .map(|q| q.batch)
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
pub fn tied_batches(options: &[(u64, f64, f64)], band: NoiseBand) -> Vec<u64> {
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
        let time = |o: &(u64, f64, f64)| updates_vs_min(bn, o.0 as f64) * o.1;
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
/// accumulation option when memory caps the batch below B_noise).
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
            let candidate = |b: u64| fits(b) && e.rate_failed_from.is_none_or(|f| b < f);
            let fitting: Vec<StepPoint> = e
                .points
                .iter()
                .filter(|q| candidate(q.batch))
                .copied()
                .collect();
            let (times, line) = smoothed(&fitting);
            tied = tied_batches(&times, band);
            // Within the tie, the batch nearest the optimum of the fitted curve,
            // (1 + B_noise/B)(fixed + per_sample B): B* = sqrt(B_noise fixed / per_sample).
            // Where the whole curve is not a line (per-step overheads at tiny
            // batches bend it), the line through the tied batches' neighbourhood.
            let optimum = line
                .or_else(|| local_line(&fitting, &tied))
                .filter(|(f, p)| *f > 0.0 && *p > 0.0)
                .map(|(f, p)| (bn * f / p).sqrt());
            let mut tie_break = TieBreak::Smallest;
            if let Some((opt, near)) =
                optimum.and_then(|opt| nearest_tied(&tied, opt).map(|near| (opt, near)))
            {
                let named = match measured_faster(&fitting, &tied, near, bn) {
                    Some(faster) => {
                        tie_break = TieBreak::Measured { optimum: opt };
                        faster
                    }
                    None => {
                        tie_break = TieBreak::Optimum(opt);
                        near
                    }
                };
                tied.retain(|&b| b != named);
                tied.insert(0, named);
            }
            let time =
                |o: &TrainingOption| updates_vs_min(bn, o.micro_batch as f64) * o.micro_step_s;
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
    let accumulation = match (b_noise, e.max_batch) {
        (Some(bn), Some(m)) if capped_by_memory && (m as f64) < bn => e
            .points
            .iter()
            .filter(|q| q.batch <= m)
            .max_by_key(|q| q.batch)
            .map(|q| {
                let steps = (bn / q.batch as f64).ceil().max(2.0) as u64;
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
mod tests {
    use super::*;
    use crate::target::rank;

    fn pts(v: &[(u64, f64)]) -> Vec<StepPoint> {
        v.iter()
            .map(|&(batch, step_s)| StepPoint {
                batch,
                step_s,
                rel_err: 0.0,
            })
            .collect()
    }

    fn evidence<'a>(points: &'a [StepPoint], max: Option<u64>) -> DeviceEvidence<'a> {
        DeviceEvidence {
            device: DeviceSpec::Cpu,
            points,
            knee_batch: Some(64),
            efficiency: 0.9,
            max_batch: max,
            max_batch_source: if max.is_some() {
                MaxBatchSource::Measured
            } else {
                MaxBatchSource::NotSearched
            },
            noise_hint: NoiseHint::GiveData,
            rate_failed_from: None,
        }
    }

    const ADAM: LrAdviceInput = LrAdviceInput {
        rule: LrRule::Sqrt,
        reference: None,
    };

    #[test]
    fn with_a_noise_scale_the_fastest_predicted_time_wins() {
        // Step time 1 ms + 0.01 ms per sample; B_noise = 400.
        // (1 + 400/B)(1 + 0.01 B) ms: B=16: 26 x 1.16 = 30.2; 64: 7.25 x 1.64 = 11.9;
        // 256: 2.5625 x 3.56 = 9.1; 1024: 1.39 x 11.24 = 15.6. 256 wins.
        let p = pts(&[
            (16, 1.16e-3),
            (64, 1.64e-3),
            (256, 3.56e-3),
            (1024, 11.24e-3),
        ]);
        let (rec, options) = recommend(&evidence(&p, None), Some(NoiseBand::exact(400.0)), ADAM);
        assert_eq!(rec.recommended_batch, Some(256));
        assert_eq!(options.len(), 4);
        assert!(rec.accumulation.is_none());
        let table = rank(&options, 400.0, None);
        assert_eq!(table[0].option.micro_batch, 256);
        assert!(
            (table[1].vs_best - 11.89 / 9.1225).abs() < 1e-2,
            "{table:?}"
        );
    }

    #[test]
    fn a_batch_whose_rate_did_not_train_is_not_recommended_but_stays_in_the_table() {
        // The same curve as above: 256 is fastest, 64 next.
        let p = pts(&[
            (16, 1.16e-3),
            (64, 1.64e-3),
            (256, 3.56e-3),
            (1024, 11.24e-3),
        ]);
        let e = DeviceEvidence {
            rate_failed_from: Some(256),
            ..evidence(&p, None)
        };
        let (rec, options) = recommend(&e, Some(NoiseBand::exact(400.0)), ADAM);
        assert_eq!(rec.recommended_batch, Some(64));
        assert_eq!(options.len(), 4, "the table keeps every batch that fits");
    }

    #[test]
    fn without_data_the_knee_is_recommended() {
        let p = pts(&[(16, 1e-3), (64, 2e-3)]);
        let (rec, _) = recommend(&evidence(&p, None), None, ADAM);
        assert_eq!(rec.recommended_batch, Some(64));
        assert!(
            matches!(rec.reason, Reason::Knee { efficiency, .. } if efficiency == 0.9),
            "{:?}",
            rec.reason
        );
    }

    #[test]
    fn memory_below_the_critical_batch_adds_accumulation() {
        // The device fits 32 at most; B_noise = 250: accumulate ceil(250/32) = 8.
        let p = pts(&[(8, 1e-3), (32, 2e-3), (128, 6e-3)]);
        let (rec, options) =
            recommend(&evidence(&p, Some(32)), Some(NoiseBand::exact(250.0)), ADAM);
        let acc = rec.accumulation.expect("accumulation advised");
        assert_eq!(
            (acc.micro_batch, acc.steps, acc.effective_batch),
            (32, 8, 256)
        );
        assert!((acc.update_s - 16e-3).abs() < 1e-12);
        // 128 does not fit: not an option; the accumulation option is.
        assert!(options.iter().all(|o| o.micro_batch <= 32));
        assert!(options.iter().any(|o| o.accumulation == 8));
        assert_eq!(rec.max_batch_source, MaxBatchSource::Measured);
    }

    /// `run --batches 64,256` where 256 ran: it is the largest tried, not a
    /// memory cap, so B_noise above it asks for no accumulation.
    #[test]
    fn the_largest_listed_batch_is_not_a_memory_cap() {
        let p = pts(&[(64, 1e-3), (256, 2e-3)]);
        let e = DeviceEvidence {
            max_batch_source: MaxBatchSource::LargestTried,
            ..evidence(&p, Some(256))
        };
        let (rec, options) = recommend(&e, Some(NoiseBand::exact(700.0)), ADAM);
        assert!(rec.accumulation.is_none(), "{:?}", rec.accumulation);
        assert!(options.iter().all(|o| o.accumulation == 1));
        assert_eq!(rec.recommended_batch, Some(256));
    }

    #[test]
    fn a_reference_learning_rate_is_scaled_to_the_recommendation() {
        let p = pts(&[(16, 1e-3), (64, 1e-3)]);
        let lr = LrAdviceInput {
            rule: LrRule::Sqrt,
            reference: Some((16, 1e-3)),
        };
        let (rec, _) = recommend(&evidence(&p, None), Some(NoiseBand::exact(100.0)), lr);
        assert_eq!(rec.recommended_batch, Some(64));
        assert!((rec.learning_rate.unwrap() - 2e-3).abs() < 1e-12);
    }

    #[test]
    fn the_source_serialises_as_before() {
        let v = serde_json::to_value(MaxBatchSource::PredictedForRam).unwrap();
        assert_eq!(v["max_batch_source"], "predicted for this machine's RAM");
        assert_eq!(v["max_batch_source_code"], "predicted_for_ram");
    }

    /// Step times with 10 % errors: batches within the noise of the fastest
    /// tie, and the smallest of them is named; the tie does not depend on
    /// which of them happened to measure fastest.
    #[test]
    fn ties_within_noise_name_the_smallest_tied_batch() {
        // (1 + 400/B) x step: 128: 4.125 x 3.0 = 12.4; 256: 2.5625 x 4.6 = 11.8;
        // 512: 1.78 x 7.8 = 13.9; 32: 13.5 x 1.4 = 18.9. 128 and 256 are within
        // 5 % errors of each other; 32 is not, at any B_noise of the band.
        let mk = |s256: f64| {
            let pts: Vec<StepPoint> = [(32, 1.4e-3), (128, 3.0e-3), (256, s256), (512, 7.8e-3)]
                .iter()
                .map(|&(batch, step_s)| StepPoint {
                    batch,
                    step_s,
                    rel_err: 0.05,
                })
                .collect();
            let band = NoiseBand {
                b_noise: 400.0,
                low: 300.0,
                high: Some(520.0),
            };
            let (rec, _) = recommend(&evidence(&pts, None), Some(band), ADAM);
            rec
        };
        // Whether 256 measures a little faster or slower, the answer is the same.
        for s256 in [4.4e-3, 4.6e-3, 4.9e-3] {
            let rec = mk(s256);
            assert!(
                rec.tied_batches.starts_with(&[128, 256]),
                "{s256}: {:?}",
                rec.tied_batches
            );
            assert_eq!(rec.recommended_batch, Some(128));
        }
    }

    /// A per-step floor up to a hinge inside the tie, then a rise in proportion
    /// to the batch (a one-hidden-layer MLP on R's kidtran, 863 rows, steps of
    /// 0.06-0.2 ms, as `advise` timed them): no line meets the tie's
    /// neighbourhood, so no line's optimum breaks the tie (one through it said
    /// 611, and 512 was named where 256 trained 20 % faster in `sweep
    /// --verify`); the smallest tied power of two is named.
    #[test]
    fn a_tie_across_a_hinge_is_not_broken_by_a_line_through_it() {
        let pts: Vec<StepPoint> = [
            (32, 56.9),
            (64, 56.9),
            (128, 74.8),
            (161, 74.8),
            (203, 74.8),
            (256, 74.8),
            (512, 147.4),
            (776, 214.5),
        ]
        .iter()
        .map(|&(batch, us)| StepPoint {
            batch,
            step_s: us * 1e-6,
            rel_err: 0.006,
        })
        .collect();
        let band = NoiseBand {
            b_noise: 1060.0,
            low: 722.0,
            high: None,
        };
        let (rec, _) = recommend(&evidence(&pts, None), Some(band), ADAM);
        assert!(rec.tied_batches.contains(&512), "{:?}", rec.tied_batches);
        assert_eq!(rec.recommended_batch, Some(256), "{:?}", rec.tied_batches);
    }

    /// Step times that two processes time 13 % apart, flat to 256 and then
    /// rising in proportion to the batch (a one-hidden-layer MLP on R's
    /// boot::aids, 570 rows, as `advise` timed them): with such errors a line
    /// passes for the curve and its optimum (about 360) sits nearer 512, but
    /// the measurements put 512's time to target 1.7x 256's, far beyond both
    /// errors; `sweep --verify` trained 256 30 % faster. The measured faster
    /// one is named, and the report says why.
    #[test]
    fn a_line_optimum_that_the_measurements_contradict_does_not_name_the_batch() {
        let pts: Vec<StepPoint> = [
            (1, 52.5),
            (2, 54.8),
            (4, 54.8),
            (8, 59.3),
            (16, 60.6),
            (32, 60.6),
            (64, 60.6),
            (128, 63.1),
            (161, 63.1),
            (203, 66.6),
            (256, 71.3),
            (512, 167.5),
            (513, 174.9),
        ]
        .iter()
        .map(|&(batch, us)| StepPoint {
            batch,
            step_s: us * 1e-6,
            rel_err: 0.13,
        })
        .collect();
        let band = NoiseBand {
            b_noise: 331.0,
            low: 262.0,
            high: None,
        };
        let (rec, _) = recommend(&evidence(&pts, None), Some(band), ADAM);
        assert!(rec.tied_batches.contains(&512), "{:?}", rec.tied_batches);
        assert_eq!(rec.recommended_batch, Some(256), "{:?}", rec.tied_batches);
        assert!(
            matches!(
                rec.reason,
                Reason::TimeToTarget {
                    tie_break: TieBreak::Measured { .. },
                    ..
                }
            ),
            "{:?}",
            rec.reason
        );
    }

    /// Update times measured to 0.1-1.5 % that bend away from any line (a
    /// per-step floor to batch 32, a faster kernel at 1,024: the shipped
    /// digits MLP on a 2-core CPU, one `advise`): a line explains 11 of the 13
    /// within 10 %, but its median miss is 7 %, more than a second run moves
    /// a step time, so the medians stand: the tie holds the batches they show
    /// fastest across the band. (Smoothed, the tie was 256 and 512 in two of
    /// five runs, 128 and 1,024 in the others.)
    #[test]
    fn precise_step_times_that_bend_are_not_smoothed_into_a_line() {
        let measured = [
            (1, 58.6, 0.0014),
            (2, 57.5, 0.0017),
            (4, 61.3, 0.0017),
            (8, 62.2, 0.0019),
            (16, 61.4, 0.0013),
            (32, 67.0, 0.0083),
            (64, 82.0, 0.0013),
            (128, 114.9, 0.0012),
            (256, 197.8, 0.0012),
            (512, 361.1, 0.0013),
            (645, 449.1, 0.0027),
            (813, 516.3, 0.0016),
            (1024, 523.6, 0.0150),
        ];
        let pts: Vec<StepPoint> = measured
            .iter()
            .map(|&(batch, us, rel_err)| StepPoint {
                batch,
                step_s: us * 1e-6,
                rel_err,
            })
            .collect();
        assert_eq!(step_time_line(&pts), None);
        let band = NoiseBand {
            b_noise: 461.0,
            low: 392.0,
            high: None,
        };
        let (rec, _) = recommend(&evidence(&pts, None), Some(band), ADAM);
        // (1 + 461/B) x step: 128: 529 us, 256: 554 us, 64: 672 us; 256 is the
        // fastest further up the band, 1,024 at its open end (4 x 461). The
        // line through them would have put 512 in the tie and left 128 out.
        let mut tied = rec.tied_batches.clone();
        tied.sort_unstable();
        assert_eq!(tied, vec![128, 256, 1024]);
        // A curve a line meets within a few per cent (breast-cancer's MLP on
        // the same machine, 0.1 % errors, one outlier at 512) is smoothed:
        // its misses are what a second run would move.
        let near_line: Vec<StepPoint> = [
            (1, 44.5),
            (2, 46.4),
            (4, 49.1),
            (8, 49.0),
            (16, 49.5),
            (32, 52.6),
            (64, 60.7),
            (128, 78.1),
            (256, 113.1),
            (512, 214.3),
        ]
        .iter()
        .map(|&(batch, us)| StepPoint {
            batch,
            step_s: us * 1e-6,
            rel_err: 0.001,
        })
        .collect();
        assert!(step_time_line(&near_line).is_some());
        // The bent times with 20 % errors are noise about a line: smoothed.
        let noisy: Vec<StepPoint> = pts
            .iter()
            .map(|q| StepPoint { rel_err: 0.2, ..*q })
            .collect();
        assert!(step_time_line(&noisy).is_some());
    }

    /// A tie is broken among the ladder's powers of two, which every run
    /// measures: the refinement at 203 that one run added does not take the
    /// answer from 256 (B* 216, mnist-mlp on scaled MNIST); without a tied
    /// power of two, the nearest of all.
    #[test]
    fn a_tie_is_broken_among_the_powers_of_two_every_run_measures() {
        assert_eq!(nearest_tied(&[203, 256, 512], 216.0), Some(256));
        assert_eq!(nearest_tied(&[256, 406, 512], 380.0), Some(512));
        assert_eq!(nearest_tied(&[32, 64, 81, 102], 46.0), Some(64));
        assert_eq!(nearest_tied(&[323, 406], 380.0), Some(406));
        assert_eq!(nearest_tied(&[], 380.0), None);
    }

    /// A batch that is fastest only inside the band, neither at its ends nor
    /// at its centre, is tied: step time 1 + B/256 (B* = sqrt(256 B_noise))
    /// puts the fastest at 128 for B_noise 50 and at 2,048 for 20,000; 512 is
    /// the fastest around 3,200 and 24 % or more behind at either end.
    #[test]
    fn a_batch_fastest_inside_the_band_is_tied() {
        let options: Vec<(u64, f64, f64)> = [32u64, 128, 512, 2048]
            .iter()
            .map(|&b| (b, 1.0 + b as f64 / 256.0, 0.0))
            .collect();
        let band = NoiseBand {
            b_noise: 50.0,
            low: 50.0,
            high: Some(20_000.0),
        };
        assert_eq!(tied_batches(&options, band), vec![128, 512, 2048]);
    }

    #[test]
    fn exact_measurements_tie_only_at_equal_times() {
        let pts = [(64u64, 1e-3, 0.0), (128, 1.5e-3, 0.0), (256, 3.0e-3, 0.0)];
        // B_noise 128: 64: 3 x 1 = 3.0; 128: 2 x 1.5 = 3.0; 256: 1.5 x 3 = 4.5.
        assert_eq!(tied_batches(&pts, NoiseBand::exact(128.0)), vec![64, 128]);
    }
}
