//! The largest batch that fits: predict from the plan, calibrate the plan's line
//! with measured peaks at two small batches, run one step at the predicted
//! limit, and bisect only the gap that remains. No blind doubling.

use batchfit_plan::Bytes;
use serde::Serialize;

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

/// One logged trial.
#[derive(Clone, Debug, Serialize)]
pub struct TrialRecord {
    pub batch: u64,
    /// Why this batch was tried: calibration, prediction, step-up, bisection.
    pub reason: &'static str,
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
    let mut run = |b: u64, reason: &'static str, trials: &mut Vec<TrialRecord>| -> Verdict {
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

    // Two calibration batches, a quarter and a half of the planned limit: far
    // enough from zero that activations, not fixed temporaries (the optimizer's
    // update), set the peak, so the measured slope is the per-sample cost.
    let b1 = (planned_limit / 4).max(1);
    let b2 = (planned_limit / 2).max(b1 + 1).min(cap);
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
            match run(b, "calibration", &mut trials) {
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
            let mut reason = "prediction";
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
                        reason = "step-up";
                    }
                    Verdict::OutOfMemory => {
                        hi = Some(b);
                        // The calibrated line is usually a few percent optimistic at the
                        // limit; one step just under it often closes the gap at once.
                        let under = (b as f64 / 1.05).floor() as u64;
                        if reason == "prediction" && under > lo {
                            match run(under, "just under the prediction", &mut trials) {
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
                match run(b, "bisection", &mut trials) {
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
            match run(mid, "bisection", &mut trials) {
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
    pub trials: Vec<(u64, &'static str, Verdict)>,
}

/// Runs exactly `batches`, in order, and summarises them: the largest that
/// ran, the smallest out of memory (not necessarily adjacent).
pub fn each_listed(
    batches: &[u64],
    mut trial: impl FnMut(u64, &'static str) -> Verdict,
) -> LadderResult {
    let mut r = LadderResult::default();
    for &b in batches {
        let v = trial(b, "listed");
        r.trials.push((b, "listed", v));
        match v {
            Verdict::Runs { .. } => r.max_batch = r.max_batch.max(Some(b)),
            Verdict::OutOfMemory => {
                r.smallest_failure = Some(r.smallest_failure.map_or(b, |f| f.min(b)))
            }
            Verdict::Broken => {}
        }
    }
    r
}

/// Largest batch that runs, exactly, when nothing predicts memory (an external
/// command): doubling from `start` up to `cap` until the first out-of-memory,
/// then integer bisection of the gap, so `max_batch + 1` is a measured failure.
/// The doubling rungs double as the geometric samples of the throughput curve.
/// A crash or time-out stops the search: it is not evidence about memory.
pub fn ladder_then_bisect(
    start: u64,
    cap: u64,
    mut trial: impl FnMut(u64, &'static str) -> Verdict,
) -> LadderResult {
    let mut r = LadderResult::default();
    let mut run = |b: u64, why: &'static str, r: &mut LadderResult| {
        let v = trial(b, why);
        r.trials.push((b, why, v));
        v
    };
    let cap = cap.max(1);
    let mut b = start.clamp(1, cap);
    loop {
        match run(b, "doubling", &mut r) {
            Verdict::Runs { .. } => r.max_batch = Some(b),
            Verdict::OutOfMemory => {
                r.smallest_failure = Some(b);
                break;
            }
            Verdict::Broken => {
                r.stopped_at = Some(b);
                return r;
            }
        }
        if b == cap {
            r.capped = true;
            return r;
        }
        b = b.saturating_mul(2).min(cap);
    }
    let mut lo = r.max_batch.unwrap_or(0);
    let mut hi = r.smallest_failure.expect("the ladder ended on a failure");
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        match run(mid, "bisection", &mut r) {
            Verdict::Runs { .. } => lo = mid,
            Verdict::OutOfMemory => hi = mid,
            Verdict::Broken => {
                r.stopped_at = Some(mid);
                break;
            }
        }
    }
    r.max_batch = (lo > 0).then_some(lo);
    r.smallest_failure = Some(hi);
    r
}

/// The ratio of the predicting search's rungs, and the furthest it extrapolates a
/// line past the largest batch that ran.
const RUNG: u64 = 8;

/// How [`predict_then_bracket`] searches.
#[derive(Clone, Copy, Debug)]
pub struct PredictOptions {
    /// First batch tried.
    pub start: u64,
    /// Never try above this.
    pub cap: u64,
    /// The memory the measured peaks are held against.
    pub budget: Bytes,
    /// Done when the largest batch that ran, x (1 + tolerance), ran out of memory.
    pub tolerance: f64,
    /// Give up after this many trials.
    pub max_trials: usize,
}

/// Largest batch that runs, to within `tolerance`, for a command whose peak
/// memory is measured at every trial: two rungs (`start`, then 8 x `start`)
/// give a line `fixed + per_sample x B` through the measured peaks; one trial
/// just under the line's batch at the budget, one `tolerance` above it to
/// confirm the bracket. Where memory is linear in the batch that is four
/// trials. The line is refitted after each success, through the largest batch
/// that ran and the largest at most half of it (memory may bend; peaks are
/// coarse). A prediction more than one rung past
/// the largest batch that ran is approached halfway (in log space) first. Once a
/// trial ran out of memory, a prediction is tried only in the lower half of the
/// bracket, else the gap is bisected geometrically. A crash or time-out stops the search, as
/// in [`ladder_then_bisect`].
pub fn predict_then_bracket(
    opts: &PredictOptions,
    mut trial: impl FnMut(u64, &'static str) -> Verdict,
) -> LadderResult {
    let mut r = LadderResult::default();
    let cap = opts.cap.max(1);
    let tol = opts.tolerance.max(1e-6);
    let mut lo = 0u64;
    let mut hi: Option<u64> = None;
    let mut peaks: Vec<(u64, f64)> = Vec::new();
    let mut run = |b: u64, why: &'static str, r: &mut LadderResult| {
        let v = trial(b, why);
        r.trials.push((b, why, v));
        v
    };
    let done = |lo: u64, hi: Option<u64>| {
        hi.is_some_and(|h| h <= lo + 1 || (lo as f64 * (1.0 + tol)).ceil() as u64 >= h)
    };
    // The next batch: the line's prediction just under the budget, else a
    // step of `tolerance` above the largest run, else geometric bisection.
    // A prediction further than one rung (`RUNG` x the largest run) is not
    // trusted: a line through small batches is mostly the allocator's fixed
    // part and its granularity (PyTorch's VmPeak grows by glibc's 64 MiB
    // arenas), so the next trial goes halfway there in log space and the line
    // is refitted from it. Inside a bracket a prediction is used only below
    // the bracket's (geometric) midpoint; else the bracket is bisected.
    // `ran_up`: confirmations in a row that ran (the line keeps saying the
    // budget is just above): each doubles the next step, an exponential search.
    // `down`: trials in a row that ran out of memory, the first a prediction:
    // the largest batch is likely just under it, so the next trial backs off
    // from it by `tolerance`, doubling with each further failure, never below
    // the bracket's midpoint (the same exponential search, downward).
    let next = |lo: u64,
                hi: Option<u64>,
                peaks: &[(u64, f64)],
                ran_up: i32,
                down: Option<i32>|
     -> (u64, &'static str) {
        let top = hi.map_or(cap, |h| h - 1).min(cap);
        let mid = |lo: u64, h: u64| {
            ((lo.max(1) as f64 * h as f64).sqrt().round() as u64).clamp(lo + 1, h - 1)
        };
        if lo == 0 {
            return match hi {
                Some(h) => (h / 2, "bisection"),
                None => (opts.start.clamp(1, cap), "start"),
            };
        }
        if peaks.len() < 2 {
            return match hi {
                Some(h) => (mid(lo, h), "bisection"),
                None => ((lo.saturating_mul(RUNG)).min(top), "rung"),
            };
        }
        // The largest run and, as a base, the largest run at most half its batch
        // (else the one below it): near enough that a bend in memory shows, wide
        // enough that the peaks' granularity does not set the slope.
        let mut sorted: Vec<(u64, f64)> = peaks.to_vec();
        sorted.sort_by_key(|p| p.0);
        let last = sorted[sorted.len() - 1];
        let base = sorted
            .iter()
            .rev()
            .find(|p| p.0 * 2 <= last.0)
            .copied()
            .unwrap_or(sorted[sorted.len() - 2]);
        let line = Line::through(base, last);
        let step_up = ((lo as f64 * (1.0 + tol * 2f64.powi(ran_up))).ceil() as u64)
            .max(lo + 1)
            .min(top);
        // No growth between the two largest runs: memory is not resolved yet.
        let Some(p) = line.map(|l| l.max_batch(opts.budget)) else {
            return match hi {
                Some(h) => (mid(lo, h), "bisection"),
                None => ((lo.saturating_mul(RUNG)).min(top), "rung"),
            };
        };
        let under = (p as f64 * (1.0 - tol / 2.0)).floor() as u64;
        if let (Some(h), Some(k)) = (hi, down) {
            let back = (h as f64 * (1.0 - tol * 2f64.powi(k))).floor() as u64;
            if back > lo {
                return (back.max(mid(lo, h)), "back-off");
            }
        }
        match hi {
            // Inside a bracket a prediction past the midpoint is what missed before.
            Some(h) if under > lo && under < mid(lo, h) => (under, "prediction"),
            Some(h) if under <= lo && step_up < h => (step_up.min(mid(lo, h)), "confirmation"),
            Some(h) => (mid(lo, h), "bisection"),
            None if under <= lo => (step_up, "confirmation"),
            None if under > lo.saturating_mul(RUNG) => {
                let toward = (lo as f64 * p as f64).sqrt().round() as u64;
                (toward.clamp(lo + 1, top), "rung")
            }
            None => (under.min(top), "prediction"),
        }
    };
    let mut ran_up = 0;
    let mut down: Option<i32> = None;
    while !done(lo, hi) && r.trials.len() < opts.max_trials {
        if lo >= cap {
            r.capped = true;
            break;
        }
        let (b, why) = next(lo, hi, &peaks, ran_up, down);
        if b == 0 || b <= lo || hi.is_some_and(|h| b >= h) {
            break;
        }
        match run(b, why, &mut r) {
            Verdict::Runs { peak } => {
                lo = b;
                ran_up = if why == "confirmation" { ran_up + 1 } else { 0 };
                down = None;
                if let Some(p) = peak {
                    peaks.push((b, p.as_f64()));
                }
            }
            Verdict::OutOfMemory => {
                hi = Some(hi.map_or(b, |h| h.min(b)));
                down = match (why, down) {
                    ("prediction", _) => Some(0),
                    ("back-off", Some(k)) => Some(k + 1),
                    _ => None,
                };
            }
            Verdict::Broken => {
                r.stopped_at = Some(b);
                break;
            }
        }
    }
    r.max_batch = (lo > 0).then_some(lo);
    r.smallest_failure = hi;
    r
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
    fn line_fit() {
        let l = Line::fit(&[(1, 12.0), (2, 14.0), (3, 16.0)]).unwrap();
        assert!((l.fixed - 10.0).abs() < 1e-9 && (l.per_sample - 2.0).abs() < 1e-9);
        assert_eq!(l.max_batch(Bytes(20)), 5);
    }

    fn ladder_with_threshold(threshold: u64, start: u64, cap: u64) -> LadderResult {
        ladder_then_bisect(start, cap, |b, _| {
            if b <= threshold {
                Verdict::Runs { peak: None }
            } else {
                Verdict::OutOfMemory
            }
        })
    }

    #[test]
    fn ladder_finds_the_exact_threshold() {
        for threshold in [1, 2, 3, 7, 100, 127, 128, 129, 1000, 4097] {
            let r = ladder_with_threshold(threshold, 1, 1 << 20);
            assert_eq!(r.max_batch, Some(threshold), "threshold {threshold}");
            assert_eq!(r.smallest_failure, Some(threshold + 1));
            let failed_at = |b| {
                r.trials
                    .iter()
                    .any(|t| t.0 == b && t.2 == Verdict::OutOfMemory)
            };
            assert!(
                failed_at(threshold + 1) || threshold.is_power_of_two() && failed_at(threshold * 2)
            );
            // doubling rungs + bisection of one octave: about 2 log2(threshold) trials.
            let bound = 2 * (64 - threshold.leading_zeros() as usize) + 2;
            assert!(
                r.trials.len() <= bound,
                "{} trials for {threshold}",
                r.trials.len()
            );
        }
    }

    #[test]
    fn ladder_when_even_the_start_fails_or_the_cap_is_reached() {
        let r = ladder_with_threshold(0, 1, 64);
        assert_eq!((r.max_batch, r.smallest_failure), (None, Some(1)));
        let r = ladder_with_threshold(5, 16, 64);
        assert_eq!((r.max_batch, r.smallest_failure), (Some(5), Some(6)));
        let r = ladder_with_threshold(1000, 1, 100);
        assert_eq!(r.max_batch, Some(100));
        assert!(r.capped && r.smallest_failure.is_none());
        assert_eq!(r.trials.last().unwrap().0, 100);
    }

    #[test]
    fn ladder_stops_at_a_crash_without_calling_it_out_of_memory() {
        let r = ladder_then_bisect(1, 1 << 20, |b, _| match b {
            ..=8 => Verdict::Runs { peak: None },
            _ => Verdict::Broken,
        });
        assert_eq!(r.max_batch, Some(8));
        assert_eq!(r.smallest_failure, None);
        assert_eq!(r.stopped_at, Some(16));
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

    /// A command whose memory is `fixed + per x B` with a budget: at most 6
    /// trials to within 2 %, across starts, slopes and budgets.
    #[test]
    fn predicting_search_brackets_linear_memory_in_few_trials() {
        let cases: [(f64, f64, f64, u64); 4] = [
            (500e6, 2.0e5, 4.0e9, 64),
            (300e6, 1.0e6, 6.0e9, 1),
            (2.0e9, 3.3e4, 4.0e9, 64),
            (100e6, 5.0e7, 24.0e9, 8),
        ];
        for (fixed, per, budget, start) in cases {
            let r = search_peaks(start, budget, |b| fixed + per * b as f64);
            assert!(
                r.trials.len() <= 6,
                "{} trials: {:?}",
                r.trials.len(),
                r.trials
            );
        }
    }

    /// The predicting search from `start` under `budget` for a command whose
    /// peak at batch b is `peak(b)`, checked to land within 2 % under the true
    /// largest batch.
    fn search_peaks(start: u64, budget: f64, peak: impl Fn(u64) -> f64) -> LadderResult {
        let truth = (1..1_000_000u64)
            .take_while(|&b| peak(b) <= budget)
            .last()
            .unwrap();
        let r = predict_then_bracket(
            &PredictOptions {
                start,
                cap: 1 << 30,
                budget: Bytes(budget as u64),
                tolerance: 0.02,
                max_trials: 40,
            },
            |b, _| {
                if peak(b) <= budget {
                    Verdict::fits(Bytes(peak(b) as u64))
                } else {
                    Verdict::OutOfMemory
                }
            },
        );
        let m = r.max_batch.unwrap();
        assert!(
            m <= truth && m as f64 >= truth as f64 / 1.02,
            "{m} vs {truth}: {r:?}"
        );
        r
    }

    /// Memory measured in coarse steps, as a process's VmPeak grows by glibc's
    /// 64 MiB arenas: a line through two small batches is mostly the steps, so
    /// the search approaches its prediction instead of jumping to it.
    #[test]
    fn predicting_search_survives_coarse_memory_steps() {
        const STEP: f64 = 64.0 * 1024.0 * 1024.0;
        for (fixed, per) in [(3.65e9, 42.5e3), (3.0e9, 1.0e5), (1.0e9, 3.0e5)] {
            let r = search_peaks(64, 4.096e9, |b| {
                ((fixed + per * b as f64) / STEP).ceil() * STEP
            });
            assert!(r.trials.len() <= 10, "{:?}", r.trials);
        }
    }

    /// Memory that bends upward: the prediction misses, bisection finishes.
    #[test]
    fn predicting_search_falls_back_to_bisection() {
        let r = search_peaks(16, 8.0e9, |b| {
            1e8 + 1e5 * b as f64 + 2.0 * (b as f64).powi(2)
        });
        assert!(r.trials.len() <= 12, "{:?}", r.trials);
    }

    #[test]
    fn predicting_search_stops_at_a_crash() {
        let r = predict_then_bracket(
            &PredictOptions {
                start: 8,
                cap: 1 << 20,
                budget: Bytes(1 << 30),
                tolerance: 0.02,
                max_trials: 24,
            },
            |b, _| {
                if b > 8 {
                    Verdict::Broken
                } else {
                    Verdict::fits(Bytes(1000 * b))
                }
            },
        );
        assert_eq!(r.max_batch, Some(8));
        assert_eq!(r.stopped_at, Some(64));
        assert_eq!(r.smallest_failure, None);
    }
}
