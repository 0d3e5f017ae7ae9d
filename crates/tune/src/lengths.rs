//! Which batches survive a whole epoch of real lengths, and what bucketing gains.
//!
//! A batch that fits at the median length runs out of memory on the longest
//! samples, late in an epoch. From the plan at each length ([`LengthPlanner`])
//! and the data's lengths this builds: the largest fixed batch that fits the
//! longest sample; a bucket table (per length bucket, the largest batch that fits
//! its longest sample); a frame budget; and, for one simulated epoch of each
//! scheme, its steps, padding, planned peak and compute. With measured step
//! times ([`StepTimeModel`]) each scheme's epoch time is predicted.

use crate::buckets::{EpochBatch, EpochCost, LengthStats, Scheme, bucket_bounds, epoch};
use batchfit_plan::Bytes;
use batchfit_plan::lengths::{LengthPlanner, SeqMemory};
use serde::Serialize;

/// Which epoch of a scheme is simulated (any fixed seed: the counts are of that epoch).
pub const EPOCH_SEED: u64 = 0;

/// Lengths above this many distinct values are planned at this many quantiles for
/// the frame budget (plus the shortest and longest, where its bound is decided).
const FRAME_BUDGET_POINTS: usize = 64;

/// One bucket of the table.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BucketRow {
    /// Shortest and longest sample of the bucket (the batch is padded to at most `longest`).
    pub shortest: u64,
    pub longest: u64,
    pub samples: u64,
    /// The largest batch whose planned peak at `longest` fits the budget.
    pub batch: u64,
    pub planned_bytes: Bytes,
}

/// The kind of a batching scheme (see [`crate::buckets`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SchemeKind {
    /// One batch for all, the largest that fits the longest sample.
    Fixed,
    /// One batch per length bucket.
    Buckets,
    /// A padded-frames budget per batch.
    Frames,
    /// The batch a benchmark at the median length finds: shown because it fails.
    MedianBenchmark,
}

impl SchemeKind {
    pub fn label(self) -> &'static str {
        match self {
            SchemeKind::Fixed => "fixed padded batch",
            SchemeKind::Buckets => "sorted buckets",
            SchemeKind::Frames => "frame budget",
            SchemeKind::MedianBenchmark => "batch sized at the median",
        }
    }
}

/// One scheme over one simulated epoch.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SchemeRow {
    pub kind: SchemeKind,
    pub scheme: Scheme,
    pub steps: u64,
    pub padding_waste: f64,
    pub padded_frames: u64,
    /// Training FLOPs of the epoch, padding included.
    pub train_flops: f64,
    /// The largest planned peak of any batch of the epoch.
    pub planned_peak: Bytes,
    /// The batch of the epoch closest to the budget: (samples, padded length).
    pub riskiest_batch: (u64, u64),
    /// Batches whose planned peak exceeds the budget (0 for every scheme but the median's).
    pub batches_over_budget: u64,
    /// Predicted seconds of the epoch, from measured step times (a prediction).
    pub predicted_epoch_s: Option<f64>,
}

/// Everything the plan says about training on these lengths under a budget.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LengthPlan {
    pub lengths: LengthStats,
    pub budget_bytes: Bytes,
    /// The batches are sized so that their planned peak fits this: the budget less
    /// `margin`, the share by which the plan has under-counted its runtime at most.
    pub sized_for_bytes: Bytes,
    pub margin: f64,
    /// Where the batches come from: the plan, or measured limits (`probe --lengths`).
    pub batches_from: BatchSource,
    /// The memory form of the moment that peaks at the longest length.
    pub memory_form: SeqMemory,
    /// The largest batch that fits the longest sample (so every batch of any scheme).
    pub fixed_batch: u64,
    /// The largest batch at the median length: what a benchmark at one typical length finds.
    pub median_batch: u64,
    pub buckets: Vec<BucketRow>,
    /// Padded frames per batch (batch x longest in batch) that fit at every length.
    pub frame_budget: u64,
    pub schemes: Vec<SchemeRow>,
}

/// Where a length plan's batch sizes come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchSource {
    /// The largest batches the plan fits in the budget (predicted).
    Planned,
    /// The largest batches that ran, found by a search at each bucket's longest length.
    Measured,
}

/// Why no plan over lengths can be made.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum LengthPlanError {
    #[error(
        "not one sample of the longest length ({longest}) fits {budget}: shorten the longest sequences, or raise the budget"
    )]
    LongestDoesNotFit { longest: u64, budget: Bytes },
}

/// The sizes a length plan is made of.
struct Sizes {
    fixed: u64,
    median: u64,
    bounds: Vec<u64>,
    bucket_batches: Vec<u64>,
    frame_budget: u64,
}

/// Plans the schemes for `lengths` (non-empty) under `budget`, with `buckets` buckets,
/// sizing every batch to fit `budget x (1 - margin)`.
pub fn plan_lengths(
    planner: &LengthPlanner,
    lengths: &[u64],
    budget: Bytes,
    margin: f64,
    buckets: usize,
) -> Result<LengthPlan, LengthPlanError> {
    let sized_for = Bytes((budget.as_f64() * (1.0 - margin.clamp(0.0, 0.9))) as u64);
    let stats = LengthStats::of(lengths);
    let fixed =
        planner
            .max_batch(stats.max, sized_for)
            .ok_or(LengthPlanError::LongestDoesNotFit {
                longest: stats.max,
                budget: sized_for,
            })?;
    let mut sorted = lengths.to_vec();
    sorted.sort_unstable();
    let bounds = bucket_bounds(&sorted, buckets);
    // Every length is at most the longest, which fits: so does one sample of any.
    let fits = |t: u64| planner.max_batch(t, sized_for).unwrap_or(1);
    let sizes = Sizes {
        fixed,
        median: fits(stats.median),
        bucket_batches: bounds.iter().map(|&t| fits(t)).collect(),
        bounds,
        frame_budget: planner
            .frame_budget(&frame_budget_lengths(&sorted), sized_for)
            .unwrap_or(stats.max),
    };
    Ok(assemble(
        planner,
        lengths,
        budget,
        sized_for,
        BatchSource::Planned,
        sizes,
    ))
}

impl LengthPlan {
    /// This plan with each bucket's batch replaced by its measured limit (`measured`:
    /// one per bucket, in order). The fixed batch becomes the longest bucket's, and
    /// the frame budget is capped by every measured bucket's.
    /// `under_count` is the most the plan fell short of a measured peak at those limits
    /// (0.02 = 2 %): the frame budget, planned at lengths between the buckets' too, is
    /// planned for the budget less that share.
    pub fn with_measured_batches(
        &self,
        planner: &LengthPlanner,
        lengths: &[u64],
        measured: &[u64],
        under_count: f64,
    ) -> LengthPlan {
        let bounds: Vec<u64> = self.buckets.iter().map(|b| b.longest).collect();
        let measured_frames = bounds
            .iter()
            .zip(measured)
            .map(|(&t, &b)| (b + 1) * t - 1)
            .min()
            .unwrap_or(u64::MAX);
        let sizes = Sizes {
            fixed: measured.last().copied().unwrap_or(self.fixed_batch).max(1),
            median: self.median_batch,
            bucket_batches: measured.iter().map(|&b| b.max(1)).collect(),
            bounds,
            frame_budget: {
                let mut sorted = lengths.to_vec();
                sorted.sort_unstable();
                let sized = Bytes(
                    (self.budget_bytes.as_f64() * (1.0 - under_count.clamp(0.0, 0.9))) as u64,
                );
                planner
                    .frame_budget(&frame_budget_lengths(&sorted), sized)
                    .unwrap_or(self.frame_budget)
                    .min(self.frame_budget)
                    .min(measured_frames)
            },
        };
        assemble(
            planner,
            lengths,
            self.budget_bytes,
            self.sized_for_bytes,
            BatchSource::Measured,
            sizes,
        )
    }
}

fn assemble(
    planner: &LengthPlanner,
    lengths: &[u64],
    budget: Bytes,
    sized_for: Bytes,
    source: BatchSource,
    sizes: Sizes,
) -> LengthPlan {
    let stats = LengthStats::of(lengths);
    let mut sorted = lengths.to_vec();
    sorted.sort_unstable();
    let mut rows = Vec::new();
    let mut shortest = stats.min;
    for (&longest, &batch) in sizes.bounds.iter().zip(&sizes.bucket_batches) {
        let samples = sorted
            .iter()
            .filter(|&&l| l >= shortest && l <= longest)
            .count() as u64;
        rows.push(BucketRow {
            shortest,
            longest,
            samples,
            batch,
            planned_bytes: planner.bytes_at(batch, longest),
        });
        shortest = sorted
            .iter()
            .copied()
            .find(|&l| l > longest)
            .unwrap_or(longest);
    }
    let mut schemes = vec![
        (SchemeKind::Fixed, Scheme::Fixed { batch: sizes.fixed }),
        (
            SchemeKind::Buckets,
            Scheme::Buckets {
                bounds: sizes.bounds.clone(),
                batches: sizes.bucket_batches.clone(),
            },
        ),
        (
            SchemeKind::Frames,
            Scheme::Frames {
                budget: sizes.frame_budget,
            },
        ),
    ];
    if sizes.median > sizes.fixed {
        schemes.push((
            SchemeKind::MedianBenchmark,
            Scheme::Fixed {
                batch: sizes.median,
            },
        ));
    }
    let schemes = schemes
        .into_iter()
        .map(|(kind, scheme)| scheme_row(planner, lengths, budget, kind, scheme))
        .collect();
    LengthPlan {
        memory_form: planner.seq_memory(stats.max),
        lengths: stats,
        budget_bytes: budget,
        margin: 1.0 - sized_for.as_f64() / budget.as_f64(),
        sized_for_bytes: sized_for,
        batches_from: source,
        fixed_batch: sizes.fixed,
        median_batch: sizes.median,
        buckets: rows,
        frame_budget: sizes.frame_budget,
        schemes,
    }
}

/// The lengths at which the frame budget is planned: every distinct length, or
/// [`FRAME_BUDGET_POINTS`] quantiles with the shortest and longest. The bound
/// (batch + 1) x T is least at an end of the range for memory of the form
/// a + bT + cT^2 (T / (a + bT + cT^2) rises, then falls), so the quantiles
/// only guard against other forms.
fn frame_budget_lengths(sorted: &[u64]) -> Vec<u64> {
    let mut distinct = sorted.to_vec();
    distinct.dedup();
    if distinct.len() <= FRAME_BUDGET_POINTS {
        return distinct;
    }
    let n = distinct.len() - 1;
    let mut v: Vec<u64> = (0..=FRAME_BUDGET_POINTS)
        .map(|i| distinct[i * n / FRAME_BUDGET_POINTS])
        .collect();
    v.dedup();
    v
}

fn scheme_row(
    planner: &LengthPlanner,
    lengths: &[u64],
    budget: Bytes,
    kind: SchemeKind,
    scheme: Scheme,
) -> SchemeRow {
    let batches = epoch(lengths, &scheme, EPOCH_SEED);
    let cost = EpochCost::of(&batches);
    let planned = |b: &EpochBatch| planner.bytes_at(b.samples, b.padded_to);
    let riskiest = batches
        .iter()
        .max_by_key(|b| planned(b))
        .copied()
        .expect("a non-empty epoch");
    SchemeRow {
        kind,
        steps: cost.steps,
        padding_waste: cost.padding_waste,
        padded_frames: cost.padded_frames,
        train_flops: batches
            .iter()
            .map(|b| b.samples as f64 * planner.train_flops(b.padded_to))
            .sum(),
        planned_peak: planned(&riskiest),
        riskiest_batch: (riskiest.samples, riskiest.padded_to),
        batches_over_budget: batches.iter().filter(|b| planned(b) > budget).count() as u64,
        predicted_epoch_s: None,
        scheme,
    }
}

/// Seconds of a training step at batch B and padded length T:
/// `overhead_s + per_step_s x T + B x train_flops(T) / flops_per_s`, fitted to
/// measured steps. The per-step term is a recurrence's sequential loop (T dependent
/// steps, each with its own launches and synchronisation), which no batch amortises.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct StepTimeModel {
    pub overhead_s: f64,
    pub per_step_s: f64,
    pub flops_per_s: f64,
}

/// A measured step: batch, padded length, its training FLOPs (B x per-sample), seconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct MeasuredStep {
    pub batch: u64,
    pub padded_to: u64,
    pub train_flops: f64,
    pub step_s: f64,
}

impl StepTimeModel {
    /// Least squares of seconds on (1, T, FLOPs) with every coefficient at least 0,
    /// weighted by 1 / seconds^2 so each step counts by its relative error. `None`
    /// when no fit with a positive FLOP rate exists (fewer than two distinct FLOP counts).
    pub fn fit(steps: &[MeasuredStep]) -> Option<StepTimeModel> {
        let rows: Vec<([f64; 3], f64, f64)> = steps
            .iter()
            .filter(|s| s.step_s > 0.0 && s.train_flops > 0.0)
            .map(|s| {
                (
                    [1.0, s.padded_to as f64, s.train_flops],
                    s.step_s,
                    1.0 / (s.step_s * s.step_s),
                )
            })
            .collect();
        if rows.len() < 2 {
            return None;
        }
        // Every subset of the three terms that keeps FLOPs; the best fit whose
        // coefficients are all non-negative (exact non-negative least squares for three).
        let mut best: Option<([f64; 3], f64)> = None;
        let subsets: [&[usize]; 4] = [&[0, 1, 2], &[0, 2], &[1, 2], &[2]];
        for cols in subsets {
            let Some(coef) = weighted_least_squares(&rows, cols) else {
                continue;
            };
            if coef.iter().any(|&c| c < 0.0) || coef[2] <= 0.0 {
                continue;
            }
            let residual: f64 = rows
                .iter()
                .map(|(x, y, w)| {
                    let pred: f64 = (0..3).map(|j| coef[j] * x[j]).sum();
                    w * (y - pred).powi(2)
                })
                .sum();
            if best.is_none_or(|(_, r)| residual < r) {
                best = Some((coef, residual));
            }
        }
        best.map(|(c, _)| StepTimeModel {
            overhead_s: c[0],
            per_step_s: c[1],
            flops_per_s: 1.0 / c[2],
        })
    }

    /// Predicted seconds of one step at length `padded_to` of `train_flops`.
    pub fn step_s(&self, padded_to: u64, train_flops: f64) -> f64 {
        self.overhead_s + self.per_step_s * padded_to as f64 + train_flops / self.flops_per_s
    }
}

/// Weighted least squares on the columns `cols` of `rows` ((x, y, weight)); the other
/// coefficients are 0. `None` when those columns are not independent on the rows.
fn weighted_least_squares(rows: &[([f64; 3], f64, f64)], cols: &[usize]) -> Option<[f64; 3]> {
    let k = cols.len();
    if rows.len() < k {
        return None;
    }
    // Normal equations, each column scaled to unit size so FLOPs (1e12) and 1 mix.
    let scale: Vec<f64> = cols
        .iter()
        .map(|&j| {
            rows.iter()
                .map(|r| r.0[j].abs())
                .fold(0.0, f64::max)
                .max(1e-300)
        })
        .collect();
    let mut a = vec![vec![0.0; k + 1]; k];
    for (x, y, w) in rows {
        for (i, &ci) in cols.iter().enumerate() {
            let xi = x[ci] / scale[i];
            for (j, &cj) in cols.iter().enumerate() {
                a[i][j] += w * xi * x[cj] / scale[j];
            }
            a[i][k] += w * xi * y;
        }
    }
    // Gaussian elimination with partial pivoting on k <= 3 unknowns.
    for c in 0..k {
        let p = (c..k).max_by(|&i, &j| a[i][c].abs().total_cmp(&a[j][c].abs()))?;
        a.swap(c, p);
        let diag = a[c][c];
        if diag.abs() < 1e-12 * a.iter().map(|r| r[c].abs()).fold(0.0, f64::max).max(1e-300) {
            return None;
        }
        let pivot = a[c].clone();
        for (_, row) in a.iter_mut().enumerate().filter(|(r, _)| *r != c) {
            let f = row[c] / diag;
            for (x, p) in row.iter_mut().zip(&pivot).skip(c) {
                *x -= f * p;
            }
        }
    }
    let mut out = [0.0; 3];
    for (i, &ci) in cols.iter().enumerate() {
        out[ci] = a[i][k] / a[i][i] / scale[i];
    }
    Some(out)
}

impl LengthPlan {
    /// Fills each scheme's predicted epoch time from `model`.
    pub fn predict_epochs(
        &mut self,
        planner: &LengthPlanner,
        lengths: &[u64],
        model: &StepTimeModel,
    ) {
        for s in &mut self.schemes {
            let seconds = epoch(lengths, &s.scheme, EPOCH_SEED)
                .iter()
                .map(|b| {
                    model.step_s(
                        b.padded_to,
                        b.samples as f64 * planner.train_flops(b.padded_to),
                    )
                })
                .sum();
            s.predicted_epoch_s = Some(seconds);
        }
    }

    /// The row of `kind`.
    pub fn scheme(&self, kind: SchemeKind) -> Option<&SchemeRow> {
        self.schemes.iter().find(|s| s.kind == kind)
    }
}

/// One bucket measured at its longest length: the largest batch that ran (a
/// search), then that batch timed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BucketMeasurement {
    pub longest: u64,
    /// The plan's batch for the bucket.
    pub planned_batch: u64,
    /// The largest batch that ran, and the smallest that ran out of memory (measured).
    pub max_batch: Option<u64>,
    pub smallest_failure: Option<u64>,
    /// Trials of the search.
    pub trials: usize,
    /// Why the search stopped early (a crash or time-out), if it did.
    pub stopped: Option<String>,
    /// Planned and measured peak at `max_batch`, and its median step seconds.
    pub planned_bytes: Option<Bytes>,
    pub measured_peak: Option<Bytes>,
    pub step_s: Option<f64>,
}

impl BucketMeasurement {
    /// (measured - planned) / planned, where the batch ran.
    pub fn peak_error(&self) -> Option<f64> {
        let planned = self.planned_bytes?.as_f64();
        self.measured_peak.map(|m| (m.as_f64() - planned) / planned)
    }

    /// Whether the batch above the limit is within 10 % of it (the limit is sharp).
    pub fn limit_within_10_percent(&self) -> bool {
        match (self.max_batch, self.smallest_failure) {
            (Some(b), Some(f)) => f <= (b as f64 * 1.1).ceil() as u64,
            _ => false,
        }
    }
}

/// A scheme's epoch timed on the device: every batch, or a systematic sample of
/// them (every k-th in order of size), each in its own measuring run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EpochCheck {
    pub kind: SchemeKind,
    pub steps: u64,
    /// Batches timed (all `steps` when the epoch is small enough).
    pub timed: u64,
    /// Sum of the timed steps, scaled by steps / timed (measured; a sample estimate
    /// when `timed < steps`).
    pub measured_epoch_s: f64,
    /// The step-time model's epoch (a prediction).
    pub predicted_epoch_s: Option<f64>,
    /// A timed batch that did not run, and how it ended (the epoch is then not timed).
    pub failed: Option<String>,
}

/// Indices of `n` of `len` items, evenly spread over them (all when `n >= len`).
pub fn systematic_sample(len: usize, n: usize) -> Vec<usize> {
    if n >= len {
        return (0..len).collect();
    }
    let mut v: Vec<usize> = (0..n).map(|i| (2 * i + 1) * len / (2 * n)).collect();
    v.dedup();
    v
}

/// The batches of `kind`'s epoch sorted by padded length, then size: the order a
/// systematic sample is drawn in, so it spans the shapes.
pub fn epoch_by_shape(plan: &LengthPlan, lengths: &[u64], kind: SchemeKind) -> Vec<EpochBatch> {
    let mut batches = plan
        .scheme(kind)
        .map(|s| epoch(lengths, &s.scheme, EPOCH_SEED))
        .unwrap_or_default();
    batches.sort_by_key(|b| (b.padded_to, b.samples));
    batches
}

/// A length plan under one named budget.
#[derive(Clone, Debug, Serialize)]
pub struct NamedLengthPlan {
    /// Preset name, or `memory` for `--memory` / `--memory-limit`.
    pub budget: String,
    #[serde(flatten)]
    pub plan: LengthPlan,
}

/// One bucket of `run --lengths`: the user's command at the bucket's longest length.
#[derive(Clone, Debug, Serialize)]
pub struct RunBucket {
    pub shortest: u64,
    pub longest: u64,
    pub samples: u64,
    /// The largest batch that ran and the smallest that ran out of memory (measured).
    pub max_batch: Option<u64>,
    pub smallest_failure: Option<u64>,
    /// The batch whose crash or time-out stopped the search (never out of memory).
    pub stopped_at: Option<u64>,
    pub trials: usize,
    pub seconds: f64,
}

/// What `run --lengths` measured: each bucket's largest batch in the user's command.
#[derive(Clone, Debug, Serialize)]
pub struct RunLengths {
    /// The command, `{batch}` and `{len}` unreplaced.
    pub command: String,
    pub memory_limit_bytes: Option<batchfit_plan::Bytes>,
    pub lengths: LengthStats,
    /// Ascending; searched longest first.
    pub buckets: Vec<RunBucket>,
    /// One simulated epoch at the longest bucket's batch for every batch, and with
    /// each bucket's own batch (when every bucket's batch ran).
    pub fixed_epoch: Option<EpochCost>,
    pub bucket_epoch: Option<EpochCost>,
    pub seconds: f64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use batchfit_graph::zoo;
    use batchfit_plan::TrainOptions;

    /// Clip lengths of 1-15 s at 50 frames/s, long-tailed: a fixed rule, not data.
    fn clips(n: u64) -> Vec<u64> {
        (0..n).map(|i| 50 + (i * i * 7 + i * 13) % 700).collect()
    }

    #[test]
    fn buckets_fit_and_beat_the_fixed_batch() {
        let g = zoo::build("rnn-tutorial").unwrap();
        let planner = LengthPlanner::new(&g, &TrainOptions::default()).unwrap();
        let lengths = clips(3000);
        let budget = Bytes(6 << 30);
        let p = plan_lengths(&planner, &lengths, budget, 0.0, 6).unwrap();
        assert_eq!(p.buckets.last().unwrap().longest, p.lengths.max);
        assert_eq!(p.buckets.iter().map(|b| b.samples).sum::<u64>(), 3000);
        for b in &p.buckets {
            assert!(b.planned_bytes <= budget);
            assert!(planner.bytes_at(b.batch + 1, b.longest) > budget);
        }
        // Shorter buckets take bigger batches.
        assert!(p.buckets.windows(2).all(|w| w[0].batch >= w[1].batch));
        let fixed = p.scheme(SchemeKind::Fixed).unwrap();
        let buckets = p.scheme(SchemeKind::Buckets).unwrap();
        let frames = p.scheme(SchemeKind::Frames).unwrap();
        for s in [fixed, buckets, frames] {
            assert_eq!(s.batches_over_budget, 0, "{:?}", s.kind);
            assert!(s.planned_peak <= budget);
        }
        assert!(buckets.steps < fixed.steps && buckets.padding_waste < fixed.padding_waste);
        assert!(frames.train_flops < fixed.train_flops);
        // Sized at the median, an epoch has batches that do not fit.
        let median = p.scheme(SchemeKind::MedianBenchmark).unwrap();
        assert!(median.batches_over_budget > 0);
    }

    #[test]
    fn margin_and_measured_batches() {
        let g = zoo::build("rnn-tutorial").unwrap();
        let planner = LengthPlanner::new(&g, &TrainOptions::default()).unwrap();
        let lengths = clips(500);
        let budget = Bytes(4 << 30);
        let exact = plan_lengths(&planner, &lengths, budget, 0.0, 4).unwrap();
        let safe = plan_lengths(&planner, &lengths, budget, 0.1, 4).unwrap();
        for (s, e) in safe.buckets.iter().zip(&exact.buckets) {
            assert!(s.batch < e.batch);
            assert!(s.planned_bytes.as_f64() <= 0.9 * budget.as_f64() + 1.0);
        }
        assert!((safe.margin - 0.1).abs() < 1e-6);
        let measured: Vec<u64> = exact.buckets.iter().map(|b| b.batch / 2).collect();
        let m = exact.with_measured_batches(&planner, &lengths, &measured, 0.0);
        assert_eq!(m.batches_from, BatchSource::Measured);
        assert_eq!(m.fixed_batch, *measured.last().unwrap());
        assert!(m.frame_budget < exact.frame_budget);
        let got: Vec<u64> = m.buckets.iter().map(|b| b.batch).collect();
        assert_eq!(got, measured);
    }

    #[test]
    fn systematic_samples_spread() {
        assert_eq!(systematic_sample(10, 5), vec![1, 3, 5, 7, 9]);
        assert_eq!(systematic_sample(3, 8), vec![0, 1, 2]);
        assert_eq!(systematic_sample(100, 1), vec![50]);
    }

    #[test]
    fn longest_that_does_not_fit_is_an_error() {
        let g = zoo::build("rnn-tutorial").unwrap();
        let planner = LengthPlanner::new(&g, &TrainOptions::default()).unwrap();
        let e = plan_lengths(&planner, &[10, 100_000], Bytes(1 << 30), 0.0, 4).unwrap_err();
        assert!(e.to_string().contains("100000"), "{e}");
    }

    #[test]
    fn step_time_fit_recovers_its_terms() {
        let m = StepTimeModel {
            overhead_s: 0.01,
            per_step_s: 2e-4,
            flops_per_s: 1e10,
        };
        let step = |batch: u64, t: u64| {
            let f = batch as f64 * 1e6 * t as f64;
            MeasuredStep {
                batch,
                padded_to: t,
                train_flops: f,
                step_s: m.step_s(t, f),
            }
        };
        let steps = [step(40, 50), step(20, 100), step(10, 200), step(5, 200)];
        let fit = StepTimeModel::fit(&steps).unwrap();
        assert!((fit.overhead_s - 0.01).abs() < 1e-9, "{fit:?}");
        assert!((fit.per_step_s - 2e-4).abs() < 1e-12, "{fit:?}");
        assert!((fit.flops_per_s / 1e10 - 1.0).abs() < 1e-9);
        // Without a per-step cost, none is fitted.
        let flat = StepTimeModel {
            per_step_s: 0.0,
            ..m
        };
        let steps: Vec<MeasuredStep> = [(8, 10), (16, 10), (4, 30)]
            .iter()
            .map(|&(b, t)| {
                let f = b as f64 * 3e7 * t as f64;
                MeasuredStep {
                    batch: b,
                    padded_to: t,
                    train_flops: f,
                    step_s: flat.step_s(t, f),
                }
            })
            .collect();
        let fit = StepTimeModel::fit(&steps).unwrap();
        assert!(fit.per_step_s.abs() < 1e-9 && fit.overhead_s >= 0.0);
        assert!(StepTimeModel::fit(&steps[..1]).is_none());
    }
}
