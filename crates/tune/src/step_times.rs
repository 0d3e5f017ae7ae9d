//! Step times as the recommendation judges them: the medians as measured,
//! or the line through them where it misses them by no more than a second run
//! would (so one noisy point does not move the answer).

use crate::diagnose::StepPoint;

/// The step times the tie is judged on, as `(batch, seconds, relative
/// error)`. Step time is smooth in the batch: where the line `fixed +
/// per_sample x B` fitted to the measured points explains at least 70 % of
/// them within 4 standard errors (or 10 %), and its misfit is the
/// measurements' noise (the median residual at most 2 standard errors, each
/// at least 2.5 %: `NOISE_MISFIT`, `REPEATABILITY`), the line refitted to
/// those replaces the single medians, with the error of a line through n
/// points (the median error x sqrt(2 / n)); so one noisy point does not move
/// the answer. Otherwise the medians as measured:
/// precise step times that bend away from a line (a per-step floor at small
/// batches, a faster kernel at one size) are the curve, not noise.
pub fn smoothed_step_times(points: &[StepPoint]) -> Vec<(u64, f64, f64)> {
    smoothed(points).0
}

/// The line `(fixed, per_sample)` through the measured step times, when it
/// explains them (see [`smoothed_step_times`]); `None` when the curve is not a line.
pub fn step_time_line(points: &[StepPoint]) -> Option<(f64, f64)> {
    smoothed(points).1
}

/// Step times to judge ties on: `(batch, seconds, relative error)`.
type StepTimes = Vec<(u64, f64, f64)>;

/// [`smoothed_step_times`] and the line `(fixed, per_sample)`, when it was used.
pub(crate) fn smoothed(points: &[StepPoint]) -> (StepTimes, Option<(f64, f64)>) {
    let measured: Vec<(u64, f64, f64)> = points
        .iter()
        .map(|q| (q.batch, q.step_s, q.rel_err))
        .collect();
    if points.len() < 3 {
        return (measured, None);
    }
    let Some((fixed, per)) = relative_line(points) else {
        return (measured, None);
    };
    let explained = |q: &&StepPoint| {
        let model = fixed + per * q.batch as f64;
        let allowed = (4.0 * q.rel_err).max(0.10);
        model > 0.0 && ((model - q.step_s) / q.step_s).abs() <= allowed
    };
    // A few outliers (a busy moment) are left out of the line; more mean the
    // curve is not a line, and the medians stand.
    let inliers: Vec<StepPoint> = points.iter().filter(explained).copied().collect();
    if fixed < 0.0 || inliers.len() * 10 < points.len() * 7 || inliers.len() < 3 {
        return (measured, None);
    }
    let Some((fixed, per)) = relative_line(&inliers) else {
        return (measured, None);
    };
    if fixed < 0.0 || per <= 0.0 || !misfit_is_noise(points, fixed, per) {
        return (measured, None);
    }
    let mut errs: Vec<f64> = points
        .iter()
        .map(|q| {
            if q.rel_err.is_finite() {
                q.rel_err
            } else {
                1.0
            }
        })
        .collect();
    errs.sort_by(f64::total_cmp);
    let err = errs[errs.len() / 2] * (2.0 / points.len() as f64).sqrt();
    let smooth = points
        .iter()
        .map(|q| (q.batch, fixed + per * q.batch as f64, err))
        .collect();
    (smooth, Some((fixed, per)))
}

/// The median residual of a line that explains step times, in standard
/// errors: for normal errors the median |z| is 0.67, so 2 allows errors
/// underestimated threefold.
const NOISE_MISFIT: f64 = 2.0;

/// How much one batch's step time moves between separate runs on an idle
/// machine, whatever its own repeats say (a 2-core VM, the digits MLP in five
/// `advise` runs: 110-113 us at 128, 433-454 us at 1,024). Smoothing is for
/// answers that hold when asked twice, so a line may miss the points by what
/// a second run would, but a bend larger than that (a per-step floor at small
/// batches, a faster kernel at one size) is the curve.
pub(crate) const REPEATABILITY: f64 = 0.025;

/// Whether the line `fixed + per x B` misses the points by no more than their
/// noise: the median of |residual| / (step x relative error) is at most
/// [`NOISE_MISFIT`], each error at least [`REPEATABILITY`]. A point whose
/// error is unknown (one timed step) shows no misfit.
fn misfit_is_noise(points: &[StepPoint], fixed: f64, per: f64) -> bool {
    let mut z: Vec<f64> = points
        .iter()
        .map(|q| {
            let miss = ((fixed + per * q.batch as f64) - q.step_s).abs() / q.step_s;
            if q.rel_err.is_finite() {
                miss / q.rel_err.max(REPEATABILITY)
            } else {
                0.0
            }
        })
        .collect();
    if z.is_empty() {
        return false;
    }
    z.sort_by(f64::total_cmp);
    z[z.len() / 2] <= NOISE_MISFIT
}

/// The line through the measured points from half the smallest to twice the
/// largest of `batches` (at least three points), when both its terms are
/// positive and it misses them by no more than their noise: step time is
/// often a line there even when tiny batches bend the curve, but not always
/// (a per-step floor up to a hinge inside the tie, then a rise in proportion
/// to the batch), and the optimum of a line that bends through a hinge is
/// neither side's.
pub(crate) fn local_line(points: &[StepPoint], batches: &[u64]) -> Option<(f64, f64)> {
    let (lo, hi) = (*batches.iter().min()?, *batches.iter().max()?);
    let near: Vec<StepPoint> = points
        .iter()
        .filter(|q| 2 * q.batch >= lo && q.batch <= 2 * hi)
        .copied()
        .collect();
    if near.len() < 3 {
        return None;
    }
    relative_line(&near).filter(|&(f, p)| f > 0.0 && p > 0.0 && misfit_is_noise(&near, f, p))
}

/// `fixed + per_sample x B` by least squares on relative errors (weights
/// 1/step^2): timings scatter in proportion to their size, and an unweighted
/// fit lets the largest batch's noise set the line.
fn relative_line(points: &[StepPoint]) -> Option<(f64, f64)> {
    let w: Vec<(f64, f64, f64)> = points
        .iter()
        .filter(|q| q.step_s > 0.0 && q.step_s.is_finite())
        .map(|q| (q.batch as f64, q.step_s, 1.0 / (q.step_s * q.step_s)))
        .collect();
    let sw: f64 = w.iter().map(|p| p.2).sum();
    if w.len() < 2 || sw <= 0.0 {
        return None;
    }
    let mx = w.iter().map(|p| p.2 * p.0).sum::<f64>() / sw;
    let my = w.iter().map(|p| p.2 * p.1).sum::<f64>() / sw;
    let sxx: f64 = w.iter().map(|p| p.2 * (p.0 - mx).powi(2)).sum();
    let sxy: f64 = w.iter().map(|p| p.2 * (p.0 - mx) * (p.1 - my)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let per = sxy / sxx;
    Some((my - per * mx, per))
}
