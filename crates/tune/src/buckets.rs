//! How variable-length samples become batches, and what each way costs.
//!
//! A padded batch costs the memory and compute of its longest sample. Three
//! schemes are compared over one epoch of the given lengths, each batch padded
//! to its own longest sample (PyTorch's `pad_sequence`, Keras'
//! `padded_batch` without a fixed shape):
//!
//! - **fixed**: one batch size for every batch, drawn at random from all samples;
//!   it must fit the longest sample, since some batch will hold it.
//! - **buckets**: samples grouped by length into buckets (equal counts); each
//!   bucket has its own batch, the largest that fits its longest sample.
//! - **frames**: a budget of padded frames per batch (batch x longest in batch),
//!   batches cut from the samples sorted by length (ESPnet's `batch_bins`).
//!
//! The epoch is simulated with a seeded shuffle, so every count is exact for
//! that epoch and the same from run to run.

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde::Serialize;

/// One batch of an epoch: its samples and the length it is padded to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct EpochBatch {
    pub samples: u64,
    pub padded_to: u64,
    /// Sum of the samples' own lengths.
    pub real_frames: u64,
}

impl EpochBatch {
    /// Frames computed on, padding included.
    pub fn padded_frames(&self) -> u64 {
        self.samples * self.padded_to
    }
}

/// A batching scheme with its sizes decided.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "scheme", rename_all = "snake_case")]
pub enum Scheme {
    /// One batch size, samples drawn from the whole set.
    Fixed { batch: u64 },
    /// Buckets by length: `bounds[i]` is bucket i's longest sample (inclusive,
    /// ascending), `batches[i]` its batch.
    Buckets { bounds: Vec<u64>, batches: Vec<u64> },
    /// Padded frames per batch at most.
    Frames { budget: u64 },
}

/// Summary statistics of the lengths.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LengthStats {
    pub samples: u64,
    pub min: u64,
    pub median: u64,
    pub p90: u64,
    pub max: u64,
    pub total_frames: u64,
}

impl LengthStats {
    /// Statistics of non-empty `lengths`.
    pub fn of(lengths: &[u64]) -> LengthStats {
        let mut s = lengths.to_vec();
        s.sort_unstable();
        let at = |q: f64| s[((s.len() - 1) as f64 * q).round() as usize];
        LengthStats {
            samples: s.len() as u64,
            min: s[0],
            median: at(0.5),
            p90: at(0.9),
            max: s[s.len() - 1],
            total_frames: s.iter().sum(),
        }
    }
}

/// Upper bounds of `k` buckets of about equal counts (each a length that occurs),
/// ascending, the last the longest length; fewer when lengths repeat.
pub fn bucket_bounds(lengths: &[u64], k: usize) -> Vec<u64> {
    let mut s = lengths.to_vec();
    s.sort_unstable();
    let n = s.len();
    let k = k.clamp(1, n.max(1));
    let mut bounds: Vec<u64> = (1..=k).map(|i| s[(i * n).div_ceil(k) - 1]).collect();
    bounds.dedup();
    bounds
}

/// The bucket (index into `bounds`) of a sample of length `len`.
pub fn bucket_of(bounds: &[u64], len: u64) -> usize {
    bounds.partition_point(|&b| b < len).min(bounds.len() - 1)
}

/// The batches of one epoch of `lengths` under `scheme`, in training order
/// (shuffled with `seed`). A batch size of 0 is read as 1.
pub fn epoch(lengths: &[u64], scheme: &Scheme, seed: u64) -> Vec<EpochBatch> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    match scheme {
        Scheme::Fixed { batch } => {
            let mut order = lengths.to_vec();
            order.shuffle(&mut rng);
            cut(&order, (*batch).max(1), &mut out);
        }
        Scheme::Buckets { bounds, batches } => {
            let mut groups: Vec<Vec<u64>> = vec![Vec::new(); bounds.len()];
            for &l in lengths {
                groups[bucket_of(bounds, l)].push(l);
            }
            for (g, &b) in groups.iter_mut().zip(batches) {
                g.shuffle(&mut rng);
                cut(g, b.max(1), &mut out);
            }
            out.shuffle(&mut rng);
        }
        Scheme::Frames { budget } => {
            let mut sorted = lengths.to_vec();
            sorted.sort_unstable();
            let mut start = 0;
            for (i, &l) in sorted.iter().enumerate() {
                // Sorted, so the newest sample is the batch's longest.
                if (i + 1 - start) as u64 * l > *budget && i > start {
                    out.push(batch_of(&sorted[start..i]));
                    start = i;
                }
            }
            if start < sorted.len() {
                out.push(batch_of(&sorted[start..]));
            }
            out.shuffle(&mut rng);
        }
    }
    out
}

fn cut(samples: &[u64], batch: u64, out: &mut Vec<EpochBatch>) {
    out.extend(samples.chunks(batch as usize).map(batch_of));
}

fn batch_of(samples: &[u64]) -> EpochBatch {
    EpochBatch {
        samples: samples.len() as u64,
        padded_to: samples.iter().copied().max().unwrap_or(0),
        real_frames: samples.iter().sum(),
    }
}

/// What an epoch of batches costs in steps and padding.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct EpochCost {
    pub steps: u64,
    pub padded_frames: u64,
    /// Share of the padded frames that are padding.
    pub padding_waste: f64,
    /// The largest batch and the longest padding of any batch.
    pub largest_batch: u64,
    pub longest_padded: u64,
}

impl EpochCost {
    pub fn of(batches: &[EpochBatch]) -> EpochCost {
        let padded: u64 = batches.iter().map(EpochBatch::padded_frames).sum();
        let real: u64 = batches.iter().map(|b| b.real_frames).sum();
        EpochCost {
            steps: batches.len() as u64,
            padded_frames: padded,
            padding_waste: if padded == 0 {
                0.0
            } else {
                1.0 - real as f64 / padded as f64
            },
            largest_batch: batches.iter().map(|b| b.samples).max().unwrap_or(0),
            longest_padded: batches.iter().map(|b| b.padded_to).max().unwrap_or(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_split_equal_counts() {
        let l: Vec<u64> = (1..=100).collect();
        assert_eq!(bucket_bounds(&l, 4), vec![25, 50, 75, 100]);
        assert_eq!(bucket_bounds(&[7, 7, 7, 9], 4), vec![7, 9]);
        assert_eq!(bucket_of(&[25, 50], 26), 1);
        assert_eq!(bucket_of(&[25, 50], 25), 0);
    }

    #[test]
    fn every_sample_in_one_batch_once() {
        let l: Vec<u64> = (0..1000).map(|i| 20 + (i * 37 % 700)).collect();
        let total: u64 = l.iter().sum();
        let bounds = bucket_bounds(&l, 5);
        for s in [
            Scheme::Fixed { batch: 33 },
            Scheme::Buckets {
                batches: vec![50, 40, 30, 20, 10],
                bounds: bounds.clone(),
            },
            Scheme::Frames { budget: 9000 },
        ] {
            let e = epoch(&l, &s, 1);
            assert_eq!(e.iter().map(|b| b.samples).sum::<u64>(), 1000, "{s:?}");
            assert_eq!(e.iter().map(|b| b.real_frames).sum::<u64>(), total);
            assert!(e.iter().all(|b| b.padded_frames() >= b.real_frames));
            if let Scheme::Frames { budget } = s {
                assert!(e.iter().all(|b| b.padded_frames() <= budget));
            }
            if let Scheme::Buckets { bounds, batches } = &s {
                // A batch holds one bucket's samples, at most that bucket's batch.
                for b in &e {
                    assert!(b.samples <= batches[bucket_of(bounds, b.padded_to)]);
                }
            }
        }
    }

    #[test]
    fn sorting_wastes_less_than_random_batches() {
        let l: Vec<u64> = (0..2000).map(|i| 50 + (i * 7919 % 701)).collect();
        let fixed = EpochCost::of(&epoch(&l, &Scheme::Fixed { batch: 16 }, 0));
        let frames = EpochCost::of(&epoch(&l, &Scheme::Frames { budget: 16 * 750 }, 0));
        assert!(frames.padding_waste < 0.05 && fixed.padding_waste > 0.3);
        assert_eq!(fixed.steps, 125);
        // Same epoch, same seed.
        assert_eq!(
            epoch(&l, &Scheme::Fixed { batch: 16 }, 3),
            epoch(&l, &Scheme::Fixed { batch: 16 }, 3)
        );
    }

    #[test]
    fn stats_quantiles() {
        let s = LengthStats::of(&[5, 1, 3, 2, 4]);
        assert_eq!((s.min, s.median, s.max, s.total_frames), (1, 3, 5, 15));
    }
}
