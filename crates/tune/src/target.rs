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
mod tests;
