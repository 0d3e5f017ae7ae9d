//! A user's command when nothing measures its memory: the listed batches, or
//! doubling to the first out-of-memory and integer bisection of the last octave.

use super::{LadderResult, TrialReason, Verdict};

/// Runs exactly `batches`, in order, and summarises them: the largest that
/// ran, the smallest out of memory (not necessarily adjacent).
pub fn each_listed(
    batches: &[u64],
    mut trial: impl FnMut(u64, TrialReason) -> Verdict,
) -> LadderResult {
    let mut r = LadderResult::default();
    for &b in batches {
        let v = trial(b, TrialReason::Listed);
        r.trials.push((b, TrialReason::Listed, v));
        match v {
            Verdict::Runs { .. } => r.max_batch = r.max_batch.max(Some(b)),
            Verdict::OutOfMemory => {
                r.smallest_failure = Some(r.smallest_failure.map_or(b, |f| f.min(b)))
            }
            Verdict::Broken => {}
        }
    }
    r
}

/// Largest batch that runs, exactly, when nothing predicts memory (an external
/// command): doubling from `start` up to `cap` until the first out-of-memory,
/// then integer bisection of the gap, so `max_batch + 1` is a measured failure.
/// The doubling rungs double as the geometric samples of the throughput curve.
/// A crash or time-out stops the search: it is not evidence about memory.
pub fn ladder_then_bisect(
    start: u64,
    cap: u64,
    mut trial: impl FnMut(u64, TrialReason) -> Verdict,
) -> LadderResult {
    let mut r = LadderResult::default();
    let mut run = |b: u64, why: TrialReason, r: &mut LadderResult| {
        let v = trial(b, why);
        r.trials.push((b, why, v));
        v
    };
    let cap = cap.max(1);
    let mut b = start.clamp(1, cap);
    loop {
        match run(b, TrialReason::Doubling, &mut r) {
            Verdict::Runs { .. } => r.max_batch = Some(b),
            Verdict::OutOfMemory => {
                r.smallest_failure = Some(b);
                break;
            }
            Verdict::Broken => {
                r.stopped_at = Some(b);
                return r;
            }
        }
        if b == cap {
            r.capped = true;
            return r;
        }
        b = b.saturating_mul(2).min(cap);
    }
    let mut lo = r.max_batch.unwrap_or(0);
    let mut hi = r.smallest_failure.expect("the ladder ended on a failure");
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        match run(mid, TrialReason::Bisection, &mut r) {
            Verdict::Runs { .. } => lo = mid,
            Verdict::OutOfMemory => hi = mid,
            Verdict::Broken => {
                r.stopped_at = Some(mid);
                break;
            }
        }
    }
    r.max_batch = (lo > 0).then_some(lo);
    r.smallest_failure = Some(hi);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ladder_with_threshold(threshold: u64, start: u64, cap: u64) -> LadderResult {
        ladder_then_bisect(start, cap, |b, _| {
            if b <= threshold {
                Verdict::Runs { peak: None }
            } else {
                Verdict::OutOfMemory
            }
        })
    }

    #[test]
    fn ladder_finds_the_exact_threshold() {
        for threshold in [1, 2, 3, 7, 100, 127, 128, 129, 1000, 4097] {
            let r = ladder_with_threshold(threshold, 1, 1 << 20);
            assert_eq!(r.max_batch, Some(threshold), "threshold {threshold}");
            assert_eq!(r.smallest_failure, Some(threshold + 1));
            let failed_at = |b| {
                r.trials
                    .iter()
                    .any(|t| t.0 == b && t.2 == Verdict::OutOfMemory)
            };
            assert!(
                failed_at(threshold + 1) || threshold.is_power_of_two() && failed_at(threshold * 2)
            );
            // doubling rungs + bisection of one octave: about 2 log2(threshold) trials.
            let bound = 2 * (64 - threshold.leading_zeros() as usize) + 2;
            assert!(
                r.trials.len() <= bound,
                "{} trials for {threshold}",
                r.trials.len()
            );
        }
    }

    #[test]
    fn ladder_when_even_the_start_fails_or_the_cap_is_reached() {
        let r = ladder_with_threshold(0, 1, 64);
        assert_eq!((r.max_batch, r.smallest_failure), (None, Some(1)));
        let r = ladder_with_threshold(5, 16, 64);
        assert_eq!((r.max_batch, r.smallest_failure), (Some(5), Some(6)));
        let r = ladder_with_threshold(1000, 1, 100);
        assert_eq!(r.max_batch, Some(100));
        assert!(r.capped && r.smallest_failure.is_none());
        assert_eq!(r.trials.last().unwrap().0, 100);
    }

    #[test]
    fn ladder_stops_at_a_crash_without_calling_it_out_of_memory() {
        let r = ladder_then_bisect(1, 1 << 20, |b, _| match b {
            ..=8 => Verdict::Runs { peak: None },
            _ => Verdict::Broken,
        });
        assert_eq!(r.max_batch, Some(8));
        assert_eq!(r.smallest_failure, None);
        assert_eq!(r.stopped_at, Some(16));
    }
}
