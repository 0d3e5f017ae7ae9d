//! What measuring one device found: a point per batch (step times, peak
//! memory, or how it failed), the max-batch search under a memory budget, the
//! knee, and what a time budget left out. `probe` fills it in from the
//! engine's worker and `run` from the user's command; the decisions
//! ([`crate::decide`]) and the reports read it.

use crate::device::DeviceSpec;
use crate::diagnose::StepPoint;
use crate::knee::KneeRange;
use crate::search::TrialRecord;
use crate::stats::Summary;
use crate::trial::{FailureKind, Outcome};
use batchfit_plan::Bytes;
use serde::Serialize;

/// One measured batch size.
#[derive(Clone, Debug, Serialize)]
pub struct ProbePoint {
    pub batch: u64,
    /// Median seconds per training step (measured).
    pub step_time_s: f64,
    /// 10th-percentile seconds per step (measured): the step as bursts of
    /// interference leave it; one update's time starts from it
    /// ([`DeviceProbe::update_points`]).
    pub step_time_p10_s: f64,
    /// 90th-percentile seconds per step (measured).
    pub step_time_p90_s: f64,
    /// Mean seconds per step (measured): what a training's total time grows
    /// by per step, slow steps included; null where not measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_time_mean_s: Option<f64>,
    /// Standard error of the median step time, relative to it (measured spread).
    pub step_time_rel_err: f64,
    pub steps_timed: usize,
    /// batch / median step time (measured).
    pub samples_per_s: f64,
    /// Counting-allocator high-water mark (measured); null where not measurable.
    pub peak_bytes: Option<Bytes>,
    /// Peak RSS of the measuring process (measured).
    pub peak_rss_bytes: Option<Bytes>,
    /// The plan's peak at this batch (predicted); null where nothing was planned (`run`).
    pub planned_bytes: Option<Bytes>,
    /// (planned - measured) / measured, percent.
    pub plan_error_pct: Option<f64>,
    /// Whether the spread of the timings is wide (outliers, p10-p90 over 25 % of the median).
    pub noisy: bool,
    /// Share of the machine's CPU time other virtual machines took while the
    /// steps were timed (steal time, measured); null where not reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_steal_share: Option<f64>,
    /// Out of memory, crashed or timed out instead of measured: how it ended, in words.
    pub failure: Option<String>,
    /// The same, as a code (`out_of_memory`, `crashed`, `failed`, `timed_out`, `not_started`).
    pub failure_code: Option<FailureKind>,
}

impl ProbePoint {
    /// A measured point from its timing summary.
    pub fn measured(
        batch: u64,
        s: &Summary,
        peak: Option<u64>,
        rss: Option<u64>,
        planned: Option<Bytes>,
    ) -> ProbePoint {
        ProbePoint {
            batch,
            step_time_s: s.median,
            step_time_p10_s: s.p10,
            step_time_p90_s: s.p90,
            step_time_mean_s: Some(s.mean),
            step_time_rel_err: s.rel_std_err,
            steps_timed: s.n,
            samples_per_s: batch as f64 / s.median,
            peak_bytes: peak.map(Bytes),
            peak_rss_bytes: rss.map(Bytes),
            planned_bytes: planned,
            plan_error_pct: peak
                .filter(|&p| p > 0)
                .zip(planned)
                .map(|(p, planned)| 100.0 * (planned.as_f64() - p as f64) / p as f64),
            noisy: s.noisy(),
            cpu_steal_share: None,
            failure: None,
            failure_code: None,
        }
    }

    /// One batch timed in several processes, as one point: each timing the mean
    /// of the processes' own. A training runs in one process, whichever it
    /// gets, so what it can expect is the mean; keeping the fastest process
    /// would make a batch timed three times look faster than one timed once,
    /// and the batches that decide the answer are the ones timed again.
    /// Memory is the largest any process reached. `runs` ran, at one batch.
    pub fn pooled(runs: &[ProbePoint]) -> ProbePoint {
        let n = runs.len().max(1) as f64;
        let mean = |f: &dyn Fn(&ProbePoint) -> f64| runs.iter().map(f).sum::<f64>() / n;
        let step = mean(&|p| p.step_time_s);
        let means: Option<Vec<f64>> = runs.iter().map(|p| p.step_time_mean_s).collect();
        let steals: Option<Vec<f64>> = runs.iter().map(|p| p.cpu_steal_share).collect();
        let max_bytes = |f: &dyn Fn(&ProbePoint) -> Option<Bytes>| runs.iter().filter_map(f).max();
        let first = &runs[0];
        let peak = max_bytes(&|p| p.peak_bytes);
        ProbePoint {
            batch: first.batch,
            step_time_s: step,
            step_time_p10_s: mean(&|p| p.step_time_p10_s),
            step_time_p90_s: mean(&|p| p.step_time_p90_s),
            step_time_mean_s: means.map(|m| m.iter().sum::<f64>() / n),
            // The mean of n independent medians: its error falls by sqrt(n).
            step_time_rel_err: mean(&|p| p.step_time_rel_err.powi(2)).sqrt() / n.sqrt(),
            steps_timed: runs.iter().map(|p| p.steps_timed).sum(),
            samples_per_s: first.batch as f64 / step,
            peak_bytes: peak,
            peak_rss_bytes: max_bytes(&|p| p.peak_rss_bytes),
            planned_bytes: first.planned_bytes,
            plan_error_pct: peak
                .filter(|p| p.0 > 0)
                .zip(first.planned_bytes)
                .map(|(p, planned)| 100.0 * (planned.as_f64() - p.as_f64()) / p.as_f64()),
            noisy: runs.iter().any(|p| p.noisy),
            cpu_steal_share: steals.map(|s| s.iter().sum::<f64>() / n),
            failure: None,
            failure_code: None,
        }
    }

    /// A batch that did not run: how it ended, and that outcome in words.
    pub fn failed(
        batch: u64,
        planned: Option<Bytes>,
        kind: FailureKind,
        why: String,
    ) -> ProbePoint {
        ProbePoint {
            batch,
            step_time_s: f64::NAN,
            step_time_p10_s: f64::NAN,
            step_time_p90_s: f64::NAN,
            step_time_mean_s: None,
            step_time_rel_err: f64::NAN,
            steps_timed: 0,
            samples_per_s: 0.0,
            peak_bytes: None,
            peak_rss_bytes: None,
            planned_bytes: planned,
            plan_error_pct: None,
            noisy: false,
            cpu_steal_share: None,
            failure: Some(why),
            failure_code: Some(kind),
        }
    }

    /// A batch whose process ended as `outcome` (not [`Outcome::Ran`]), said as the outcome says itself.
    pub fn ended(batch: u64, planned: Option<Bytes>, outcome: &Outcome) -> ProbePoint {
        let kind = outcome.failure_kind().unwrap_or(FailureKind::Failed);
        ProbePoint::failed(batch, planned, kind, outcome.to_string())
    }

    /// A batch that ran but reported no step times (a user's command without step lines).
    pub fn untimed(batch: u64, peak: Option<Bytes>, rss: Option<Bytes>) -> ProbePoint {
        ProbePoint {
            samples_per_s: f64::NAN,
            peak_bytes: peak,
            peak_rss_bytes: rss,
            cpu_steal_share: None,
            failure: None,
            failure_code: None,
            ..ProbePoint::failed(batch, None, FailureKind::Failed, String::new())
        }
    }

    /// Whether the batch ran.
    pub fn ok(&self) -> bool {
        self.failure_code.is_none()
    }

    /// Whether it ran out of memory.
    pub fn out_of_memory(&self) -> bool {
        self.failure_code == Some(FailureKind::OutOfMemory)
    }
}

/// The search for the largest batch that fits.
#[derive(Clone, Debug, Serialize)]
pub struct MaxBatchSearch {
    pub budget_bytes: Bytes,
    /// Largest batch that ran (measured).
    pub max_batch: Option<u64>,
    /// Smallest batch that ran out of memory (measured).
    pub smallest_failure: Option<u64>,
    /// The plan's limit before calibration (predicted).
    pub planned_limit: Option<u64>,
    /// The limit from the calibrated line (predicted, then confirmed).
    pub predicted_limit: u64,
    /// The batch whose crash or time-out stopped the search (not out of memory).
    pub stopped_at: Option<u64>,
    /// How that trial ended, in words, and as a code.
    pub stop_reason: Option<String>,
    pub stop_code: Option<FailureKind>,
    pub trials: Vec<TrialRecord>,
    pub seconds: f64,
}

/// Everything measured on one device.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceProbe {
    pub device: DeviceSpec,
    /// CPU threads, for the CPU.
    pub threads: Option<usize>,
    pub points: Vec<ProbePoint>,
    /// Largest batch that fits (measured by the search), else null.
    pub max_batch: Option<u64>,
    /// Smallest batch within `efficiency` of the best throughput (measured).
    pub knee_batch: Option<u64>,
    /// Where the knee lies given the timings' errors, and from which batch the
    /// throughput is flat within them.
    pub knee_range: Option<KneeRange>,
    pub efficiency: f64,
    /// Trial steps the max-batch search took (0 when it did not run).
    pub search_trials: usize,
    pub search: Option<MaxBatchSearch>,
    pub seconds: f64,
    /// Under a time budget (`advise --budget`): what it left unmeasured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<ProbeBudget>,
    /// How far one process's median step time strays from another's at the
    /// same batch, relative (measured on the batches timed twice; null where
    /// none was): every step time's error includes it.
    #[serde(default)]
    pub between_process_error: Option<f64>,
}

impl DeviceProbe {
    /// A device with these points and nothing else measured (no search, no
    /// knee), for tests.
    #[cfg(test)]
    pub(crate) fn of_points(device: DeviceSpec, points: Vec<ProbePoint>) -> DeviceProbe {
        DeviceProbe {
            device,
            threads: None,
            points,
            max_batch: None,
            knee_batch: None,
            knee_range: None,
            efficiency: 0.9,
            search_trials: 0,
            search: None,
            seconds: 0.0,
            budget: None,
            between_process_error: None,
        }
    }

    /// The measured (batch, median step time, its error) of the batches that
    /// ran, the error widened by [`DeviceProbe::between_process_error`].
    pub fn step_points(&self) -> Vec<StepPoint> {
        non_decreasing_in_batch(
            step_points(&self.points)
                .into_iter()
                .map(|q| StepPoint {
                    rel_err: self.step_error(q.rel_err),
                    ..q
                })
                .collect(),
        )
    }

    /// A step time's relative error: its process's own, and how far another
    /// process would measure it (each batch is timed in its own process, so
    /// two batches compared differ by both).
    fn step_error(&self, within: f64) -> f64 {
        within.hypot(self.between_process_error.unwrap_or(0.0))
    }

    /// The measured time of one update at each batch that ran, as a training
    /// loop spends it: the batch's undisturbed step time, its 10th-percentile
    /// step, times [`DeviceProbe::interference`] (slow steps count in a
    /// total, at the share they took over every batch), plus
    /// `input_seconds(batch)`, gathering the batch from the data, which the
    /// probe's synthetic batch leaves out. The median where no mean was
    /// measured.
    ///
    /// Why not each batch's own mean: interference (another process, another
    /// virtual machine) comes in bursts that fall on whichever batch is being
    /// timed. Over five `advise` runs of each of the verify suite's eight data
    /// sets, a batch's mean step spread by 21 % between the fastest and the
    /// slowest run (the median over batches; 12-39 % by data set), its 10th
    /// percentile by 9 % (1-34 %); and the 10th percentiles put `sweep
    /// --verify`'s trainings' step times in proportion to each other more
    /// closely (a 6.4 % rms miss against 8.1 %).
    pub fn update_points(&self, input_seconds: &dyn Fn(u64) -> Option<f64>) -> Vec<StepPoint> {
        let interference = self.interference();
        non_decreasing_in_batch(
            self.points
                .iter()
                .filter(|q| q.ok())
                .map(|q| StepPoint {
                    batch: q.batch,
                    step_s: match (q.step_time_mean_s, undisturbed(q)) {
                        (Some(_), Some(p10)) => p10 * interference,
                        (Some(mean), None) => mean,
                        (None, _) => q.step_time_s,
                    } + input_seconds(q.batch).unwrap_or(0.0),
                    rel_err: self.step_error(q.step_time_rel_err),
                })
                .collect(),
        )
    }

    /// How much longer a step takes on average than undisturbed while this
    /// device was timed: the geometric mean over the batches that ran of mean
    /// / 10th-percentile step time, at least 1 (1 where none has both). A
    /// share of the machine's time, the same for every batch in expectation,
    /// so it is read from all of them.
    pub fn interference(&self) -> f64 {
        let logs: Vec<f64> = self
            .points
            .iter()
            .filter(|q| q.ok())
            .filter_map(|q| Some((q.step_time_mean_s? / undisturbed(q)?).ln()))
            .filter(|l| l.is_finite())
            .collect();
        if logs.is_empty() {
            return 1.0;
        }
        (logs.iter().sum::<f64>() / logs.len() as f64)
            .exp()
            .max(1.0)
    }

    /// The point that ran with the highest throughput.
    pub fn fastest(&self) -> Option<&ProbePoint> {
        self.points
            .iter()
            .filter(|p| p.ok())
            .max_by(|a, b| a.samples_per_s.total_cmp(&b.samples_per_s))
    }
}

/// Step times that never fall as the batch grows: a batch timed slower than
/// a larger one takes the larger one's time. A step of more rows does at
/// least the work of one of fewer with the same kernels, and interference
/// (other processes, another virtual machine) only ever slows a step, so a
/// smaller batch measured slower was measured in a busier moment. Seen on
/// models whose step is a few tens of microseconds, where the per-step
/// overhead is the whole step: one process timed batch 16 at 0.068 ms and
/// another batch 40 at 0.050, and trainings ran both at 0.052-0.055. Points
/// keep their order.
pub fn non_decreasing_in_batch(mut points: Vec<StepPoint>) -> Vec<StepPoint> {
    let mut order: Vec<usize> = (0..points.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(points[i].batch));
    let mut least = f64::INFINITY;
    for i in order {
        least = least.min(points[i].step_s);
        points[i].step_s = least;
    }
    points
}

/// A point's 10th-percentile step time, where it is a time.
fn undisturbed(q: &ProbePoint) -> Option<f64> {
    Some(q.step_time_p10_s).filter(|p| p.is_finite() && *p > 0.0)
}

/// The measured (batch, median step time, its error) of the points that ran.
pub fn step_points(points: &[ProbePoint]) -> Vec<StepPoint> {
    points
        .iter()
        .filter(|q| q.ok())
        .map(|q| StepPoint {
            batch: q.batch,
            step_s: q.step_time_s,
            rel_err: q.step_time_rel_err,
        })
        .collect()
}

/// The points as `(batch, samples/s, relative error)` for the knee's range.
pub fn curve_with_errors(points: &[ProbePoint]) -> Vec<(u64, f64, f64)> {
    points
        .iter()
        .filter(|p| p.ok() && p.samples_per_s.is_finite())
        .map(|p| (p.batch, p.samples_per_s, p.step_time_rel_err))
        .collect()
}

/// What a time budget left unmeasured.
#[derive(Clone, Debug, Serialize)]
pub struct ProbeBudget {
    pub budget_s: f64,
    /// Batches the sampling would have measured but whose predicted cost passed the budget.
    pub not_measured: Vec<u64>,
    /// The first of them: its step predicted from the measured batch below it (a prediction).
    pub predicted_step_s: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two processes timing one batch at 1 and 2 ms a step: the point is their
    /// mean (1.5 ms), not the faster; steps add up, memory is the larger peak.
    #[test]
    fn a_batch_timed_in_two_processes_is_their_mean() {
        let timed = |ms: f64, peak: u64| {
            let steps = [ms * 1e-3; 10];
            ProbePoint::measured(64, &crate::stats::summarize(&steps), Some(peak), None, None)
        };
        let p = ProbePoint::pooled(&[timed(1.0, 100), timed(2.0, 300)]);
        assert!((p.step_time_s - 1.5e-3).abs() < 1e-12, "{p:?}");
        assert!((p.step_time_mean_s.unwrap() - 1.5e-3).abs() < 1e-12);
        assert!((p.samples_per_s - 64.0 / 1.5e-3).abs() < 1e-6);
        assert_eq!(p.steps_timed, 20);
        assert_eq!(p.peak_bytes, Some(Bytes(300)));
        assert!(p.ok());
    }

    /// A batch whose steps took `p10_ms` undisturbed and `mean_ms` on average.
    fn timed_point(batch: u64, p10_ms: f64, mean_ms: Option<f64>) -> ProbePoint {
        let steps = [p10_ms * 1e-3; 10];
        let mut p = ProbePoint::measured(batch, &crate::stats::summarize(&steps), None, None, None);
        p.step_time_mean_s = mean_ms.map(|m| m * 1e-3);
        p
    }

    fn cpu_probe(points: Vec<ProbePoint>) -> DeviceProbe {
        DeviceProbe::of_points(DeviceSpec::Cpu, points)
    }

    /// A burst that fell on one batch's timing (32: mean 1.44 ms over a
    /// 1 ms floor) weighs on every batch by the share it took over all of
    /// them, sqrt(1.44 x 1) = 1.2: the update times keep the floors'
    /// proportion (1 : 2), where the means (1.44 : 2) would not.
    #[test]
    fn one_update_is_the_undisturbed_step_times_the_devices_interference() {
        let probe = cpu_probe(vec![
            timed_point(32, 1.0, Some(1.44)),
            timed_point(64, 2.0, Some(2.0)),
        ]);
        assert!((probe.interference() - 1.2).abs() < 1e-9);
        let gather = |b: u64| Some(b as f64 * 1e-6);
        let updates = probe.update_points(&gather);
        assert_eq!(millis(&updates), vec![(32, 1.232), (64, 2.464)]);
        // A faster mean than the floor reads no negative interference.
        assert_eq!(
            cpu_probe(vec![timed_point(32, 1.0, Some(0.9))]).interference(),
            1.0
        );
        // Without a mean (documents before it), the median as it was.
        let old = cpu_probe(vec![timed_point(32, 1.0, None)]);
        assert_eq!(millis(&old.update_points(&|_| None)), vec![(32, 1.0)]);
    }

    fn point(batch: u64, ms: f64) -> StepPoint {
        StepPoint {
            batch,
            step_s: ms * 1e-3,
            rel_err: 0.01,
        }
    }

    fn millis(points: &[StepPoint]) -> Vec<(u64, f64)> {
        points
            .iter()
            .map(|q| (q.batch, (q.step_s * 1e6).round() / 1e3))
            .collect()
    }

    #[test]
    fn a_smaller_batch_timed_slower_than_a_larger_one_takes_its_time() {
        // Out of order on purpose: the points keep theirs.
        let timed = vec![
            point(32, 0.074),
            point(16, 0.068),
            point(40, 0.050),
            point(64, 0.080),
        ];
        assert_eq!(
            millis(&non_decreasing_in_batch(timed)),
            vec![(32, 0.050), (16, 0.050), (40, 0.050), (64, 0.080)]
        );
    }

    #[test]
    fn step_times_rising_with_the_batch_are_kept() {
        let timed = vec![
            point(16, 0.10),
            point(64, 0.16),
            point(256, 0.41),
            point(1024, 1.05),
        ];
        assert_eq!(
            millis(&non_decreasing_in_batch(timed.clone())),
            millis(&timed)
        );
    }
}
