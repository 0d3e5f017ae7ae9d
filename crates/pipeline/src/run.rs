//! `run`: the user's own training command, once per batch size, each in a
//! fresh process tree through the one runner of `batchfit_exec`: the largest
//! batch that runs (exactly), the throughput curve and its knee.

use crate::output::check_output_folder;
use crate::{Error, Progress, Result};
use batchfit_exec::{CommandTemplate, Outcome, StepReader, TrialOptions, TrialResult, run_trial};
use batchfit_plan::Bytes;
use batchfit_report::probe::curve_with_errors;
use batchfit_report::probe::{DeviceProbe, ProbePoint};
use batchfit_report::run::{RunDocument, RunTrial};
use batchfit_tune::diagnose::StepPoint;
use batchfit_tune::knee::{knee, knee_range, refine_between, smooth_knee};
use batchfit_tune::lr::LrRule;
use batchfit_tune::search::{
    LadderResult, Line, PredictOptions, Verdict, each_listed, ladder_then_bisect,
    predict_then_bracket,
};
use std::cell::RefCell;
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use batchfit_exec::{Launcher, LauncherKind};

/// How to run the user's command.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// The command, with `{batch}` where the batch size goes.
    pub command: Vec<String>,
    /// Run exactly these batches instead of searching.
    pub batches: Vec<u64>,
    /// The search stops here.
    pub max_batch: u64,
    /// First batch of the doubling search.
    pub start: u64,
    pub timeout: Duration,
    /// `--throughput-regex`, else the `BATCHFIT {...}` protocol.
    pub throughput_regex: Option<String>,
    /// Reported steps left out as warm-up.
    pub warmup_steps: usize,
    /// The knee's share of the best throughput.
    pub efficiency: f64,
    /// Copy the command's output to stderr.
    pub show_output: bool,
    /// Checked before the first trial (the binary writes it).
    pub html: Option<PathBuf>,
    /// How the learning rate should follow the batch (from the command's optimizer).
    pub lr_rule: LrRule,
    /// Each process of a trial may map at most this much (RLIMIT_AS); with it
    /// the search predicts the largest batch from the measured peaks.
    pub memory_limit: Option<Bytes>,
    /// The predicting search stops when the largest batch that ran is within
    /// this share of the smallest that did not (0.02 = 2 %).
    pub tolerance: f64,
    /// Also report the batch that leaves this share of the limit free.
    pub margin: Option<f64>,
    /// Run the command through a data-parallel launcher; `{batch}` is then
    /// the per-device micro-batch.
    pub launcher: Option<Launcher>,
    /// Only the largest batch: no knee refinement (`run --lengths`, per bucket).
    pub search_only: bool,
}

/// Runs the trials: the search (or the listed batches), then the knee refinement.
pub fn run(cfg: &RunConfig, progress: &dyn Progress) -> Result<RunDocument> {
    // Everything the user can get wrong is checked before the first trial.
    let template = CommandTemplate::new(cfg.command.clone())?;
    let reader = match &cfg.throughput_regex {
        Some(p) => StepReader::regex(p)
            .map_err(|e| Error::input_because(format!("--throughput-regex `{p}`: {e}"), e))?,
        None => StepReader::Protocol,
    };
    if cfg.start > cfg.max_batch {
        return Err(Error::input(format!(
            "--start {} is above --max-batch {}",
            cfg.start, cfg.max_batch
        )));
    }
    if let Some(path) = &cfg.html {
        check_output_folder("--html", path)?;
    }
    if let Some(l) = &cfg.launcher {
        l.check()?;
    }
    batchfit_exec::interrupt::set_message(
        "the running trial's process tree was ended; no report was written",
    );

    let opts = TrialOptions {
        timeout: cfg.timeout,
        reader,
        warmup_steps: cfg.warmup_steps,
        echo: cfg.show_output,
        memory_limit: cfg.memory_limit.map(|b| b.0),
        launcher: cfg.launcher.clone(),
    };
    let started = Instant::now();
    let mut trials: Vec<RunTrial> = Vec::new();
    // Set when the program cannot start at all: bad input, not a result.
    let not_started: RefCell<Option<String>> = RefCell::new(None);
    let trial = |b: u64, reason: &'static str, trials: &mut Vec<RunTrial>| -> Verdict {
        if not_started.borrow().is_some() {
            return Verdict::Broken;
        }
        progress.add_length(1);
        progress.message(format!("batch {b} ({reason})"));
        let result = run_trial(&template, b, &opts, &mut |steps| {
            progress.message(format!("batch {b} ({reason}): {steps} steps"));
        });
        progress.advance(1);
        if let Outcome::NotStarted(why) = &result.outcome {
            *not_started.borrow_mut() = Some(why.clone());
        }
        // Under a limit the search reads the measured peak the limit holds.
        let peak = result.peak_vm_bytes.or(result.peak_host_bytes).map(Bytes);
        let v = result.outcome.verdict(peak);
        trials.push(RunTrial { reason, result });
        v
    };

    let search: LadderResult = if !cfg.batches.is_empty() {
        each_listed(&cfg.batches, |b, why| trial(b, why, &mut trials))
    } else if let Some(budget) = cfg.memory_limit {
        let opts = PredictOptions {
            start: cfg.start,
            cap: cfg.max_batch,
            budget,
            tolerance: cfg.tolerance,
            max_trials: 40,
        };
        predict_then_bracket(&opts, |b, why| trial(b, why, &mut trials))
    } else {
        // The first trial tells where the command runs: on an NVIDIA GPU (NVML
        // saw it) the budget is the device's memory and the measure NVML's use,
        // so the search can predict; elsewhere nothing bounds memory but the
        // machine, and the ladder doubles to the first out-of-memory.
        let first = trial(cfg.start.clamp(1, cfg.max_batch), "start", &mut trials);
        let gpu = trials.last().and_then(|t| {
            let r = &t.result;
            r.gpu_device
                .and_then(batchfit_exec::monitor::gpu_total_bytes)
                .filter(|_| r.peak_gpu_bytes.is_some())
        });
        match gpu {
            Some(total) => {
                let opts = PredictOptions {
                    start: cfg.start,
                    cap: cfg.max_batch,
                    budget: Bytes(total),
                    tolerance: cfg.tolerance,
                    max_trials: 40,
                };
                let mut done_first = Some(first);
                predict_then_bracket(&opts, |b, why| match done_first.take() {
                    // The start trial already ran: its verdict, now read as GPU memory.
                    Some(_) => gpu_verdict(trials.last().map(|t| &t.result)),
                    None => {
                        trial(b, why, &mut trials);
                        gpu_verdict(trials.last().map(|t| &t.result))
                    }
                })
            }
            None => {
                let mut done_first = Some(first);
                ladder_then_bisect(cfg.start, cfg.max_batch, |b, why| match done_first.take() {
                    Some(v) => v,
                    None => trial(b, why, &mut trials),
                })
            }
        }
    };
    let search_trials = trials.len();
    if let Some(why) = not_started.take() {
        let check = if cfg.launcher.is_some() {
            "check --launcher / --launcher-cmd"
        } else {
            "check the command after `--`"
        };
        return Err(Error::input(format!("{why}; {check}")));
    }

    // The knee, refined between it and the sampled batch below it.
    let curve = |trials: &[RunTrial]| -> Vec<(u64, f64)> {
        trials
            .iter()
            .filter(|t| t.result.outcome == Outcome::Ran)
            .filter_map(|t| {
                t.result
                    .steps
                    .as_ref()
                    .map(|s| (t.result.batch, s.samples_per_s))
            })
            .collect()
    };
    // A predicting search samples the curve sparsely: refine until the batch
    // below the knee is within a factor 2 of it (three rounds at most).
    // The step-time line's knee where the line explains the points, else the medians'.
    let knee_of = |trials: &[RunTrial]| {
        let steps: Vec<StepPoint> = trials
            .iter()
            .filter(|t| t.result.outcome == Outcome::Ran)
            .filter_map(|t| {
                t.result.steps.as_ref().map(|s| StepPoint {
                    batch: t.result.batch,
                    step_s: s.step_time.median,
                    rel_err: s.step_time.rel_std_err,
                })
            })
            .collect();
        smooth_knee(&steps, cfg.efficiency).or_else(|| knee(&curve(trials), cfg.efficiency))
    };
    let mut knee_batch = knee_of(&trials);
    for _ in 0..3 {
        let Some(k) = knee_batch.filter(|_| cfg.batches.is_empty() && !cfg.search_only) else {
            break;
        };
        let below = curve(&trials).iter().map(|p| p.0).filter(|&b| b < k).max();
        let Some(below) = below.filter(|&b| b * 2 < k || !refined_once(&trials)) else {
            break;
        };
        let extra = refine_between(below, k, 2);
        if extra.is_empty() {
            break;
        }
        for b in extra {
            trial(b, "knee refinement", &mut trials);
        }
        knee_batch = knee_of(&trials);
    }

    let with_margin = cfg
        .margin
        .zip(search.max_batch)
        .map(|(m, max)| batch_with_margin(&trials, cfg.memory_limit, max, m));
    let device = device_probe(
        &trials,
        search.max_batch,
        knee_batch,
        cfg.efficiency,
        started,
    );
    let (noise, target_loss) = crate::run_advice::noise_of(&trials);
    let advice = crate::run_advice::advise_run(&device, &trials, noise.as_ref(), cfg.lr_rule);
    Ok(RunDocument {
        schema_version: batchfit_report::SCHEMA_VERSION,
        kind: "run",
        command: template.display(),
        launch_command: cfg
            .launcher
            .as_ref()
            .map(|l| CommandTemplate::display_argv(&l.wrap(template.argv()))),
        world_size: cfg.launcher.as_ref().map_or(1, Launcher::world_size),
        devices: vec![device],
        noise,
        recommendation: advice.recommendation,
        time_to_target: advice.time_to_target,
        target_loss,
        findings: advice.findings,
        trials,
        max_batch: search.max_batch,
        smallest_failure: search.smallest_failure,
        stopped_at: search.stopped_at,
        capped: search.capped,
        search_trials,
        memory_limit_bytes: cfg.memory_limit,
        batch_with_margin: with_margin,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// A trial's verdict with its peak GPU memory (NVML) as the measured peak.
fn gpu_verdict(r: Option<&TrialResult>) -> Verdict {
    match r {
        Some(r) => r.outcome.verdict(r.peak_gpu_bytes.map(Bytes)),
        None => Verdict::Broken,
    }
}

/// Whether a knee refinement already ran.
fn refined_once(trials: &[RunTrial]) -> bool {
    trials.iter().any(|t| t.reason == "knee refinement")
}

/// The largest batch that leaves `margin` of the memory free: on the line
/// through the measured peaks of the two largest batches that ran when a limit
/// was given, else `max_batch` shrunk by the margin.
fn batch_with_margin(trials: &[RunTrial], limit: Option<Bytes>, max: u64, margin: f64) -> u64 {
    let mut peaks: Vec<(u64, f64)> = trials
        .iter()
        .filter(|t| t.result.outcome == Outcome::Ran)
        .filter_map(|t| {
            let r = &t.result;
            r.peak_vm_bytes
                .or(r.peak_host_bytes)
                .map(|p| (r.batch, p as f64))
        })
        .collect();
    peaks.sort_by_key(|p| p.0);
    peaks.dedup_by_key(|p| p.0);
    let fitted = match (limit, peaks.as_slice()) {
        (Some(l), [.., a, b]) => Line::through(*a, *b)
            .map(|line| line.max_batch(Bytes((l.as_f64() * (1.0 - margin)) as u64))),
        _ => None,
    };
    fitted
        .unwrap_or(((max as f64) * (1.0 - margin)).floor() as u64)
        .clamp(1, max)
}

/// The trials in `probe`'s shape, one point per batch (its last trial).
fn device_probe(
    trials: &[RunTrial],
    max_batch: Option<u64>,
    knee_batch: Option<u64>,
    efficiency: f64,
    started: Instant,
) -> DeviceProbe {
    let mut points: Vec<ProbePoint> = Vec::new();
    for t in trials {
        points.retain(|p| p.batch != t.result.batch);
        points.push(point(&t.result));
    }
    points.sort_by_key(|p| p.batch);
    let gpu = trials.iter().find_map(|t| t.result.gpu_device);
    DeviceProbe {
        knee_range: knee_range(&curve_with_errors(&points), efficiency),
        device: gpu.map_or_else(|| "host".to_string(), |d| format!("cuda:{d}")),
        threads: None,
        points,
        max_batch,
        knee_batch,
        efficiency,
        search_trials: trials.len(),
        search: None,
        seconds: started.elapsed().as_secs_f64(),
        budget: None,
    }
}

fn point(r: &TrialResult) -> ProbePoint {
    match (&r.outcome, &r.steps) {
        (Outcome::Ran, Some(s)) => {
            let mut p = ProbePoint::measured(
                r.batch,
                &s.step_time,
                r.peak_gpu_bytes.or(r.peak_host_bytes),
                r.peak_host_bytes,
                None,
            );
            // Commands report samples per step; they may differ from the batch.
            p.samples_per_s = s.samples_per_s;
            p
        }
        (Outcome::Ran, None) => {
            let mut p = ProbePoint::failed(r.batch, None, String::new());
            p.failure = None;
            p.samples_per_s = f64::NAN;
            p.peak_bytes = r
                .peak_gpu_bytes
                .or(r.peak_host_bytes)
                .map(batchfit_plan::Bytes);
            p.peak_rss_bytes = r.peak_host_bytes.map(batchfit_plan::Bytes);
            p
        }
        (outcome, _) => ProbePoint::failed(r.batch, None, outcome.to_string()),
    }
}
