//! The one measuring loop of `probe` and `run`: sample the throughput curve,
//! refine the knee, settle it by measuring again the batches that decide it,
//! within a time budget. It drives a [`Trials`] runner (the engine's worker,
//! the user's command, a stand-in in tests) and decides which batch to
//! measure next; the runner only runs trials.

use crate::knee::{KneeRange, knee, knee_range, refine_between, smooth_knee};
use crate::probe::{ProbePoint, curve_with_errors, step_points};
use crate::search::{TrialReason, Verdict};

/// How many warm-up steps a measurement takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Warmup {
    /// The configured warm-up.
    Configured,
    /// One step: the step is slow enough to be warm after it (see [`TimeBudget`]).
    One,
}

/// What one trial measured, and how a max-batch search reads it.
#[derive(Clone, Debug)]
pub struct Measurement {
    pub point: ProbePoint,
    pub verdict: Verdict,
}

/// Runs trials: one process per trial, whatever it runs.
pub trait Trials {
    /// Measures `batch` (timed steps and peak memory, or how it failed).
    fn measure(&mut self, batch: u64, reason: TrialReason, warmup: Warmup) -> Measurement;
    /// Seconds since the measuring began, for a time budget.
    fn elapsed_s(&self) -> f64;
}

/// Rounds of knee refinement at most: refine between the knee and the measured
/// batch below it, again while that batch is under half the knee. A curve
/// sampled at every power of two (`probe`) needs one round; a predicting
/// search (`run --memory-limit`) samples rungs 8x apart and needs up to three
/// (8 -> 2 -> 1.26).
pub const REFINE_ROUNDS: usize = 3;

/// The widest gap between sampled batches a searched curve is left with: the
/// knee is read off the samples, and a search that predicts the limit from
/// its first trial (`run --model`) samples only the start and the limit, so
/// where throughput saturates in between would be a guess. Gaps wider than
/// this are sampled at every 4x.
const GAP_FACTOR: u64 = 4;

/// Batches that sample the gaps wider than `GAP_FACTOR` (4x) between the
/// batches that ran (`ran`, any order): from the lower end of each, up by the
/// factor, while the next is under half the upper end.
pub fn gap_samples(ran: &[u64]) -> Vec<u64> {
    let mut sorted: Vec<u64> = ran.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out = Vec::new();
    for w in sorted.windows(2) {
        let (low, high) = (w[0].max(1), w[1]);
        let mut b = low.saturating_mul(GAP_FACTOR);
        while b.saturating_mul(2) <= high {
            out.push(b);
            b = b.saturating_mul(GAP_FACTOR);
        }
    }
    out
}

/// Rounds of measuring again the batches that decide an uncertain knee, for
/// the engine's worker: a repeat costs a worker start and a few seconds of
/// steps, and two rounds settle the knees of the corpus. A user's command
/// takes none: its trial is a whole training process (seconds to minutes), and
/// measuring again would double what the user waits for.
pub const SETTLE_ROUNDS_ENGINE: usize = 2;

/// How to measure a device's curve.
#[derive(Clone, Debug)]
pub struct CurvePlan {
    /// Batches to sample, in order (empty: the points given are the samples).
    pub batches: Vec<u64>,
    /// The user listed them: measured as listed, once each; no refinement,
    /// no settling, and a failure does not stop the sampling.
    pub listed: bool,
    /// Rounds of knee refinement ([`REFINE_ROUNDS`]; 0: none).
    pub refine_rounds: usize,
    /// Rounds of settling ([`SETTLE_ROUNDS_ENGINE`], or 0).
    pub settle_rounds: usize,
    /// The knee is the smallest batch reaching this share of the best throughput.
    pub efficiency: f64,
    /// With the noise scale known, the time-to-target winner and its measured
    /// neighbours are settled with the knee's batches.
    pub b_noise: Option<f64>,
    /// A wall-clock budget: a batch whose predicted cost passes it is not measured.
    pub budget: Option<TimeBudget>,
}

/// The measured curve.
#[derive(Clone, Debug)]
pub struct Curve {
    /// One point per batch, ascending: a batch measured again is the mean of its processes.
    pub points: Vec<ProbePoint>,
    pub knee_batch: Option<u64>,
    pub knee_range: Option<KneeRange>,
    /// Batches the budget left out, ascending.
    pub not_measured: Vec<u64>,
    /// [`between_process_error`] of the batches measured twice; `None` where
    /// none was.
    pub between_process_error: Option<f64>,
}

/// Seconds of starting a worker, loading the model and building its step, besides
/// the steps (a generous figure: the engine's compiled step is built per process).
const WORKER_START_S: f64 = 1.0;

/// The share of a budget the measurements may plan to spend: the rest is for the plan,
/// the report, and a step slower than predicted (a step's time is predicted from the
/// batch below it, and a bigger batch can be slower per sample).
const BUDGET_FOR_STEPS: f64 = 0.9;

/// A step this slow is warm after one step: a longer warm-up only spends the budget.
const SLOW_STEP_S: f64 = 1.0;

/// A wall-clock budget for measuring (`advise --budget`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TimeBudget {
    /// Seconds the whole measurement may take.
    pub deadline_s: f64,
    /// The configured warm-up steps and the cap on timed seconds per batch.
    pub warmup: usize,
    pub time_cap_s: f64,
}

impl TimeBudget {
    /// The warm-up of a batch whose step is predicted to take `step_s`
    /// (`None`: unknown, the first batch), `elapsed_s` into the budget; `None`
    /// when its cost passes the budget.
    pub fn warmup_for(&self, step_s: Option<f64>, elapsed_s: f64) -> Option<Warmup> {
        let Some(step) = step_s else {
            return Some(Warmup::Configured);
        };
        let (warmup, kind) = if step >= SLOW_STEP_S {
            (1, Warmup::One)
        } else {
            (self.warmup, Warmup::Configured)
        };
        // Warm-up, then timed steps until their sum reaches the cap: one step when a
        // step alone does, else at most the cap and one step more.
        let timed = if step >= self.time_cap_s {
            step
        } else {
            self.time_cap_s + step
        };
        let cost = WORKER_START_S + warmup as f64 * step + timed;
        (elapsed_s + cost <= BUDGET_FOR_STEPS * self.deadline_s).then_some(kind)
    }
}

/// A batch's step time predicted from the measured batch nearest below it, growing in
/// proportion to the batch (an upper bound while the device is not yet saturated);
/// `None` before anything below it ran.
pub fn predicted_step_s(points: &[ProbePoint], b: u64) -> Option<f64> {
    points
        .iter()
        .filter(|p| p.ok() && p.batch <= b)
        .max_by_key(|p| p.batch)
        .map(|p| p.step_time_s * b as f64 / p.batch as f64)
}

/// The relative error of one process's median step time as another process
/// would measure it, from the log-ratios of repeated measurements of the same
/// batch: their variance is twice that error's square. 0 with no repeats.
pub fn between_process_error(log_ratios: &[f64]) -> f64 {
    if log_ratios.is_empty() {
        return 0.0;
    }
    let mean_square = log_ratios.iter().map(|d| d * d).sum::<f64>() / log_ratios.len() as f64;
    (mean_square / 2.0).sqrt()
}

/// The step-time line's knee where the line explains the points, else the medians'.
pub fn knee_of(points: &[ProbePoint], efficiency: f64) -> Option<u64> {
    let timed: Vec<(u64, f64)> = timed(points).map(|p| (p.batch, p.samples_per_s)).collect();
    smooth_knee(&step_points(points), efficiency).or_else(|| knee(&timed, efficiency))
}

/// The points that ran and reported step times.
fn timed(points: &[ProbePoint]) -> impl Iterator<Item = &ProbePoint> {
    points
        .iter()
        .filter(|p| p.ok() && p.samples_per_s.is_finite())
}

/// The batches that decide an uncertain knee, to be measured again: the knee,
/// the measured batch below it, the fastest, every batch inside the knee's
/// range, and with `b_noise` the batch whose predicted time to target,
/// (B + B_noise) / throughput, is least, with its measured neighbours.
pub fn settling_batches(
    points: &[ProbePoint],
    knee: u64,
    range: KneeRange,
    b_noise: Option<f64>,
) -> Vec<u64> {
    let mut ok: Vec<&ProbePoint> = points.iter().filter(|p| p.ok()).collect();
    ok.sort_by_key(|p| p.batch);
    let fastest = ok
        .iter()
        .max_by(|a, b| a.samples_per_s.total_cmp(&b.samples_per_s))
        .map(|p| p.batch);
    let below = ok.iter().map(|p| p.batch).filter(|&b| b < knee).max();
    let winner: Vec<u64> = b_noise
        .and_then(|bn| {
            let i = (0..ok.len()).min_by(|&i, &j| {
                let time = |p: &ProbePoint| (p.batch as f64 + bn) / p.samples_per_s;
                time(ok[i]).total_cmp(&time(ok[j]))
            })?;
            Some(
                ok[i.saturating_sub(1)..(i + 2).min(ok.len())]
                    .iter()
                    .map(|p| p.batch)
                    .collect(),
            )
        })
        .unwrap_or_default();
    let mut again: Vec<u64> = ok
        .iter()
        .map(|p| p.batch)
        .filter(|b| (range.low..=range.high).contains(b))
        .chain([Some(knee), below, fastest].into_iter().flatten())
        .chain(winner)
        .collect();
    again.sort_unstable();
    again.dedup();
    again
}

/// The measuring loop's state: the points so far, the repeats' log-ratios,
/// what the budget left out.
struct Loop<'a> {
    trials: &'a mut dyn Trials,
    plan: &'a CurvePlan,
    points: Vec<ProbePoint>,
    repeats: Vec<f64>,
    /// Every measurement that ran, in order (a batch timed again has several).
    timings: Vec<ProbePoint>,
    skipped: Vec<u64>,
}

impl Loop<'_> {
    /// Measures `b` unless its predicted cost passes the budget; says whether it did.
    /// A batch measured again is the mean of its processes ([`ProbePoint::pooled`]):
    /// the batches that decide the answer are the ones timed again, and keeping
    /// their fastest process would put them ahead of batches timed once. The
    /// measurements of a batch also tell how far one process's median strays
    /// from another's, which a process's own spread does not show.
    fn measure(&mut self, b: u64, reason: TrialReason) -> bool {
        let warmup = match &self.plan.budget {
            None => Warmup::Configured,
            Some(budget) => {
                let predicted = predicted_step_s(&self.points, b);
                match budget.warmup_for(predicted, self.trials.elapsed_s()) {
                    Some(w) => w,
                    None => {
                        self.skipped.push(b);
                        return false;
                    }
                }
            }
        };
        let row = self.trials.measure(b, reason, warmup).point;
        if row.ok() {
            if let Some(last) = self.timings.iter().rev().find(|q| q.batch == b) {
                self.repeats.push((row.step_time_s / last.step_time_s).ln());
            }
            self.timings.push(row.clone());
        }
        let earlier = self.points.iter_mut().find(|q| q.batch == b);
        match earlier {
            Some(q) if row.ok() => {
                let runs: Vec<ProbePoint> = self
                    .timings
                    .iter()
                    .filter(|t| t.batch == b)
                    .cloned()
                    .collect();
                *q = ProbePoint::pooled(&runs);
            }
            Some(_) => {}
            None => self.points.push(row),
        }
        true
    }

    fn knee(&self) -> Option<u64> {
        knee_of(&self.points, self.plan.efficiency)
    }

    /// The knee's range, the timings' errors widened by how far one process's
    /// median strays from another's.
    fn range(&self) -> Option<KneeRange> {
        let between = between_process_error(&self.repeats);
        let curve: Vec<(u64, f64, f64)> = curve_with_errors(&self.points)
            .into_iter()
            .map(|(b, rate, err)| (b, rate, err.hypot(between)))
            .collect();
        knee_range(&curve, self.plan.efficiency)
    }
}

/// Measures a device's curve: the plan's batches (after `points` already
/// measured, e.g. by a search whose every trial is a measurement), the knee
/// refined, then settled.
pub fn measure_curve(trials: &mut dyn Trials, plan: &CurvePlan, points: Vec<ProbePoint>) -> Curve {
    let timings = points.iter().filter(|p| p.ok()).cloned().collect();
    let mut l = Loop {
        trials,
        plan,
        points,
        repeats: Vec::new(),
        timings,
        skipped: Vec::new(),
    };
    let reason = if plan.listed {
        TrialReason::Listed
    } else {
        TrialReason::Sampled
    };
    for (i, &b) in plan.batches.iter().enumerate() {
        if !l.measure(b, reason) {
            // Larger batches cost more still: none of them is measured either.
            l.skipped.extend(&plan.batches[i + 1..]);
            break;
        }
        // Bigger batches will not fit either.
        if !plan.listed && l.points.last().is_some_and(|p| !p.ok()) {
            break;
        }
    }
    let mut knee_batch = l.knee();
    if !plan.listed {
        for round in 0..plan.refine_rounds {
            let Some(k) = knee_batch else { break };
            let below = timed(&l.points).map(|p| p.batch).filter(|&b| b < k).max();
            let Some(below) = below.filter(|&b| round == 0 || b * 2 < k) else {
                break;
            };
            let extra = refine_between(below, k, 2);
            if extra.is_empty() {
                break;
            }
            for b in extra {
                l.measure(b, TrialReason::KneeRefinement);
            }
            knee_batch = l.knee();
        }
    }
    let mut range = l.range();
    let settle = if plan.listed { 0 } else { plan.settle_rounds };
    for round in 0..settle {
        let (Some(k), Some(r)) = (knee_batch, range) else {
            break;
        };
        if round > 0 && r.low == r.high {
            break;
        }
        for b in settling_batches(&l.points, k, r, plan.b_noise) {
            l.measure(b, TrialReason::Settling);
        }
        knee_batch = l.knee();
        range = l.range();
    }
    let mut points = l.points;
    points.sort_by_key(|p| p.batch);
    let mut not_measured = l.skipped;
    not_measured.retain(|b| !points.iter().any(|p| p.batch == *b));
    not_measured.sort_unstable();
    not_measured.dedup();
    Curve {
        points,
        knee_batch,
        knee_range: range.map(|r| r.covering(knee_batch)),
        not_measured,
        between_process_error: (!l.repeats.is_empty()).then(|| between_process_error(&l.repeats)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The start and the limit 150x apart get 256, 1,024 and 4,096 between;
    /// rungs 8x apart one batch between; doublings nothing.
    #[test]
    fn wide_gaps_are_sampled_at_every_4x() {
        assert_eq!(gap_samples(&[9998, 64, 9485]), vec![256, 1024, 4096]);
        assert_eq!(gap_samples(&[64, 512, 3107, 6673]), vec![256]);
        assert!(gap_samples(&[1, 2, 4, 8, 16]).is_empty());
        assert_eq!(gap_samples(&[1, 9]), vec![4]);
    }
    use crate::stats::summarize;
    use crate::trial::FailureKind;

    /// A stand-in device: step 1 ms + 10 us per sample, the first measurement
    /// of each batch `slow_first` times slower (a busy neighbour), out of memory
    /// above `max`; each trial costs 1 s plus its steps on a simulated clock.
    struct StandIn {
        slow_first: f64,
        max: u64,
        seen: Vec<(u64, TrialReason)>,
        clock_s: f64,
    }

    impl Trials for StandIn {
        fn measure(&mut self, b: u64, reason: TrialReason, _: Warmup) -> Measurement {
            let first = !self.seen.iter().any(|s| s.0 == b);
            self.seen.push((b, reason));
            let step = (0.001 + 0.00001 * b as f64) * if first { self.slow_first } else { 1.0 };
            self.clock_s += 1.0 + 5.0 * step;
            if b > self.max {
                return Measurement {
                    point: ProbePoint::failed(b, None, FailureKind::OutOfMemory, "oom".into()),
                    verdict: Verdict::OutOfMemory,
                };
            }
            Measurement {
                point: ProbePoint::measured(b, &summarize(&[step; 5]), None, None, None),
                verdict: Verdict::Runs { peak: None },
            }
        }

        fn elapsed_s(&self) -> f64 {
            self.clock_s
        }
    }

    fn stand_in(slow_first: f64, max: u64) -> StandIn {
        StandIn {
            slow_first,
            max,
            seen: Vec::new(),
            clock_s: 0.0,
        }
    }

    fn plan(batches: Vec<u64>) -> CurvePlan {
        CurvePlan {
            batches,
            listed: false,
            refine_rounds: REFINE_ROUNDS,
            settle_rounds: SETTLE_ROUNDS_ENGINE,
            efficiency: 0.9,
            b_noise: None,
            budget: None,
        }
    }

    /// Throughput B / (1 ms + 10 us B) up to 512: 90 % of the best first at
    /// 323 (refined between 256 and 512), and a batch timed again is the
    /// mean of its slow first and clean later processes.
    #[test]
    fn the_knee_is_refined_then_settled_and_repeats_are_pooled() {
        let mut dev = stand_in(1.5, u64::MAX);
        let curve = measure_curve(
            &mut dev,
            &plan(crate::knee::geometric_batches(1, 512)),
            Vec::new(),
        );
        assert!(matches!(curve.knee_batch, Some(323 | 406)), "{curve:?}");
        let refined: Vec<u64> = dev
            .seen
            .iter()
            .filter(|s| s.1 == TrialReason::KneeRefinement)
            .map(|s| s.0)
            .collect();
        assert_eq!(refined, [323, 406]);
        assert!(dev.seen.iter().any(|s| s.1 == TrialReason::Settling));
        // 323 timed slow once (1.5x) and clean after: the mean of its processes.
        let timed = dev.seen.iter().filter(|s| s.0 == 323).count() as f64;
        assert!(timed >= 2.0, "{:?}", dev.seen);
        let p = curve.points.iter().find(|p| p.batch == 323).unwrap();
        let expected = 0.00423 * (1.5 + (timed - 1.0)) / timed;
        assert!((p.step_time_s - expected).abs() < 1e-9, "{p:?}");
        let range = curve.knee_range.unwrap();
        assert!(range.low < 323 && range.high >= 323, "{range:?}");
    }

    /// A sparse start (rungs 64x apart) is refined over two rounds: 1,024
    /// is the knee once 256 and 1,024 are measured, and 256 is under half of
    /// it; listed batches are measured once.
    #[test]
    fn sparse_samples_take_more_refinement_and_listed_batches_none() {
        let mut dev = stand_in(1.0, u64::MAX);
        let seeded: Vec<ProbePoint> = [1u64, 64, 4096]
            .iter()
            .map(|&b| dev.measure(b, TrialReason::Rung, Warmup::Configured).point)
            .collect();
        let mut p = plan(Vec::new());
        p.settle_rounds = 0;
        let curve = measure_curve(&mut dev, &p, seeded);
        let refined: Vec<u64> = dev
            .seen
            .iter()
            .filter(|s| s.1 == TrialReason::KneeRefinement)
            .map(|s| s.0)
            .collect();
        assert_eq!(refined, [256, 1024, 406, 645], "{:?}", dev.seen);
        assert_eq!(curve.knee_batch, Some(1024));

        let mut dev = stand_in(1.0, 100);
        let mut p = plan(vec![64, 512, 32]);
        p.listed = true;
        let curve = measure_curve(&mut dev, &p, Vec::new());
        assert_eq!(dev.seen.len(), 3, "listed, once each, past a failure");
        assert!(
            curve
                .points
                .iter()
                .any(|p| p.batch == 512 && p.out_of_memory())
        );
    }

    /// The sampling stops at the first out-of-memory, and a budget leaves out
    /// the batches whose predicted cost would pass it.
    #[test]
    fn a_failure_or_the_budget_ends_the_sampling() {
        let mut dev = stand_in(1.0, 40);
        let mut p = plan(vec![8, 16, 32, 64, 128]);
        p.refine_rounds = 0;
        p.settle_rounds = 0;
        measure_curve(&mut dev, &p, Vec::new());
        assert_eq!(dev.seen.len(), 4, "{:?}", dev.seen);

        let mut dev = stand_in(1.0, u64::MAX);
        let mut p = plan(vec![8, 16, 32, 64, 128]);
        p.budget = Some(TimeBudget {
            deadline_s: 6.0,
            warmup: 1,
            time_cap_s: 1.0,
        });
        let curve = measure_curve(&mut dev, &p, Vec::new());
        assert!(!curve.not_measured.is_empty(), "{curve:?}");
        assert!(dev.clock_s <= 6.0 + 3.0, "{}", dev.clock_s);
    }

    #[test]
    fn the_budget_leaves_out_what_would_pass_it() {
        let budget = |deadline_s: f64| TimeBudget {
            deadline_s,
            warmup: 3,
            time_cap_s: 2.0,
        };
        // Nothing known yet: measured with the usual warm-up.
        assert_eq!(budget(1.0).warmup_for(None, 0.0), Some(Warmup::Configured));
        // A fast step fits a minute; a slow one is warmed once; one that would pass is left out.
        assert_eq!(
            budget(60.0).warmup_for(Some(0.1), 0.0),
            Some(Warmup::Configured)
        );
        assert_eq!(budget(60.0).warmup_for(Some(10.0), 0.0), Some(Warmup::One));
        assert_eq!(budget(60.0).warmup_for(Some(30.0), 0.0), None);
        assert_eq!(budget(60.0).warmup_for(Some(0.1), 55.0), None);
    }

    #[test]
    fn a_step_is_predicted_from_the_batch_below_it() {
        let ran = |b: u64, s: f64| ProbePoint::measured(b, &summarize(&[s; 3]), None, None, None);
        let points = vec![
            ran(4, 0.5),
            ran(8, 1.0),
            ProbePoint::failed(16, None, FailureKind::Crashed, "x".into()),
        ];
        assert_eq!(predicted_step_s(&points, 32), Some(4.0));
        assert_eq!(predicted_step_s(&points, 4), Some(0.5));
        assert_eq!(predicted_step_s(&points, 2), None);
    }
}
