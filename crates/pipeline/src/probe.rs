//! `probe`: real timed training steps across batch sizes on one device, each
//! batch in a fresh worker process; the largest batch under a memory budget
//! (predicted from the plan, confirmed, bisected only in the gap); the knee.

use crate::{Error, Progress, Result};
use batchfit_engine::DeviceSpec;
use batchfit_engine::worker::{WorkerRequest, WorkerResult, run_child};
use batchfit_exec::Outcome;
use batchfit_graph::Graph;
use batchfit_plan::plan::{CpuHost, plan_on};
use batchfit_plan::{Bytes, Optimizer, Plan, TrainOptions, plan};
use batchfit_report::probe::curve_with_errors;
use batchfit_report::probe::{DeviceProbe, MaxBatchSearch, ProbeBudget, ProbePoint};
use batchfit_tune::knee::{geometric_batches, knee, knee_range, refine_between, smooth_knee};
use batchfit_tune::search::{Line, SearchOptions, find_max_batch};
use batchfit_tune::stats::StopRule;
use std::cell::RefCell;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Rounds of measuring again the batches that decide an uncertain knee.
const KNEE_ROUNDS: usize = 2;

/// How to measure training steps (the flags of every measuring command).
#[derive(Clone, Debug)]
pub struct MeasureConfig {
    /// Measure exactly these batches; empty: sample geometrically.
    pub batches: Vec<u64>,
    /// Memory budget per device; with it the largest batch is searched for.
    pub memory_limit: Option<Bytes>,
    /// The knee is the smallest batch reaching this share of the best throughput.
    pub efficiency: f64,
    /// CPU threads of the steps (default: all cores).
    pub threads: Option<usize>,
    /// Untimed steps before timing.
    pub warmup: usize,
    /// Seconds of timed steps per batch at most.
    pub time_cap_s: f64,
    /// Largest batch sampled when no memory limit bounds it.
    pub up_to: u64,
    pub optimizer: Optimizer,
    pub lr: f64,
    /// Sequence length of recurrent models (default: the model's).
    pub seq_len: Option<usize>,
    /// Seed of the synthetic inputs and initial weights.
    pub seed: u64,
    /// One measuring process is stopped after this long.
    pub timeout: Duration,
    /// The program started as the measuring worker (normally batchfit itself).
    pub worker: PathBuf,
    /// Wall-clock seconds the whole measurement may take (`advise --budget`): a batch
    /// whose predicted cost would pass it is not measured, and the report says so.
    pub budget_s: Option<f64>,
}

/// A model ready to be measured: what the worker loads, and the plan's inputs.
pub struct Target<'a> {
    /// `zoo:NAME` or a model file, loaded again in each worker.
    pub source: String,
    pub graph: &'a Graph,
    pub seq_len: usize,
}

impl MeasureConfig {
    /// The training options the worker's steps run under on `device`.
    pub(crate) fn train_options(&self, device: DeviceSpec) -> TrainOptions {
        TrainOptions {
            optimizer: self.optimizer,
            seq_len: self.seq_len,
            gpu: device.is_gpu(),
            ..TrainOptions::default()
        }
    }

    /// The CPU the plan is made for: the threads the worker will use (`None`: all).
    pub(crate) fn host(&self, device: DeviceSpec) -> Option<CpuHost> {
        match self.threads {
            Some(threads) if !device.is_gpu() => Some(CpuHost {
                threads: threads as u64,
                ..CpuHost::detect()
            }),
            _ => None,
        }
    }

    /// The plan for `device`; on the CPU for the threads the worker will use.
    fn plan_for(&self, graph: &Graph, device: DeviceSpec) -> Plan {
        let opts = self.train_options(device);
        match self.host(device) {
            Some(host) => plan_on(graph, &opts, host),
            None => plan(graph, &opts),
        }
    }

    /// The worker's request; `short` is one untimed-warm-up step (a search trial).
    fn request(&self, t: &Target, device: DeviceSpec, batch: u64, short: bool) -> WorkerRequest {
        self.request_warm(t, device, batch, short, self.warmup)
    }

    /// [`MeasureConfig::request`] with `warmup` untimed steps before timing.
    fn request_warm(
        &self,
        t: &Target,
        device: DeviceSpec,
        batch: u64,
        short: bool,
        warmup: usize,
    ) -> WorkerRequest {
        let stop = StopRule::default();
        WorkerRequest {
            model: t.source.clone(),
            device,
            batch,
            optimizer: self.optimizer,
            lr: self.lr,
            seq_len: t.seq_len,
            seed: self.seed,
            warmup: if short { 1 } else { warmup },
            min_steps: if short { 1 } else { 5 },
            min_time_s: if short {
                0.0
            } else {
                stop.min_time_s.min(self.time_cap_s / 2.0)
            },
            max_steps: if short { 1 } else { stop.max_steps },
            time_cap_s: self.time_cap_s,
            target_rel_err: stop.target_rel_err,
            // The worker holds the CPU's allocator or the GPU's pools to it.
            memory_limit: self.memory_limit.map(|b| b.0),
            threads: self.threads,
        }
    }

    /// A timed run with `warmup` untimed steps.
    fn run_warm(&self, t: &Target, device: DeviceSpec, batch: u64, warmup: usize) -> WorkerResult {
        run_child(
            &self.worker,
            &self.request_warm(t, device, batch, false, warmup),
            self.timeout,
        )
    }

    pub(crate) fn run(
        &self,
        t: &Target,
        device: DeviceSpec,
        batch: u64,
        short: bool,
    ) -> WorkerResult {
        run_child(
            &self.worker,
            &self.request(t, device, batch, short),
            self.timeout,
        )
    }
}

/// Measures one device: max-batch search (with a limit), throughput curve, knee.
pub fn probe_device(
    cfg: &MeasureConfig,
    t: &Target,
    device: DeviceSpec,
    progress: &dyn Progress,
) -> Result<DeviceProbe> {
    probe_device_for(cfg, t, device, None, progress)
}

/// [`probe_device`] for advice with the noise scale `b_noise` known: the batch
/// whose predicted time to target, (B + B_noise) / throughput, is least and its
/// measured neighbours are measured again with the knee's.
pub fn probe_device_for(
    cfg: &MeasureConfig,
    t: &Target,
    device: DeviceSpec,
    b_noise: Option<f64>,
    progress: &dyn Progress,
) -> Result<DeviceProbe> {
    let started = Instant::now();
    let plan = cfg.plan_for(t.graph, device);

    let search = match cfg.memory_limit {
        Some(limit) => {
            if limit <= plan.memory.fixed_bytes {
                return Err(Error::input(format!(
                    "--memory-limit {limit} is below the model's fixed memory ({} for weights, gradients and optimizer state); raise the limit or use --optimizer sgd",
                    plan.memory.fixed_bytes
                )));
            }
            Some(search_max_batch(cfg, t, device, &plan, limit, progress))
        }
        None => None,
    };
    let max_batch = search.as_ref().and_then(|s| s.max_batch);

    let explicit = !cfg.batches.is_empty();
    let batches = if explicit {
        cfg.batches.clone()
    } else {
        geometric_batches(1, max_batch.unwrap_or(cfg.up_to).max(1))
    };
    let mut points: Vec<ProbePoint> = Vec::new();
    // A batch measured again keeps the faster of its measurements: on a shared
    // machine interference only ever slows a step down, so the slower process
    // measured the neighbours, not the batch (as `timeit` keeps the best repeat).
    // The two measurements of a batch also tell how far one process's median
    // strays from another's, which a process's own spread does not show.
    let repeats: RefCell<Vec<f64>> = RefCell::default();
    let budget = Budget::new(cfg, started);
    let skipped: RefCell<Vec<u64>> = RefCell::default();
    // Measures `b` unless its predicted cost passes the budget; says whether it did.
    let measure = |b: u64, points: &mut Vec<ProbePoint>| -> bool {
        let predicted = predicted_step_s(points, b);
        let Some(warmup) = budget.warmup_for(predicted) else {
            skipped.borrow_mut().push(b);
            progress.advance(1);
            return false;
        };
        progress.message(format!("{device}: timing batch {b}"));
        let row = point(
            b,
            Some(plan.bytes_at(b)),
            cfg.run_warm(t, device, b, warmup),
            cfg,
        );
        progress.advance(1);
        let earlier = points.iter_mut().find(|q| q.batch == b);
        if let Some(q) = &earlier
            && q.ok()
            && row.ok()
        {
            repeats
                .borrow_mut()
                .push((row.step_time_s / q.step_time_s).ln());
        }
        match earlier {
            Some(q) if !q.ok() || (row.ok() && row.step_time_s < q.step_time_s) => *q = row,
            Some(_) => {}
            None => points.push(row),
        }
        true
    };
    progress.add_length(batches.len() as u64);
    for (i, &b) in batches.iter().enumerate() {
        if !measure(b, &mut points) {
            // Larger batches cost more still: none of them is measured either.
            skipped.borrow_mut().extend(&batches[i + 1..]);
            break;
        }
        // Bigger batches will not fit either.
        if !explicit && points.last().is_some_and(|p| !p.ok()) {
            break;
        }
    }
    let curve = |points: &[ProbePoint]| -> Vec<(u64, f64)> {
        points
            .iter()
            .filter(|p| p.ok())
            .map(|p| (p.batch, p.samples_per_s))
            .collect()
    };
    // The step-time line's knee where the line explains the points, else the medians'.
    let knee_of = |points: &[ProbePoint]| {
        smooth_knee(&crate::advise::points_to_steps(points), cfg.efficiency)
            .or_else(|| knee(&curve(points), cfg.efficiency))
    };
    let mut knee_batch = knee_of(&points);
    // Refine between the knee and the sampled batch below it.
    if !explicit && let Some(k) = knee_batch {
        let below = points
            .iter()
            .filter(|p| p.ok() && p.batch < k)
            .map(|p| p.batch)
            .max();
        if let Some(below) = below {
            let extra = refine_between(below, k, 2);
            progress.add_length(extra.len() as u64);
            for b in extra {
                measure(b, &mut points);
            }
            knee_batch = knee_of(&points);
        }
    }
    // Settle the knee of a sampled curve: measure again the batches that decide it (the knee, the
    // batch below it, the fastest, and any batch inside the knee's range; with
    // `b_noise`, those around the time-to-target winner too), then
    // again while the timings still cannot tell where it is (KNEE_ROUNDS at most).
    let range_of = |points: &[ProbePoint]| {
        let between = between_process_error(&repeats.borrow());
        let curve: Vec<(u64, f64, f64)> = curve_with_errors(points)
            .into_iter()
            .map(|(b, rate, err)| (b, rate, err.hypot(between)))
            .collect();
        knee_range(&curve, cfg.efficiency)
    };
    let mut range = range_of(&points);
    // Listed batches are measured as listed, once each.
    let rounds = if explicit { 0 } else { KNEE_ROUNDS };
    for round in 0..rounds {
        let (Some(k), Some(r)) = (knee_batch, range) else {
            break;
        };
        if round > 0 && r.low == r.high {
            break;
        }
        let mut ok: Vec<&ProbePoint> = points.iter().filter(|p| p.ok()).collect();
        ok.sort_by_key(|p| p.batch);
        let fastest = ok
            .iter()
            .max_by(|a, b| a.samples_per_s.total_cmp(&b.samples_per_s))
            .map(|p| p.batch);
        let below = ok.iter().map(|p| p.batch).filter(|&b| b < k).max();
        // The time-to-target winner and the batches either side of it.
        let winner: Vec<u64> = b_noise
            .and_then(|bn| {
                let i = (0..ok.len()).min_by(|&i, &j| {
                    let time = |p: &ProbePoint| (p.batch as f64 + bn) / p.samples_per_s;
                    time(ok[i]).total_cmp(&time(ok[j]))
                })?;
                Some(
                    ok[i.saturating_sub(1)..(i + 2).min(ok.len())]
                        .iter()
                        .map(|p| p.batch)
                        .collect(),
                )
            })
            .unwrap_or_default();
        let mut again: Vec<u64> = ok
            .iter()
            .map(|p| p.batch)
            .filter(|b| (r.low..=r.high).contains(b))
            .chain([Some(k), below, fastest].into_iter().flatten())
            .chain(winner)
            .collect();
        again.sort_unstable();
        again.dedup();
        progress.add_length(again.len() as u64);
        for b in again {
            measure(b, &mut points);
        }
        knee_batch = knee_of(&points);
        range = range_of(&points);
    }
    points.sort_by_key(|p| p.batch);
    let mut not_measured = skipped.into_inner();
    not_measured.retain(|b| !points.iter().any(|p| p.batch == *b));
    not_measured.sort_unstable();
    not_measured.dedup();
    Ok(DeviceProbe {
        budget: cfg.budget_s.map(|budget_s| ProbeBudget {
            budget_s,
            predicted_step_s: not_measured
                .first()
                .and_then(|&b| predicted_step_s(&points, b)),
            not_measured,
        }),
        knee_range: range,
        device: device.to_string(),
        threads: (!device.is_gpu()).then(|| cfg.threads.unwrap_or_else(default_threads)),
        points,
        max_batch,
        knee_batch,
        efficiency: cfg.efficiency,
        search_trials: search.as_ref().map_or(0, |s| s.trials.len()),
        search,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// A batch's step time predicted from the measured batch nearest below it, growing in
/// proportion to the batch (an upper bound while the device is not yet saturated);
/// `None` before anything below it ran.
fn predicted_step_s(points: &[ProbePoint], b: u64) -> Option<f64> {
    points
        .iter()
        .filter(|p| p.ok() && p.batch <= b)
        .max_by_key(|p| p.batch)
        .map(|p| p.step_time_s * b as f64 / p.batch as f64)
}

/// The wall-clock budget of a probe: whether a batch may be measured, and with how
/// many warm-up steps.
struct Budget {
    deadline_s: Option<f64>,
    started: Instant,
    warmup: usize,
    time_cap_s: f64,
}

/// Seconds of starting a worker, loading the model and building its step, besides
/// the steps (a generous figure: the engine's compiled step is built per process).
const WORKER_START_S: f64 = 1.0;

/// The share of a budget the measurements may plan to spend: the rest is for the plan,
/// the report, and a step slower than predicted (a step's time is predicted from the
/// batch below it, and a bigger batch can be slower per sample).
const BUDGET_FOR_STEPS: f64 = 0.9;

/// A step this slow is warm after one step: a longer warm-up only spends the budget.
const SLOW_STEP_S: f64 = 1.0;

impl Budget {
    fn new(cfg: &MeasureConfig, started: Instant) -> Budget {
        Budget {
            deadline_s: cfg.budget_s,
            started,
            warmup: cfg.warmup,
            time_cap_s: cfg.time_cap_s,
        }
    }

    /// The warm-up steps to measure a batch whose step is predicted to take `step_s`
    /// (`None`: unknown, the first batch), or `None` when its cost passes the budget.
    fn warmup_for(&self, step_s: Option<f64>) -> Option<usize> {
        let Some(deadline) = self.deadline_s else {
            return Some(self.warmup);
        };
        let Some(step) = step_s else {
            return Some(self.warmup);
        };
        let warmup = if step >= SLOW_STEP_S { 1 } else { self.warmup };
        // Warm-up, then timed steps until their sum reaches the cap: one step when a
        // step alone does, else at most the cap and one step more.
        let timed = if step >= self.time_cap_s {
            step
        } else {
            self.time_cap_s + step
        };
        let cost = WORKER_START_S + warmup as f64 * step + timed;
        (self.started.elapsed().as_secs_f64() + cost <= BUDGET_FOR_STEPS * deadline)
            .then_some(warmup)
    }
}

/// The relative error of one process's median step time as another process
/// would measure it, from the log-ratios of repeated measurements of the same
/// batch: their variance is twice that error's square. 0 with no repeats.
fn between_process_error(log_ratios: &[f64]) -> f64 {
    if log_ratios.is_empty() {
        return 0.0;
    }
    let mean_square = log_ratios.iter().map(|d| d * d).sum::<f64>() / log_ratios.len() as f64;
    (mean_square / 2.0).sqrt()
}

/// One row of the throughput table from how its worker ended.
fn point(b: u64, planned: Option<Bytes>, r: WorkerResult, cfg: &MeasureConfig) -> ProbePoint {
    match (&r.outcome, r.point) {
        (Outcome::Ran, Some(p)) => {
            ProbePoint::measured(b, &p.summary(), p.peak_bytes, p.peak_rss_bytes, planned)
        }
        (Outcome::TimedOut, _) => ProbePoint::failed(
            b,
            planned,
            format!("timed out after {:.0} s", cfg.timeout.as_secs_f64()),
        ),
        (outcome, _) => ProbePoint::failed(b, planned, outcome.to_string()),
    }
}

/// The largest batch under `limit`: the plan's line, calibrated with two
/// measured peaks, confirmed at the predicted limit, bisected in the gap.
/// A crash or time-out stops the search (`stopped_at`); it is not out of memory.
pub(crate) fn search_max_batch(
    cfg: &MeasureConfig,
    t: &Target,
    device: DeviceSpec,
    plan: &Plan,
    limit: Bytes,
    progress: &dyn Progress,
) -> MaxBatchSearch {
    let started = Instant::now();
    let planned = Line {
        fixed: plan.memory.fixed_bytes.as_f64(),
        per_sample: plan.memory.per_sample_bytes.as_f64(),
    };
    let opts = SearchOptions {
        budget: limit,
        tolerance: 1.1,
        cap: 1 << 24,
        max_trials: 24,
    };
    let mut stop_reason = None;
    let result = find_max_batch(planned, &opts, |b| {
        progress.message(format!("{device}: does batch {b} fit in {limit}?"));
        let r = cfg.run(t, device, b, true);
        let peak = r.point.as_ref().map(|p| Bytes(p.peak_bytes.unwrap_or(0)));
        let verdict = r.outcome.verdict(peak);
        if !matches!(r.outcome, Outcome::Ran | Outcome::OutOfMemory(_)) {
            stop_reason = Some(r.outcome.to_string());
        }
        verdict
    });
    MaxBatchSearch {
        budget_bytes: limit,
        max_batch: result.max_batch,
        smallest_failure: result.smallest_failure,
        planned_limit: plan.max_batch(limit),
        predicted_limit: result.predicted_limit,
        stopped_at: result.stopped_at,
        stop_reason: result.stopped_at.and(stop_reason),
        trials: result.trials,
        seconds: started.elapsed().as_secs_f64(),
    }
}

fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Everything `probe` measured, for its document.
pub struct ProbeOutput {
    pub graph: Graph,
    pub devices: Vec<DeviceProbe>,
}

/// Loads `source`, checks the engine can train it, and probes every device in turn.
pub fn probe(
    cfg: &MeasureConfig,
    source: &str,
    devices: &[DeviceSpec],
    progress: &dyn Progress,
) -> Result<ProbeOutput> {
    let graph = batchfit_graph::load(source)?;
    batchfit_engine::model::check_trainable(&graph)?;
    let seq_len = cfg.seq_len.or(graph.default_seq_len).unwrap_or(1);
    let target = Target {
        source: source.to_string(),
        graph: &graph,
        seq_len,
    };
    let mut out = Vec::new();
    for &d in devices {
        out.push(probe_device(cfg, &target, d, progress)?);
    }
    Ok(ProbeOutput {
        devices: out,
        graph,
    })
}

/// The devices named on the command line, checked: unknown names and GPUs
/// this build lacks are bad input. Empty: the CPU.
pub fn parse_devices(names: &[String]) -> Result<Vec<DeviceSpec>> {
    if names.is_empty() {
        return Ok(vec![DeviceSpec::Cpu]);
    }
    names
        .iter()
        .map(|d| {
            let spec = DeviceSpec::parse(d)?;
            spec.device()
                .map_err(|e| Error::input_because(format!("--device {d}: {e}"), e))?;
            // burn makes a wgpu device lazily: without an adapter every trial would crash.
            #[cfg(feature = "wgpu")]
            if matches!(spec, DeviceSpec::Wgpu(_)) && batchfit_engine::device::wgpu_adapters().is_empty() {
                return Err(Error::input(format!(
                    "--device {d}: wgpu sees no adapter on this machine (no Vulkan, Metal or DX12 driver; docs/gpu.md)"
                )));
            }
            Ok(spec)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use batchfit_tune::stats::summarize;

    fn ran(batch: u64, step_s: f64) -> ProbePoint {
        ProbePoint::measured(
            batch,
            &summarize(&[step_s, step_s, step_s]),
            None,
            None,
            None,
        )
    }

    #[test]
    fn a_step_is_predicted_from_the_batch_below_it() {
        let points = vec![
            ran(4, 0.5),
            ran(8, 1.0),
            ProbePoint::failed(16, None, "x".into()),
        ];
        assert_eq!(predicted_step_s(&points, 32), Some(4.0));
        assert_eq!(predicted_step_s(&points, 4), Some(0.5));
        assert_eq!(predicted_step_s(&points, 2), None);
    }

    #[test]
    fn the_budget_leaves_out_what_would_pass_it() {
        let budget = |deadline_s: Option<f64>| Budget {
            deadline_s,
            started: Instant::now(),
            warmup: 3,
            time_cap_s: 2.0,
        };
        // No budget, or nothing known yet: measured with the usual warm-up.
        assert_eq!(budget(None).warmup_for(Some(1e6)), Some(3));
        assert_eq!(budget(Some(1.0)).warmup_for(None), Some(3));
        // A fast step fits a minute; a slow one is warmed once; one that would pass is left out.
        assert_eq!(budget(Some(60.0)).warmup_for(Some(0.1)), Some(3));
        assert_eq!(budget(Some(60.0)).warmup_for(Some(10.0)), Some(1));
        assert_eq!(budget(Some(60.0)).warmup_for(Some(30.0)), None);
    }
}
