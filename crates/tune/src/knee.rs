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
}
