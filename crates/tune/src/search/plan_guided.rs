//! The engine's search: the plan predicts the limit, two measured peaks
//! calibrate its line, one step at the predicted limit confirms it, and only
//! the gap that remains is bisected.

use super::{Line, TrialReason, TrialRecord, Verdict};
use batchfit_plan::Bytes;
use serde::Serialize;

/// How far under a prediction that ran out of memory the next trial goes. The
/// calibrated line is usually a few percent optimistic at the limit (the burn
/// plan's measured error on the corpus is within about 8 %, most models within
/// 3 %), so a step 5 % under often closes the gap in one trial.
const JUST_UNDER: f64 = 1.05;

/// The calibration batches as shares of the plan's limit: a quarter and a half,
/// far enough from zero that activations, not fixed temporaries (the
/// optimizer's update), set the peak, so the measured slope is the per-sample
/// cost; small enough that both fit even when the plan over-predicts 2x.
const CALIBRATION_DIVISORS: [u64; 2] = [4, 2];

/// How the search runs.
#[derive(Clone, Copy, Debug)]
pub struct SearchOptions {
    pub budget: Bytes,
    /// The answer is within this factor: `ceil(answer x tolerance)` does not fit.
    pub tolerance: f64,
    /// Never try a batch above this (dataset size, a sanity cap).
    pub cap: u64,
    /// Give up after this many trials.
    pub max_trials: usize,
}

impl SearchOptions {
    /// The probe's search under `budget`: the answer within 10 % (a limit
    /// measured closer would not survive a longer run's fragmentation), never
    /// past 2^24 samples (the worker builds a synthetic batch of that many
    /// rows), and at most 24 trials (each starts a worker and runs one step:
    /// the exact plan needs 3-4, a plan off by half about 10).
    pub fn probe(budget: Bytes) -> SearchOptions {
        SearchOptions {
            budget,
            tolerance: 1.1,
            cap: 1 << 24,
            max_trials: 24,
        }
    }
}

/// What the search found, and every trial it took.
#[derive(Clone, Debug, Serialize)]
pub struct SearchResult {
    /// Largest batch that ran; `None` if not even batch 1 did.
    pub max_batch: Option<u64>,
    /// Smallest batch that ran out of memory; `None` if the cap was reached first.
    pub smallest_failure: Option<u64>,
    /// The plan's line calibrated with the measured peaks.
    pub calibrated: Option<Line>,
    pub predicted_limit: u64,
    /// The batch whose crash or time-out stopped the search, if one did.
    pub stopped_at: Option<u64>,
    pub trials: Vec<TrialRecord>,
}

/// Finds the largest batch for which `try_batch` fits, starting from the plan's line.
/// A [`Verdict::Broken`] trial ends the search at once (`stopped_at`): a crash
/// is not evidence about memory.
pub fn find_max_batch(
    planned: Line,
    opts: &SearchOptions,
    mut try_batch: impl FnMut(u64) -> Verdict,
) -> SearchResult {
    let mut trials: Vec<TrialRecord> = Vec::new();
    let mut run = |b: u64, reason: TrialReason, trials: &mut Vec<TrialRecord>| -> Verdict {
        if let Some(t) = trials.iter().find(|t| t.batch == b) {
            return t.verdict;
        }
        let verdict = try_batch(b);
        trials.push(TrialRecord {
            batch: b,
            reason,
            verdict,
        });
        verdict
    };
    let cap = opts.cap.max(1);
    let planned_limit = planned.max_batch(opts.budget).clamp(1, cap);

    let [first, second] = CALIBRATION_DIVISORS;
    let b1 = (planned_limit / first).max(1);
    let b2 = (planned_limit / second).max(b1 + 1).min(cap);
    let mut lo = 0u64; // largest known fit
    let mut hi: Option<u64> = None; // smallest known failure
    let mut stopped_at: Option<u64> = None;
    let mut peaks = Vec::new();
    let mut calibrated = None;
    let mut predicted_limit = planned_limit;
    'search: {
        for b in [b1, b2] {
            if b > cap || hi.is_some_and(|h| b >= h) {
                continue;
            }
            match run(b, TrialReason::Calibration, &mut trials) {
                Verdict::Runs { peak } => {
                    lo = lo.max(b);
                    if let Some(p) = peak {
                        peaks.push((b, p.as_f64()));
                    }
                }
                Verdict::OutOfMemory => hi = Some(hi.map_or(b, |h| h.min(b))),
                Verdict::Broken => {
                    stopped_at = Some(b);
                    break 'search;
                }
            }
        }
        calibrated = match peaks.as_slice() {
            [a, b] => Line::through(*a, *b),
            _ => None,
        };
        let line = calibrated.unwrap_or(planned);
        predicted_limit = line.max_batch(opts.budget).clamp(1, cap);

        // One step at the predicted limit, then step up by the tolerance while it fits.
        if hi.is_none() {
            let mut b = predicted_limit.max(lo + 1).min(cap);
            let mut reason = TrialReason::Prediction;
            loop {
                if b <= lo {
                    break;
                }
                match run(b, reason, &mut trials) {
                    Verdict::Runs { .. } => {
                        lo = b;
                        if b >= cap || trials.len() >= opts.max_trials {
                            break;
                        }
                        b = ((b as f64 * opts.tolerance).ceil() as u64)
                            .max(b + 1)
                            .min(cap);
                        reason = TrialReason::StepUp;
                    }
                    Verdict::OutOfMemory => {
                        hi = Some(b);
                        let under = (b as f64 / JUST_UNDER).floor() as u64;
                        if reason == TrialReason::Prediction && under > lo {
                            match run(under, TrialReason::JustUnderPrediction, &mut trials) {
                                Verdict::Runs { .. } => lo = under,
                                Verdict::OutOfMemory => hi = Some(under),
                                Verdict::Broken => {
                                    stopped_at = Some(under);
                                    break 'search;
                                }
                            }
                        }
                        break;
                    }
                    Verdict::Broken => {
                        stopped_at = Some(b);
                        break 'search;
                    }
                }
            }
        }

        // Not even the calibration fitted: search below it.
        if lo == 0
            && let Some(mut h) = hi
        {
            while h > 1 && trials.len() < opts.max_trials {
                let b = (h / 2).max(1);
                match run(b, TrialReason::Bisection, &mut trials) {
                    Verdict::Runs { .. } => {
                        lo = b;
                        hi = Some(h);
                        break;
                    }
                    Verdict::OutOfMemory => {
                        h = b;
                        hi = Some(b);
                    }
                    Verdict::Broken => {
                        stopped_at = Some(b);
                        break 'search;
                    }
                }
            }
        }
        // Bisect (geometrically) the gap between the largest fit and the smallest failure.
        while let Some(h) = hi {
            if lo == 0 || (lo as f64 * opts.tolerance).ceil() as u64 >= h || h <= lo + 1 {
                break;
            }
            if trials.len() >= opts.max_trials {
                break;
            }
            let mid = ((lo as f64 * h as f64).sqrt().round() as u64).clamp(lo + 1, h - 1);
            match run(mid, TrialReason::Bisection, &mut trials) {
                Verdict::Runs { .. } => lo = mid,
                Verdict::OutOfMemory => hi = Some(mid),
                Verdict::Broken => {
                    stopped_at = Some(mid);
                    break 'search;
                }
            }
        }
    }
    SearchResult {
        max_batch: (lo > 0).then_some(lo),
        smallest_failure: hi,
        calibrated,
        predicted_limit,
        stopped_at,
        trials,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(fixed: u64, per: u64, budget: u64) -> impl FnMut(u64) -> Verdict {
        move |b| {
            let peak = fixed + per * b;
            if peak <= budget {
                Verdict::fits(Bytes(peak))
            } else {
                Verdict::OutOfMemory
            }
        }
    }

    fn opts(budget: u64) -> SearchOptions {
        SearchOptions {
            budget: Bytes(budget),
            tolerance: 1.1,
            cap: 1 << 30,
            max_trials: 40,
        }
    }

    fn check(res: &SearchResult, truth: u64) {
        let m = res.max_batch.unwrap();
        assert!(m <= truth, "{m} > {truth}");
        assert!(
            (m as f64 * 1.1).ceil() as u64 > truth,
            "{m} too far below {truth}"
        );
    }

    #[test]
    fn exact_plan_needs_few_trials() {
        let budget = 512 << 20;
        let planned = Line {
            fixed: 1e6,
            per_sample: 1e5,
        };
        let res = find_max_batch(planned, &opts(budget), device(1_000_000, 100_000, budget));
        check(&res, (budget - 1_000_000) / 100_000);
        assert!(res.trials.len() <= 4, "{:?}", res.trials);
    }

    #[test]
    fn plan_off_by_a_third_is_corrected_by_calibration() {
        let budget = 512 << 20;
        // The plan thinks a sample costs two thirds of what it does.
        let planned = Line {
            fixed: 1e6,
            per_sample: 6.6e4,
        };
        let res = find_max_batch(planned, &opts(budget), device(3_000_000, 100_000, budget));
        check(&res, (budget - 3_000_000) / 100_000);
        assert!(res.trials.len() <= 5, "{:?}", res.trials);
        let c = res.calibrated.unwrap();
        assert!((c.per_sample - 1e5).abs() < 1.0);
    }

    #[test]
    fn plan_off_by_half_still_converges() {
        let budget = 512 << 20;
        let planned = Line {
            fixed: 1e6,
            per_sample: 5e4,
        };
        let res = find_max_batch(planned, &opts(budget), device(3_000_000, 100_000, budget));
        check(&res, (budget - 3_000_000) / 100_000);
        assert!(res.trials.len() <= 10, "{:?}", res.trials);
    }

    #[test]
    fn nonlinear_memory_is_bisected() {
        let budget: u64 = 100 << 20;
        // Memory grows faster than linear: calibration underestimates the limit's cost.
        let mut dev = |b: u64| {
            let peak = 1_000_000 + 10_000 * b + 20 * b * b;
            if peak <= budget {
                Verdict::fits(Bytes(peak))
            } else {
                Verdict::OutOfMemory
            }
        };
        let truth = (1..100_000u64)
            .take_while(|&b| 1_000_000 + 10_000 * b + 20 * b * b <= budget)
            .last()
            .unwrap();
        let res = find_max_batch(
            Line {
                fixed: 1e6,
                per_sample: 1e4,
            },
            &opts(budget),
            &mut dev,
        );
        check(&res, truth);
        assert!(res.trials.len() <= 12, "{}", res.trials.len());
    }

    #[test]
    fn nothing_fits() {
        let res = find_max_batch(
            Line {
                fixed: 1e6,
                per_sample: 1e4,
            },
            &opts(1 << 20),
            |_| Verdict::OutOfMemory,
        );
        assert_eq!(res.max_batch, None);
        assert_eq!(res.smallest_failure, Some(1));
    }

    #[test]
    fn max_batch_search_stops_at_a_crash_without_calling_it_out_of_memory() {
        let budget = 512u64 << 20;
        let planned = Line {
            fixed: 1e6,
            per_sample: 1e5,
        };
        // Fits by memory up to ~5,200, but crashes (not OOM) from 3,000 on.
        let res = find_max_batch(planned, &opts(budget), |b| {
            if b >= 3000 {
                Verdict::Broken
            } else {
                Verdict::fits(Bytes(1_000_000 + 100_000 * b))
            }
        });
        assert!(res.stopped_at.is_some_and(|b| b >= 3000), "{res:?}");
        assert_eq!(
            res.smallest_failure, None,
            "a crash is not a memory failure"
        );
        assert!(res.max_batch.is_some_and(|m| m < 3000));
        let last = res.trials.last().unwrap();
        assert_eq!(last.verdict, Verdict::Broken);
        assert_eq!(Some(last.batch), res.stopped_at);
    }
}
