//! The knee: the smallest batch that runs efficiently (Sutskever's advice: the smallest minibatch that runs efficiently).

/// The smallest batch whose throughput reaches `efficiency` of the best measured.
/// `points` are `(batch, samples_per_s)`; returns `None` for no points.
pub fn knee(points: &[(u64, f64)], efficiency: f64) -> Option<u64> {
    let best = points.iter().map(|p| p.1).fold(f64::NAN, f64::max);
    if best.is_nan() {
        return None;
    }
    points
        .iter()
        .filter(|p| p.1 >= efficiency * best)
        .map(|p| p.0)
        .min()
}

/// One-sided 95 % normal quantile for "within the measurement's noise".
const Z: f64 = 1.645;

/// The knee with its uncertainty, from `(batch, samples_per_s, relative
/// standard error)`: `low` is the smallest batch whose throughput could reach
/// `efficiency` of the best within Z standard errors (the two errors
/// combined), `high` the smallest that reaches it even at the low end of its
/// error; `flat_from` the smallest batch than which no larger measured batch
/// is faster beyond the noise (throughput is flat within noise from there).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct KneeRange {
    pub low: u64,
    pub high: u64,
    pub flat_from: u64,
}

impl KneeRange {
    /// The range widened to hold `knee`: the knee is read off the line fitted to
    /// every step time ([`smooth_knee`]), the range off the medians, and one
    /// straying median can move the range past the knee it stands for.
    pub fn covering(self, knee: Option<u64>) -> KneeRange {
        let Some(k) = knee else { return self };
        KneeRange {
            low: self.low.min(k),
            high: self.high.max(k),
            flat_from: self.flat_from,
        }
    }
}

/// See [`KneeRange`]; `None` for no points.
pub fn knee_range(points: &[(u64, f64, f64)], efficiency: f64) -> Option<KneeRange> {
    let rel = |e: f64| if e.is_finite() { e.min(1.0) } else { 1.0 };
    let best = points
        .iter()
        .filter(|p| p.1.is_finite())
        .max_by(|a, b| a.1.total_cmp(&b.1))?;
    let bound = |p: &(u64, f64, f64), sign: f64| {
        let err = (rel(p.2).powi(2) + rel(best.2).powi(2)).sqrt();
        p.1 / best.1 * (1.0 + sign * Z * err)
    };
    let mut sorted: Vec<&(u64, f64, f64)> = points.iter().filter(|p| p.1.is_finite()).collect();
    sorted.sort_by_key(|p| p.0);
    let low = sorted
        .iter()
        .find(|p| p.0 == best.0 || bound(p, 1.0) >= efficiency)?
        .0;
    let high = sorted
        .iter()
        .find(|p| p.0 == best.0 || bound(p, -1.0) >= efficiency)?
        .0;
    // The smallest batch no larger batch is measurably faster than.
    let faster = |a: &(u64, f64, f64), b: &(u64, f64, f64)| {
        let err = (rel(a.2).powi(2) + rel(b.2).powi(2)).sqrt();
        b.1 > a.1 * (1.0 + Z * err)
    };
    let flat_from = sorted
        .iter()
        .enumerate()
        .find(|(i, p)| sorted[i + 1..].iter().all(|q| !faster(p, q)))?
        .1
        .0;
    Some(KneeRange {
        low,
        high: high.max(low),
        flat_from,
    })
}

/// The knee read off the step-time line when the line explains the measured
/// points (`advice::step_time_line`): the smallest measured batch whose fitted
/// throughput, B / (fixed + per_sample B), reaches `efficiency` of the best
/// fitted throughput among the measured batches. It rests on every point, not
/// on the single noisy median next to the threshold, so a second run reproduces
/// it; `None` when the curve is not a line (then [`knee`] on the medians).
pub fn smooth_knee(points: &[crate::diagnose::StepPoint], efficiency: f64) -> Option<u64> {
    let (fixed, per) = crate::advice::step_time_line(points)?;
    let fitted = |b: u64| b as f64 / (fixed + per * b as f64);
    let best = points
        .iter()
        .map(|q| fitted(q.batch))
        .fold(f64::NAN, f64::max);
    points
        .iter()
        .map(|q| q.batch)
        .filter(|&b| fitted(b) >= efficiency * best)
        .min()
}

/// Batches to sample: powers of two from `lo` to `hi`, always ending at `hi`.
pub fn geometric_batches(lo: u64, hi: u64) -> Vec<u64> {
    let mut v = Vec::new();
    let mut b = lo.max(1);
    while b < hi {
        v.push(b);
        b *= 2;
    }
    v.push(hi.max(1));
    v.dedup();
    v
}

/// Batches to refine a knee found between `below` (not efficient) and `at`
/// (efficient): the geometric midpoints, at most `n`.
pub fn refine_between(below: u64, at: u64, n: usize) -> Vec<u64> {
    let mut v = Vec::new();
    if at <= below + 1 {
        return v;
    }
    let ratio = (at as f64 / below as f64).powf(1.0 / (n + 1) as f64);
    let mut x = below as f64;
    for _ in 0..n {
        x *= ratio;
        let b = x.round() as u64;
        if b > below && b < at && !v.contains(&b) {
            v.push(b);
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knee_is_smallest_batch_within_efficiency() {
        let pts = [
            (16, 100.0),
            (32, 180.0),
            (64, 270.0),
            (128, 300.0),
            (256, 290.0),
        ];
        assert_eq!(knee(&pts, 0.9), Some(64));
        assert_eq!(knee(&pts, 0.5), Some(32));
        assert_eq!(knee(&pts, 1.0), Some(128));
        assert_eq!(knee(&[], 0.9), None);
    }

    #[test]
    fn sampling_and_refinement() {
        assert_eq!(geometric_batches(8, 100), vec![8, 16, 32, 64, 100]);
        assert_eq!(refine_between(32, 64, 1), vec![45]);
        assert!(refine_between(32, 33, 2).is_empty());
    }

    #[test]
    fn knee_range_widens_with_noise() {
        let pts = [
            (16, 100.0),
            (32, 180.0),
            (64, 270.0),
            (128, 300.0),
            (256, 290.0),
        ];
        let exact: Vec<(u64, f64, f64)> = pts.iter().map(|&(b, t)| (b, t, 0.0)).collect();
        let r = knee_range(&exact, 0.9).unwrap();
        assert_eq!((r.low, r.high), (64, 64));
        // Nothing above 128 is faster than it.
        assert_eq!(r.flat_from, 128);
        let noisy: Vec<(u64, f64, f64)> = pts.iter().map(|&(b, t)| (b, t, 0.05)).collect();
        let r = knee_range(&noisy, 0.9).unwrap();
        // 180/300 = 0.6 cannot reach 0.9 even with 5 % errors; 270/300 = 0.9 can,
        // but not surely: the knee lies between 64 and 128.
        assert_eq!((r.low, r.high), (64, 128));
        assert_eq!(r.flat_from, 64);
        assert!(knee_range(&[], 0.9).is_none());
        // A knee read elsewhere (the fitted line) widens the range to hold it.
        let held = r.covering(Some(32));
        assert_eq!((held.low, held.high, held.flat_from), (32, 128, 64));
        assert_eq!(r.covering(Some(100)), r);
        assert_eq!(r.covering(None), r);
    }

    /// On a line of step times the smooth knee is the medians' knee; one noisy
    /// median near the threshold moves the medians' knee but not the line's.
    #[test]
    fn smooth_knee_rests_on_every_point() {
        use crate::diagnose::StepPoint;
        let line = |b: u64| 2e-3 + 1e-5 * b as f64;
        let mut pts: Vec<StepPoint> = [16u64, 32, 64, 128, 256, 512, 1024, 2048]
            .iter()
            .map(|&b| StepPoint {
                batch: b,
                step_s: line(b),
                rel_err: 0.03,
            })
            .collect();
        let curve = |pts: &[StepPoint]| -> Vec<(u64, f64)> {
            pts.iter()
                .map(|p| (p.batch, p.batch as f64 / p.step_s))
                .collect()
        };
        let exact = smooth_knee(&pts, 0.9);
        assert_eq!(exact, knee(&curve(&pts), 0.9));
        // 1024 measures 8 % slow: the medians' knee moves to 2048, the line's stays.
        pts[6].step_s *= 1.08;
        assert_eq!(knee(&curve(&pts), 0.9), Some(2048));
        assert_eq!(smooth_knee(&pts, 0.9), exact);
    }
}
