//! `run`'s noise scale, with `advise`'s estimator: the noise trial read in
//! stretches (in Adam's geometry where the helper measured it), refitted to
//! the steps the other trials took to its target, as `advise`'s rate checks
//! refit its noise run.

use super::{LossTarget, RunRate, fixed_row_losses, rank0_losses};
use crate::basis::{BasisSource, MethodCode, NoiseRunAt, PredictionBasis};
use crate::lr::LrRule;
use crate::noise::{NoiseEstimator, RawEstimate, two_batch, without_replacement};
use crate::search::TrialReason;
use crate::stability::{
    CHECK_LIMIT, REFIT_CEILING, RateCheck, RateVerdict, checked_b_noise, judge, mark_no_gain,
};
use crate::target::{Rows, StepsCurve};
use crate::trajectory::{RunPoint, Segment, trajectory};
use crate::trial::{NoiseReport, RunTrial, StepReport, TrialResult};
use serde::Serialize;

/// Smoothing of the noise estimates: `noise`'s default for a training run.
const BETA: f64 = 0.95;

/// The noise scale measured in one trial of the user's command.
#[derive(Clone, Debug, Serialize)]
pub struct RunNoise {
    /// The trial it comes from: the noise trial, else the one with the most
    /// noise measurements.
    pub batch: u64,
    /// The noise scale the prediction uses: B_eff of the trial's stretches
    /// (`method` "stretches", as `advise` draws it from its noise run), or the
    /// end value B_simple where the stretches cannot be measured (measured).
    pub b_noise: f64,
    /// Its 90 % band (`None` high: unbounded).
    pub b_noise_low: f64,
    pub b_noise_high: Option<f64>,
    pub method: MethodCode,
    /// The estimates are of the step Adam takes, g / (sqrt(v) + ε): every
    /// measurement of the trial carried the helper's preconditioned norms.
    pub preconditioned: bool,
    /// The training set's rows the helper reported (`rows=`, `noise.rows`):
    /// |G|² is corrected for the finite data with it; `None`: not reported,
    /// no correction.
    #[serde(serialize_with = "crate::target::serialize_row_count")]
    pub data_rows: Option<Rows>,
    /// The trial's stretches (empty for the end value).
    pub segments: Vec<Segment>,
    /// Steps the trial took to the target (see [`LossTarget`]).
    pub steps_to_target: Option<f64>,
    /// The target is on the loss of fixed training rows that the command's
    /// lines carried (`train_loss`, in evaluation mode), the loss `advise`
    /// judges by; else on the mean of a window of the steps' own losses.
    pub target_on_fixed_rows: bool,
    /// The noise trial's own B_noise where the other trials' steps to the
    /// target (or projections, [`RateCheck::projected_steps`]) refitted it
    /// (`b_noise` is then the refit, as `advise`'s rate checks refit its
    /// noise run's); `None`: `b_noise` is the trial's.
    pub b_noise_run: Option<f64>,
    /// The other trials read as rate checks: their steps to the target.
    pub checks: Vec<RateCheck>,
    /// B_simple at the end of that trial, smoothed as `noise` does, with its
    /// 90 % band (measured), for comparison.
    pub b_simple: f64,
    pub b_simple_low: f64,
    /// `None`: unbounded.
    pub b_simple_high: Option<f64>,
    /// Noise measurements and optimizer steps in that trial.
    pub measurements: usize,
    pub steps: usize,
    /// S_min of S(B) fitted with B_noise to the trials' steps to the target
    /// where three or more batches measured them, else through that trial's
    /// steps, S(B) as the trials' rate follows the batch
    /// ([`RunRate::rate_model`]) (predicted).
    pub s_min: Option<f64>,
    /// B_simple of every trial that reported noise: (batch, B_simple).
    pub per_trial: Vec<(u64, f64)>,
}

/// B_simple of one trial with its 90 % band and the number of measurements.
#[derive(Clone, Copy)]
struct TrialNoise {
    b_simple: f64,
    low: f64,
    high: f64,
    measurements: usize,
}

/// Rank 0's valid noise measurements of a trial with the step that made
/// each (steps count from 1; a line without `step` counts by position).
fn measurements(reports: &[StepReport]) -> Vec<(f64, NoiseReport)> {
    reports
        .iter()
        .filter(|r| r.rank.unwrap_or(0) == 0)
        .enumerate()
        .filter_map(|(i, r)| {
            let n = r.noise.filter(|m| m.is_valid())?;
            Some((r.step.unwrap_or(i as u64 + 1) as f64, n))
        })
        .collect()
}

/// Each measurement's raw tr(Sigma) and |G|^2 estimates: in Adam's geometry
/// when every measurement from the first that carries it on does (before the
/// optimizer's first update there is no second moment to read, so those
/// measurements are left out), else of the raw gradient (one trial's
/// stretches are summed, so they must all be in one geometry); and which.
fn estimates(measured: &[(f64, NoiseReport)]) -> (Vec<(f64, RawEstimate)>, bool) {
    let carried = |m: &[(f64, NoiseReport)]| m.iter().all(|(_, m)| m.preconditioned.is_some());
    let (kept, pre) = match measured
        .iter()
        .position(|(_, m)| m.preconditioned.is_some())
    {
        Some(i) if carried(&measured[i..]) => (&measured[i..], true),
        _ => (measured, false),
    };
    let raw = kept
        .iter()
        .map(|(step, m)| {
            let (small, big) = match m.preconditioned.filter(|_| pre) {
                Some(p) => (p.g_small_sq, p.g_big_sq),
                None => (m.g_small_sq, m.g_big_sq),
            };
            let raw = two_batch(m.b_small, small, m.b_big, big);
            (
                *step,
                m.finite_rows().map_or(raw, |n| without_replacement(raw, n)),
            )
        })
        .collect();
    (raw, pre)
}

/// B_simple of one trial's noise measurements, in the order it made them;
/// `None` without a usable estimate.
fn trial_noise(reports: &[StepReport]) -> Option<TrialNoise> {
    let (raw, _) = estimates(&measurements(reports));
    let mut est = NoiseEstimator::new(Some(BETA));
    for (_, r) in &raw {
        est.push(*r);
    }
    let e = est.estimate()?;
    Some(TrialNoise {
        b_simple: e.b_simple,
        low: e.low,
        high: e.high,
        measurements: raw.len(),
    })
}

/// Optimizer steps a trial reported: the highest `step` (steps count from 1,
/// as the helper and the examples number them), at least the lines reported.
fn steps_taken(reports: &[StepReport]) -> usize {
    let highest = reports.iter().filter_map(|r| r.step).max().unwrap_or(0);
    (highest as usize).max(reports.len())
}

/// The batch of `advise`'s noise run (B_big = 8 x 16 samples): `run`'s noise
/// trial trains there too, so that both measure the noise scale, and set the
/// target, at the same batch.
pub const NOISE_TRIAL_BATCH: u64 = (crate::noise::DEFAULT_B_SMALL * crate::noise::DEFAULT_K) as u64;

/// Where `run`'s noise trial trains: [`NOISE_TRIAL_BATCH`] within the batches
/// that ran (a batch below one that ran runs too), when the command reported
/// noise measurements at all (it uses the helper); else `None`.
pub fn noise_trial_batch(trials: &[RunTrial]) -> Option<u64> {
    let ran: Vec<&TrialResult> = trials
        .iter()
        .map(|t| &t.result)
        .filter(|r| r.outcome.ran())
        .collect();
    let measured = ran
        .iter()
        .any(|r| r.reports.iter().any(|s| s.noise.is_some()));
    let lo = ran.iter().map(|r| r.batch).min()?;
    let hi = ran.iter().map(|r| r.batch).max()?;
    measured.then(|| NOISE_TRIAL_BATCH.clamp(lo, hi))
}

/// Every other trial that ran at a handed rate, as a rate check: its steps
/// to `target` (measured; `None` where its steps ended first) beside
/// `curve`'s (predicted), the first and last points of its loss curve on the
/// target's statistic ([`LossTarget::curve`]). A trial
/// whose steps ended first is projected from the level it reached
/// ([`projected_steps`]).
fn trial_checks(
    trials: &[RunTrial],
    target: LossTarget,
    curve: StepsCurve,
    run: &[StepReport],
    run_to_target: f64,
) -> Vec<RateCheck> {
    trials
        .iter()
        .filter(|t| t.reason != TrialReason::Noise && t.result.outcome.ran())
        .filter_map(|t| {
            let r = &t.result;
            let lr = r.learning_rate?;
            let losses = target.curve(&r.reports);
            let (start, end) = (losses.first()?.1, losses.last()?.1);
            let reached = target.steps_to(&r.reports, 0).map(|s| s.0);
            let (max_steps, predicted) = (steps_taken(&r.reports), curve.steps(r.batch as f64));
            let verdict = match judge(start, end, reached) {
                RateVerdict::Stalled if (max_steps as f64) < CHECK_LIMIT * predicted => {
                    RateVerdict::Unfinished
                }
                v => v,
            };
            let projected_steps = (verdict == RateVerdict::Unfinished)
                .then(|| projected_steps(&r.reports, run, target, end, run_to_target))
                .flatten();
            Some(RateCheck {
                batch: r.batch,
                lr,
                rule_rate: true,
                max_steps: max_steps as u64,
                loss_start: start,
                loss_end: end,
                steps_to_target: reached,
                predicted_steps: predicted,
                verdict,
                projected_steps,
                seeds: 1,
                steps_sd: None,
            })
        })
        .collect()
}

/// The steps a trial whose steps ended before `target` would take to it:
/// its steps to `level` (the last point of its loss curve) over the noise
/// trial's (`run`) steps to that level, times the noise trial's to the
/// target. S(B) = S_min (1 + B_noise/B) puts the same ratio between two
/// batches at every level, so a trial that got part of the way measured it.
/// `None` unless both descended to the level (neither was there at the first
/// point of its curve: a trial that made no progress measures no ratio).
fn projected_steps(
    trial: &[StepReport],
    run: &[StepReport],
    target: LossTarget,
    level: f64,
    run_to_target: f64,
) -> Option<f64> {
    let at_level = LossTarget {
        target: level + 1e-9 * level.abs(),
        ..target
    };
    let descended = |reports: &[StepReport]| {
        let first = target.curve(reports).first()?.0;
        at_level
            .steps_to(reports, 0)
            .map(|s| s.0)
            .filter(|&s| s > first)
    };
    let (trial_steps, run_steps) = (descended(trial)?, descended(run)?);
    Some(run_to_target * trial_steps / run_steps).filter(|s| s.is_finite())
}

/// The noise trial's target: its level on the loss of the fixed training rows
/// where it reported that loss twice or more (the mean of its evaluations in
/// its last tenth of `steps`, as `advise` sets its target from its noise
/// run), else the mean of its last tenth of step losses.
fn trial_target(reports: &[StepReport], steps: usize) -> Option<LossTarget> {
    let fixed = fixed_row_losses(reports);
    if fixed.len() >= 2 {
        let target = crate::trajectory::final_level(&fixed, steps)?;
        return Some(LossTarget::of_run(target, steps).on(true));
    }
    let losses: Vec<f64> = rank0_losses(reports).map(|l| l.0).collect();
    (!losses.is_empty()).then(|| {
        let t = LossTarget::of_run(0.0, losses.len());
        let tail = &losses[losses.len() - t.window..];
        LossTarget {
            target: tail.iter().sum::<f64>() / tail.len() as f64,
            ..t
        }
    })
}

/// The noise scale of the trials, with `advise`'s estimator. Each trial that
/// reported noise gets its B_simple; the noise trial ([`TrialReason::Noise`],
/// measuring every step) stands for the command, else the one with the most
/// measurements (the larger batch on a tie). Its final loss is the target
/// (on the fixed training rows' loss where the lines carry it, see [`LossTarget`]). S(B) is summed over the
/// stretches of that trial ([`trajectory`]: each stretch's noise scale, in
/// Adam's geometry where the helper measured it, weighted by the steps it
/// spent), the trial's end value where its stretches cannot be measured; S_min
/// runs through its steps to the target, S(B) as `rate` follows the batch.
pub fn noise_of(trials: &[RunTrial], rate: &RunRate) -> (Option<RunNoise>, Option<f64>) {
    let per: Vec<(&RunTrial, TrialNoise)> = trials
        .iter()
        .filter(|t| t.result.outcome.ran())
        .filter_map(|t| trial_noise(&t.result.reports).map(|n| (t, n)))
        .collect();
    let Some(&(best, noise)) = per.iter().max_by_key(|(t, n)| {
        (
            t.reason == TrialReason::Noise,
            n.measurements,
            t.result.batch,
        )
    }) else {
        return (None, None);
    };
    let best = &best.result;
    let steps = steps_taken(&best.reports);
    let target = trial_target(&best.reports, steps);
    let (raw, preconditioned) = estimates(&measurements(&best.reports));
    let mut points: Vec<RunPoint> = raw
        .iter()
        .map(|(step, r)| RunPoint {
            updates: *step,
            g2_raw: r.g2,
            trace_raw: r.trace,
        })
        .collect();
    // The first measurement stands for the steps before it (the helper
    // starts measuring after a few), so that S_min counts them.
    if let Some(p) = points.first_mut() {
        p.updates = 0.0;
    }
    let batch = best.batch as f64;
    // The rows the helper says the script draws its batches from without
    // replacement (a shuffled loader's epoch), as `advise` counts S(B).
    // Adam's family (the helper's preconditioned norms, else the rule of
    // Adam's family the command's optimizer gives) counts them as Adam does.
    let adaptive = preconditioned || rate.rule() == LrRule::Sqrt;
    let rows = measurements(&best.reports)
        .iter()
        .find_map(|(_, m)| m.finite_rows())
        .map(|n| Rows { n, adaptive });
    let traj = target.and_then(|t| {
        // The target is a mean of the curve's own last points: the curve
        // reaches it, whatever the rounding of the sums.
        let curve = t.curve(&best.reports);
        trajectory(
            &points,
            &curve,
            batch,
            rows,
            t.target + 1e-9 * t.target.abs(),
        )
    });
    let model = rate.rate_model(Some(best.batch));
    let (b_noise, band, method, segments, to_target) = match &traj {
        Some(t) => (
            t.curve().b_noise,
            t.b_noise_band,
            MethodCode::Stretches,
            t.segments.clone(),
            t.updates_to_target,
        ),
        None => (
            noise.b_simple,
            (noise.low, noise.high),
            MethodCode::EndValue,
            Vec::new(),
            steps as f64,
        ),
    };
    // The other trials are `advise`'s rate checks: each trained at its own
    // batch's rate for the command's steps, so where it reached the target it
    // measured S(B) there, and B_noise is refitted to them as advise does.
    let curve = StepsCurve::through(to_target, batch, b_noise, rows);
    let mut checks = match target {
        Some(t) => trial_checks(trials, t, curve, &best.reports, to_target),
        None => Vec::new(),
    };
    if traj.is_some() {
        mark_no_gain(&mut checks, Some((best.batch, to_target)));
    }
    // Every trial that reached the target (or projects to it) measured S(B)
    // as the noise trial did, with the same command and the same statistic:
    // no point is the anchor, so S_min and B_noise are both fitted where
    // three batches allow; else the curve is refitted through the noise
    // trial as `advise` refits its noise run.
    let fitted = match rate {
        RunRate::Handed { .. } if traj.is_some() => {
            let points: Vec<(f64, f64)> = checks
                .iter()
                .filter_map(|c| {
                    let steps = match c.verdict {
                        RateVerdict::Trains => c.steps_to_target,
                        RateVerdict::Unfinished => c.projected_steps,
                        _ => None,
                    };
                    Some((c.batch as f64, steps?))
                })
                .chain([(batch, to_target)])
                .collect();
            let largest = points.iter().map(|p| p.0).fold(batch, f64::max);
            StepsCurve::fit(&points, REFIT_CEILING * b_noise.max(largest), rows)
        }
        _ => None,
    };
    let refit = fitted.map(|c| c.b_noise).or_else(|| match rate {
        RunRate::Handed { scaling, .. } if traj.is_some() => {
            let basis = PredictionBasis {
                lr: *scaling,
                warmup_epochs: 0.0,
                target_loss: target.map_or(f64::NAN, |t| t.target),
                curve,
                source: BasisSource::Stretches {
                    run: NoiseRunAt {
                        batch: best.batch,
                        lr: best.learning_rate.unwrap_or(scaling.at(best.batch)),
                    },
                    updates_to_target: to_target,
                    b_simple_end: Some(noise.b_simple),
                    segments: Vec::new(),
                    preconditioned,
                    band,
                },
                b_noise_run: None,
                reference_updates: None,
            };
            checked_b_noise(&basis, scaling, &checks)
        }
        // The refit's S(B) is the rule's; a command at its own fixed rate
        // keeps the noise trial's value.
        _ => None,
    });
    let b_noise_run = refit.map(|_| b_noise);
    let (b_noise, band) = match refit {
        Some(bn) => (bn, (band.0 * bn / b_noise, band.1 * bn / b_noise)),
        None => (b_noise, band),
    };
    let s_min = match fitted {
        Some(c) => Some(c.s_min),
        None => target.map(|_| to_target / model.updates_vs_min(b_noise, batch, rows)),
    }
    .filter(|s| *s > 0.0 && s.is_finite());
    let mut per_trial: Vec<(u64, f64)> = per
        .iter()
        .filter(|(t, _)| t.reason != TrialReason::Noise)
        .map(|(t, n)| (t.result.batch, n.b_simple))
        .collect();
    per_trial.sort_by_key(|p| p.0);
    (
        Some(RunNoise {
            batch: best.batch,
            b_noise,
            b_noise_low: band.0,
            b_noise_high: band.1.is_finite().then_some(band.1),
            method,
            preconditioned,
            data_rows: rows,
            segments,
            steps_to_target: traj.as_ref().map(|t| t.updates_to_target),
            target_on_fixed_rows: target.is_some_and(|t| t.fixed_rows),
            b_noise_run,
            checks,
            b_simple: noise.b_simple,
            b_simple_low: noise.low,
            b_simple_high: noise.high.is_finite().then_some(noise.high),
            measurements: noise.measurements,
            steps,
            s_min,
            per_trial,
        }),
        target.map(|t| t.target),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lr::{LrRule, LrScaling};
    use crate::stability::failed_from;

    fn report(loss: f64) -> StepReport {
        StepReport {
            step: None,
            samples: None,
            seconds: 0.01,
            loss: Some(loss),
            train_loss: None,
            noise: None,
            rank: None,
        }
    }

    /// A trial of `steps` steps at `batch` whose loss after step i is
    /// `loss(i)`; with `noise`, measuring every other step with true
    /// |G|^2 = 1 and tr(Sigma) = 100 in the raw norms and 400 in Adam's
    /// geometry (where `pre(i)`).
    fn trial(
        batch: u64,
        reason: TrialReason,
        steps: u64,
        loss: impl Fn(u64) -> f64,
        noise: bool,
        pre: impl Fn(u64) -> bool,
    ) -> RunTrial {
        use crate::trial::{Outcome, SquaredNorms};
        let norms = |trace: f64, b: f64| 1.0 + trace / b;
        let reports = (1..=steps)
            .map(|i| StepReport {
                step: Some(i),
                loss: Some(loss(i)),
                train_loss: None,
                noise: (noise && i % 2 == 0).then(|| NoiseReport {
                    b_small: 16.0,
                    g_small_sq: norms(100.0, 16.0),
                    b_big: 128.0,
                    g_big_sq: norms(100.0, 128.0),
                    preconditioned: pre(i).then(|| SquaredNorms {
                        g_small_sq: norms(400.0, 16.0),
                        g_big_sq: norms(400.0, 128.0),
                    }),
                    rows: None,
                }),
                ..report(0.0)
            })
            .collect();
        let mut result = TrialResult::not_started(batch, String::new());
        result.outcome = Outcome::Ran;
        result.reports = reports;
        result.learning_rate = Some(1e-3 * (batch as f64 / 32.0).sqrt());
        RunTrial { reason, result }
    }

    /// The noise trial: 200 steps at 128, the loss falling linearly from 2.
    fn noise_trial(steps: u64, pre: impl Fn(u64) -> bool) -> RunTrial {
        let loss = move |i: u64| 2.0 - i as f64 / steps as f64;
        trial(128, TrialReason::Listed, steps, loss, true, pre)
    }

    fn sqrt_rate() -> RunRate {
        RunRate::Handed {
            scaling: LrScaling {
                rule: LrRule::Sqrt,
                ref_batch: 32,
                ref_lr: 1e-3,
                cap_batch: None,
            },
            in_command: true,
        }
    }

    /// `run` reads its trial as `advise` reads its noise run: stretches of the
    /// measurements, in Adam's geometry where every measurement carries it;
    /// S_min through the steps to the target (the middle of the last window).
    #[test]
    fn the_noise_trial_is_read_in_stretches_and_in_adams_geometry() {
        let rate = sqrt_rate();
        let (n, target) = noise_of(&[noise_trial(200, |_| true)], &rate);
        let n = n.unwrap();
        assert_eq!(n.method, MethodCode::Stretches);
        assert!(n.preconditioned);
        assert!((n.b_noise - 400.0).abs() < 1e-6, "{}", n.b_noise);
        assert!((n.b_simple - 400.0).abs() < 1e-6, "{}", n.b_simple);
        assert_eq!(n.segments.len(), 5, "100 measurements, 20 a stretch");
        // Target: the mean of the last 20 losses, reached at their middle.
        let t = target.unwrap();
        assert!((t - (2.0 - 190.5 / 200.0)).abs() < 1e-9, "{t}");
        let to = n.steps_to_target.unwrap();
        assert!((to - 191.0).abs() < 1e-6, "{to}");
        assert!((n.s_min.unwrap() - to / (1.0 + 400.0 / 128.0)).abs() < 1e-6);
        // Before the optimizer's first update there is no state to read: the
        // measurements from the first that carries it on are in Adam's geometry.
        let (n, _) = noise_of(&[noise_trial(200, |i| i > 2)], &rate);
        let n = n.unwrap();
        assert!(n.preconditioned && (n.b_noise - 400.0).abs() < 1e-6);
        assert_eq!(n.measurements, 99);
        // One measurement without it later on: all read raw.
        let (n, _) = noise_of(&[noise_trial(200, |i| i != 50)], &rate);
        let n = n.unwrap();
        assert!(!n.preconditioned);
        assert!((n.b_noise - 100.0).abs() < 1e-6, "{}", n.b_noise);
    }

    /// A helper told its data set's rows: micro-batches drawn without
    /// replacement from N rows have norms E|g_b|^2 = |G|^2 + (T / b)(N - b) / (N - 1),
    /// which read as |G|^2 short by T / (N - 1) without the correction `advise`
    /// applies (here B_simple 667 for 400). With `rows`, `run` applies it too;
    /// a count below the big batch is no such data set and is left out.
    #[test]
    fn a_helper_that_names_its_rows_gets_the_finite_data_correction() {
        let (trace, rows) = (400.0, 1000.0);
        let finite = |b: f64| 1.0 + trace / b * (rows - b) / (rows - 1.0);
        let with_rows = |rows: f64| {
            let mut t = noise_trial(200, |_| true);
            for r in &mut t.result.reports {
                if let Some(n) = &mut r.noise {
                    n.rows = Some(rows);
                    n.preconditioned = Some(crate::trial::SquaredNorms {
                        g_small_sq: finite(n.b_small),
                        g_big_sq: finite(n.b_big),
                    });
                }
            }
            let n = noise_of(&[t], &sqrt_rate()).0.unwrap();
            (n.b_simple, n.data_rows)
        };
        // The trace estimates the per-sample variance with N - 1: T N / (N - 1).
        let (corrected, said) = with_rows(rows);
        assert!(
            (corrected - trace * rows / (rows - 1.0)).abs() < 1e-6,
            "{corrected}"
        );
        assert_eq!(said.map(|r| r.n), Some(rows));
        let (uncorrected, said) = with_rows(64.0);
        let short = trace * rows / (rows - 1.0) / (1.0 - trace / (rows - 1.0));
        assert!(
            (uncorrected - short).abs() < 1e-6,
            "{uncorrected} against {short}"
        );
        assert_eq!(said, None);
    }

    /// Where the lines carry the loss on fixed training rows, `run` sets its
    /// target on it (the mean of the evaluations in the last tenth of the
    /// noise trial's steps, as `advise` does) and reads every trial's steps
    /// to the target on it: the step losses (here 0.5 above, as dropout
    /// keeps a training loss) are not the statistic.
    #[test]
    fn the_target_is_on_the_fixed_rows_where_the_lines_carry_them() {
        let rate = sqrt_rate();
        let with_fixed = |mut t: RunTrial, steps: f64| {
            for r in &mut t.result.reports {
                let i = r.step.unwrap();
                let clean = 2.0 - i as f64 / steps;
                r.loss = Some(clean + 0.5);
                r.train_loss = (i % 4 == 0).then_some(clean);
            }
            t
        };
        let run = with_fixed(noise_trial(200, |_| true), 200.0);
        // A trial at 512 whose loss falls twice as fast per step.
        let fast = with_fixed(
            trial(512, TrialReason::Listed, 200, |_| 0.0, false, |_| false),
            100.0,
        );
        let (n, target) = noise_of(&[run, fast], &rate);
        let n = n.unwrap();
        assert!(n.target_on_fixed_rows);
        // Evaluations at 180, 184, ..., 200: their mean is the loss at 190.
        let t = target.unwrap();
        assert!((t - (2.0 - 190.0 / 200.0)).abs() < 1e-9, "{t}");
        assert!((n.steps_to_target.unwrap() - 190.0).abs() < 1e-6);
        let check = n.checks.iter().find(|c| c.batch == 512).unwrap();
        assert!((check.steps_to_target.unwrap() - 95.0).abs() < 1e-6);
        assert!((check.loss_start - (2.0 - 4.0 / 100.0)).abs() < 1e-12);
    }

    /// The noise trial stands for the command even with fewer measurements;
    /// it trains at the noise run's batch within the batches that ran.
    #[test]
    fn the_noise_trial_stands_for_the_command() {
        let rate = sqrt_rate();
        let flat = |_| 1.0;
        let many = trial(1024, TrialReason::Listed, 400, flat, true, |_| false);
        let few = trial(128, TrialReason::Noise, 100, flat, true, |_| false);
        let (n, _) = noise_of(&[many.clone(), few], &rate);
        assert_eq!(n.unwrap().batch, 128);
        let (n, _) = noise_of(std::slice::from_ref(&many), &rate);
        assert_eq!(n.unwrap().batch, 1024);
        let silent = |b| trial(b, TrialReason::Listed, 10, flat, false, |_| false);
        assert_eq!(noise_trial_batch(&[silent(32), many.clone()]), Some(128));
        assert_eq!(noise_trial_batch(&[silent(512), many]), Some(512));
        assert_eq!(noise_trial_batch(&[silent(16), silent(64)]), None);
    }

    /// The other trials measured S(B) where they reached the target: B_noise
    /// is refitted to their steps, as advise's rate checks refit its run's.
    /// The noise trial reads 400; the trials at 256 and 512 took the steps of
    /// a noise scale of 100 (their loss reaches the target there).
    #[test]
    fn the_trials_steps_to_the_target_refit_the_noise_scale() {
        let rate = sqrt_rate();
        let target = 2.0 - 190.5 / 200.0;
        let s = |b: f64| 191.0 * (1.0 + 100.0 / b) / (1.0 + 100.0 / 128.0);
        let reaching = |b: u64| {
            let at = s(b as f64);
            trial(
                b,
                TrialReason::Listed,
                200,
                move |i| target + (2.0 - target) * (1.0 - i as f64 / at),
                false,
                |_| false,
            )
        };
        let noise = RunTrial {
            reason: TrialReason::Noise,
            ..noise_trial(200, |_| true)
        };
        // Above the target throughout: at 64 for fewer steps than twice its
        // prediction (unfinished), at 1,024 for more (stalled: the rate failed).
        let flat = move |_| target + 0.5;
        let short = trial(64, TrialReason::Listed, 200, flat, false, |_| false);
        let stalled = trial(1024, TrialReason::Listed, 400, flat, false, |_| false);
        let trials = [
            noise_trial(200, |_| true),
            reaching(256),
            reaching(512),
            short,
            stalled,
            noise,
        ];
        let (n, _) = noise_of(&trials, &rate);
        let n = n.unwrap();
        assert!((n.b_noise_run.unwrap() - 400.0).abs() < 1e-6);
        assert!((n.b_noise / 100.0 - 1.0).abs() < 0.05, "{}", n.b_noise);
        let reached: Vec<(u64, f64)> = n
            .checks
            .iter()
            .filter_map(|c| c.steps_to_target.map(|s| (c.batch, s)))
            .collect();
        assert_eq!(reached.len(), 3, "{:?}", n.checks);
        for (b, steps) in reached {
            assert!((steps - s(b as f64)).abs() <= 1.0, "{b}: {steps}");
        }
        let verdict = |b: u64| n.checks.iter().find(|c| c.batch == b).unwrap().verdict;
        assert_eq!(verdict(64), RateVerdict::Unfinished);
        assert_eq!(verdict(1024), RateVerdict::Stalled);
        assert_eq!(failed_from(&n.checks), Some(1024));
        // A command at its own fixed rate keeps the noise trial's value.
        let own = RunRate::CommandsOwn {
            assumed_rule: LrRule::Sqrt,
            tuned_at: None,
        };
        let (n, _) = noise_of(&trials, &own);
        assert_eq!(n.unwrap().b_noise_run, None);
    }

    /// A trial whose steps end before the target still measured how much
    /// slower its batch is: to the loss it reached it took twice the noise
    /// trial's steps, so it projects to twice the noise trial's steps to the
    /// target; a trial that made no progress projects nothing. Projections
    /// enter the fit beside the trials that finished.
    #[test]
    fn an_unfinished_trial_projects_from_the_level_it_reached() {
        let rate = sqrt_rate();
        let noise = RunTrial {
            reason: TrialReason::Noise,
            ..noise_trial(200, |_| true)
        };
        // The noise trial's loss falls by 1/200 a step; this one's by 1/400.
        let half_speed = trial(
            64,
            TrialReason::Listed,
            200,
            |i| 2.0 - i as f64 / 400.0,
            false,
            |_| false,
        );
        let flat = trial(32, TrialReason::Listed, 200, |_| 2.5, false, |_| false);
        let (n, _) = noise_of(&[noise.clone(), half_speed, flat], &rate);
        let n = n.unwrap();
        let check = |b: u64| *n.checks.iter().find(|c| c.batch == b).unwrap();
        assert_eq!(check(64).verdict, RateVerdict::Unfinished);
        let to = n.steps_to_target.unwrap();
        let projected = check(64).projected_steps.unwrap();
        assert!(
            (projected / (2.0 * to) - 1.0).abs() < 0.02,
            "{projected} vs {to}"
        );
        assert_eq!(check(32).projected_steps, None);
        // Two batches only: the curve is refitted through the noise trial,
        // to the projection's steps at 64.
        let fitted = StepsCurve::through(to, 128.0, n.b_noise, n.data_rows).steps(64.0);
        assert!(
            (fitted / projected - 1.0).abs() < 0.02,
            "{fitted} vs {projected}"
        );
    }
}
