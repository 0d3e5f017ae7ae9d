//! A batch-size schedule trained beside a sweep's fixed batches: its runs on
//! the first device against the fastest fixed batch, and its predicted steps.

use super::mean_std;
use super::summary::{ScheduleSource, ScheduleSummary, SweepRun, SweepSummary};
use crate::schedule::{Schedule, predict};
use crate::trajectory::Segment;

/// The schedule's runs on the first device beside the fastest fixed batch,
/// and its predicted steps over the noise run's stretches to the sweep's
/// target (`segments`; `None` when that run did not reach it).
pub fn schedule_summary(
    source: ScheduleSource,
    schedule: Schedule,
    segments: Option<&[Segment]>,
    sweep: &SweepSummary,
) -> ScheduleSummary {
    let first = sweep.settings.first_device();
    let of: Vec<&SweepRun> = sweep
        .runs
        .iter()
        .filter(|r| r.device == first && r.record.schedule.is_some())
        .collect();
    let rows = sweep.settings.rows_drawn_from();
    let predicted = segments.map(|s| predict(&schedule, s, rows));
    let stat = |v: Vec<f64>| (!v.is_empty()).then(|| mean_std(&v));
    let steps: Vec<f64> = of.iter().filter_map(|r| r.steps_to_target).collect();
    let seconds: Vec<f64> = of.iter().filter_map(|r| r.seconds_to_target).collect();
    let st = stat(steps.clone());
    let sec = stat(seconds.clone());
    let acc = stat(
        of.iter()
            .filter_map(|r| r.record.final_val_accuracy)
            .collect(),
    );
    let best = sweep
        .per_batch
        .iter()
        .filter(|b| b.runs > 0 && b.reached == b.runs)
        .filter_map(|b| b.seconds_mean.map(|s| (b.batch, s)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(b, _)| b);
    let fixed_of = |f: fn(&SweepRun) -> Option<f64>| -> Vec<f64> {
        sweep
            .runs
            .iter()
            .filter(|r| {
                r.device == first && r.record.schedule.is_none() && Some(r.record.batch) == best
            })
            .filter_map(f)
            .collect()
    };
    // Ratio of means and z of their difference (schedule minus fixed).
    let compare = |a: &[f64], b: &[f64]| {
        super::difference(a, b)
            .map(|(ratio, diff, se)| (ratio, if se > 0.0 { diff / se } else { 0.0 }))
    };
    let complete = !of.is_empty() && seconds.len() == of.len();
    let secs = compare(&seconds, &fixed_of(|r| r.seconds_to_target)).filter(|_| complete);
    let steps_cmp = compare(&steps, &fixed_of(|r| r.steps_to_target)).filter(|_| complete);
    ScheduleSummary {
        source,
        predicted_steps: predicted.map(|p| p.0),
        predicted_samples: predicted.map(|p| p.1),
        predicted_steps_best_fixed: segments
            .zip(best)
            .map(|(s, b)| predict(&Schedule::fixed(b, 1.0), s, rows).0),
        schedule,
        runs: of.len(),
        reached: steps.len(),
        steps_mean: st.map(|s| s.0),
        steps_std: st.map(|s| s.1),
        samples_mean: stat(of.iter().filter_map(|r| r.samples_to_target).collect()).map(|s| s.0),
        seconds_mean: sec.map(|s| s.0),
        seconds_std: sec.map(|s| s.1),
        steps_error_pct: predicted.zip(st).map(|(p, m)| 100.0 * (p.0 - m.0) / m.0),
        val_loss_mean: stat(of.iter().filter_map(|r| r.record.final_val_loss).collect())
            .map(|s| s.0),
        val_accuracy_mean: acc.map(|s| s.0),
        val_accuracy_std: acc.map(|s| s.1),
        best_fixed: best,
        seconds_ratio: secs.map(|s| s.0),
        seconds_z: secs.map(|s| s.1),
        steps_ratio: steps_cmp.map(|s| s.0),
        steps_z: steps_cmp.map(|s| s.1),
        beats_best_fixed: secs.is_some_and(|(_, z)| z < -2.0),
    }
}
