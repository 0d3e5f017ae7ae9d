//! Predicted beside measured: `advise`'s time to target held against real
//! trainings of the same batches, with the same learning rates, to the same
//! target; and whether the recommended batch was, as trained, the fastest.

use crate::basis::PredictionBasis;
use crate::device::DeviceSpec;
use crate::run::{LossTarget, RunRate};
use crate::sweep::{difference, mean_std};
use crate::trial::TrialResult;
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};

/// The recommended batch counts as right when its measured time to target is
/// within this share of the fastest measured batch's.
pub const RECOMMENDATION_TOLERANCE: f64 = 0.05;

/// What `advise` predicted for one batch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Predicted {
    pub batch: u64,
    pub steps: f64,
    /// Predicted seconds, when the batch's step time was measured.
    pub seconds: Option<f64>,
}

/// What the trainings of one batch measured: one value per seed that reached
/// the target, out of `runs`.
#[derive(Clone, Debug, PartialEq)]
pub struct Measured {
    pub batch: u64,
    pub runs: usize,
    pub steps: Vec<f64>,
    pub seconds: Vec<f64>,
}

/// One batch, predicted beside measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VerifyRow {
    pub batch: u64,
    pub predicted_steps: f64,
    pub predicted_seconds: Option<f64>,
    /// Predicted seconds over the smallest predicted seconds of the batches verified.
    pub predicted_vs_best: Option<f64>,
    pub runs: usize,
    /// Runs that reached the target.
    pub reached: usize,
    pub steps_mean: Option<f64>,
    pub steps_std: Option<f64>,
    pub seconds_mean: Option<f64>,
    pub seconds_std: Option<f64>,
    /// Measured seconds over the fastest measured batch's (batches all of whose runs reached it).
    pub vs_best: Option<f64>,
    /// (predicted - measured) / measured, percent.
    pub steps_error_pct: Option<f64>,
    pub seconds_error_pct: Option<f64>,
    pub vs_best_error_pct: Option<f64>,
    /// Two standard errors of the measured `vs_best`, percent: how far the
    /// seeds alone move it (each batch's and the fastest's spread over its
    /// seeds; for the fastest itself, its ratio to the batch the prediction
    /// put fastest, 0 where that is the same batch). None with fewer than
    /// two seeds.
    #[serde(default)]
    pub vs_best_noise_pct: Option<f64>,
}

/// Whether the advice held.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Verdict {
    pub recommended: u64,
    /// The batch with the lowest measured mean time to target (all its runs reached it).
    pub fastest: Option<u64>,
    /// Recommended over fastest measured time.
    pub recommended_vs_fastest: Option<f64>,
    /// The difference is within two standard errors of the seeds' spread.
    pub within_seed_noise: bool,
    /// The recommended batch is the fastest, within [`RECOMMENDATION_TOLERANCE`]
    /// or within the seeds' noise.
    pub held: bool,
    /// The largest |error| of the predicted time relative to the best, and its batch.
    pub worst_relative: Option<(u64, f64)>,
    /// The largest |error| of the predicted seconds, and its batch.
    pub worst_absolute: Option<(u64, f64)>,
    /// The batches whose error of the predicted time relative to the best
    /// exceeds the seeds' noise of the measured one (`vs_best_noise_pct`).
    pub relative_beyond_noise: Vec<u64>,
    /// What the verdict line says (`line` in words is the report's).
    #[serde(rename = "line_code")]
    pub outcome: VerdictOutcome,
}

/// The verdict, with the figures its line states.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum VerdictOutcome {
    /// The recommended batch reached the target fastest: its mean seconds over `runs`.
    Fastest { seconds: f64, runs: usize },
    /// Held: the recommended batch took `seconds`, within the tolerance
    /// (`by_tolerance`) or the seeds' noise of the fastest.
    Within {
        seconds: f64,
        /// Its mean time over the fastest's.
        ratio: f64,
        fastest: u64,
        fastest_seconds: f64,
        by_tolerance: bool,
    },
    /// Did not hold: slower than the fastest beyond the seeds' noise.
    NotHeld {
        /// The advice had stated `fastest` tied with the recommended batch
        /// (its timings could not tell them apart).
        fastest_in_tie: bool,
        seconds: f64,
        ratio: f64,
        fastest: u64,
        fastest_seconds: f64,
    },
    /// The recommended batch was not trained.
    NotTrained,
    /// It did not reach the target in every run.
    NotReached,
    /// Its runs started at or below the target loss: no step was needed, so
    /// the runs say nothing of the steps the prediction is about.
    AtTargetFromTheStart,
}

impl VerdictOutcome {
    /// The machine-readable code.
    pub fn code(self) -> &'static str {
        match self {
            VerdictOutcome::Fastest { .. } => "fastest",
            VerdictOutcome::Within { .. } => "within",
            VerdictOutcome::NotHeld { .. } => "not_held",
            VerdictOutcome::NotTrained => "not_trained",
            VerdictOutcome::NotReached => "not_reached",
            VerdictOutcome::AtTargetFromTheStart => "at_target_from_the_start",
        }
    }
}

impl Serialize for VerdictOutcome {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.code())
    }
}

fn pct(predicted: f64, measured: f64) -> f64 {
    100.0 * (predicted - measured) / measured
}

/// The rows (in the order of `predicted`) and the verdict on `recommended`,
/// which the advice named from the batches `tied` (empty: none stated).
pub fn verify(
    predicted: &[Predicted],
    measured: &[Measured],
    recommended: u64,
    tied: &[u64],
) -> (Vec<VerifyRow>, Verdict) {
    let stat = |v: &[f64]| (!v.is_empty()).then(|| mean_std(v));
    let of = |b: u64| measured.iter().find(|m| m.batch == b);
    let complete = |m: &Measured| m.runs > 0 && m.seconds.len() == m.runs;
    // A run that took no step to the target started there: no time to compare.
    let started_there = |m: &Measured| !m.steps.is_empty() && m.steps.iter().all(|&s| s <= 0.0);
    let fastest = measured
        .iter()
        .filter(|m| complete(m) && !started_there(m))
        .filter_map(|m| stat(&m.seconds).map(|s| (m, s)))
        .min_by(|a, b| a.1.0.total_cmp(&b.1.0));
    let best_predicted = predicted
        .iter()
        .filter_map(|p| p.seconds)
        .fold(f64::INFINITY, f64::min);
    // The batch the prediction put fastest, as measured.
    let predicted_fastest = predicted
        .iter()
        .filter(|p| p.seconds == Some(best_predicted))
        .find_map(|p| of(p.batch))
        .filter(|m| complete(m));
    let rows: Vec<VerifyRow> = predicted
        .iter()
        .map(|p| {
            let m = of(p.batch);
            let steps = m.and_then(|m| stat(&m.steps));
            let seconds = m.and_then(|m| stat(&m.seconds));
            let vs_best = match (m, seconds, fastest) {
                (Some(m), Some(s), Some((_, f))) if complete(m) => Some(s.0 / f.0),
                _ => None,
            };
            let predicted_vs_best = p.seconds.map(|s| s / best_predicted);
            // The fastest against itself is exactly 1; its error is how much
            // faster it measured than the batch the prediction put fastest,
            // so its noise is that ratio's (none where the two are one batch).
            let vs_best_noise_pct = match (m, fastest) {
                (Some(m), Some((f, _))) if complete(m) && f.batch == m.batch => {
                    match predicted_fastest {
                        Some(pf) if pf.batch != m.batch => ratio_noise_pct(&m.seconds, &pf.seconds),
                        _ => (m.seconds.len() >= 2).then_some(0.0),
                    }
                }
                (Some(m), Some((f, _))) if complete(m) => ratio_noise_pct(&m.seconds, &f.seconds),
                _ => None,
            };
            VerifyRow {
                batch: p.batch,
                predicted_steps: p.steps,
                predicted_seconds: p.seconds,
                predicted_vs_best,
                runs: m.map_or(0, |m| m.runs),
                reached: m.map_or(0, |m| m.seconds.len()),
                steps_mean: steps.map(|s| s.0),
                steps_std: steps.map(|s| s.1),
                seconds_mean: seconds.map(|s| s.0),
                seconds_std: seconds.map(|s| s.1),
                vs_best,
                steps_error_pct: steps.map(|s| pct(p.steps, s.0)),
                seconds_error_pct: p.seconds.zip(seconds).map(|(p, s)| pct(p, s.0)),
                vs_best_error_pct: predicted_vs_best.zip(vs_best).map(|(p, m)| pct(p, m)),
                vs_best_noise_pct,
            }
        })
        .collect();
    let worst = |f: fn(&VerifyRow) -> Option<f64>| {
        rows.iter()
            .filter_map(|r| f(r).map(|e| (r.batch, e)))
            .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
    };
    let worst_relative = worst(|r| r.vs_best_error_pct);
    let worst_absolute = worst(|r| r.seconds_error_pct);
    let relative_beyond_noise = rows
        .iter()
        .filter(|r| match (r.vs_best_error_pct, r.vs_best_noise_pct) {
            (Some(e), Some(n)) => e.abs() > n,
            _ => false,
        })
        .map(|r| r.batch)
        .collect();
    let rec = of(recommended);
    let rec_seconds = rec
        .filter(|m| complete(m) && !started_there(m))
        .and_then(|m| stat(&m.seconds));
    let (recommended_vs_fastest, within_seed_noise) = match (rec, rec_seconds, fastest) {
        (Some(r), Some(_), Some((f, _))) => match difference(&r.seconds, &f.seconds) {
            Some((ratio, diff, se)) => (Some(ratio), diff <= 2.0 * se),
            None => (None, false),
        },
        _ => (None, false),
    };
    let held = recommended_vs_fastest.is_some_and(|r| r <= 1.0 + RECOMMENDATION_TOLERANCE)
        || within_seed_noise;
    let outcome = match (recommended_vs_fastest, fastest) {
        (Some(_), Some((f, fs))) if f.batch == recommended => VerdictOutcome::Fastest {
            seconds: fs.0,
            runs: f.seconds.len(),
        },
        (Some(r), Some((f, fs))) if held => VerdictOutcome::Within {
            seconds: fs.0 * r,
            ratio: r,
            fastest: f.batch,
            fastest_seconds: fs.0,
            by_tolerance: r <= 1.0 + RECOMMENDATION_TOLERANCE,
        },
        (Some(r), Some((f, fs))) => VerdictOutcome::NotHeld {
            fastest_in_tie: tied.contains(&f.batch),
            seconds: fs.0 * r,
            ratio: r,
            fastest: f.batch,
            fastest_seconds: fs.0,
        },
        _ if rec.is_none() => VerdictOutcome::NotTrained,
        _ if rec.is_some_and(started_there) => VerdictOutcome::AtTargetFromTheStart,
        _ => VerdictOutcome::NotReached,
    };
    (
        rows,
        Verdict {
            recommended,
            fastest: fastest.map(|(f, _)| f.batch),
            recommended_vs_fastest,
            within_seed_noise,
            held,
            worst_relative,
            worst_absolute,
            relative_beyond_noise,
            outcome,
        },
    )
}

/// Two standard errors of mean(`a`) / mean(`b`), percent of it, from each
/// group's spread over its seeds (first order: the ratio's relative variance is
/// the sum of the means' relative variances). None with fewer than two seeds in
/// either.
fn ratio_noise_pct(a: &[f64], b: &[f64]) -> Option<f64> {
    if a.len() < 2 || b.len() < 2 {
        return None;
    }
    let rel_var = |v: &[f64]| {
        let (m, s) = mean_std(v);
        (m > 0.0).then(|| s * s / (v.len() as f64 * m * m))
    };
    Some(200.0 * (rel_var(a)? + rel_var(b)?).sqrt())
}

/// `recommended` and the batches either side of it in `batches` (ascending),
/// the batches a check trains by default.
fn with_neighbours(batches: &[u64], recommended: u64) -> Vec<u64> {
    match batches.iter().position(|&b| b == recommended) {
        Some(i) => batches[i.saturating_sub(1)..(i + 2).min(batches.len())].to_vec(),
        None => vec![recommended],
    }
}

/// An advice under check: what `advise --json` predicted, on which device, for which batch.
#[derive(Clone, Debug)]
pub struct CheckedAdvice {
    /// The advice file, as named.
    pub path: String,
    /// The model and data it measured.
    pub inputs: crate::decide::AdviceInputs,
    pub basis: PredictionBasis,
    /// The device of the first recommendation: the one checked.
    pub device: DeviceSpec,
    pub recommended: u64,
    /// The batches the advice could not tell apart from the recommended one
    /// (its `tied_batches`; empty in documents before them).
    pub tied: Vec<u64>,
    /// Measured seconds per update at each batch of the table on that device
    /// (no accumulation), ascending by batch.
    pub update_s: Vec<(u64, f64)>,
    /// The first seed none of the advice's own trainings (its noise runs and
    /// rate checks) used: the check trains from it, so that it measures
    /// trainings the advice never saw. A rate check trains exactly as the
    /// check does (same rows, weights and order for a seed), so a check on the
    /// advice's seeds would read back its own measurements.
    pub first_seed: u64,
}

impl CheckedAdvice {
    /// The batches checked by default: the recommended one and its neighbours
    /// in the advice's table.
    pub fn default_batches(&self) -> Vec<u64> {
        let batches: Vec<u64> = self.update_s.iter().map(|p| p.0).collect();
        with_neighbours(&batches, self.recommended)
    }

    /// Predicted steps, and seconds where the advice measured the batch's step.
    pub fn predicted(&self, batch: u64) -> Predicted {
        let steps = self.basis.curve.steps(batch as f64);
        Predicted {
            batch,
            steps,
            seconds: self
                .update_s
                .iter()
                .find(|p| p.0 == batch)
                .map(|p| p.1 * steps),
        }
    }

    /// Epochs enough for three times the predicted steps at `batch` from `rows` rows.
    pub fn epochs_for(&self, batch: u64, rows: usize) -> u32 {
        let per_epoch = (rows as u64 / batch.max(1)).max(1) as f64;
        (3.0 * self.predicted(batch).steps / per_epoch).ceil() as u32
    }
}

/// `sweep --verify ADVICE.json`: predicted beside measured, and the verdict.
#[derive(Clone, Debug, Serialize)]
pub struct VerifyReport {
    /// The advice file.
    pub advice: String,
    /// The device whose recommendation is checked (the runs train on it).
    pub device: DeviceSpec,
    /// What the prediction assumed; the runs trained with it.
    pub basis: PredictionBasis,
    pub rows: Vec<VerifyRow>,
    pub verdict: Verdict,
}

impl VerifyReport {
    /// The advice's predictions beside what the runs of each batch measured.
    pub fn new(advice: &CheckedAdvice, measured: &[Measured]) -> VerifyReport {
        let predicted: Vec<Predicted> =
            measured.iter().map(|m| advice.predicted(m.batch)).collect();
        let (rows, verdict) = verify(&predicted, measured, advice.recommended, &advice.tied);
        VerifyReport {
            advice: advice.path.clone(),
            device: advice.device,
            basis: advice.basis.clone(),
            rows,
            verdict,
        }
    }
}

/// A run's advice under check.
#[derive(Clone, Debug)]
pub struct CheckedRun {
    pub path: String,
    pub recommended: u64,
    /// The batches the run could not tell apart from the recommended one.
    pub tied: Vec<u64>,
    /// The run's predictions at each batch of its table (no accumulation), ascending.
    pub predicted: Vec<Predicted>,
    pub target: LossTarget,
    pub rate: RunRate,
}

impl CheckedRun {
    /// The recommended batch and its neighbours in the run's table.
    pub fn default_batches(&self) -> Vec<u64> {
        let batches: Vec<u64> = self.predicted.iter().map(|p| p.batch).collect();
        with_neighbours(&batches, self.recommended)
    }
}

/// What `run --verify` found.
#[derive(Clone, Debug, Serialize)]
pub struct RunVerifyReport {
    /// The advice file.
    pub advice: String,
    /// The command trained, with its placeholders.
    pub command: String,
    /// The loss each trial trained to, and the window of losses that reads it.
    pub target: LossTarget,
    /// The rates the trials trained at: the run's.
    pub learning_rate: RunRate,
    pub seeds: u64,
    pub rows: Vec<VerifyRow>,
    pub verdict: Verdict,
    /// Every trial, in order.
    pub trials: Vec<VerifyTrial>,
}

/// One training of the check.
#[derive(Clone, Debug, Serialize)]
pub struct VerifyTrial {
    pub batch: u64,
    pub seed: u64,
    /// Steps and seconds to the target (measured), `None` if not reached.
    pub steps_to_target: Option<f64>,
    pub seconds_to_target: Option<f64>,
    #[serde(flatten)]
    pub result: TrialResult,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(batch: u64, seconds: &[f64]) -> Measured {
        Measured {
            batch,
            runs: 3,
            steps: seconds.iter().map(|s| s * 1000.0).collect(),
            seconds: seconds.to_vec(),
        }
    }

    fn p(batch: u64, seconds: f64) -> Predicted {
        Predicted {
            batch,
            steps: seconds * 1000.0,
            seconds: Some(seconds),
        }
    }

    #[test]
    fn the_fastest_batch_as_recommended_holds_and_errors_are_per_batch() {
        let pred = [p(64, 0.12), p(128, 0.10), p(256, 0.11)];
        let meas = [
            m(64, &[0.15, 0.16, 0.14]),
            m(128, &[0.10, 0.11, 0.12]),
            m(256, &[0.13, 0.12, 0.14]),
        ];
        let (rows, v) = verify(&pred, &meas, 128, &[]);
        assert!(v.held && v.fastest == Some(128), "{v:?}");
        assert!(
            matches!(v.outcome, VerdictOutcome::Fastest { runs: 3, .. }),
            "{v:?}"
        );
        // 64: predicted 1.2x the best, measured 0.15/0.11 = 1.364x.
        let e = rows[0].vs_best_error_pct.unwrap();
        assert!(
            (e - 100.0 * (1.2 / (0.15 / 0.11) - 1.0)).abs() < 1e-9,
            "{e}"
        );
        assert!((rows[1].seconds_error_pct.unwrap() - 100.0 * (0.10 / 0.11 - 1.0)).abs() < 1e-9);
        assert_eq!(v.worst_relative.unwrap().0, 64);
    }

    /// The noise of a measured ratio: two standard errors from both batches'
    /// spreads over their seeds; an error beyond it is named, one within it
    /// is not.
    #[test]
    fn a_relative_error_is_read_against_the_seeds_noise_of_the_measured_ratio() {
        let pred = [p(32, 0.30), p(64, 0.13), p(128, 0.10)];
        let meas = [
            // Scattered seeds: 0.4 ± 0.1 over 3 against 0.1 ± 0.01.
            m(32, &[0.3, 0.4, 0.5]),
            // Tight seeds: 0.16 ± 0.001.
            m(64, &[0.159, 0.160, 0.161]),
            m(128, &[0.09, 0.10, 0.11]),
        ];
        let (rows, v) = verify(&pred, &meas, 128, &[]);
        let want = |a: [f64; 2], b: [f64; 2]| {
            // mean, sd of each; 3 seeds.
            200.0 * ((a[1] / a[0]).powi(2) / 3.0 + (b[1] / b[0]).powi(2) / 3.0).sqrt()
        };
        let n32 = rows[0].vs_best_noise_pct.unwrap();
        assert!((n32 - want([0.4, 0.1], [0.1, 0.01])).abs() < 1e-9, "{n32}");
        let n64 = rows[1].vs_best_noise_pct.unwrap();
        assert!(
            (n64 - want([0.16, 0.001], [0.1, 0.01])).abs() < 1e-9,
            "{n64}"
        );
        // The fastest against itself: exactly 1, no noise.
        assert_eq!(rows[2].vs_best_noise_pct, Some(0.0));
        // 32: predicted 3.0x, measured 4.0x: -25 %, within its ±35 %.
        // 64: predicted 1.3x, measured 1.6x: -19 %, beyond its ±12 %.
        assert!((rows[0].vs_best_error_pct.unwrap() + 25.0).abs() < 1e-9);
        assert!(n32 > 25.0 && n64 < 18.75, "{n32} {n64}");
        assert_eq!(v.relative_beyond_noise, [64]);
        // One seed: no spread to read.
        let one = [
            Measured {
                runs: 1,
                ..m(64, &[0.16])
            },
            Measured {
                runs: 1,
                ..m(128, &[0.10])
            },
        ];
        let (rows, v) = verify(&pred[1..], &one, 128, &[]);
        assert!(rows.iter().all(|r| r.vs_best_noise_pct.is_none()));
        assert!(v.relative_beyond_noise.is_empty());
        // Predicted fastest 128, measured fastest 64 (1.3x predicted, 1.0x
        // measured): 64's error is the 128-to-64 ratio's, so is its noise.
        let faster = [m(64, &[0.08, 0.09, 0.10]), m(128, &[0.09, 0.10, 0.11])];
        let (rows, _) = verify(&pred[1..], &faster, 128, &[]);
        assert_eq!(rows[0].vs_best, Some(1.0));
        let n = rows[0].vs_best_noise_pct.unwrap();
        assert!((n - want([0.09, 0.01], [0.1, 0.01])).abs() < 1e-9, "{n}");
        // 128's against 64, the measured fastest, as before.
        let n128 = rows[1].vs_best_noise_pct.unwrap();
        assert!(
            (n128 - want([0.1, 0.01], [0.09, 0.01])).abs() < 1e-9,
            "{n128}"
        );
    }

    #[test]
    fn a_slower_recommendation_holds_only_within_tolerance_or_seed_noise() {
        let pred = [p(128, 0.10), p(256, 0.11)];
        // 128 is 20 % slower than 256 with tight seeds: did not hold; the
        // verdict says whether the advice had stated 256 tied with 128.
        let slower = [
            m(128, &[0.120, 0.121, 0.119]),
            m(256, &[0.100, 0.101, 0.099]),
        ];
        for (tied, in_tie) in [(&[][..], false), (&[128, 256][..], true)] {
            let (_, v) = verify(&pred, &slower, 128, tied);
            assert!(!v.held && !v.within_seed_noise, "{v:?}");
            assert!(
                matches!(
                    v.outcome,
                    VerdictOutcome::NotHeld {
                        fastest: 256,
                        fastest_in_tie,
                        ..
                    } if fastest_in_tie == in_tie
                ),
                "{v:?}"
            );
        }
        // 3 % slower: within the tolerance.
        let (_, v) = verify(
            &pred,
            &[
                m(128, &[0.103, 0.104, 0.102]),
                m(256, &[0.100, 0.101, 0.099]),
            ],
            128,
            &[],
        );
        assert!(v.held && !v.within_seed_noise, "{v:?}");
        // 20 % slower but the seeds scatter by 30 %: within the seeds' noise.
        let (_, v) = verify(
            &pred,
            &[m(128, &[0.08, 0.12, 0.16]), m(256, &[0.07, 0.10, 0.13])],
            128,
            &[],
        );
        assert!(v.held && v.within_seed_noise, "{v:?}");
        assert!(
            matches!(
                v.outcome,
                VerdictOutcome::Within {
                    by_tolerance: false,
                    ..
                }
            ),
            "{v:?}"
        );
    }

    #[test]
    fn a_recommendation_that_did_not_reach_the_target_cannot_be_checked() {
        let pred = [p(128, 0.10), p(256, 0.11)];
        let mut short = m(128, &[0.1]);
        short.runs = 3;
        let (rows, v) = verify(&pred, &[short, m(256, &[0.1, 0.1, 0.1])], 128, &[]);
        assert!(!v.held && rows[0].vs_best.is_none());
        assert_eq!(v.outcome, VerdictOutcome::NotReached);
    }

    /// Runs whose first loss was already at the target took no step: no
    /// time to compare, and no verdict of "held" on them.
    #[test]
    fn runs_that_start_at_the_target_cannot_check_the_advice() {
        let pred = [p(128, 0.10), p(256, 0.11)];
        let none = |b| Measured {
            batch: b,
            runs: 2,
            steps: vec![0.0, 0.0],
            seconds: vec![0.0, 0.0],
        };
        let (rows, v) = verify(&pred, &[none(128), none(256)], 128, &[]);
        assert!(!v.held && v.fastest.is_none() && rows.iter().all(|r| r.vs_best.is_none()));
        assert_eq!(v.outcome, VerdictOutcome::AtTargetFromTheStart);
    }
}
