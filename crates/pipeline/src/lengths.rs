//! `--lengths`: plan (and with `probe`, measure) a sequence model over the
//! lengths of the user's data instead of one `--seq-len`.

use crate::probe::{MeasureConfig, Target, search_max_batch};
use crate::{Error, Progress, Result};
use batchfit_engine::DeviceSpec;
use batchfit_graph::Graph;
use batchfit_plan::lengths::LengthPlanner;
use batchfit_plan::{Bytes, TrainOptions};
use batchfit_report::lengths::NamedLengthPlan;
use batchfit_plan::Plan;
use batchfit_tune::lengths::{
    BucketMeasurement, EpochCheck, MeasuredStep, SchemeKind, StepTimeModel, epoch_by_shape,
    plan_lengths, systematic_sample,
};
use std::time::Instant;

/// What `--lengths` asks.
#[derive(Clone, Debug)]
pub struct LengthsRequest {
    /// `FILE` or `FILE:KEY` (see `batchfit_data::lengths`).
    pub source: String,
    /// Buckets of about equal counts.
    pub buckets: usize,
    /// `probe`: batches of each scheme's epoch to time (0: none).
    pub measure_epochs: usize,
}

/// A budget to plan for: its name, bytes, and whether it is a GPU's.
#[derive(Clone, Debug)]
pub struct NamedBudget {
    pub name: String,
    pub bytes: Bytes,
    pub gpu: bool,
}

/// Reads the lengths and checks the model has a sequence axis to apply them to.
pub fn read(graph: &Graph, source: &str) -> Result<Vec<u64>> {
    if !graph.has_seq() {
        return Err(Error::input(format!(
            "--lengths: model `{}` has no sequence axis (no input with a length dimension T), so its memory does not depend on the lengths",
            graph.name
        )));
    }
    Ok(batchfit_data::lengths::read_lengths(source)?)
}

/// The share of the budget the plan's batches leave free: the most the plan has
/// under-counted this runtime's peak where it was measured (0 where it was not).
fn margin(opts: &TrainOptions) -> f64 {
    batchfit_plan::accuracy::measured_error(opts.runtime, opts.gpu)
        .map_or(0.0, |e| (-e.lowest).max(0.0))
}

/// The plan over the lengths for each budget.
pub fn plan_over(
    graph: &Graph,
    opts: &TrainOptions,
    req: &LengthsRequest,
    budgets: &[NamedBudget],
) -> Result<(Vec<u64>, Vec<NamedLengthPlan>)> {
    let lengths = read(graph, &req.source)?;
    if budgets.is_empty() {
        return Err(Error::input(
            "--lengths needs a budget to fit the batches in: --memory or --device-preset",
        ));
    }
    let mut out = Vec::new();
    for b in budgets {
        let opts = TrainOptions {
            gpu: b.gpu,
            ..opts.clone()
        };
        let planner = LengthPlanner::new(graph, &opts).expect("checked: a sequence axis");
        let plan = plan_lengths(&planner, &lengths, b.bytes, margin(&opts), req.buckets).map_err(|e| {
            Error::input_because(format!("--lengths {} under {}", req.source, b.name), e)
        })?;
        out.push(NamedLengthPlan {
            budget: b.name.clone(),
            plan,
        });
    }
    Ok((lengths, out))
}

/// What `probe --lengths` measured on one device.
pub struct LengthProbe {
    pub plan: NamedLengthPlan,
    /// Longest bucket first, as measured.
    pub buckets: Vec<BucketMeasurement>,
    /// Every timed step: each bucket's largest batch, and half batches at the ends.
    pub timed_steps: Vec<MeasuredStep>,
    /// The step-time model fitted to the timed steps.
    pub step_model: Option<StepTimeModel>,
    /// Epochs timed with `measure_epochs`.
    pub epochs: Vec<EpochCheck>,
    pub seconds: f64,
}

/// Plans the buckets under `--memory-limit`, then measures them longest first (the
/// bucket most likely to fail fails fast): at each bucket's longest length, the largest
/// batch that runs (the plan-guided search of `probe`), then that batch timed. The
/// buckets, fixed batch and frame budget become the measured ones, and each scheme's
/// epoch time is predicted from the measured steps.
pub fn probe_lengths(
    cfg: &MeasureConfig,
    source: &str,
    req: &LengthsRequest,
    device: DeviceSpec,
    progress: &dyn Progress,
) -> Result<(Graph, LengthProbe)> {
    let started = Instant::now();
    let Some(limit) = cfg.memory_limit else {
        return Err(Error::input(
            "probe --lengths needs --memory-limit: the budget the buckets are sized for",
        ));
    };
    let graph = batchfit_graph::load(source)?;
    batchfit_engine::model::check_trainable(&graph)?;
    let lengths = read(&graph, &req.source)?;
    let planner = LengthPlanner::on(&graph, &cfg.train_options(device), cfg.host(device))
        .expect("checked: a sequence axis");
    // Measured limits replace the plan's, so the plan is sized without a margin.
    let planned = plan_lengths(&planner, &lengths, limit, 0.0, req.buckets)
        .map_err(|e| Error::input_because(format!("--lengths {}", req.source), e))?;
    let mut measured = Vec::new();
    for b in planned.buckets.iter().rev() {
        let target = Target {
            source: source.to_string(),
            graph: &graph,
            seq_len: b.longest as usize,
        };
        let plan_t = planner.at(b.longest, Plan::clone);
        let search = search_max_batch(cfg, &target, device, &plan_t, limit, progress);
        let timed = search.max_batch.map(|m| {
            progress.message(format!("{device}: timing batch {m} at length {}", b.longest));
            cfg.run(&target, device, m, false)
        });
        let point = timed.as_ref().and_then(|r| r.point.as_ref());
        measured.push(BucketMeasurement {
            longest: b.longest,
            planned_batch: b.batch,
            max_batch: search.max_batch,
            smallest_failure: search.smallest_failure,
            trials: search.trials.len(),
            stopped: search.stop_reason.clone().or_else(|| {
                timed
                    .as_ref()
                    .filter(|r| r.point.is_none())
                    .map(|r| format!("timing run: {}", r.outcome))
            }),
            planned_bytes: search.max_batch.map(|m| plan_t.bytes_at(m)),
            measured_peak: point.and_then(|p| p.peak_bytes).map(Bytes),
            step_s: point.map(|p| p.summary().median),
        });
    }
    measured.reverse();
    let batches: Vec<u64> = measured
        .iter()
        .zip(&planned.buckets)
        .map(|(m, b)| m.max_batch.unwrap_or(b.batch))
        .collect();
    let mut plan = planned.with_measured_batches(&planner, &lengths, &batches);
    let step = |batch: u64, t: u64, step_s: f64| MeasuredStep {
        batch,
        padded_to: t,
        train_flops: batch as f64 * planner.train_flops(t),
        step_s,
    };
    let mut steps: Vec<MeasuredStep> = measured
        .iter()
        .filter_map(|m| Some(step(m.max_batch?, m.longest, m.step_s?)))
        .collect();
    // The buckets' batches fill the memory alike, so their FLOPs hardly differ: half
    // batches at the longest and shortest lengths separate the FLOPs from the length.
    let ends = [measured.last(), measured.first()];
    for m in ends.into_iter().flatten() {
        let Some(half) = m.max_batch.map(|b| b / 2).filter(|&h| h >= 1) else {
            continue;
        };
        if m.max_batch == Some(half) || steps.iter().any(|s| (s.batch, s.padded_to) == (half, m.longest)) {
            continue;
        }
        let target = Target {
            source: source.to_string(),
            graph: &graph,
            seq_len: m.longest as usize,
        };
        progress.message(format!("{device}: timing batch {half} at length {}", m.longest));
        let r = cfg.run(&target, device, half, false);
        if let Some(p) = &r.point {
            steps.push(step(half, m.longest, p.summary().median));
        }
    }
    let step_model = StepTimeModel::fit(&steps);
    if let Some(model) = &step_model {
        plan.predict_epochs(&planner, &lengths, model);
    }
    let mut epochs = Vec::new();
    if req.measure_epochs > 0 {
        // The median's batches do not fit: it has no epoch to time.
        for kind in [SchemeKind::Fixed, SchemeKind::Buckets, SchemeKind::Frames] {
            let batches = epoch_by_shape(&plan, &lengths, kind);
            let picks = systematic_sample(batches.len(), req.measure_epochs);
            let mut total = 0.0;
            for &i in &picks {
                let b = batches[i];
                let target = Target {
                    source: source.to_string(),
                    graph: &graph,
                    seq_len: b.padded_to as usize,
                };
                progress.message(format!(
                    "{device}: {}: timing batch {} at length {}",
                    kind.label(),
                    b.samples,
                    b.padded_to
                ));
                let r = cfg.run(&target, device, b.samples, false);
                let Some(p) = r.point else {
                    return Err(Error::Failure {
                        message: format!(
                            "timing the {} epoch: batch {} at length {}: {}",
                            kind.label(),
                            b.samples,
                            b.padded_to,
                            r.outcome
                        ),
                        source: None,
                    });
                };
                total += p.summary().median;
            }
            epochs.push(EpochCheck {
                kind,
                steps: batches.len() as u64,
                timed: picks.len() as u64,
                measured_epoch_s: total * batches.len() as f64 / picks.len().max(1) as f64,
                predicted_epoch_s: plan.scheme(kind).and_then(|s| s.predicted_epoch_s),
            });
        }
    }
    Ok((
        graph,
        LengthProbe {
            plan: NamedLengthPlan {
                budget: "memory-limit".into(),
                plan,
            },
            buckets: measured,
            timed_steps: steps,
            step_model,
            epochs,
            seconds: started.elapsed().as_secs_f64(),
        },
    ))
}
