//! `batchfit probe`: real timed training steps across batch sizes on each device.

use crate::error::{CliError, CliResult};
use crate::options::{input, load_model, parse_bytes, positive_u64, positive_usize};
use batchfit_engine::DeviceSpec;
use batchfit_engine::worker::{Outcome, WorkerRequest, run_child};
use batchfit_graph::Graph;
use batchfit_plan::{Bytes, Optimizer, Plan, TrainOptions, plan};
use batchfit_report::probe::{DeviceProbe, MaxBatchSearch, ProbeDocument, ProbePoint, render};
use batchfit_tune::knee::{geometric_batches, knee, refine_between};
use batchfit_tune::search::{Line, SearchOptions, Trial, find_max_batch};
use batchfit_tune::stats::StopRule;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Args, Clone)]
pub struct ProbeArgs {
    /// zoo:NAME, a .toml layer spec or an .onnx file [default: zoo:digits-mlp].
    pub model: Option<String>,
    #[command(flatten)]
    pub measure: MeasureFlags,
    /// Print the measurements as JSON (schema: docs/json.md).
    #[arg(long)]
    pub json: bool,
}

/// Flags of every command that measures training steps.
#[derive(Args, Clone, Debug)]
pub struct MeasureFlags {
    /// Devices to measure, comma-separated: cpu, cuda:0, wgpu:0 [probe: cpu; advise: every device present].
    #[arg(long, value_delimiter = ',')]
    pub device: Vec<String>,
    /// Measure exactly these batch sizes (comma-separated) instead of sampling.
    #[arg(long, value_delimiter = ',', value_parser = positive_u64)]
    pub batches: Vec<u64>,
    /// Memory budget per device (CPU: enforced by batchfit's allocator), e.g. 6GiB.
    /// With it, the largest batch that fits is searched for.
    #[arg(long, value_parser = parse_bytes)]
    pub memory_limit: Option<Bytes>,
    /// The knee is the smallest batch reaching this share of the best throughput.
    #[arg(long, default_value_t = 0.9, value_parser = parse_share)]
    pub efficiency: f64,
    /// CPU threads for the training steps (default: all cores).
    #[arg(long, value_parser = positive_usize)]
    pub threads: Option<usize>,
    /// Untimed steps before timing each batch size.
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    /// Seconds of timed steps per batch size at most.
    #[arg(long, default_value_t = 2.0, value_parser = parse_seconds)]
    pub time_cap: f64,
    /// Largest batch sampled when no --memory-limit bounds it.
    #[arg(long, default_value_t = 1024, value_parser = positive_u64)]
    pub up_to: u64,
    /// Optimizer of the measured steps: sgd, momentum, adam, adamw.
    #[arg(long, default_value = "adam", value_parser = parse_optimizer)]
    pub optimizer: Optimizer,
    /// Learning rate of the measured steps.
    #[arg(long, default_value_t = 1e-3)]
    pub lr: f64,
    /// Sequence length T for recurrent models.
    #[arg(long, value_parser = positive_usize)]
    pub seq_len: Option<usize>,
    /// Seed of the synthetic inputs and initial weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Seconds after which one measuring process is stopped.
    #[arg(long, default_value_t = 600.0, value_parser = parse_seconds)]
    pub timeout: f64,
}

pub fn parse_share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x > 0.0 && x <= 1.0 => Ok(x),
        _ => Err(format!("`{s}` must be a share in (0, 1], e.g. 0.9")),
    }
}

pub fn parse_seconds(s: &str) -> Result<f64, String> {
    let t = s.trim_end_matches('s');
    match t.parse::<f64>() {
        Ok(x) if x > 0.0 && x.is_finite() => Ok(x),
        _ => Err(format!("`{s}` must be a positive number of seconds")),
    }
}

fn parse_optimizer(s: &str) -> Result<Optimizer, String> {
    Optimizer::parse(s)
        .ok_or_else(|| format!("`{s}` is not one of {}", Optimizer::NAMES.join(", ")))
}

/// A model ready to be measured: what to load in the child, and its plan inputs.
pub struct Target<'a> {
    pub source: String,
    pub graph: &'a Graph,
    pub seq_len: usize,
}

impl MeasureFlags {
    /// The devices, checked: unknown names and GPUs absent from this build are bad input.
    pub fn devices(&self) -> CliResult<Vec<DeviceSpec>> {
        let mut out = Vec::new();
        let cpu = ["cpu".to_string()];
        let names: &[String] = if self.device.is_empty() {
            &cpu
        } else {
            &self.device
        };
        for d in names {
            let spec = DeviceSpec::parse(d).map_err(input)?;
            spec.device()
                .map_err(|e| CliError::Input(format!("--device {d}: {e}")))?;
            out.push(spec);
        }
        Ok(out)
    }

    fn plan_for(&self, graph: &Graph, device: DeviceSpec) -> Plan {
        plan(
            graph,
            &TrainOptions {
                optimizer: self.optimizer,
                seq_len: self.seq_len,
                gpu: device.is_gpu(),
                ..TrainOptions::default()
            },
        )
    }

    fn request(&self, t: &Target, device: DeviceSpec, batch: u64, short: bool) -> WorkerRequest {
        WorkerRequest {
            model: t.source.clone(),
            device,
            batch,
            optimizer: self.optimizer,
            lr: self.lr,
            seq_len: t.seq_len,
            seed: self.seed,
            warmup: if short { 1 } else { self.warmup },
            min_steps: if short { 1 } else { 5 },
            min_time_s: if short {
                0.0
            } else {
                StopRule::default().min_time_s.min(self.time_cap / 2.0)
            },
            max_steps: if short {
                1
            } else {
                StopRule::default().max_steps
            },
            time_cap_s: self.time_cap,
            target_rel_err: StopRule::default().target_rel_err,
            memory_limit: if device.is_gpu() {
                None
            } else {
                self.memory_limit.map(|b| b.0)
            },
            threads: self.threads,
        }
    }
}

/// Measures one device: max-batch search (with a limit), throughput curve, knee.
pub fn probe_device(
    flags: &MeasureFlags,
    t: &Target,
    device: DeviceSpec,
    bar: &ProgressBar,
) -> CliResult<DeviceProbe> {
    let started = Instant::now();
    let exe = current_exe()?;
    let plan = flags.plan_for(t.graph, device);
    let timeout = Duration::from_secs_f64(flags.timeout);

    let search = match flags.memory_limit {
        Some(limit) => {
            if limit <= plan.memory.fixed_bytes {
                return Err(CliError::Input(format!(
                    "--memory-limit {limit} is below the model's fixed memory ({} for weights, gradients and optimizer state); raise the limit or use --optimizer sgd",
                    plan.memory.fixed_bytes
                )));
            }
            Some(search_max_batch(
                flags, t, device, &plan, limit, &exe, timeout, bar,
            ))
        }
        None => None,
    };
    let max_batch = search.as_ref().and_then(|s| s.max_batch);

    let explicit = !flags.batches.is_empty();
    let mut batches = if explicit {
        flags.batches.clone()
    } else {
        let top = max_batch.unwrap_or(flags.up_to).max(1);
        geometric_batches(1, top)
    };
    let mut points: Vec<ProbePoint> = Vec::new();
    let measure = |b: u64, points: &mut Vec<ProbePoint>| {
        bar.set_message(format!("{device}: timing batch {b}"));
        let planned = Some(plan.bytes_at(b));
        let point = match run_child(&exe, &flags.request(t, device, b, false), timeout) {
            Outcome::Measured(r) => {
                ProbePoint::measured(b, &r.summary(), r.peak_bytes, r.peak_rss_bytes, planned)
            }
            Outcome::OutOfMemory(why) => {
                ProbePoint::failed(b, planned, format!("out of memory ({why})"))
            }
            Outcome::Failed(e) => ProbePoint::failed(b, planned, e.to_string()),
            Outcome::Crashed(e) => ProbePoint::failed(b, planned, format!("crashed: {e}")),
            Outcome::TimedOut => ProbePoint::failed(
                b,
                planned,
                format!("timed out after {:.0} s", flags.timeout),
            ),
        };
        bar.inc(1);
        points.push(point);
    };
    bar.inc_length(batches.len() as u64);
    for &b in &batches {
        measure(b, &mut points);
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
    let mut knee_batch = knee(&curve(&points), flags.efficiency);
    // Refine between the knee and the sampled batch below it.
    if !explicit && let Some(k) = knee_batch {
        let below = points
            .iter()
            .filter(|p| p.ok() && p.batch < k)
            .map(|p| p.batch)
            .max();
        if let Some(below) = below {
            let extra = refine_between(below, k, 2);
            bar.inc_length(extra.len() as u64);
            for b in extra {
                measure(b, &mut points);
                batches.push(b);
            }
            knee_batch = knee(&curve(&points), flags.efficiency);
        }
    }
    points.sort_by_key(|p| p.batch);
    Ok(DeviceProbe {
        device: device.to_string(),
        threads: (!device.is_gpu()).then(|| flags.threads.unwrap_or_else(default_threads)),
        points,
        max_batch,
        knee_batch,
        efficiency: flags.efficiency,
        search_trials: search.as_ref().map_or(0, |s| s.trials.len()),
        search,
        seconds: started.elapsed().as_secs_f64(),
    })
}

#[allow(clippy::too_many_arguments)] // one search: its inputs are its inputs
fn search_max_batch(
    flags: &MeasureFlags,
    t: &Target,
    device: DeviceSpec,
    plan: &Plan,
    limit: Bytes,
    exe: &std::path::Path,
    timeout: Duration,
    bar: &ProgressBar,
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
    let result = find_max_batch(planned, &opts, |b| {
        bar.set_message(format!("{device}: does batch {b} fit in {limit}?"));
        bar.tick();
        match run_child(exe, &flags.request(t, device, b, true), timeout) {
            Outcome::Measured(r) => Trial::Fits {
                peak: Bytes(r.peak_bytes.unwrap_or(0)),
            },
            // A crash or time-out at some size is treated like not fitting, so the
            // search still ends; the throughput rows report the real cause.
            _ => Trial::OutOfMemory,
        }
    });
    MaxBatchSearch {
        budget_bytes: limit,
        max_batch: result.max_batch,
        smallest_failure: result.smallest_failure,
        planned_limit: plan.max_batch(limit),
        predicted_limit: result.predicted_limit,
        trials: result.trials,
        seconds: started.elapsed().as_secs_f64(),
    }
}

fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn current_exe() -> CliResult<PathBuf> {
    std::env::current_exe()
        .map_err(|e| CliError::Failure(format!("cannot find the batchfit binary: {e}")))
}

/// A progress bar on stderr (hidden when stderr is not a terminal).
pub fn progress(hidden: bool) -> ProgressBar {
    if hidden {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .expect("valid template"),
    );
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

pub fn run(args: ProbeArgs) -> CliResult {
    let source = args
        .model
        .clone()
        .unwrap_or_else(|| crate::options::DEFAULT_MODEL.to_string());
    let graph = load_model(Some(&source))?;
    batchfit_engine::model::check_trainable(&graph).map_err(input)?;
    let devices = args.measure.devices()?;
    let seq_len = args.measure.seq_len.or(graph.default_seq_len).unwrap_or(1);
    let target = Target {
        source,
        graph: &graph,
        seq_len,
    };
    let bar = progress(args.json);
    let mut results = Vec::new();
    for d in devices {
        results.push(probe_device(&args.measure, &target, d, &bar)?);
    }
    bar.finish_and_clear();
    if args.json {
        let doc = ProbeDocument {
            schema_version: batchfit_report::SCHEMA_VERSION,
            kind: "probe",
            model: &graph.name,
            parameters: graph.param_count(),
            optimizer: args.measure.optimizer.name(),
            devices: &results,
        };
        println!(
            "{}",
            serde_json::to_string_pretty(&doc).expect("serialises")
        );
    } else {
        print!("{}", render(&graph.name, &results));
    }
    Ok(())
}
