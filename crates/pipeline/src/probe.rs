//! `probe`: real timed training steps across batch sizes on one device, each
//! batch in a fresh worker process. The measuring loop and the searches are
//! `batchfit_tune`'s; this module runs their trials ([`WorkerTrials`]).

use crate::{Error, Progress, Result};
use batchfit_engine::DeviceSpec;
use batchfit_engine::device::BurnDevice;
use batchfit_engine::worker::{WorkerRequest, WorkerResult, run_child};
use batchfit_exec::Outcome;
use batchfit_graph::{Graph, LossRequest};
use batchfit_plan::plan::{CpuHost, plan_on};
use batchfit_plan::{Bytes, Optimizer, Plan, TrainOptions, plan};
use batchfit_tune::knee::geometric_batches;
use batchfit_tune::measure::{
    CurvePlan, Measurement, REFINE_ROUNDS, SETTLE_ROUNDS_ENGINE, TimeBudget, Trials, Warmup,
    measure_curve,
};
use batchfit_tune::probe::{DeviceProbe, MaxBatchSearch, ProbeBudget, ProbePoint};
use batchfit_tune::search::{Line, SearchOptions, TrialReason, find_max_batch};
use batchfit_tune::stats::StopRule;
use batchfit_tune::trial::FailureKind;
use std::path::PathBuf;
use std::time::{Duration, Instant};

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
    /// Seconds of timed steps per batch at least (within `time_cap_s`).
    pub min_time_s: f64,
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
    /// The loss the user named (`--loss`), applied again in each worker.
    pub loss: Option<LossRequest>,
    pub graph: &'a Graph,
    pub seq_len: usize,
}

/// Timed steps a second of `min_time_s` may take: a step of 50 us, the
/// fastest the engine takes, fills it.
const MAX_STEPS_PER_S: f64 = 20_000.0;

/// How long a trial runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TrialLength {
    /// Warm-up, then timed steps until the median is stable.
    Timed(usize),
    /// One step: does the batch fit?
    OneStep,
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

    /// The warm-up steps and the stop rule of a trial of `length`: a timed
    /// one for at least `min_time_s` (within the cap), with room for steps of
    /// 50 us to fill it.
    fn stop_rule(&self, length: TrialLength) -> (usize, StopRule) {
        let stop = StopRule {
            time_cap_s: self.time_cap_s,
            ..StopRule::default()
        };
        match length {
            TrialLength::OneStep => (
                1,
                StopRule {
                    min_steps: 1,
                    min_time_s: 0.0,
                    max_steps: 1,
                    ..stop
                },
            ),
            TrialLength::Timed(warmup) => (
                warmup,
                StopRule {
                    min_steps: 5,
                    min_time_s: self.min_time_s.min(self.time_cap_s),
                    max_steps: stop
                        .max_steps
                        .max((MAX_STEPS_PER_S * self.min_time_s) as usize),
                    ..stop
                },
            ),
        }
    }

    /// Runs one worker: a timed measurement or a one-step trial.
    pub(crate) fn run(
        &self,
        t: &Target,
        device: DeviceSpec,
        batch: u64,
        length: TrialLength,
    ) -> WorkerResult {
        let (warmup, stop) = self.stop_rule(length);
        let req = WorkerRequest {
            model: t.source.clone(),
            loss: t.loss,
            device,
            batch,
            optimizer: self.optimizer,
            lr: self.lr,
            seq_len: t.seq_len,
            seed: self.seed,
            warmup,
            min_steps: stop.min_steps,
            min_time_s: stop.min_time_s,
            max_steps: stop.max_steps,
            time_cap_s: stop.time_cap_s,
            target_rel_err: stop.target_rel_err,
            // The worker holds the CPU's allocator or the GPU's pools to it.
            memory_limit: self.memory_limit.map(|b| b.0),
            threads: self.threads,
        };
        run_child(&self.worker, &req, self.timeout)
    }
}

/// The engine's worker as the measuring loop's runner: each trial a fresh
/// process measuring one batch.
pub struct WorkerTrials<'a> {
    cfg: &'a MeasureConfig,
    target: &'a Target<'a>,
    device: DeviceSpec,
    plan: &'a Plan,
    progress: &'a dyn Progress,
    started: Instant,
}

impl<'a> WorkerTrials<'a> {
    pub fn new(
        cfg: &'a MeasureConfig,
        target: &'a Target<'a>,
        device: DeviceSpec,
        plan: &'a Plan,
        progress: &'a dyn Progress,
    ) -> Self {
        WorkerTrials {
            cfg,
            target,
            device,
            plan,
            progress,
            started: Instant::now(),
        }
    }
}

impl Trials for WorkerTrials<'_> {
    fn measure(&mut self, b: u64, _: TrialReason, warmup: Warmup) -> Measurement {
        let warmup = match warmup {
            Warmup::Configured => self.cfg.warmup,
            Warmup::One => 1,
        };
        self.progress.add_length(1);
        self.progress
            .message(format!("{}: timing batch {b}", self.device));
        let r = self
            .cfg
            .run(self.target, self.device, b, TrialLength::Timed(warmup));
        self.progress.advance(1);
        let planned = Some(self.plan.bytes_at(b));
        let verdict = r
            .outcome
            .verdict(r.point.as_ref().and_then(|p| p.peak_bytes).map(Bytes));
        let point = match (&r.outcome, r.point) {
            (Outcome::Ran, Some(p)) => ProbePoint {
                cpu_steal_share: p.cpu_steal_share,
                ..ProbePoint::measured(b, &p.summary(), p.peak_bytes, p.peak_rss_bytes, planned)
            },
            (Outcome::TimedOut, _) => ProbePoint::failed(
                b,
                planned,
                FailureKind::TimedOut,
                format!("timed out after {:.0} s", self.cfg.timeout.as_secs_f64()),
            ),
            (outcome, _) => ProbePoint::ended(b, planned, outcome),
        };
        Measurement { point, verdict }
    }

    fn elapsed_s(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
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
/// whose predicted time to target is least and its measured neighbours are
/// measured again with the knee's.
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
    let listed = !cfg.batches.is_empty();
    let curve_plan = CurvePlan {
        batches: if listed {
            cfg.batches.clone()
        } else {
            geometric_batches(1, max_batch.unwrap_or(cfg.up_to).max(1))
        },
        listed,
        refine_rounds: REFINE_ROUNDS,
        settle_rounds: SETTLE_ROUNDS_ENGINE,
        efficiency: cfg.efficiency,
        b_noise,
        budget: cfg.budget_s.map(|deadline_s| TimeBudget {
            deadline_s,
            warmup: cfg.warmup,
            time_cap_s: cfg.time_cap_s,
        }),
    };
    let mut trials = WorkerTrials::new(cfg, t, device, &plan, progress);
    let curve = measure_curve(&mut trials, &curve_plan, Vec::new());
    Ok(DeviceProbe {
        budget: cfg.budget_s.map(|budget_s| ProbeBudget {
            budget_s,
            predicted_step_s: curve
                .not_measured
                .first()
                .and_then(|&b| batchfit_tune::measure::predicted_step_s(&curve.points, b)),
            not_measured: curve.not_measured,
        }),
        knee_range: curve.knee_range,
        between_process_error: curve.between_process_error,
        device,
        threads: (!device.is_gpu()).then(|| cfg.threads.unwrap_or_else(default_threads)),
        points: curve.points,
        max_batch,
        knee_batch: curve.knee_batch,
        efficiency: cfg.efficiency,
        search_trials: search.as_ref().map_or(0, |s| s.trials.len()),
        search,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The largest batch under `limit` by the plan-guided search, each trial one
/// step in a fresh worker. A crash or time-out stops the search
/// (`stopped_at`); it is not out of memory.
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
    let mut stopped_by: Option<Outcome> = None;
    let result = find_max_batch(planned, &SearchOptions::probe(limit), |b| {
        progress.message(format!("{device}: does batch {b} fit in {limit}?"));
        let r = cfg.run(t, device, b, TrialLength::OneStep);
        let peak = r.point.as_ref().map(|p| Bytes(p.peak_bytes.unwrap_or(0)));
        if r.outcome.failure_kind().is_some() && !matches!(r.outcome, Outcome::OutOfMemory(_)) {
            stopped_by = Some(r.outcome.clone());
        }
        r.outcome.verdict(peak)
    });
    let stopped_by = result.stopped_at.and(stopped_by);
    MaxBatchSearch {
        budget_bytes: limit,
        max_batch: result.max_batch,
        smallest_failure: result.smallest_failure,
        planned_limit: plan.max_batch(limit),
        predicted_limit: result.predicted_limit,
        stopped_at: result.stopped_at,
        stop_reason: stopped_by.as_ref().map(|o| o.to_string()),
        stop_code: stopped_by.as_ref().and_then(Outcome::failure_kind),
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
    loss: Option<&LossRequest>,
    devices: &[DeviceSpec],
    progress: &dyn Progress,
) -> Result<ProbeOutput> {
    let graph = batchfit_graph::load_trainable(source, loss)?;
    batchfit_engine::model::check_trainable(&graph)?;
    let seq_len = cfg.seq_len.or(graph.default_seq_len).unwrap_or(1);
    let target = Target {
        source: source.to_string(),
        loss: loss.copied(),
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
            let spec = batchfit_engine::device::parse(d)?;
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

    fn config(min_time_s: f64, time_cap_s: f64) -> MeasureConfig {
        MeasureConfig {
            batches: Vec::new(),
            memory_limit: None,
            efficiency: 0.9,
            threads: None,
            warmup: 3,
            time_cap_s,
            min_time_s,
            up_to: 1024,
            optimizer: Optimizer::Adam,
            lr: 1e-3,
            seq_len: None,
            seed: 0,
            timeout: Duration::from_secs(60),
            worker: PathBuf::from("batchfit"),
            budget_s: None,
        }
    }

    /// `--min-time` sets how long a batch is timed at least, within the cap,
    /// with room for steps of 50 us to fill it; a one-step trial is one step.
    #[test]
    fn a_timed_trial_runs_at_least_min_time_within_the_cap() {
        let (warmup, stop) = config(0.25, 2.0).stop_rule(TrialLength::Timed(3));
        assert_eq!(warmup, 3);
        assert_eq!((stop.min_time_s, stop.time_cap_s), (0.25, 2.0));
        assert_eq!(stop.max_steps, StopRule::default().max_steps);
        let (_, longer) = config(1.0, 2.0).stop_rule(TrialLength::Timed(3));
        assert_eq!((longer.min_time_s, longer.max_steps), (1.0, 20_000));
        let (_, capped) = config(3.0, 2.0).stop_rule(TrialLength::Timed(3));
        assert_eq!(capped.min_time_s, 2.0);
        let (warmup, one) = config(1.0, 2.0).stop_rule(TrialLength::OneStep);
        assert_eq!(
            (warmup, one.min_steps, one.max_steps, one.min_time_s),
            (1, 1, 1, 0.0)
        );
    }
}
