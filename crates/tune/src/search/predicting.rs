//! A user's command whose peak memory is measured at every trial (under
//! `--memory-limit`, or on a GPU NVML sees): a line through measured peaks
//! predicts the limit, and a bracket of `tolerance` confirms it.

use super::{LadderResult, Line, TrialReason, Verdict};
use batchfit_plan::Bytes;

/// The ratio of the predicting search's rungs, and the furthest it extrapolates a
/// line past the largest batch that ran: two peaks 8x apart resolve the
/// per-sample slope even where a process's peak grows in glibc's 64 MiB arenas,
/// and a line is not trusted much further than the span it was measured over.
const RUNG: u64 = 8;

/// Trials a predicting search of a user's command may take: on linear memory it
/// needs 4-6 (tests), on coarse or bending memory up to about 12, and where a
/// process's limit also moves between runs 9 on average and up to 17
/// (simulated, tests); 40 leaves room
/// for a curve that defeats every prediction to be bisected down to 2 % from
/// 2^20 (about 20 rungs and halvings) before it gives up.
pub const MAX_TRIALS: usize = 40;

/// The plan counts the runtime's tensors (within about 10 % on bench/'s
/// corpus); a process's address space grows faster, by the allocator's
/// slack (glibc keeps freed chunks mapped: 27 % over the plan's bytes per
/// sample on examples/run_pytorch.py). The trial after the first is a
/// measuring trial: it takes the share `1 / HINT_SLACK` of the room the
/// plan's slope sees above the first trial's peak, so a slope up to half
/// again the plan's still runs, and its peak, far from the first trial's,
/// measures the slope itself; the line through the two predicts the limit.
const HINT_SLACK: f64 = 1.5;

/// Confirmations that ran in a row widen the next step by doubling it, at
/// most to this many times `tolerance`: peaks measured near the budget
/// flatten (the allocator works within the limit), so a line through them
/// keeps saying "just above" while the limit is a few percent further; a
/// step wider than twice the tolerance costs more halvings back than it saves.
const MAX_CONFIRMATION_STEPS: f64 = 2.0;

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
    /// Bytes each further sample adds, from the plan of the same network
    /// (`run --model`): the first trial's peak and this slope predict the
    /// limit at once, without the rung that would measure the slope.
    pub per_sample_hint: Option<f64>,
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
/// in [`super::ladder_then_bisect`].
pub fn predict_then_bracket(
    opts: &PredictOptions,
    mut trial: impl FnMut(u64, TrialReason) -> Verdict,
) -> LadderResult {
    let mut r = LadderResult::default();
    let cap = opts.cap.max(1);
    let tol = opts.tolerance.max(1e-6);
    let mut lo = 0u64;
    let mut hi: Option<u64> = None;
    let mut peaks: Vec<(u64, f64)> = Vec::new();
    let mut run = |b: u64, why: TrialReason, r: &mut LadderResult| {
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
     -> (u64, TrialReason) {
        let top = hi.map_or(cap, |h| h - 1).min(cap);
        let mid = |lo: u64, h: u64| {
            ((lo.max(1) as f64 * h as f64).sqrt().round() as u64).clamp(lo + 1, h - 1)
        };
        if lo == 0 {
            return match hi {
                Some(h) => (h / 2, TrialReason::Bisection),
                None => (opts.start.clamp(1, cap), TrialReason::Start),
            };
        }
        // With one measured peak, the plan's slope through it, trusted as far
        // as it predicts (it was not measured over a short span).
        let hinted = match (peaks, opts.per_sample_hint) {
            ([only], Some(slope)) if slope > 0.0 => Some(Line {
                fixed: only.1 - slope * only.0 as f64,
                per_sample: slope,
            }),
            _ => None,
        };
        if peaks.len() < 2 && hinted.is_none() {
            return match hi {
                Some(h) => (mid(lo, h), TrialReason::Bisection),
                None => ((lo.saturating_mul(RUNG)).min(top), TrialReason::Rung),
            };
        }
        // The largest run and, as a base, the largest run at most half its batch
        // (else the one below it): near enough that a bend in memory shows, wide
        // enough that the peaks' granularity does not set the slope.
        let line = hinted.or_else(|| {
            let mut sorted: Vec<(u64, f64)> = peaks.to_vec();
            sorted.sort_by_key(|p| p.0);
            let last = sorted[sorted.len() - 1];
            let base = sorted
                .iter()
                .rev()
                .find(|p| p.0 * 2 <= last.0)
                .copied()
                .unwrap_or(sorted[sorted.len() - 2]);
            Line::through(base, last)
        });
        let widen = 2f64.powi(ran_up).min(MAX_CONFIRMATION_STEPS);
        let step_up = ((lo as f64 * (1.0 + tol * widen)).ceil() as u64)
            .max(lo + 1)
            .min(top);
        // No growth between the two largest runs: memory is not resolved yet.
        let Some(p) = line.map(|l| l.max_batch(opts.budget)) else {
            return match hi {
                Some(h) => (mid(lo, h), TrialReason::Bisection),
                None => ((lo.saturating_mul(RUNG)).min(top), TrialReason::Rung),
            };
        };
        let under = match hinted {
            Some(_) => lo + ((p.saturating_sub(lo)) as f64 / HINT_SLACK).floor() as u64,
            None => (p as f64 * (1.0 - tol / 2.0)).floor() as u64,
        };
        // The back-off from a failure at `h`, `k` failures into it. After the
        // plan's hint it keeps the share of the room the hint kept. After a
        // line's prediction it is first the batch a tolerance step below `h`,
        // h / (1 + tol), so that if it runs the bracket is closed (h (1 - tol)
        // lands a few samples short of that and costs a trial more), then
        // h (1 - tol 2^k), an exponential search downward.
        if let (Some(h), Some(k)) = (hi, down) {
            let widened = 2f64.powi(k);
            let back = if hinted.is_some() {
                (h as f64 * (1.0 - (1.0 - 1.0 / HINT_SLACK) * widened)).floor()
            } else if k == 0 {
                (h as f64 / (1.0 + tol)).ceil()
            } else {
                (h as f64 * (1.0 - tol * widened)).floor()
            } as u64;
            if back > lo {
                return (back.max(mid(lo, h)), TrialReason::BackOff);
            }
        }
        // A prediction nearer the largest run than two confirmation steps
        // tells less than the confirmation: the confirmation ends the search
        // if it runs out of memory, where a failed prediction that far leaves
        // a bracket wider than the tolerance and takes another trial; if both
        // would run, the prediction gains at most one step.
        let two_steps = ((lo as f64 * (1.0 + 2.0 * tol * widen)).ceil() as u64).min(top);
        match hi {
            // Inside a bracket a prediction past the midpoint is what missed before.
            Some(h) if under >= step_up && under < mid(lo, h) => (under, TrialReason::Prediction),
            Some(h) if under < step_up && step_up < h => {
                (step_up.min(mid(lo, h)), TrialReason::Confirmation)
            }
            Some(h) => (mid(lo, h), TrialReason::Bisection),
            None if under < two_steps => (step_up, TrialReason::Confirmation),
            None if hinted.is_none() && under > lo.saturating_mul(RUNG) => {
                let toward = (lo as f64 * p as f64).sqrt().round() as u64;
                (toward.clamp(lo + 1, top), TrialReason::Rung)
            }
            None => (under.min(top), TrialReason::Prediction),
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
                ran_up = if why == TrialReason::Confirmation {
                    ran_up + 1
                } else {
                    0
                };
                down = None;
                if let Some(p) = peak {
                    peaks.push((b, p.as_f64()));
                }
            }
            Verdict::OutOfMemory => {
                hi = Some(hi.map_or(b, |h| h.min(b)));
                down = match (why, down) {
                    (TrialReason::Prediction, _) => Some(0),
                    (TrialReason::BackOff, Some(k)) => Some(k + 1),
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
        search_hinted(start, budget, None, peak)
    }

    /// [`search_peaks`] with the plan's per-sample bytes as a hint.
    fn search_hinted(
        start: u64,
        budget: f64,
        hint: Option<f64>,
        peak: impl Fn(u64) -> f64,
    ) -> LadderResult {
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
                per_sample_hint: hint,
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
                per_sample_hint: None,
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

    /// examples/run_pytorch.py's search under 4,096,000,000 bytes, from 64
    /// with the plan's slope (33.7 KB a sample) where the process's is 42.7
    /// KB: a command that runs out of memory above `fails_above` (before its
    /// neighbours' peaks say), its peak `low(b)` under the line. Returns the
    /// search and why each batch was tried.
    fn search_failing_above(
        fails_above: u64,
        low: impl Fn(u64) -> f64,
    ) -> (LadderResult, Vec<TrialReason>) {
        let r = predict_then_bracket(
            &PredictOptions {
                start: 64,
                cap: 1 << 30,
                budget: Bytes(4_096_000_000),
                tolerance: 0.02,
                max_trials: 40,
                per_sample_hint: Some(33.7e3),
            },
            |b, _| {
                if b <= fails_above {
                    Verdict::fits(Bytes((3.65e9 + 42.7e3 * b as f64 - low(b)) as u64))
                } else {
                    Verdict::OutOfMemory
                }
            },
        );
        let reasons = r.trials.iter().map(|t| t.1).collect();
        (r, reasons)
    }

    /// A process's VmPeak moves by tens of MB at one batch. A peak 10 MB low
    /// at the prediction that ran tilts the refitted line 3 % past it: the
    /// confirmation 2 % up is tried rather than that prediction, and its
    /// failure closes the bracket in four trials.
    #[test]
    fn a_prediction_within_two_steps_gives_way_to_the_confirmation() {
        let fails_above = 10_440;
        let (r, reasons) = search_failing_above(fails_above, |b| {
            if (10_000..10_450).contains(&b) {
                10e6
            } else {
                0.0
            }
        });
        use TrialReason::{Confirmation, Prediction, Start};
        assert_eq!(
            reasons,
            [Start, Prediction, Prediction, Confirmation],
            "{:?}",
            r.trials
        );
        let found = r.max_batch.unwrap();
        assert!(found <= fails_above && found as f64 * 1.02 >= fails_above as f64);
    }

    /// The command failing below the line's limit (10,200 where the line
    /// says 10,445): the prediction runs out of memory, and the back-off a
    /// tolerance step under it, h / 1.02, runs and closes the bracket: four
    /// trials (h x 0.98 lands a few samples short and needs a fifth).
    #[test]
    fn a_back_off_from_a_failed_prediction_closes_the_bracket() {
        let fails_above = 10_200;
        let (r, reasons) = search_failing_above(fails_above, |_| 0.0);
        use TrialReason::{BackOff, Prediction, Start};
        assert_eq!(
            reasons,
            [Start, Prediction, Prediction, BackOff],
            "{:?}",
            r.trials
        );
        let (found, failed) = (r.max_batch.unwrap(), r.smallest_failure.unwrap());
        assert!(found <= fails_above && (found as f64 * 1.02).ceil() as u64 >= failed);
    }

    /// `run --model`: the plan's slope, off by up to 10 % either way, and the
    /// first trial's peak predict the limit; on linear memory the search needs
    /// at most 4 trials to within 2 %. On coarse memory (64 MiB steps) with
    /// little room above the fixed part (3 GB of 4.1), a line through two
    /// peaks is off by a step at either end, and bisection finishes: at most 7.
    #[test]
    fn a_plan_slope_finds_the_limit_in_four_trials() {
        const STEP: f64 = 64.0 * 1024.0 * 1024.0;
        for (fixed, per, budget, start) in [
            (500e6, 2.0e5, 4.0e9, 64),
            (3.0e9, 1.0e5, 4.096e9, 64),
            (1.0e9, 3.0e5, 4.096e9, 16),
            (300e6, 1.0e6, 6.0e9, 1),
        ] {
            for error in [0.9, 0.97, 1.0, 1.03, 1.1] {
                for coarse in [false, true] {
                    let r = search_hinted(start, budget, Some(per * error), |b| {
                        let exact = fixed + per * b as f64;
                        if coarse {
                            (exact / STEP).ceil() * STEP
                        } else {
                            exact
                        }
                    });
                    assert!(
                        r.trials.len() <= if coarse { 7 } else { 4 },
                        "slope x{error}, coarse {coarse}: {} trials {:?}",
                        r.trials.len(),
                        r.trials
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod simulated {
    use super::*;
    use rand::{Rng, SeedableRng, rngs::StdRng};

    /// A command under `budget` that needs `fixed + per x B` bytes, measured
    /// through the allocator's granularity `gran` (at a phase drawn for each
    /// search) with `noise` bytes either way on each peak. Each trial's need
    /// per sample moves by `spread` either way (a batch near the limit runs in
    /// one process and fails in the next), and the command fails `early`
    /// (a share of the per-sample bytes) before its peaks' line says.
    struct Command {
        fixed: f64,
        per: f64,
        budget: f64,
        gran: f64,
        noise: f64,
        spread: f64,
        early: f64,
    }

    /// Trials one search of `cmd` from 64 took; asserts it closed a 2 % bracket.
    fn trials_to_search(cmd: &Command, rng: &mut StdRng) -> usize {
        let phase = rng.random::<f64>() * cmd.gran;
        let coarse = |bytes: f64| ((bytes + phase) / cmd.gran).ceil() * cmd.gran - phase;
        let mut either_way = |width: f64| width * (rng.random::<f64>() * 2.0 - 1.0);
        let r = predict_then_bracket(
            &PredictOptions {
                start: 64,
                cap: 1 << 30,
                budget: Bytes(cmd.budget as u64),
                tolerance: 0.02,
                max_trials: MAX_TRIALS,
                per_sample_hint: None,
            },
            |b, _| {
                let share = 1.0 + cmd.early + either_way(cmd.spread);
                if coarse(cmd.fixed + cmd.per * b as f64 * share) > cmd.budget {
                    Verdict::OutOfMemory
                } else {
                    let peak = coarse(cmd.fixed + cmd.per * b as f64) + either_way(cmd.noise);
                    Verdict::fits(Bytes(peak as u64))
                }
            },
        );
        let (found, failed) = (r.max_batch.unwrap(), r.smallest_failure.unwrap());
        assert!((found as f64 * 1.02).ceil() as u64 >= failed, "{r:?}");
        r.trials.len()
    }

    /// Peaks in 64 MiB steps with 20-30 MB of noise, a limit that moves 1-2 %
    /// between processes and, for half the commands, a process that fails
    /// 5-10 % before its peaks' line: a PyTorch script's VmPeak under
    /// RLIMIT_AS (bench/README.md) and three other shapes of room. 100
    /// searches each from a fixed seed: every one closes its 2 % bracket
    /// although a batch that ran may fail in the next process, none takes
    /// more than 20 trials, and the mean stays under 9.5 (8.9 at the time of
    /// writing, 46 % of searches within 8).
    #[test]
    fn coarse_noisy_memory_is_searched_in_few_trials() {
        let mut rng = StdRng::seed_from_u64(7);
        let mut trials = Vec::new();
        for (fixed, per, budget) in [
            (3.65e9, 42.7e3, 4.096e9),
            (3.0e9, 1.0e5, 4.096e9),
            (1.0e9, 3.0e5, 4.096e9),
            (2.0e9, 3.3e4, 8.0e9),
        ] {
            for (noise, spread, early) in [
                (20e6, 0.01, 0.0),
                (30e6, 0.02, 0.0),
                (20e6, 0.01, 0.05),
                (30e6, 0.02, 0.1),
            ] {
                let cmd = Command {
                    fixed,
                    per,
                    budget,
                    gran: 64.0 * 1024.0 * 1024.0,
                    noise,
                    spread,
                    early,
                };
                trials.extend((0..100).map(|_| trials_to_search(&cmd, &mut rng)));
            }
        }
        let mean = trials.iter().sum::<usize>() as f64 / trials.len() as f64;
        let within_8 = trials.iter().filter(|&&t| t <= 8).count() as f64 / trials.len() as f64;
        let most = *trials.iter().max().unwrap();
        assert!(
            mean <= 9.5 && most <= 20,
            "mean {mean:.2}, most {most}, {:.0} % within 8",
            within_8 * 100.0
        );
    }
}
