//! Updates to a target loss from the noise scale along a measured run, not
//! from its end value alone.
//!
//! The noise scale grows as the loss falls (on MNIST from about 50 at the
//! start to over 1,000 near a low loss), so one end value charges the early,
//! easy part of training the late part's cost. McCandlish et al. 2018 (section
//! 2.3) apply S(B) = S_min (1 + B_noise / B) to each stretch of training: a run
//! at batch B_run that spends ΔS updates on a stretch whose noise scale is B_i
//! needed ΔS_min,i = ΔS / (1 + B_i / B_run) updates at the large-batch limit,
//! and a run at batch B needs
//!
//! S(B) = Σ_i ΔS_min,i (1 + B_i / B) = S_min (1 + B_eff / B),
//!
//! with S_min = Σ ΔS_min,i and B_eff the ΔS_min-weighted mean of the B_i: the
//! sum is again one [`StepsCurve`], so every table that ranks by S(B) takes it
//! unchanged.

use crate::target::{Rows, StepsCurve, noise_batch, updates_vs_min, updates_vs_min_on};
use serde::{Deserialize, Serialize};

/// Measurements in one stretch of the run: the noise scale of a stretch is the
/// ratio of its summed raw tr(Sigma) and |G|^2 estimates (as the running
/// estimator does), and 20 of them keep it within about ±30 % on the seed
/// models while still resolving the growth across a 200-step run.
pub const SEGMENT_MEASUREMENTS: usize = 20;

/// One noise measurement of the run, in order: the updates made before it
/// and its two raw estimates. A run may measure every update (`noise`) or
/// only some (a user's script).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RunPoint {
    pub updates: f64,
    pub g2_raw: f64,
    pub trace_raw: f64,
}

/// One stretch of the run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    /// Updates made before the stretch.
    pub first_update: f64,
    /// Updates the run spent on it.
    pub updates: f64,
    /// The run's training loss where it starts and ends.
    pub loss_start: f64,
    pub loss_end: f64,
    /// Its noise scale: summed raw tr(Sigma) over summed raw |G|^2.
    pub b_noise: f64,
    /// Updates it needs at the large-batch limit: `updates / (1 + b_noise / B_run)`.
    pub s_min: f64,
}

/// The run to the target, stretch by stretch.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Trajectory {
    /// The batch the run trained at.
    pub run_batch: f64,
    /// The training rows its batches were drawn from without replacement
    /// ([`noise_batch`]); `None`: unlimited.
    #[serde(serialize_with = "crate::target::serialize_row_count")]
    pub rows: Option<Rows>,
    /// Updates the run took to reach the target.
    pub updates_to_target: f64,
    pub segments: Vec<Segment>,
    /// The 90 % band of B_eff ([`Trajectory::curve`]'s B_noise) over resamples of
    /// each stretch's measurements; `high` infinite where a resample of some stretch
    /// has no positive |G|^2.
    pub b_noise_band: (f64, f64),
}

/// One-sided 95 % normal quantile: a stretch's |G|^2 counts as measured when its
/// mean less this many standard errors is still above zero.
const Z: f64 = 1.645;

/// Resamples of the measurements behind the band of B_eff: enough that the 5th and
/// 95th percentiles move by a few percent between seeds.
const RESAMPLES: usize = 400;

impl Trajectory {
    /// Predicted updates to the target at `batch`: Σ ΔS_min,i (1 + B_i / B).
    pub fn steps(&self, batch: f64) -> f64 {
        self.segments
            .iter()
            .map(|s| s.s_min * updates_vs_min_on(s.b_noise, batch, self.rows))
            .sum()
    }

    /// The same prediction as one curve: S_min = Σ ΔS_min,i, B_noise = B_eff.
    pub fn curve(&self) -> StepsCurve {
        let s_min: f64 = self.segments.iter().map(|s| s.s_min).sum();
        let weighted: f64 = self.segments.iter().map(|s| s.s_min * s.b_noise).sum();
        StepsCurve {
            s_min,
            b_noise: weighted / s_min,
            rows: self.rows,
        }
    }
}

/// Where the evaluated loss curve `(updates, loss)` first reaches `target`,
/// interpolated linearly between the evaluation above it and the one at or
/// below it, as a sweep measures its runs.
pub fn reach(losses: &[(f64, f64)], target: f64) -> Option<f64> {
    let i = losses.iter().position(|p| p.1 <= target)?;
    if i == 0 {
        return Some(losses[0].0);
    }
    let ((u0, l0), (u1, l1)) = (losses[i - 1], losses[i]);
    let t = ((l0 - target) / (l0 - l1)).clamp(0.0, 1.0);
    Some(u0 + t * (u1 - u0))
}

/// A run's final level on its evaluated loss curve `(updates, loss)`: the
/// mean of the evaluations in the last tenth of its `steps`, else its last
/// evaluation (`None` without any). `advise` sets its target so from its noise
/// run, and `run` from its noise trial's fixed-rows loss.
pub fn final_level(losses: &[(f64, f64)], steps: usize) -> Option<f64> {
    let last_tenth = (steps * 9 / 10) as f64;
    let tail: Vec<f64> = losses
        .iter()
        .filter(|p| p.0 >= last_tenth)
        .map(|p| p.1)
        .collect();
    match tail.len() {
        0 => losses.last().map(|p| p.1),
        n => Some(tail.iter().sum::<f64>() / n as f64),
    }
}

/// The loss curve at `updates`, linear between evaluations (NaN without any).
fn loss_at(losses: &[(f64, f64)], updates: f64) -> f64 {
    match losses.iter().position(|p| p.0 >= updates) {
        Some(0) | None if losses.is_empty() => f64::NAN,
        Some(0) => losses[0].1,
        None => losses[losses.len() - 1].1,
        Some(i) => {
            let ((u0, l0), (u1, l1)) = (losses[i - 1], losses[i]);
            l0 + (updates - u0) / (u1 - u0) * (l1 - l0)
        }
    }
}

/// The stretches of a run at `run_batch`, from its noise measurements
/// `points` and its evaluated training loss `losses` (updates, loss), up to
/// where that loss first reaches `target`, its batches drawn from `rows`
/// training rows (`None`: unlimited). `None` when it never does, reaches
/// it before any update, or no stretch has positive estimates (the noise
/// scale is not measurable). A stretch whose summed |G|^2 or tr(Sigma) is not
/// positive is merged into its neighbour.
pub fn trajectory(
    points: &[RunPoint],
    losses: &[(f64, f64)],
    run_batch: f64,
    rows: Option<Rows>,
    target: f64,
) -> Option<Trajectory> {
    // The run's noise is its batch's without replacement.
    let run_noise_batch = noise_batch(run_batch, rows);
    let reached = reach(losses, target)?;
    let start = points.first()?.updates;
    if reached <= start {
        return None;
    }
    let measured = points.iter().take_while(|p| p.updates < reached).count();
    let updates_at = |i: usize| {
        if i < measured {
            points[i].updates
        } else {
            reached
        }
    };
    // Stretches of SEGMENT_MEASUREMENTS; a short remainder joins the last one.
    let mut bounds: Vec<(usize, usize)> = (0..measured)
        .step_by(SEGMENT_MEASUREMENTS)
        .map(|a| (a, (a + SEGMENT_MEASUREMENTS).min(measured)))
        .collect();
    if bounds.len() > 1 {
        let (a, b) = bounds[bounds.len() - 1];
        if b - a < SEGMENT_MEASUREMENTS / 2 {
            bounds.pop();
            bounds.last_mut().expect("more than one").1 = b;
        }
    }
    let sums = |(a, b): (usize, usize)| {
        let p = &points[a..b];
        (
            p.iter().map(|q| q.g2_raw).sum::<f64>(),
            p.iter().map(|q| q.trace_raw).sum::<f64>(),
        )
    };
    // A stretch on a plateau, where |G|^2 is small and indistinguishable from
    // zero, carries no noise scale (its ratio reads as 1e9 or 1e10): it is
    // merged with a neighbour, as a stretch whose sums are not positive is. A
    // stretch whose |G|^2 is large but noisy (Adam's first steps, before its
    // second moment has settled) is no plateau: it keeps its own ratio.
    let mean_g2 = |(a, b): (usize, usize)| sums((a, b)).0 / (b - a).max(1) as f64;
    let typical_g2 = {
        let mut m: Vec<f64> = bounds.iter().map(|&r| mean_g2(r)).collect();
        m.sort_by(f64::total_cmp);
        m.get(m.len() / 2).copied().unwrap_or(0.0)
    };
    let measurable = |r: (usize, usize)| {
        let (g2, tr) = sums(r);
        let plateau = mean_g2(r) < typical_g2 && !g2_resolved(&points[r.0..r.1]);
        g2 > 0.0 && tr > 0.0 && g2.is_finite() && tr.is_finite() && !plateau
    };
    while let Some(i) = bounds.iter().position(|&r| !measurable(r)) {
        if bounds.len() == 1 {
            return None;
        }
        // Into the previous stretch, or the next for the first.
        let j = if i > 0 { i - 1 } else { 1 };
        let (lo, hi) = (i.min(j), i.max(j));
        bounds[lo] = (bounds[lo].0, bounds[hi].1);
        bounds.remove(hi);
    }
    let segments = bounds
        .iter()
        .map(|&(a, b)| {
            let (g2, tr) = sums((a, b));
            let b_noise = tr / g2;
            let (from, to) = (updates_at(a), updates_at(b));
            Segment {
                first_update: from,
                updates: to - from,
                loss_start: loss_at(losses, from),
                loss_end: loss_at(losses, to),
                b_noise,
                s_min: (to - from) / updates_vs_min(b_noise, run_noise_batch),
            }
        })
        .collect();
    let b_noise_band = band(points, &bounds, &updates_at, run_noise_batch);
    Some(Trajectory {
        run_batch,
        rows,
        updates_to_target: reached - start,
        segments,
        b_noise_band,
    })
}

/// Whether a stretch's summed |G|^2 is above zero beyond its measurements' noise:
/// the mean of its raw estimates less [`Z`] standard errors stays positive. A
/// stretch of one measurement has no spread to judge: its sign decides.
fn g2_resolved(points: &[RunPoint]) -> bool {
    let n = points.len() as f64;
    if points.len() < 2 {
        return true;
    }
    let mean = points.iter().map(|p| p.g2_raw).sum::<f64>() / n;
    let var = points
        .iter()
        .map(|p| (p.g2_raw - mean).powi(2))
        .sum::<f64>()
        / (n - 1.0);
    mean - Z * (var / n).sqrt() > 0.0
}

/// The 90 % band of B_eff: each stretch's measurements resampled with replacement
/// (a seeded generator, so the band is reproducible), B_eff recomputed over the
/// stretches, its 5th and 95th percentiles.
fn band(
    points: &[RunPoint],
    bounds: &[(usize, usize)],
    updates_at: &dyn Fn(usize) -> f64,
    run_noise_batch: f64,
) -> (f64, f64) {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    let mut rng = StdRng::seed_from_u64(0x5eed);
    let mut values: Vec<f64> = (0..RESAMPLES)
        .map(|_| {
            let (mut s_min, mut weighted) = (0.0, 0.0);
            for &(a, b) in bounds {
                let n = b - a;
                let (mut g2, mut tr) = (0.0, 0.0);
                for _ in 0..n {
                    let p = &points[a + rng.random_range(0..n)];
                    g2 += p.g2_raw;
                    tr += p.trace_raw;
                }
                if g2 <= 0.0 || tr <= 0.0 {
                    return f64::INFINITY;
                }
                let b_i = tr / g2;
                let ds = (updates_at(b) - updates_at(a)) / updates_vs_min(b_i, run_noise_batch);
                s_min += ds;
                weighted += ds * b_i;
            }
            weighted / s_min
        })
        .collect();
    values.sort_by(f64::total_cmp);
    let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
    (at(0.05), at(0.95))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A measurement at every update with the given trace, |G|^2 = 1.
    fn run(n: usize, trace: impl Fn(usize) -> f64, g2: impl Fn(usize) -> f64) -> Vec<RunPoint> {
        (0..n)
            .map(|i| RunPoint {
                updates: i as f64,
                g2_raw: g2(i),
                trace_raw: trace(i),
            })
            .collect()
    }

    /// A run whose noise scale quadruples halfway: the prediction is the sum of
    /// the two stretches' curves, not the end value's.
    #[test]
    fn growing_noise_scale_is_summed_stretch_by_stretch() {
        let run_batch = 128.0;
        let points = run(200, |i| if i < 100 { 100.0 } else { 400.0 }, |_| 1.0);
        // Loss evaluated every 10 updates, falling by 0.1 each time.
        let losses: Vec<(f64, f64)> = (0..=20)
            .map(|j| (10.0 * j as f64, 2.0 - 0.1 * j as f64))
            .collect();
        // 0.25 lies halfway between the evaluations at 170 (0.3) and 180 (0.2).
        let t = trajectory(&points, &losses, run_batch, None, 0.25).unwrap();
        assert!(
            (t.updates_to_target - 175.0).abs() < 1e-9,
            "{}",
            t.updates_to_target
        );
        let early = 100.0 / (1.0 + 100.0 / 128.0);
        let late = 75.0 / (1.0 + 400.0 / 128.0);
        let at = |b: f64| early * (1.0 + 100.0 / b) + late * (1.0 + 400.0 / b);
        for b in [16.0, 128.0, 1024.0] {
            assert!((t.steps(b) - at(b)).abs() < 1e-9, "{b}");
            assert!((t.curve().steps(b) - at(b)).abs() < 1e-9, "{b}");
        }
        // The run's own batch gets exactly the run's updates back.
        assert!((t.steps(run_batch) - 175.0).abs() < 1e-9);
        // The end value alone overstates the steps of small batches.
        let end_only = StepsCurve::through(175.0, run_batch, 400.0, None);
        assert!(end_only.steps(16.0) > 1.2 * t.steps(16.0));
        assert!((t.segments[0].loss_start - 2.0).abs() < 1e-12);
        assert!((t.segments.last().unwrap().loss_end - 0.25).abs() < 1e-9);
    }

    /// On a finite data set the run's batch was less noisy than with
    /// replacement: each stretch's S_min is counted with the noise-effective
    /// batch, the run's own updates come back at its batch, and a batch of
    /// all the rows needs S_min exactly (no noise left).
    #[test]
    fn a_finite_data_set_counts_the_batch_without_replacement() {
        let (run_batch, rows) = (64.0, 256.0);
        let points = run(200, |_| 100.0, |_| 1.0);
        let losses: Vec<(f64, f64)> = (0..=20)
            .map(|j| (10.0 * j as f64, 2.0 - 0.1 * j as f64))
            .collect();
        let t = trajectory(
            &points,
            &losses,
            run_batch,
            crate::target::sgd_rows(rows),
            0.25,
        )
        .unwrap();
        // B_noise 100 at 64 of 256 rows: 1 + 100 (1/64 - 1/256) = 2.171875.
        let s_min = 175.0 / (1.0 + 100.0 * (1.0 / 64.0 - 1.0 / 256.0));
        assert!((t.curve().s_min - s_min).abs() < 1e-9);
        assert!((t.steps(run_batch) - 175.0).abs() < 1e-9);
        assert!((t.curve().steps(run_batch) - 175.0).abs() < 1e-9);
        assert!((t.curve().steps(rows) - s_min).abs() < 1e-9);
        let at_128 = s_min * (1.0 + 100.0 * (1.0 / 128.0 - 1.0 / 256.0));
        assert!((t.curve().steps(128.0) - at_128).abs() < 1e-9);
        // Doubling from 64 to 128 saves more than 1 + B_noise/B allows (2x at most).
        let unlimited = trajectory(&points, &losses, run_batch, None, 0.25).unwrap();
        let saved = |t: &Trajectory| t.steps(64.0) / t.steps(128.0);
        assert!(saved(&t) > saved(&unlimited));
        assert!(saved(&t) > 1.5 && saved(&unlimited) < 1.5);
    }

    #[test]
    fn unmeasurable_stretches_merge_and_unreached_targets_say_so() {
        // The second stretch alone has a negative |G|^2 estimate.
        let points = run(
            60,
            |_| 50.0,
            |i| if (20..40).contains(&i) { -0.5 } else { 1.0 },
        );
        let losses = [(0.0, 1.0), (50.0, 0.5), (59.0, 0.45)];
        let t = trajectory(&points, &losses, 64.0, None, 0.5).unwrap();
        assert_eq!(t.segments.len(), 2);
        assert_eq!(t.segments[0].updates, 40.0);
        assert!((t.segments[0].b_noise - 2000.0 / 10.0).abs() < 1e-9);
        assert!((t.steps(64.0) - t.updates_to_target).abs() < 1e-9);
        assert!(trajectory(&points, &losses, 64.0, None, 0.1).is_none());
        assert!(trajectory(&points, &losses, 64.0, None, 5.0).is_none());
    }

    /// A plateau: the last stretch's |G|^2 scatters around zero (its ratio would
    /// read as a noise scale of thousands or worse); it is merged into the stretch
    /// before it instead of carrying that value, and the band of B_eff holds the
    /// estimate.
    #[test]
    fn a_plateau_carries_no_noise_scale_of_its_own() {
        let mut seed = 7u64;
        let mut noise = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 33) as f64 / (1u64 << 31) as f64) - 0.5
        };
        let points: Vec<RunPoint> = (0..60)
            .map(|i| RunPoint {
                updates: i as f64,
                g2_raw: if i < 40 {
                    1.0 + 0.4 * noise()
                } else {
                    0.05 + 2.0 * noise()
                },
                trace_raw: 100.0 + 40.0 * noise(),
            })
            .collect();
        let losses = [(0.0, 2.0), (59.0, 0.5)];
        let t = trajectory(&points, &losses, 64.0, None, 0.5).unwrap();
        assert_eq!(t.segments.len(), 2, "{:?}", t.segments);
        assert_eq!(
            t.segments[1].updates, 39.0,
            "the plateau joined its neighbour"
        );
        assert!(
            t.segments.iter().all(|s| s.b_noise < 1000.0),
            "{:?}",
            t.segments
        );
        let (lo, hi) = t.b_noise_band;
        let b = t.curve().b_noise;
        assert!(lo <= b && b <= hi && lo > 0.0, "{lo} {b} {hi}");
    }

    /// Adam's first steps: |G|^2 huge and noisy (some estimates negative) before
    /// its second moment settles. Not a plateau: the stretch keeps its own ratio.
    #[test]
    fn a_large_noisy_start_is_no_plateau() {
        let points: Vec<RunPoint> = (0..60)
            .map(|i| RunPoint {
                updates: i as f64,
                g2_raw: match i {
                    0..20 if i % 2 == 0 => 1e6,
                    0..20 => -9e5,
                    _ => 1.0 + 0.01 * (i % 3) as f64,
                },
                trace_raw: if i < 20 { 1e7 } else { 100.0 },
            })
            .collect();
        let losses = [(0.0, 2.0), (59.0, 0.5)];
        let t = trajectory(&points, &losses, 64.0, None, 0.5).unwrap();
        assert_eq!(t.segments.len(), 3, "{:?}", t.segments);
    }

    /// A script that measures every 5th update: stretches count updates, not measurements.
    #[test]
    fn sparse_measurements_count_the_updates_between_them() {
        let points: Vec<RunPoint> = (0..100)
            .map(|i| RunPoint {
                updates: 5.0 * i as f64,
                g2_raw: 2.0,
                trace_raw: 128.0,
            })
            .collect();
        let losses = [(0.0, 1.0), (500.0, 0.5)];
        let t = trajectory(&points, &losses, 64.0, None, 0.75).unwrap();
        assert_eq!(t.updates_to_target, 250.0);
        // B_noise 64 at the run's own batch 64: half the updates are the minimum.
        assert!((t.curve().s_min - 125.0).abs() < 1e-9);
        assert!((t.curve().b_noise - 64.0).abs() < 1e-9);
    }
}
