//! `run`: the user's own training command, once per batch size, each in a
//! fresh process tree through the one runner of `batchfit_exec`
//! ([`CommandTrials`]). The searches, the measuring loop and the advice are
//! `batchfit_tune`'s.

use crate::output::check_html_output;
use crate::{Error, Progress, Result};
use batchfit_exec::{CommandTemplate, Outcome, StepReader, TrialOptions, TrialResult, run_trial};
use batchfit_plan::Bytes;
use batchfit_tune::device::DeviceSpec;
use batchfit_tune::knee::knee_range;
use batchfit_tune::lr::{LrRule, LrScaling};
use batchfit_tune::measure::{
    CurvePlan, Measurement, REFINE_ROUNDS, Trials, Warmup, gap_samples, measure_curve,
};
use batchfit_tune::probe::{DeviceProbe, ProbePoint, curve_with_errors};
use batchfit_tune::run::{
    NOISE_TRIAL_BATCH, RunRate, RunSummary, advise_run, batch_with_margin, noise_of,
    noise_trial_batch, trial_point,
};
use batchfit_tune::search::{
    LadderResult, PredictOptions, TrialReason, Verdict, each_listed, ladder_then_bisect,
    predict_then_bracket, predicting,
};
use batchfit_tune::trial::RunTrial;
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use batchfit_exec::{Launcher, LauncherKind};

/// `{seed}` in every trial of `run` (and `BATCHFIT_SEED`): `run --verify`
/// trains from the seeds after it, so that it measures trainings the run
/// never saw.
pub const RUN_TRIAL_SEED: u64 = 0;

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
    /// `--ref-lr` (at `--ref-batch`) under `lr_rule`: each trial's rate, put
    /// where the command has `{lr}` and exported as `BATCHFIT_LR`.
    pub lr: Option<LrScaling>,
    /// `--ref-batch` without `--ref-lr`: where the command's own fixed rate was tuned.
    pub tuned_at: Option<u64>,
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
    /// Bytes per sample from the plan of the same network (`--model`), for
    /// the predicting search.
    pub per_sample_hint: Option<PerSampleHint>,
    /// Where the command reports noise measurements, one more trial that
    /// measures on every step (the noise trial; `--no-noise-trial` skips it).
    pub noise_trial: bool,
}

/// The plan's per-sample bytes of the command's network, where each search
/// holds its peaks: the process's address space, or the GPU's memory.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PerSampleHint {
    pub host: f64,
    pub gpu: f64,
}

/// The user's command as the measuring loop's runner: every trial a fresh
/// process tree, logged in order with why it ran.
pub struct CommandTrials<'a> {
    template: &'a CommandTemplate,
    opts: &'a TrialOptions,
    progress: &'a dyn Progress,
    started: Instant,
    /// Every trial in the order it ran.
    pub log: Vec<RunTrial>,
    /// Set when the program cannot start at all: bad input, not a result.
    pub not_started: Option<String>,
}

impl CommandTrials<'_> {
    /// Runs `batch`; the trial's verdict reads the peak the search holds
    /// against its budget: the process's (`--memory-limit`) or the GPU's.
    fn trial(&mut self, batch: u64, reason: TrialReason, gpu: bool) -> Measurement {
        if self.not_started.is_some() {
            let point = ProbePoint::ended(batch, None, &Outcome::NotStarted(String::new()));
            return Measurement {
                point,
                verdict: Verdict::Broken,
            };
        }
        let progress = self.progress;
        let label = reason.label();
        progress.add_length(1);
        progress.message(format!("batch {batch} ({label})"));
        let result = run_trial(self.template, batch, self.opts, &mut |steps| {
            progress.message(format!("batch {batch} ({label}): {steps} steps"));
        });
        progress.advance(1);
        if let Outcome::NotStarted(why) = &result.outcome {
            self.not_started = Some(why.clone());
        }
        let peak = if gpu {
            result.peak_gpu_bytes
        } else {
            result.peak_vm_bytes.or(result.peak_host_bytes)
        };
        let measurement = Measurement {
            point: trial_point(&result),
            verdict: result.outcome.verdict(peak.map(Bytes)),
        };
        self.log.push(RunTrial { reason, result });
        measurement
    }

    /// `run`'s noise trial at `batch`: the helper asked to measure on every
    /// step (`BATCHFIT_NOISE_EVERY=1`), as `advise`'s noise run does; its
    /// step times are not a point of the curve.
    fn noise_trial(&mut self, batch: u64) {
        let progress = self.progress;
        progress.add_length(1);
        progress.message(format!("batch {batch} (noise trial)"));
        let opts = TrialOptions {
            noise_every: Some(1),
            ..self.opts.clone()
        };
        let result = run_trial(self.template, batch, &opts, &mut |steps| {
            progress.message(format!("batch {batch} (noise trial): {steps} steps"));
        });
        progress.advance(1);
        self.log.push(RunTrial {
            reason: TrialReason::Noise,
            result,
        });
    }

    /// The last trial's result.
    fn last(&self) -> Option<&TrialResult> {
        self.log.last().map(|t| &t.result)
    }

    /// One point per batch: its last trial (the noise trial's step times, which
    /// include measuring every step, are not a point).
    fn points(&self) -> Vec<ProbePoint> {
        let mut points: Vec<ProbePoint> = Vec::new();
        for t in self.log.iter().filter(|t| t.reason != TrialReason::Noise) {
            points.retain(|p| p.batch != t.result.batch);
            points.push(trial_point(&t.result));
        }
        points.sort_by_key(|p| p.batch);
        points
    }
}

impl Trials for CommandTrials<'_> {
    fn measure(&mut self, batch: u64, reason: TrialReason, _: Warmup) -> Measurement {
        self.trial(batch, reason, false)
    }

    fn elapsed_s(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }
}

/// Runs the trials: the search (or the listed batches), then the knee refinement.
pub fn run(cfg: &RunConfig, progress: &dyn Progress) -> Result<RunSummary> {
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
        check_html_output("--html", path)?;
    }
    if let Some(l) = &cfg.launcher {
        l.check()?;
    }
    let mut learning_rate = match (cfg.lr, template.takes_lr()) {
        (Some(scaling), in_command) => RunRate::Handed {
            scaling,
            in_command,
        },
        (None, true) => {
            return Err(Error::input(
                "the command takes {lr}: give --ref-lr, the learning rate tuned at --ref-batch \
                 (default: the first batch run tries), and each trial trains at the rule's rate \
                 for its batch",
            ));
        }
        (None, false) => RunRate::CommandsOwn {
            assumed_rule: cfg.lr_rule,
            tuned_at: cfg.tuned_at,
        },
    };
    batchfit_exec::interrupt::set_message(
        "the running trial's process tree was ended; no report was written",
    );
    let mut opts = TrialOptions {
        timeout: cfg.timeout,
        reader,
        warmup_steps: cfg.warmup_steps,
        echo: cfg.show_output,
        memory_limit: cfg.memory_limit.map(|b| b.0),
        launcher: cfg.launcher.clone(),
        lr: cfg.lr,
        seed: Some(RUN_TRIAL_SEED),
        stop_at: None,
        noise_every: None,
    };
    let started = Instant::now();
    // Listed batches at handed rates: the noise trial first, and the rule's rate held
    // from its noise scale up in the trials after it, as `advise` holds its rate.
    let first = match (&mut learning_rate, noise_first_batch(cfg)) {
        (RunRate::Handed { scaling, .. }, Some(batch)) => {
            let mut noise = CommandTrials {
                template: &template,
                opts: &opts,
                progress,
                started,
                log: Vec::new(),
                not_started: None,
            };
            noise.noise_trial(batch);
            let log = noise.log;
            if let Some(cap) = rate_cap(&log, scaling) {
                scaling.cap_batch = Some(cap);
                opts.lr = Some(*scaling);
            }
            log
        }
        _ => Vec::new(),
    };
    // Where it could not run (out of memory at its batch), one runs last as in a search.
    let noise_ran_first = first.iter().any(|t| t.result.outcome.ran());
    let mut trials = CommandTrials {
        template: &template,
        opts: &opts,
        progress,
        started,
        log: first,
        not_started: None,
    };
    let search = search(cfg, &mut trials);
    let search_trials = trials
        .log
        .iter()
        .filter(|t| t.reason != TrialReason::Noise)
        .count();
    if let Some(why) = trials.not_started.take() {
        let check = if cfg.launcher.is_some() {
            "check --launcher / --launcher-cmd"
        } else {
            "check the command after `--`"
        };
        return Err(Error::input(format!("{why}; {check}")));
    }
    // The search's trials are the curve's samples, its wide gaps sampled
    // (a search from the plan jumps from the start to the limit); the knee
    // is refined between them.
    let seeded = trials.points();
    let ran: Vec<u64> = seeded.iter().filter(|p| p.ok()).map(|p| p.batch).collect();
    let curve_plan = CurvePlan {
        batches: if cfg.batches.is_empty() && !cfg.search_only {
            gap_samples(&ran)
        } else {
            Vec::new()
        },
        listed: !cfg.batches.is_empty(),
        refine_rounds: if cfg.search_only { 0 } else { REFINE_ROUNDS },
        settle_rounds: 0,
        efficiency: cfg.efficiency,
        b_noise: None,
        budget: None,
    };
    let curve = measure_curve(&mut trials, &curve_plan, seeded);
    if cfg.noise_trial
        && !cfg.search_only
        && !noise_ran_first
        && let Some(batch) = noise_trial_batch(&trials.log)
    {
        trials.noise_trial(batch);
    }
    let log = trials.log;
    let gpu = log.iter().find_map(|t| t.result.gpu_device);
    let points = curve.points;
    let device = DeviceProbe {
        knee_range: knee_range(&curve_with_errors(&points), cfg.efficiency)
            .map(|r| r.covering(curve.knee_batch)),
        device: gpu.map_or(DeviceSpec::Host, |d| DeviceSpec::Cuda(d as usize)),
        threads: None,
        points,
        max_batch: search.max_batch,
        knee_batch: curve.knee_batch,
        efficiency: cfg.efficiency,
        search_trials: log.len(),
        search: None,
        seconds: started.elapsed().as_secs_f64(),
        budget: None,
        between_process_error: curve.between_process_error,
    };
    let (noise, target_loss) = noise_of(&log, &learning_rate);
    let limit_found = search.smallest_failure.is_some();
    let advice = advise_run(&device, limit_found, &log, noise.as_ref(), &learning_rate);
    Ok(RunSummary {
        command: template.display(),
        launch_command: cfg
            .launcher
            .as_ref()
            .map(|l| CommandTemplate::display_argv(&l.wrap(template.argv()))),
        world_size: cfg.launcher.as_ref().map_or(1, Launcher::world_size),
        batch_with_margin: cfg
            .margin
            .zip(search.max_batch)
            .map(|(m, max)| batch_with_margin(&log, cfg.memory_limit, max, m)),
        device,
        noise,
        advice,
        target_loss,
        trials: log,
        max_batch: search.max_batch,
        smallest_failure: search.smallest_failure,
        stopped_at: search.stopped_at,
        capped: search.capped,
        search_trials,
        memory_limit_bytes: cfg.memory_limit,
        seconds: started.elapsed().as_secs_f64(),
        learning_rate,
    })
}

/// Where the noise trial runs before the listed batches: [`NOISE_TRIAL_BATCH`] within
/// them, when they are listed and a noise trial is wanted. A search runs its noise
/// trial last, at a batch that ran.
fn noise_first_batch(cfg: &RunConfig) -> Option<u64> {
    let (lo, hi) = (cfg.batches.iter().min()?, cfg.batches.iter().max()?);
    (cfg.noise_trial && !cfg.search_only).then(|| NOISE_TRIAL_BATCH.clamp(*lo, *hi))
}

/// The batch from which the rule's rate is held: the noise trial's B_noise (never
/// below its own batch, whose rate it trained with), as `advise` holds its rate from
/// its noise run's (Adam's best rate stops rising near B_noise). `None` when the
/// trial did not run or reported no noise measurements.
fn rate_cap(noise_trial: &[RunTrial], scaling: &LrScaling) -> Option<u64> {
    let rate = RunRate::Handed {
        scaling: *scaling,
        in_command: true,
    };
    let (noise, _) = noise_of(noise_trial, &rate);
    let noise = noise.filter(|n| n.b_noise.is_finite() && n.b_noise > 0.0)?;
    Some((noise.b_noise.round() as u64).max(noise.batch))
}

/// The largest batch that runs: the listed batches; under `--memory-limit`
/// the predicting search; else one trial tells where the command runs: on an
/// NVIDIA GPU (NVML saw it) the budget is the device's memory and the measure
/// NVML's use, so the search can predict; elsewhere nothing bounds memory but
/// the machine, and the ladder doubles to the first out-of-memory.
fn search(cfg: &RunConfig, trials: &mut CommandTrials) -> LadderResult {
    let predicting = |budget: Bytes, gpu: bool| PredictOptions {
        start: cfg.start,
        cap: cfg.max_batch,
        budget,
        tolerance: cfg.tolerance,
        max_trials: predicting::MAX_TRIALS,
        per_sample_hint: cfg
            .per_sample_hint
            .map(|h| if gpu { h.gpu } else { h.host }),
    };
    if !cfg.batches.is_empty() {
        return each_listed(&cfg.batches, |b, why| trials.trial(b, why, false).verdict);
    }
    if let Some(budget) = cfg.memory_limit {
        return predict_then_bracket(&predicting(budget, false), |b, why| {
            trials.trial(b, why, false).verdict
        });
    }
    let start = cfg.start.clamp(1, cfg.max_batch);
    let first = trials.trial(start, TrialReason::Start, false).verdict;
    let gpu_total = trials.last().and_then(|r| {
        r.gpu_device
            .and_then(batchfit_exec::monitor::gpu_total_bytes)
            .filter(|_| r.peak_gpu_bytes.is_some())
    });
    match gpu_total {
        Some(total) => {
            let mut first = Some(());
            predict_then_bracket(&predicting(Bytes(total), true), |b, why| {
                match first.take() {
                    // The start trial already ran: its verdict, now read as GPU memory.
                    Some(()) => gpu_verdict(trials.last()),
                    None => trials.trial(b, why, true).verdict,
                }
            })
        }
        None => {
            let mut first = Some(first);
            ladder_then_bisect(cfg.start, cfg.max_batch, |b, why| match first.take() {
                Some(v) => v,
                None => trials.trial(b, why, false).verdict,
            })
        }
    }
}

/// A trial's verdict with its peak GPU memory (NVML) as the measured peak.
fn gpu_verdict(r: Option<&TrialResult>) -> Verdict {
    match r {
        Some(r) => r.outcome.verdict(r.peak_gpu_bytes.map(Bytes)),
        None => Verdict::Broken,
    }
}
