//! The largest batch that fits. Three strategies, one file each, all pure
//! drivers over a closure that runs one trial and says how it ended
//! ([`Verdict`]):
//!
//! - [`plan_guided`]: predict from the plan, calibrate the plan's line with
//!   measured peaks at two small batches, run one step at the predicted limit,
//!   and bisect only the gap that remains (the engine, whose plan is known);
//! - [`predicting`]: two rungs give a line through measured peaks, then one
//!   trial just under the line's limit (a user's command under a memory limit);
//! - [`ladder`]: doubling to the first out-of-memory, then integer bisection
//!   (a user's command when nothing measures memory), or exactly the listed
//!   batches.
//!
//! No blind doubling where memory is measured.

pub mod ladder;
pub mod plan_guided;
pub mod predicting;

pub use ladder::{each_listed, ladder_then_bisect};
pub use plan_guided::{SearchOptions, SearchResult, find_max_batch};
pub use predicting::{PredictOptions, predict_then_bracket};

use batchfit_plan::Bytes;
use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};

/// How one trial at some batch ended, as a search reads it: the one
/// vocabulary of the max-batch search ([`find_max_batch`]) and the ladder
/// ([`ladder_then_bisect`]). Callers map their process outcome onto it
/// (`batchfit_exec::Outcome::verdict`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum Verdict {
    /// The step ran; `peak` is its measured high-water mark, where one was measured.
    #[serde(rename = "fits")]
    Runs {
        #[serde(skip_serializing_if = "Option::is_none")]
        peak: Option<Bytes>,
    },
    /// The step ran out of memory.
    OutOfMemory,
    /// It crashed for another reason or timed out: that says nothing about
    /// memory, so the search stops there and says so.
    Broken,
}

impl Verdict {
    /// A run whose peak was measured.
    pub fn fits(peak: Bytes) -> Verdict {
        Verdict::Runs { peak: Some(peak) }
    }
}

/// Why a batch was tried: the step of a search that chose it, a knee
/// refinement, or a batch the user listed. JSON writes it as `reason` (the
/// label reports print) and `reason_code`, when flattened into its trial.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TrialReason {
    /// [`plan_guided`]: a batch whose measured peak calibrates the plan's line.
    Calibration,
    /// The limit a line predicts.
    Prediction,
    /// [`plan_guided`]: up by the tolerance while the prediction still runs.
    StepUp,
    /// [`plan_guided`]: just under a prediction that ran out of memory.
    JustUnderPrediction,
    /// Halving the gap between the largest run and the smallest failure.
    Bisection,
    /// The first trial of a search of a user's command.
    Start,
    /// [`ladder`]: twice the last batch that ran.
    Doubling,
    /// [`predicting`]: a rung (8x) of the line's base, or halfway to a far prediction.
    Rung,
    /// [`predicting`]: a tolerance above the largest run, to close the bracket.
    Confirmation,
    /// [`predicting`]: back from a prediction that ran out of memory.
    BackOff,
    /// A batch given with `--batches`.
    Listed,
    /// Between the knee and the measured batch below it.
    KneeRefinement,
    /// A batch of the sampled throughput curve ([`crate::measure`]).
    Sampled,
    /// Measured again: it decides an uncertain knee ([`crate::measure::settling_batches`]).
    Settling,
    /// `run`'s noise trial: the command measuring gradient noise on every
    /// step, for the noise scale and the target (its step times are not a
    /// point of the curve).
    Noise,
}

impl TrialReason {
    /// How reports (and earlier JSON documents) say it.
    pub fn label(self) -> &'static str {
        match self {
            TrialReason::Calibration => "calibration",
            TrialReason::Prediction => "prediction",
            TrialReason::StepUp => "step-up",
            TrialReason::JustUnderPrediction => "just under the prediction",
            TrialReason::Bisection => "bisection",
            TrialReason::Start => "start",
            TrialReason::Doubling => "doubling",
            TrialReason::Rung => "rung",
            TrialReason::Confirmation => "confirmation",
            TrialReason::BackOff => "back-off",
            TrialReason::Listed => "listed",
            TrialReason::KneeRefinement => "knee refinement",
            TrialReason::Sampled => "sampled",
            TrialReason::Settling => "settling",
            TrialReason::Noise => "noise trial",
        }
    }

    /// The machine-readable code: the label as one snake-case word.
    pub fn code(self) -> &'static str {
        match self {
            TrialReason::Calibration => "calibration",
            TrialReason::Prediction => "prediction",
            TrialReason::StepUp => "step_up",
            TrialReason::JustUnderPrediction => "just_under_prediction",
            TrialReason::Bisection => "bisection",
            TrialReason::Start => "start",
            TrialReason::Doubling => "doubling",
            TrialReason::Rung => "rung",
            TrialReason::Confirmation => "confirmation",
            TrialReason::BackOff => "back_off",
            TrialReason::Listed => "listed",
            TrialReason::KneeRefinement => "knee_refinement",
            TrialReason::Sampled => "sampled",
            TrialReason::Settling => "settling",
            TrialReason::Noise => "noise_trial",
        }
    }
}

/// `reason` and `reason_code` in the trial it is flattened into.
impl Serialize for TrialReason {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry("reason", self.label())?;
        m.serialize_entry("reason_code", self.code())?;
        m.end()
    }
}

/// One logged trial.
#[derive(Clone, Debug, Serialize)]
pub struct TrialRecord {
    pub batch: u64,
    /// Why this batch was tried.
    #[serde(flatten)]
    pub reason: TrialReason,
    #[serde(flatten)]
    pub verdict: Verdict,
}

/// `fixed + per_sample x B` fitted to measurements.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Line {
    pub fixed: f64,
    pub per_sample: f64,
}

impl Line {
    /// Through two `(batch, bytes)` points.
    pub fn through(a: (u64, f64), b: (u64, f64)) -> Option<Line> {
        if a.0 == b.0 {
            return None;
        }
        let per_sample = (b.1 - a.1) / (b.0 as f64 - a.0 as f64);
        (per_sample > 0.0).then_some(Line {
            fixed: a.1 - per_sample * a.0 as f64,
            per_sample,
        })
    }

    /// Least-squares fit through `(batch, bytes)` points.
    pub fn fit(points: &[(u64, f64)]) -> Option<Line> {
        let n = points.len() as f64;
        if points.len() < 2 {
            return None;
        }
        let mx = points.iter().map(|p| p.0 as f64).sum::<f64>() / n;
        let my = points.iter().map(|p| p.1).sum::<f64>() / n;
        let sxx: f64 = points.iter().map(|p| (p.0 as f64 - mx).powi(2)).sum();
        let sxy: f64 = points.iter().map(|p| (p.0 as f64 - mx) * (p.1 - my)).sum();
        if sxx == 0.0 || sxy <= 0.0 {
            return None;
        }
        let per_sample = sxy / sxx;
        Some(Line {
            fixed: my - per_sample * mx,
            per_sample,
        })
    }

    /// Bytes at batch `b`.
    pub fn at(&self, b: u64) -> f64 {
        self.fixed + self.per_sample * b as f64
    }

    /// The largest batch whose bytes fit `budget` (0 if none).
    pub fn max_batch(&self, budget: Bytes) -> u64 {
        let room = budget.as_f64() - self.fixed;
        if room <= 0.0 {
            0
        } else {
            (room / self.per_sample).floor() as u64
        }
    }
}

/// Result of [`ladder_then_bisect`] or [`each_listed`].
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LadderResult {
    /// Largest batch that ran.
    pub max_batch: Option<u64>,
    /// Smallest batch that ran out of memory (max_batch + 1 when the search finished).
    pub smallest_failure: Option<u64>,
    /// The batch whose crash or time-out stopped the search, if one did.
    pub stopped_at: Option<u64>,
    /// The cap was reached while still running: the limit lies above it.
    pub capped: bool,
    /// Every trial in order, with why it was run.
    pub trials: Vec<(u64, TrialReason, Verdict)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_fit() {
        let l = Line::fit(&[(1, 12.0), (2, 14.0), (3, 16.0)]).unwrap();
        assert!((l.fixed - 10.0).abs() < 1e-9 && (l.per_sample - 2.0).abs() < 1e-9);
        assert_eq!(l.max_batch(Bytes(20)), 5);
    }

    #[test]
    fn a_trial_writes_its_reason_and_code() {
        let t = TrialRecord {
            batch: 8,
            reason: TrialReason::JustUnderPrediction,
            verdict: Verdict::OutOfMemory,
        };
        let v = serde_json::to_value(&t).unwrap();
        assert_eq!(v["reason"], "just under the prediction");
        assert_eq!(v["reason_code"], "just_under_prediction");
        assert_eq!(v["outcome"], "out_of_memory");
    }
}
