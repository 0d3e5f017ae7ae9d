//! `--lengths`: plan (and with `probe`, measure) a sequence model over the
//! lengths of the user's data instead of one `--seq-len`.

use crate::probe::{MeasureConfig, Target, TrialLength, search_max_batch};
use crate::run::RunConfig;
use crate::{Error, Progress, Result};
use batchfit_engine::DeviceSpec;
use batchfit_exec::Outcome;
use batchfit_graph::{Graph, LossRequest};
use batchfit_plan::Plan;
use batchfit_plan::lengths::LengthPlanner;
use batchfit_plan::{Bytes, TrainOptions};
use batchfit_tune::buckets::{EpochCost, LengthStats, Scheme, bucket_bounds, epoch};
use batchfit_tune::lengths::{
    BucketMeasurement, EPOCH_SEED, EpochCheck, MeasuredStep, NamedLengthPlan, RunBucket,
    RunLengths, SchemeKind, StepTimeModel, epoch_by_shape, plan_lengths, systematic_sample,
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
        let plan =
            plan_lengths(&planner, &lengths, b.bytes, margin(&opts), req.buckets).map_err(|e| {
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
    loss: Option<&LossRequest>,
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
    let graph = batchfit_graph::load_trainable(source, loss)?;
    batchfit_engine::model::check_trainable(&graph)?;
    let lengths = read(&graph, &req.source)?;
    let planner = LengthPlanner::on(&graph, &cfg.train_options(device), cfg.host(device))
        .expect("checked: a sequence axis");
    // Measured limits replace the plan's, so the plan is sized without a margin.
    let planned = plan_lengths(&planner, &lengths, limit, 0.0, req.buckets)
        .map_err(|e| Error::input_because(format!("--lengths {}", req.source), e))?;
    // The model padded to length `t`, as one worker loads it.
    let target_at = |t: u64| Target {
        source: source.to_string(),
        loss: loss.copied(),
        graph: &graph,
        seq_len: t as usize,
    };
    let mut measured = Vec::new();
    for b in planned.buckets.iter().rev() {
        let target = target_at(b.longest);
        let plan_t = planner.at(b.longest, Plan::clone);
        let search = search_max_batch(cfg, &target, device, &plan_t, limit, progress);
        // The search's trials are two steps; a timed run takes more, and a batch at the
        // limit can run out of memory in a later step (rnn-tutorial at 7 x 302 frames under
        // 640 MiB ran two steps and failed in the timed run). The bucket's batch is the
        // largest that ran the timed run too: one batch lower after such a failure, at
        // most twice.
        let mut max_batch = search.max_batch;
        let mut smallest_failure = search.smallest_failure;
        let mut timed = None;
        for _ in 0..3 {
            let Some(m) = max_batch else { break };
            progress.message(format!(
                "{device}: timing batch {m} at length {}",
                b.longest
            ));
            let r = cfg.run(&target, device, m, TrialLength::Timed(cfg.warmup));
            let out_of_memory = matches!(r.outcome, Outcome::OutOfMemory(_));
            timed = Some(r);
            if !out_of_memory {
                break;
            }
            smallest_failure = Some(smallest_failure.map_or(m, |f| f.min(m)));
            max_batch = m.checked_sub(1).filter(|&b| b > 0);
        }
        let point = timed.as_ref().and_then(|r| r.point.as_ref());
        measured.push(BucketMeasurement {
            longest: b.longest,
            planned_batch: b.batch,
            max_batch,
            smallest_failure,
            trials: search.trials.len(),
            stopped: search.stop_reason.clone().or_else(|| {
                timed
                    .as_ref()
                    .filter(|r| r.point.is_none())
                    .map(|r| format!("timing run: {}", r.outcome))
            }),
            planned_bytes: max_batch.map(|m| plan_t.bytes_at(m)),
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
    let under_count = measured
        .iter()
        .filter_map(BucketMeasurement::peak_error)
        .fold(0.0, f64::max);
    let mut plan = planned.with_measured_batches(&planner, &lengths, &batches, under_count);
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
    // Not a batch of one: a single sample can take another kernel (a matrix-vector
    // product; an LSTM on a CPU took 3.3 s at 1 x 750 frames, 13.6 s at 2 x 750).
    let ends = [measured.last(), measured.first()];
    for m in ends.into_iter().flatten() {
        let Some(half) = m.max_batch.map(|b| b / 2).filter(|&h| h >= 2) else {
            continue;
        };
        if m.max_batch == Some(half)
            || steps
                .iter()
                .any(|s| (s.batch, s.padded_to) == (half, m.longest))
        {
            continue;
        }
        let target = target_at(m.longest);
        progress.message(format!(
            "{device}: timing batch {half} at length {}",
            m.longest
        ));
        let r = cfg.run(&target, device, half, TrialLength::Timed(cfg.warmup));
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
            let mut failed = None;
            for &i in &picks {
                let b = batches[i];
                let target = target_at(b.padded_to);
                progress.message(format!(
                    "{device}: {}: timing batch {} at length {}",
                    kind.label(),
                    b.samples,
                    b.padded_to
                ));
                let r = cfg.run(&target, device, b.samples, TrialLength::Timed(cfg.warmup));
                match r.point {
                    Some(p) => total += p.summary().median,
                    None => {
                        // A result, not an error: this scheme's epoch does not run.
                        failed = Some(format!(
                            "batch {} at length {}: {}",
                            b.samples, b.padded_to, r.outcome
                        ));
                        break;
                    }
                }
            }
            epochs.push(EpochCheck {
                kind,
                steps: batches.len() as u64,
                timed: picks.len() as u64,
                measured_epoch_s: if failed.is_some() {
                    f64::NAN
                } else {
                    total * batches.len() as f64 / picks.len().max(1) as f64
                },
                predicted_epoch_s: plan.scheme(kind).and_then(|s| s.predicted_epoch_s),
                failed,
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

/// The placeholder of `run --lengths`: the padded length of a trial's batches.
pub const LENGTH_PLACEHOLDER: &str = "{len}";

/// `run --lengths`: the user's command searched for its largest batch at each bucket's
/// longest length (`{len}` in the command), longest first, each trial a fresh process.
pub fn run_lengths(
    cfg: &RunConfig,
    req: &LengthsRequest,
    progress: &dyn Progress,
) -> Result<RunLengths> {
    if !cfg.command.iter().any(|a| a.contains(LENGTH_PLACEHOLDER)) {
        return Err(Error::input(format!(
            "run --lengths: put {LENGTH_PLACEHOLDER} in the command where the padded length goes (e.g. --max-len {LENGTH_PLACEHOLDER})"
        )));
    }
    if !cfg.batches.is_empty() {
        return Err(Error::input(
            "run --lengths searches each bucket's largest batch: leave out --batches",
        ));
    }
    let started = Instant::now();
    let lengths = batchfit_data::lengths::read_lengths(&req.source)?;
    let mut sorted = lengths.clone();
    sorted.sort_unstable();
    let bounds = bucket_bounds(&sorted, req.buckets);
    let mut buckets: Vec<RunBucket> = Vec::new();
    for (i, &longest) in bounds.iter().enumerate().rev() {
        let shortest = if i == 0 { sorted[0] } else { bounds[i - 1] + 1 };
        let len = longest.to_string();
        let c = RunConfig {
            command: cfg
                .command
                .iter()
                .map(|a| a.replace(LENGTH_PLACEHOLDER, &len))
                .collect(),
            search_only: true,
            html: None,
            // A shorter length fits at least the batch the longer one did.
            start: buckets
                .last()
                .and_then(|b| b.max_batch)
                .unwrap_or(cfg.start)
                .clamp(cfg.start, cfg.max_batch),
            ..cfg.clone()
        };
        progress.message(format!("bucket up to length {longest}"));
        let doc = crate::run::run(&c, progress)?;
        buckets.push(RunBucket {
            shortest,
            longest,
            samples: sorted
                .iter()
                .filter(|&&l| l >= shortest && l <= longest)
                .count() as u64,
            max_batch: doc.max_batch,
            smallest_failure: doc.smallest_failure,
            stopped_at: doc.stopped_at,
            trials: doc.search_trials,
            seconds: doc.seconds,
        });
    }
    buckets.reverse();
    let batches: Vec<u64> = buckets.iter().map(|b| b.max_batch.unwrap_or(0)).collect();
    let epochs = (batches.iter().all(|&b| b > 0)).then(|| {
        let fixed = Scheme::Fixed {
            batch: *batches.last().expect("at least one bucket"),
        };
        let bucketed = Scheme::Buckets {
            bounds: bounds.clone(),
            batches,
        };
        [fixed, bucketed].map(|s| EpochCost::of(&epoch(&lengths, &s, EPOCH_SEED)))
    });
    Ok(RunLengths {
        command: cfg.command.join(" "),
        memory_limit_bytes: cfg.memory_limit,
        lengths: LengthStats::of(&lengths),
        buckets,
        fixed_epoch: epochs.map(|e| e[0]),
        bucket_epoch: epochs.map(|e| e[1]),
        seconds: started.elapsed().as_secs_f64(),
    })
}
