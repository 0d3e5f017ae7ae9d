//! Statistics of repeated timings, in the manner of hyperfine.

use serde::Serialize;

/// Summary of a set of timings (seconds).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub n: usize,
    pub median: f64,
    pub mean: f64,
    pub std_dev: f64,
    pub min: f64,
    pub max: f64,
    pub p10: f64,
    pub p90: f64,
    /// Standard error of the median relative to it (1.2533 sigma / sqrt(n) / median).
    pub rel_std_err: f64,
    /// Samples whose modified z-score exceeds 3.5 (Iglewicz and Hoaglin).
    pub outliers: usize,
}

/// Linear-interpolated quantile of sorted data, `q` in [0, 1].
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    assert!(!sorted.is_empty(), "quantile of no data");
    let pos = q.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// Summarises `xs` (at least one value).
pub fn summarize(xs: &[f64]) -> Summary {
    let mut s = xs.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let mean = s.iter().sum::<f64>() / n as f64;
    let var = if n > 1 {
        s.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64
    } else {
        0.0
    };
    let median = quantile(&s, 0.5);
    let std_dev = var.sqrt();
    let mut dev: Vec<f64> = s.iter().map(|x| (x - median).abs()).collect();
    dev.sort_by(f64::total_cmp);
    let mad = quantile(&dev, 0.5);
    let outliers = if mad > 0.0 {
        s.iter()
            .filter(|x| 0.6745 * (*x - median).abs() / mad > 3.5)
            .count()
    } else {
        0
    };
    Summary {
        n,
        median,
        mean,
        std_dev,
        min: s[0],
        max: s[n - 1],
        p10: quantile(&s, 0.1),
        p90: quantile(&s, 0.9),
        rel_std_err: if n > 1 && median > 0.0 {
            1.2533 * std_dev / (n as f64).sqrt() / median
        } else {
            f64::INFINITY
        },
        outliers,
    }
}

impl Summary {
    /// Whether the spread is wide enough to warn about a noisy machine: the p10-p90
    /// range is over a quarter of the median, or more than a tenth are outliers.
    pub fn noisy(&self) -> bool {
        (self.p90 - self.p10) > 0.25 * self.median || self.outliers * 10 > self.n
    }
}

/// When to stop timing one batch size.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct StopRule {
    /// Stop once the median's relative standard error is below this (0.02 = 2 %).
    pub target_rel_err: f64,
    /// ... but time at least this many steps,
    pub min_steps: usize,
    /// ... and at least this many seconds (many steps for sub-millisecond ones),
    pub min_time_s: f64,
    /// ... at most this many,
    pub max_steps: usize,
    /// ... and stop after this many seconds of timed steps.
    pub time_cap_s: f64,
}

impl Default for StopRule {
    fn default() -> Self {
        StopRule {
            target_rel_err: 0.02,
            min_steps: 5,
            min_time_s: 0.25,
            max_steps: 5000,
            time_cap_s: 3.0,
        }
    }
}

impl StopRule {
    /// Whether the timings so far are enough.
    pub fn done(&self, times: &[f64]) -> bool {
        let n = times.len();
        if n >= self.max_steps || times.iter().sum::<f64>() >= self.time_cap_s {
            return n >= 1;
        }
        n >= self.min_steps
            && times.iter().sum::<f64>() >= self.min_time_s
            && summarize(times).rel_std_err < self.target_rel_err
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_quantiles() {
        let s = summarize(&[5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!(s.median, 3.0);
        assert_eq!(s.min, 1.0);
        assert_eq!(s.max, 5.0);
        assert!((s.p10 - 1.4).abs() < 1e-12);
        assert!((s.std_dev - 2.5f64.sqrt()).abs() < 1e-12);
    }

    #[test]
    fn one_wild_sample_is_an_outlier() {
        let mut xs = vec![1.0, 1.01, 0.99, 1.02, 0.98, 1.0, 1.01, 0.99];
        xs.push(5.0);
        let s = summarize(&xs);
        assert_eq!(s.outliers, 1);
        assert!(s.noisy());
        assert!(!summarize(&xs[..8]).noisy());
    }

    #[test]
    fn stop_rule_waits_for_a_stable_median_or_the_cap() {
        let rule = StopRule::default();
        assert!(!rule.done(&[0.1; 2]));
        assert!(!rule.done(&[0.01; 5]), "under the minimum time");
        assert!(rule.done(&[0.1; 5]));
        let noisy = [0.1, 0.3, 0.1, 0.3, 0.1, 0.3];
        assert!(!rule.done(&noisy));
        assert!(rule.done(&[1.0, 2.5]), "time cap reached");
        assert!(rule.done(&[0.0001; 5000]), "step cap reached");
    }
}
