//! Predicted time to a target loss: steps from the noise scale times measured
//! step time. The one home of S(B) = S_min (1 + B_noise / B) (McCandlish et
//! al. 2018, eq. 2.11): `advise`, `sweep` and the fits all use [`StepsCurve`]
//! and [`updates_vs_min`], with the batch made noise-effective by
//! [`noise_batch`] where the data set's rows are known.

use serde::{Deserialize, Serialize};

/// Updates needed at batch `batch` relative to the minimum S_min: `1 + B_noise / B`,
/// for batches drawn with replacement (or from unlimited data); pass a batch
/// drawn without replacement through [`noise_batch`] first.
pub fn updates_vs_min(b_noise: f64, batch: f64) -> f64 {
    1.0 + b_noise / batch
}

/// The training rows each epoch's batches are drawn from without replacement,
/// and how the optimizer's step feels the noise that drawing removes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rows {
    pub n: f64,
    /// Adam's family: the step is divided by the gradient's root mean square,
    /// noise included, so the noise slows it by its standard deviation, not
    /// its variance ([`noise_batch`]).
    pub adaptive: bool,
}

impl Rows {
    /// `n` rows trained by `optimizer`; `None` for no rows known (unlimited).
    pub fn of(n: f64, optimizer: batchfit_plan::Optimizer) -> Option<Rows> {
        (n.is_finite() && n > 0.0).then_some(Rows {
            n,
            adaptive: optimizer.is_adaptive(),
        })
    }
}

/// Writes [`Rows`] as JSON has always had a data set's rows: the count alone.
pub fn serialize_row_count<S: serde::Serializer>(
    rows: &Option<Rows>,
    s: S,
) -> Result<S::Ok, S::Error> {
    rows.map(|r| r.n).serialize(s)
}

/// The batch drawn with replacement (from unlimited data) that needs as many
/// updates as a batch of `batch` distinct rows of `rows`: infinite from B = N
/// (a full-batch step has no noise). A mean of B of N rows strays from the
/// full gradient by tr(Σ) (1/B - 1/N) = (tr(Σ) / B) (1 - B/N), tr(Σ) the
/// per-sample variance the estimator measures without bias
/// ([`crate::noise::without_replacement`]).
///
/// * SGD (plain or momentum) is slowed by the noise's variance:
///   S(B) = S_min (1 + B_noise (1/B - 1/N)), so B_eff = B N / (N - B).
/// * Adam's step, g / sqrt(v), is normalised by the gradient's root mean
///   square, noise included; at the square-root rule's rate its progress per
///   step falls with the noise's standard deviation, so the finite data's
///   factor enters as its square root: S(B) = S_min (1 + (B_noise / B)
///   sqrt(1 - B/N)), B_eff = B / sqrt(1 - B/N). Measured on digits (1,437
///   rows, batches 128-1,280 at one rate): the variance's form needs B_noise
///   from 190 to 680 across the batches, the standard deviation's 182-317;
///   iris (135 rows) took 129 updates at 135 and 190 at 128, which the
///   variance's form puts 8 % apart.
///
/// On small data sets the term is large: iris took 2.45x fewer updates at 128
/// than at 64, more than the 2x that 1 + B_noise/B allows for any B_noise.
/// `None`: unlimited.
pub fn noise_batch(batch: f64, rows: Option<Rows>) -> f64 {
    match rows {
        Some(Rows { n, adaptive }) => {
            if batch >= n {
                f64::INFINITY
            } else if adaptive {
                batch / (1.0 - batch / n).sqrt()
            } else {
                batch * n / (n - batch)
            }
        }
        None => batch,
    }
}

/// [`updates_vs_min`] at a batch of `batch` distinct rows of `rows`
/// ([`noise_batch`]; `None`: unlimited).
pub fn updates_vs_min_on(b_noise: f64, batch: f64, rows: Option<Rows>) -> f64 {
    updates_vs_min(b_noise, noise_batch(batch, rows))
}

/// The critical batch on `rows`: where S(B) = 2 S_min, i.e. where the noise
/// batch ([`noise_batch`]) is B_noise. SGD: B_noise N / (N + B_noise); Adam:
/// the root of B^2 + (B_noise^2 / N) B - B_noise^2; B_noise on unlimited
/// data. Past it, doubling the batch saves less than a third of the updates.
pub fn critical_batch_on(b_noise: f64, rows: Option<Rows>) -> f64 {
    match rows {
        Some(Rows { n, adaptive: false }) => b_noise * n / (n + b_noise),
        Some(Rows { n, adaptive: true }) => {
            let a = b_noise * b_noise / n;
            (-a + (a * a + 4.0 * b_noise * b_noise).sqrt()) / 2.0
        }
        None => b_noise,
    }
}

/// Epochs to target at `batch` relative to the fewest any batch needs (the
/// small-batch limit, S_min B_noise / N epochs): S(B) B / N over that, (B /
/// B_noise) S(B) / S_min (1 + B / B_noise - B / N for SGD on N rows, 1 + B /
/// B_noise on unlimited data; a batch of every row counts as N).
pub fn epochs_vs_min_on(b_noise: f64, batch: f64, rows: Option<Rows>) -> f64 {
    let b = rows.map_or(batch, |r| batch.min(r.n));
    updates_vs_min_on(b_noise, b, rows) * b / b_noise
}

/// A data set's row count as [`noise_batch`] takes it, trained by
/// `optimizer`: none known (0) is unlimited.
pub fn rows_drawn_from(rows: usize, optimizer: batchfit_plan::Optimizer) -> Option<Rows> {
    Rows::of(rows as f64, optimizer)
}

/// How a training's learning rate follows its batch, as the predicted updates count it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum RateModel {
    /// Each batch trains at its best rate (a scaling rule that holds): `1 + B_noise / B`.
    Scaled,
    /// Every batch trains at one rate, the best rate at batch `best_at`.
    Fixed { best_at: f64 },
}

impl RateModel {
    /// Updates at `batch` relative to S_min. At a fixed rate this is the
    /// quadratic model's progress per update (McCandlish et al. 2018, eq.
    /// 2.6-2.7): with x = the rate over the largest useful one, an update
    /// gains `2x - x^2 (1 + B_noise/B)` of the best possible; the best rate
    /// at `best_at` is x = 1 / (1 + B_noise/best_at), where this equals the
    /// scaled count. Infinite where that rate is too large for `batch`'s
    /// noise (the loss is predicted not to fall). Both batches are drawn from
    /// `rows` ([`noise_batch`]).
    pub fn updates_vs_min(self, b_noise: f64, batch: f64, rows: Option<Rows>) -> f64 {
        match self {
            RateModel::Scaled => updates_vs_min_on(b_noise, batch, rows),
            RateModel::Fixed { best_at } => {
                let x = 1.0 / updates_vs_min_on(b_noise, best_at, rows);
                let gain = 2.0 * x - x * x * updates_vs_min_on(b_noise, batch, rows);
                if gain > 0.0 {
                    1.0 / gain
                } else {
                    f64::INFINITY
                }
            }
        }
    }
}

/// Updates to a target as a function of the batch: S(B) = S_min (1 + B_noise / B),
/// B noise-effective ([`noise_batch`]) on a data set of `rows`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(into = "CurveRecord", from = "CurveRecord")]
pub struct StepsCurve {
    /// Fewest updates any batch can reach the target in (the large-batch limit).
    pub s_min: f64,
    pub b_noise: f64,
    /// The training rows batches are drawn from without replacement; `None`
    /// (and documents written before it): unlimited data.
    pub rows: Option<Rows>,
}

/// [`StepsCurve`] as JSON writes it: the rows a number, beside whether the
/// optimizer is Adam's family (absent: SGD's form, as documents written
/// before it were).
#[derive(Clone, Copy, Serialize, Deserialize)]
struct CurveRecord {
    s_min: f64,
    b_noise: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rows: Option<f64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    adaptive: bool,
}

impl From<StepsCurve> for CurveRecord {
    fn from(c: StepsCurve) -> CurveRecord {
        CurveRecord {
            s_min: c.s_min,
            b_noise: c.b_noise,
            rows: c.rows.map(|r| r.n),
            adaptive: c.rows.is_some_and(|r| r.adaptive),
        }
    }
}

impl From<CurveRecord> for StepsCurve {
    fn from(r: CurveRecord) -> StepsCurve {
        StepsCurve {
            s_min: r.s_min,
            b_noise: r.b_noise,
            rows: r.rows.filter(|n| n.is_finite() && *n > 0.0).map(|n| Rows {
                n,
                adaptive: r.adaptive,
            }),
        }
    }
}

impl StepsCurve {
    /// Predicted updates at `batch`.
    pub fn steps(&self, batch: f64) -> f64 {
        self.s_min * self.vs_min(batch)
    }

    /// Updates at `batch` relative to S_min.
    pub fn vs_min(&self, batch: f64) -> f64 {
        updates_vs_min_on(self.b_noise, batch, self.rows)
    }

    /// The curve through one run that took `steps` updates at `batch`, on `rows`.
    pub fn through(steps: f64, batch: f64, b_noise: f64, rows: Option<Rows>) -> StepsCurve {
        StepsCurve {
            s_min: steps / updates_vs_min_on(b_noise, batch, rows),
            b_noise,
            rows,
        }
    }

    /// Predicted seconds at `batch` when one update takes `update_s`.
    pub fn seconds(&self, batch: f64, update_s: f64) -> f64 {
        self.steps(batch) * update_s
    }

    /// The curve that fits measured (batch, updates) points best in log, by
    /// least squares, both S_min and B_noise free: B_noise over a log-spaced
    /// grid from 1 to `b_noise_ceiling` (a grid needs no starting point and
    /// cannot leave the interval), S_min in closed form for each (the mean
    /// log residual). `None` with fewer than three distinct batches: two
    /// parameters need a third point to be tested at all. `rows`: the
    /// training rows the batches were drawn from (`None`: unlimited).
    pub fn fit(
        points: &[(f64, f64)],
        b_noise_ceiling: f64,
        rows: Option<Rows>,
    ) -> Option<StepsCurve> {
        let points: Vec<(f64, f64)> = points
            .iter()
            .copied()
            .filter(|&(b, s)| b > 0.0 && s > 0.0 && s.is_finite())
            .collect();
        let mut batches: Vec<f64> = points.iter().map(|p| p.0).collect();
        batches.sort_by(f64::total_cmp);
        batches.dedup();
        if batches.len() < 3 || b_noise_ceiling.is_nan() || b_noise_ceiling <= 1.0 {
            return None;
        }
        let n = points.len() as f64;
        let curve = |bn: f64| {
            let log_s_min = points
                .iter()
                .map(|&(b, s)| s.ln() - updates_vs_min_on(bn, b, rows).ln())
                .sum::<f64>()
                / n;
            let misfit: f64 = points
                .iter()
                .map(|&(b, s)| (s.ln() - log_s_min - updates_vs_min_on(bn, b, rows).ln()).powi(2))
                .sum();
            (
                misfit,
                StepsCurve {
                    s_min: log_s_min.exp(),
                    b_noise: bn,
                    rows,
                },
            )
        };
        let b_noise = b_noise_on_grid(b_noise_ceiling, |bn| curve(bn).0);
        Some(curve(b_noise).1)
    }
}

/// The B_noise of a log-spaced grid from 1 to `ceiling` (600 steps) where
/// `misfit` is least: the refits' search, which needs no starting point and
/// cannot leave the interval.
pub(crate) fn b_noise_on_grid(ceiling: f64, misfit: impl Fn(f64) -> f64) -> f64 {
    const GRID: usize = 600;
    (0..=GRID)
        .map(|i| ceiling.powf(i as f64 / GRID as f64))
        .map(|bn| (misfit(bn), bn))
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map_or(1.0, |(_, bn)| bn)
}

/// One way to train: a device, a micro-batch, and how many micro-batches are accumulated.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TrainingOption {
    pub device: crate::device::DeviceSpec,
    pub micro_batch: u64,
    pub accumulation: u64,
    /// Measured seconds of one micro-batch step (forward + backward; the
    /// optimizer's share is counted once per update below).
    pub micro_step_s: f64,
}

impl TrainingOption {
    /// The batch one update sees.
    pub fn effective_batch(&self) -> u64 {
        self.micro_batch * self.accumulation
    }

    /// Seconds of one update.
    pub fn update_s(&self) -> f64 {
        self.micro_step_s * self.accumulation as f64
    }
}

/// Predicted time to target of one option.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TimeToTarget {
    #[serde(flatten)]
    pub option: TrainingOption,
    /// Updates needed relative to the minimum: `1 + B_noise / B_eff`.
    pub steps_vs_min: f64,
    /// Predicted updates when `S_min` is known, else `None`.
    #[serde(default)]
    pub steps: Option<f64>,
    /// Predicted seconds when `S_min` is known, else `None`.
    pub seconds: Option<f64>,
    /// Predicted updates at either end of B_noise's 90 % band (the curve held
    /// through the noise run's own batch), when the band is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps_band: Option<(f64, f64)>,
    /// The learning rate the prediction assumes at this effective batch, when
    /// the rule has a reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learning_rate: Option<f64>,
    /// Time relative to the fastest option (1.0 = the winner).
    pub vs_best: f64,
}

/// Ranks options by predicted time: `S_min (1 + B_noise/B) x update time`.
/// `s_min` is the minimum number of updates, when known (from a sweep or a run);
/// `rows` the training rows batches are drawn from ([`noise_batch`]).
pub fn rank(
    options: &[TrainingOption],
    b_noise: f64,
    s_min: Option<f64>,
    rows: Option<Rows>,
) -> Vec<TimeToTarget> {
    rank_at(options, b_noise, s_min, rows, RateModel::Scaled)
}

/// [`rank`] for a training whose rate follows the batch as `model` says.
/// Options predicted never to reach the target (a fixed rate too large for
/// their noise) are left out.
pub fn rank_at(
    options: &[TrainingOption],
    b_noise: f64,
    s_min: Option<f64>,
    rows: Option<Rows>,
    model: RateModel,
) -> Vec<TimeToTarget> {
    let vs_min =
        |o: &TrainingOption| model.updates_vs_min(b_noise, o.effective_batch() as f64, rows);
    let mut out: Vec<TimeToTarget> = options
        .iter()
        .filter(|o| vs_min(o).is_finite())
        .map(|o| {
            let steps_vs_min = vs_min(o);
            TimeToTarget {
                option: o.clone(),
                steps_vs_min,
                steps: s_min.map(|s| s * steps_vs_min),
                seconds: s_min.map(|s| s * steps_vs_min * o.update_s()),
                steps_band: None,
                learning_rate: None,
                vs_best: steps_vs_min * o.update_s(),
            }
        })
        .collect();
    let best = out.iter().map(|t| t.vs_best).fold(f64::INFINITY, f64::min);
    for t in &mut out {
        t.vs_best /= best;
    }
    out.sort_by(|a, b| a.vs_best.total_cmp(&b.vs_best));
    out
}

/// One data-parallel way to train: `world_size` devices, each running `micro_batch` samples
/// `accumulation` times per update, with one update taking `update_s` seconds (compute plus
/// exposed communication).
#[derive(Clone, Debug, Serialize)]
pub struct ScaleOption {
    /// Devices in the data-parallel group.
    pub world_size: u64,
    /// How the model states are sharded (`ddp`, `zero1`, ...).
    pub strategy: batchfit_plan::distributed::Strategy,
    /// Samples per device per forward and backward.
    pub micro_batch: u64,
    /// Micro-batches per update.
    pub accumulation: u64,
    /// Seconds of one update.
    pub update_s: f64,
}

impl ScaleOption {
    /// The batch one update sees: world size x micro-batch x accumulation.
    pub fn global_batch(&self) -> u64 {
        self.world_size * self.micro_batch * self.accumulation
    }
}

/// Predicted time to target of one data-parallel option.
#[derive(Clone, Debug, Serialize)]
pub struct ScaleTime {
    #[serde(flatten)]
    pub option: ScaleOption,
    /// World size x micro-batch x accumulation.
    pub global_batch: u64,
    /// Updates needed relative to the minimum: `1 + B_noise / B_global`
    /// (B_global noise-effective on a finite data set, [`noise_batch`]).
    pub updates_vs_min: f64,
    /// Updates needed, when `S_min` is known.
    pub updates: Option<f64>,
    /// Predicted seconds (updates x update time), when `S_min` is known.
    pub seconds: Option<f64>,
    /// Time relative to the fastest option (1.0 = the winner).
    pub vs_best: f64,
}

/// Time to target of each option, in the given order: `S(B_global) x update time`, with
/// S(B) from [`StepsCurve`] (relative to S_min when it is not known), the global
/// batch drawn from `rows` training rows ([`noise_batch`]).
pub fn time_across_world_sizes(
    options: &[ScaleOption],
    b_noise: f64,
    s_min: Option<f64>,
    rows: Option<Rows>,
) -> Vec<ScaleTime> {
    let curve = StepsCurve {
        s_min: s_min.unwrap_or(1.0),
        b_noise,
        rows,
    };
    let mut out: Vec<ScaleTime> = options
        .iter()
        .map(|o| {
            let b = o.global_batch() as f64;
            ScaleTime {
                option: o.clone(),
                global_batch: o.global_batch(),
                updates_vs_min: curve.vs_min(b),
                updates: s_min.map(|_| curve.steps(b)),
                seconds: s_min.map(|_| curve.seconds(b, o.update_s)),
                vs_best: curve.vs_min(b) * o.update_s,
            }
        })
        .collect();
    let best = out.iter().map(|t| t.vs_best).fold(f64::INFINITY, f64::min);
    for t in &mut out {
        t.vs_best /= best;
    }
    out
}

/// Elasticity of the updates with respect to the batch, `-d ln S / d ln B = (B_noise/B) /
/// (1 + B_noise/B)`: the share of a batch increase that turns into fewer updates. It is 1/2
/// exactly at B = B_noise.
pub fn updates_elasticity(b_noise: f64, batch: f64) -> f64 {
    let r = b_noise / batch;
    r / (1.0 + r)
}

/// Where extra devices stop paying for one strategy.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ScalingLimit {
    /// The strategy.
    pub strategy: batchfit_plan::distributed::Strategy,
    /// Past this world size extra devices stop paying (`None`: every world size given still pays).
    pub stop_after: Option<u64>,
    /// `-d ln T / d ln N` between `stop_after` and the next world size given.
    pub elasticity: Option<f64>,
    /// The fastest world size given.
    pub fastest_world_size: u64,
}

/// The rule: going from N to N' devices pays while the time to target falls at least half as
/// fast as the devices grow, `e = ln(T(N)/T(N')) / ln(N'/N) >= 1/2`. The device-hours to
/// target, N x T, change as `1 - e`; below e = 1/2 they grow faster than the time shrinks.
/// With the step time constant and the global batch growing with N, e is
/// [`updates_elasticity`] and the limit is the critical batch B = B_noise (McCandlish et al.
/// 2018: there S = 2 S_min and E = 2 E_min), so a measured step time that grows with N only
/// brings the limit earlier.
/// `times` are one strategy's rows (any order); `None` if there are none.
pub fn scaling_limit(times: &[ScaleTime]) -> Option<ScalingLimit> {
    let mut rows: Vec<&ScaleTime> = times.iter().collect();
    rows.sort_by_key(|t| t.option.world_size);
    rows.dedup_by_key(|t| t.option.world_size);
    let fastest = rows.iter().min_by(|a, b| a.vs_best.total_cmp(&b.vs_best))?;
    let mut limit = ScalingLimit {
        strategy: rows[0].option.strategy,
        stop_after: None,
        elasticity: None,
        fastest_world_size: fastest.option.world_size,
    };
    for w in rows.windows(2) {
        let (a, b) = (w[0], w[1]);
        let e = (a.vs_best / b.vs_best).ln()
            / (b.option.world_size as f64 / a.option.world_size as f64).ln();
        if e < 0.5 {
            limit.stop_after = Some(a.option.world_size);
            limit.elasticity = Some(e);
            break;
        }
    }
    Some(limit)
}

/// `n` rows trained by plain SGD, for tests of the variance's form.
#[cfg(test)]
pub(crate) fn sgd_rows(n: f64) -> Option<Rows> {
    Some(Rows { n, adaptive: false })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Points on a curve give it back, S_min and B_noise both; a point off
    /// it moves the fit less than a fit through one anchor would; two
    /// batches cannot test two parameters.
    #[test]
    fn a_free_fit_recovers_the_curve_from_three_batches() {
        let truth = StepsCurve {
            s_min: 40.0,
            b_noise: 380.0,
            rows: None,
        };
        let points: Vec<(f64, f64)> = [32.0, 128.0, 1024.0]
            .iter()
            .map(|&b| (b, truth.steps(b)))
            .collect();
        let c = StepsCurve::fit(&points, 1e5, None).unwrap();
        assert!((c.b_noise / 380.0 - 1.0).abs() < 0.02, "{c:?}");
        assert!((c.s_min / 40.0 - 1.0).abs() < 0.02, "{c:?}");
        assert_eq!(StepsCurve::fit(&points[..2], 1e5, None), None);
        let repeated = [points[0], points[0], points[1]];
        assert_eq!(StepsCurve::fit(&repeated, 1e5, None), None);
        // Every point 10 % high: the same B_noise, S_min 10 % higher.
        let high: Vec<(f64, f64)> = points.iter().map(|&(b, s)| (b, 1.1 * s)).collect();
        let c = StepsCurve::fit(&high, 1e5, None).unwrap();
        assert!((c.b_noise / 380.0 - 1.0).abs() < 0.02, "{c:?}");
        assert!((c.s_min / 44.0 - 1.0).abs() < 0.02, "{c:?}");
    }

    fn opt(device: &str, micro: u64, acc: u64, s: f64) -> TrainingOption {
        TrainingOption {
            device: device.parse().unwrap(),
            micro_batch: micro,
            accumulation: acc,
            micro_step_s: s,
        }
    }

    /// One fixed rate, the best at batch 32, with B_noise = 96: x = 1/4. At 32
    /// it is the scaled count (4); at 128, 2x - x^2 x 1.75 = 0.390625 of the
    /// best gain (2.56x S_min, where the scaled rule needs 1.75x); at 8,
    /// 0.5 - 0.8125 < 0: the rate is too large for that noise.
    #[test]
    fn a_fixed_rate_gains_less_above_its_batch_and_fails_far_below() {
        let fixed = RateModel::Fixed { best_at: 32.0 };
        assert!((fixed.updates_vs_min(96.0, 32.0, None) - 4.0).abs() < 1e-12);
        assert!((fixed.updates_vs_min(96.0, 128.0, None) - 1.0 / 0.390625).abs() < 1e-12);
        assert!(fixed.updates_vs_min(96.0, 8.0, None).is_infinite());
        assert!((RateModel::Scaled.updates_vs_min(96.0, 128.0, None) - 1.75).abs() < 1e-12);
        // On 256 rows both batches are noise-effective: at its own batch the
        // fixed rate is still the scaled count, 1 + 96 (1/32 - 1/256) = 3.625.
        let rows = crate::target::sgd_rows(256.0);
        assert!((fixed.updates_vs_min(96.0, 32.0, rows) - 3.625).abs() < 1e-12);
        let (x, at_128) = (1.0 / 3.625, 1.0 + 96.0 * (1.0 / 128.0 - 1.0 / 256.0));
        let want = 1.0 / (2.0 * x - x * x * at_128);
        assert!((fixed.updates_vs_min(96.0, 128.0, rows) - want).abs() < 1e-12);
        assert!(want < 1.0 / 0.390625);
        let r = rank_at(
            &[
                opt("cpu", 8, 1, 1e-3),
                opt("cpu", 32, 1, 2e-3),
                opt("cpu", 128, 1, 6e-3),
            ],
            96.0,
            Some(100.0),
            None,
            fixed,
        );
        assert_eq!(r.len(), 2, "batch 8 never reaches the target at that rate");
        assert_eq!(r[0].option.micro_batch, 32);
        assert!((r[0].steps.unwrap() - 400.0).abs() < 1e-9);
    }

    /// The 6 GB card question by hand: B_noise = 250. GPU at 25 takes 10 ms a
    /// step, CPU at 250 takes 400 ms.
    #[test]
    fn gpu_at_25_vs_cpu_at_250_by_hand() {
        let options = [
            opt("gpu", 25, 1, 0.010),
            opt("cpu", 250, 1, 0.400),
            opt("gpu", 25, 10, 0.010),
        ];
        let r = rank(&options, 250.0, Some(1000.0), None);
        // GPU at 25: 1000 x (1 + 10) x 0.010 = 110 s; GPU 25x10: 1000 x 2 x 0.1 = 200 s;
        // CPU at 250: 1000 x 2 x 0.4 = 800 s.
        assert_eq!(r[0].option.accumulation, 1);
        assert!((r[0].seconds.unwrap() - 110.0).abs() < 1e-9);
        assert!((r[1].seconds.unwrap() - 200.0).abs() < 1e-9);
        assert!((r[2].seconds.unwrap() - 800.0).abs() < 1e-9);
        assert!((r[2].vs_best - 800.0 / 110.0).abs() < 1e-9);
        assert_eq!(r[1].option.effective_batch(), 250);
    }

    #[test]
    fn steps_curve_through_one_run() {
        // 300 updates at B = 128 with B_noise = 256: S_min = 300 / 3 = 100.
        let c = StepsCurve::through(300.0, 128.0, 256.0, None);
        assert!((c.s_min - 100.0).abs() < 1e-12);
        assert!((c.steps(256.0) - 200.0).abs() < 1e-12);
        assert!((c.seconds(256.0, 0.5) - 100.0).abs() < 1e-12);
        assert!((updates_vs_min(100.0, 25.0) - 5.0).abs() < 1e-12);
    }

    /// Without replacement from N rows the noise term is B_noise (1/B - 1/N):
    /// a quarter of the rows is a third less noisy, all of them not noisy.
    #[test]
    fn a_batch_of_distinct_rows_is_less_noisy() {
        assert_eq!(noise_batch(64.0, None), 64.0);
        assert!(
            (noise_batch(64.0, crate::target::sgd_rows(256.0)) - 64.0 * 256.0 / 192.0).abs() < 1e-9
        );
        assert!(noise_batch(256.0, crate::target::sgd_rows(256.0)).is_infinite());
        assert!(noise_batch(300.0, crate::target::sgd_rows(256.0)).is_infinite());
        assert_eq!(
            updates_vs_min_on(256.0, 64.0, crate::target::sgd_rows(256.0)),
            updates_vs_min(256.0, noise_batch(64.0, crate::target::sgd_rows(256.0)))
        );
        let c = StepsCurve::through(300.0, 128.0, 256.0, crate::target::sgd_rows(512.0));
        // 1 + 256 (1/128 - 1/512) = 2.5: S_min 120.
        assert!((c.s_min - 120.0).abs() < 1e-9);
        assert!((c.steps(512.0) - 120.0).abs() < 1e-9);
        assert!((c.steps(1024.0) - 120.0).abs() < 1e-9);
        // Read back, and from a document written before the rows.
        let v = serde_json::to_value(c).unwrap();
        assert_eq!(serde_json::from_value::<StepsCurve>(v).unwrap(), c);
        let old: StepsCurve =
            serde_json::from_value(serde_json::json!({"s_min": 100.0, "b_noise": 256.0})).unwrap();
        assert_eq!(old.rows, None);
        // The fit recovers a curve measured on a finite data set.
        let points: Vec<(f64, f64)> = [16.0, 32.0, 64.0, 128.0, 256.0]
            .iter()
            .map(|&b| (b, c.steps(b)))
            .collect();
        let fitted = StepsCurve::fit(&points, 1e5, crate::target::sgd_rows(512.0)).unwrap();
        assert!((fitted.b_noise / 256.0 - 1.0).abs() < 0.02, "{fitted:?}");
    }

    /// Adam's step is slowed by the noise's standard deviation: on N rows
    /// the noise term is (B_noise / B) sqrt(1 - B/N), which keeps the
    /// unlimited data's 1 + B_noise / B far below N and, near N, falls
    /// faster than SGD's B_noise (1/B - 1/N) (iris: 129 updates at all 135
    /// rows against 190 at 128, where SGD's form has them 8 % apart).
    #[test]
    fn adams_finite_data_term_is_the_noise_standard_deviation() {
        let adam = |n: f64| Some(Rows { n, adaptive: true });
        assert!((noise_batch(64.0, adam(256.0)) - 64.0 / 0.75f64.sqrt()).abs() < 1e-9);
        assert!(noise_batch(256.0, adam(256.0)).is_infinite());
        let (bn, n) = (200.0, 135.0);
        let term = |b: f64, rows| updates_vs_min_on(bn, b, rows) - 1.0;
        assert!((term(128.0, adam(n)) - bn / 128.0 * (7.0f64 / 135.0).sqrt()).abs() < 1e-12);
        // Far below N both forms are the unlimited data's.
        let unlimited = term(16.0, None);
        for rows in [adam(1e7), sgd_rows(1e7)] {
            assert!((term(16.0, rows) / unlimited - 1.0).abs() < 1e-5);
        }
        // Near N Adam's keeps more of the noise: 128 of 135 needs more
        // updates over the full batch than SGD's form gives it.
        assert!(term(128.0, adam(n)) > 3.0 * term(128.0, sgd_rows(n)));
        // Written and read back with its optimizer; absent, SGD's form.
        let c = StepsCurve::through(190.0, 128.0, bn, adam(n));
        let v = serde_json::to_value(c).unwrap();
        assert_eq!(v["adaptive"], serde_json::json!(true));
        assert_eq!(serde_json::from_value::<StepsCurve>(v).unwrap(), c);
        let old: StepsCurve = serde_json::from_value(
            serde_json::json!({"s_min": 100.0, "b_noise": 256.0, "rows": 512.0}),
        )
        .unwrap();
        assert_eq!(old.rows, sgd_rows(512.0));
    }

    fn scale(world: u64, micro: u64, acc: u64, update_s: f64) -> ScaleOption {
        ScaleOption {
            world_size: world,
            strategy: batchfit_plan::distributed::Strategy::Ddp,
            micro_batch: micro,
            accumulation: acc,
            update_s,
        }
    }

    /// The critical batch is where S(B) = 2 S_min, on finite rows too.
    #[test]
    fn the_critical_batch_on_finite_rows_doubles_the_minimum() {
        assert_eq!(critical_batch_on(300.0, None), 300.0);
        for adaptive in [false, true] {
            for (bn, n) in [(300.0, 1_000.0), (2_000.0, 1_100.0), (50.0, 60.0)] {
                let rows = Some(Rows { n, adaptive });
                let b = critical_batch_on(bn, rows);
                assert!(b < bn.min(n), "{b} on {n} rows with B_noise {bn}");
                assert!((updates_vs_min_on(bn, b, rows) - 2.0).abs() < 1e-9);
            }
        }
        assert_eq!(epochs_vs_min_on(300.0, 600.0, None), 3.0);
        // SGD: 1 + B / B_noise - B / N, at 500 of 1,000 rows.
        let (bn, b, n) = (300.0, 500.0, 1_000.0);
        let want = 1.0 + b / bn - b / n;
        assert!((epochs_vs_min_on(bn, b, sgd_rows(n)) - want).abs() < 1e-12);
        // A full batch takes S_min updates, N / B_noise epochs over the fewest.
        let adam = Some(Rows { n, adaptive: true });
        assert!((epochs_vs_min_on(bn, 2.0 * n, adam) - n / bn).abs() < 1e-12);
        use batchfit_plan::Optimizer;
        assert_eq!(rows_drawn_from(0, Optimizer::Adam), None);
        assert_eq!(rows_drawn_from(135, Optimizer::Momentum), sgd_rows(135.0));
        assert_eq!(
            rows_drawn_from(135, Optimizer::Adamw),
            Some(Rows {
                n: 135.0,
                adaptive: true
            })
        );
    }

    /// On a finite data set a global batch counts its rows without
    /// replacement: 8 x 32 of 512 rows is as noisy as 512 drawn with it.
    #[test]
    fn world_sizes_count_a_global_batch_of_distinct_rows() {
        let opts = [scale(1, 32, 1, 1.0), scale(8, 32, 1, 1.0)];
        let t = time_across_world_sizes(&opts, 1000.0, Some(100.0), sgd_rows(512.0));
        assert!((t[1].updates_vs_min - (1.0 + 1000.0 / 512.0)).abs() < 1e-9);
        let unlimited = time_across_world_sizes(&opts, 1000.0, Some(100.0), None);
        assert!(t[1].updates.unwrap() < unlimited[1].updates.unwrap());
    }

    /// B_noise = 1000, S_min = 100, 32 per device, 1 s per update whatever N.
    #[test]
    fn time_across_world_sizes_by_hand() {
        let opts = [
            scale(1, 32, 1, 1.0),
            scale(8, 32, 1, 1.0),
            scale(8, 32, 4, 4.0),
        ];
        let t = time_across_world_sizes(&opts, 1000.0, Some(100.0), None);
        // N = 1: B = 32, S = 100 x (1 + 31.25) = 3225 s. N = 8: B = 256, S = 100 x 4.90625.
        assert_eq!(t[1].global_batch, 256);
        assert!((t[0].seconds.unwrap() - 3225.0).abs() < 1e-9);
        assert!((t[1].seconds.unwrap() - 490.625).abs() < 1e-9);
        // x4 accumulation: B = 1024, 100 x 1.9765625 x 4 s.
        assert!((t[2].seconds.unwrap() - 790.625).abs() < 1e-9);
        assert!((t[1].vs_best - 1.0).abs() < 1e-12);
        assert!((t[0].vs_best - 3225.0 / 490.625).abs() < 1e-9);
        // Without S_min: only ratios.
        let r = time_across_world_sizes(&opts, 1000.0, None, None);
        assert_eq!(r[0].seconds, None);
        assert!((r[0].vs_best - t[0].vs_best).abs() < 1e-12);
    }

    /// Constant step time, global batch doubling with N: the limit is where the global batch
    /// passes B_noise (the continuous rule's e = 1/2 at B = B_noise).
    #[test]
    fn extra_devices_stop_paying_past_the_critical_batch() {
        assert!((updates_elasticity(500.0, 500.0) - 0.5).abs() < 1e-12);
        let b_noise = 1024.0;
        let opts: Vec<ScaleOption> = [1, 2, 4, 8, 16, 32, 64, 128]
            .iter()
            .map(|&n| scale(n, 32, 1, 1.0))
            .collect();
        let t = time_across_world_sizes(&opts, b_noise, None, None);
        let l = scaling_limit(&t).unwrap();
        // Doubling from B to 2B: e = log2((1 + b/B) / (1 + b/2B)). From 32 x 16 = 512 to 1024:
        // (1 + 2) / (1 + 1) = 1.5, e = 0.585 (pays); from 1024 to 2048: 2 / 1.5, e = 0.415.
        assert_eq!(l.stop_after, Some(32));
        assert!((l.elasticity.unwrap() - (2.0f64 / 1.5).log2()).abs() < 1e-12);
        assert_eq!(l.fastest_world_size, 128);
    }

    /// A step that slows with N (communication) stops paying earlier; a perfect one never.
    #[test]
    fn slower_steps_bring_the_limit_earlier() {
        let opts = [
            scale(1, 16, 1, 1.0),
            scale(2, 16, 1, 1.0),
            scale(4, 16, 1, 1.8),
        ];
        let t = time_across_world_sizes(&opts, 1e6, None, None);
        // Far below B_noise the updates halve per doubling; 1 -> 2 pays (e = 1), 2 -> 4:
        // T falls by 2 / 1.8, e = log2(1.111) = 0.152.
        let l = scaling_limit(&t).unwrap();
        assert_eq!(l.stop_after, Some(2));
        assert_eq!(
            l.fastest_world_size, 4,
            "still fastest, at 1.8x the device-hours for 1.1x the speed"
        );
        let perfect = time_across_world_sizes(&opts[..2], 1e6, None, None);
        assert_eq!(scaling_limit(&perfect).unwrap().stop_after, None);
        assert_eq!(scaling_limit(&[]), None);
    }
}
