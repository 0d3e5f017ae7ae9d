//! `batchfit run`: the user's own training command, once per batch size, each
//! in a fresh process tree: the largest batch that runs (exactly), the
//! throughput curve and its knee.

use crate::error::{CliError, CliResult};
use crate::options::{check_output_folder, positive_u64};
use batchfit_exec::{CommandTemplate, Outcome, StepReader, TrialOptions, TrialResult, run_trial};
use batchfit_report::probe::{DeviceProbe, ProbePoint};
use batchfit_report::run::{RunDocument, RunTrial, html, render};
use batchfit_tune::knee::{knee, refine_between};
use batchfit_tune::search::{LadderResult, Verdict, each_listed, ladder_then_bisect};
use clap::Args;
use std::cell::RefCell;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Args, Clone, Debug)]
#[command(
    after_help = "Example:\n  batchfit run -- python train.py --batch-size {batch} --steps 30\n\n\
Each trial runs the command with {batch} replaced (also exported as BATCHFIT_BATCH) in a fresh\n\
process group. Step times come from lines `BATCHFIT {\"seconds\": 0.031}` the command prints per\n\
step (docs/run.md, examples/) or from --throughput-regex."
)]
pub struct RunArgs {
    /// Run exactly these batch sizes (comma-separated) instead of searching.
    #[arg(long, value_delimiter = ',', value_parser = positive_u64)]
    pub batches: Vec<u64>,
    /// Largest batch to try; the search stops there.
    #[arg(long, default_value_t = 1 << 20, value_parser = positive_u64)]
    pub max_batch: u64,
    /// First batch of the doubling search.
    #[arg(long, default_value_t = 1, value_parser = positive_u64)]
    pub start: u64,
    /// A trial still running after this long is ended and reported (e.g. 120s).
    #[arg(long, default_value = "600s", value_parser = crate::cmd::probe::parse_seconds)]
    pub timeout: f64,
    /// Read step times from output lines matching this regular expression, with a named
    /// group `seconds` (per step) or `samples_per_s`, optionally `samples`.
    #[arg(long)]
    pub throughput_regex: Option<String>,
    /// Reported steps left out of the statistics as warm-up.
    #[arg(long, default_value_t = 2)]
    pub warmup_steps: usize,
    /// The knee is the smallest batch reaching this share of the best throughput.
    #[arg(long, default_value_t = 0.9, value_parser = crate::cmd::probe::parse_share)]
    pub efficiency: f64,
    /// Copy the command's output to stderr, each line prefixed with its batch.
    #[arg(long)]
    pub show_output: bool,
    /// Print the trials as JSON (schema: docs/json.md).
    #[arg(long)]
    pub json: bool,
    /// Also write an HTML report with plots to this file.
    #[arg(long)]
    pub html: Option<PathBuf>,
    /// The training command, after `--`, with {batch} where the batch size goes.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

pub fn run(args: RunArgs) -> CliResult {
    // Everything the user can get wrong is checked before the first trial.
    let template = CommandTemplate::new(args.command.clone()).map_err(CliError::Input)?;
    let reader = match &args.throughput_regex {
        Some(p) => StepReader::regex(p)
            .map_err(|e| CliError::Input(format!("--throughput-regex `{p}`: {e}")))?,
        None => StepReader::Protocol,
    };
    if args.start > args.max_batch {
        return Err(CliError::Input(format!(
            "--start {} is above --max-batch {}",
            args.start, args.max_batch
        )));
    }
    if let Some(path) = &args.html {
        check_output_folder("--html", path)?;
    }
    batchfit_exec::interrupt::install(
        "the running trial's process tree was ended; no report was written".into(),
    )
    .map_err(CliError::Failure)?;

    let opts = TrialOptions {
        timeout: Duration::from_secs_f64(args.timeout),
        reader,
        warmup_steps: args.warmup_steps,
        echo: args.show_output,
    };
    let started = Instant::now();
    let bar = crate::cmd::probe::progress(args.json || args.show_output);
    let mut trials: Vec<RunTrial> = Vec::new();
    // Set when the program cannot start at all: bad input, not a result.
    let not_started: RefCell<Option<String>> = RefCell::new(None);
    let trial = |b: u64, reason: &'static str, trials: &mut Vec<RunTrial>| -> Verdict {
        if not_started.borrow().is_some() {
            return Verdict::Broken;
        }
        bar.inc_length(1);
        bar.set_message(format!("batch {b} ({reason})"));
        let result = run_trial(&template, b, &opts, &mut |steps| {
            bar.set_message(format!("batch {b} ({reason}): {steps} steps"));
        });
        bar.inc(1);
        if let Outcome::NotStarted(why) = &result.outcome {
            *not_started.borrow_mut() = Some(why.clone());
        }
        let v = result.outcome.verdict();
        trials.push(RunTrial { reason, result });
        v
    };

    let search: LadderResult = if args.batches.is_empty() {
        ladder_then_bisect(args.start, args.max_batch, |b, why| {
            trial(b, why, &mut trials)
        })
    } else {
        each_listed(&args.batches, |b, why| trial(b, why, &mut trials))
    };
    if let Some(why) = not_started.take() {
        bar.finish_and_clear();
        return Err(CliError::Input(format!(
            "{why}; check the command after `--`"
        )));
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
    let mut knee_batch = knee(&curve(&trials), args.efficiency);
    if args.batches.is_empty()
        && let Some(k) = knee_batch
    {
        let below = curve(&trials).iter().map(|p| p.0).filter(|&b| b < k).max();
        if let Some(below) = below {
            for b in refine_between(below, k, 2) {
                trial(b, "knee refinement", &mut trials);
            }
            knee_batch = knee(&curve(&trials), args.efficiency);
        }
    }
    bar.finish_and_clear();

    let doc = RunDocument {
        schema_version: batchfit_report::SCHEMA_VERSION,
        kind: "run",
        command: template.display(),
        devices: vec![device_probe(
            &trials,
            search.max_batch,
            knee_batch,
            args.efficiency,
            started,
        )],
        trials,
        max_batch: search.max_batch,
        smallest_failure: search.smallest_failure,
        stopped_at: search.stopped_at,
        capped: search.capped,
        seconds: started.elapsed().as_secs_f64(),
    };
    crate::options::emit_with_html(&doc, args.json, render, args.html.as_deref(), html)?;
    Ok(())
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
        device: gpu.map_or_else(|| "host".to_string(), |d| format!("cuda:{d}")),
        threads: None,
        points,
        max_batch,
        knee_batch,
        efficiency,
        search_trials: trials.len(),
        search: None,
        seconds: started.elapsed().as_secs_f64(),
    }
}

fn point(r: &TrialResult) -> ProbePoint {
    let failed = |why: String| ProbePoint::failed(r.batch, None, why);
    match &r.outcome {
        Outcome::Ran => match &r.steps {
            Some(s) => {
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
            None => {
                let mut p = failed(String::new());
                p.failure = None;
                p.samples_per_s = f64::NAN;
                p.peak_bytes = r
                    .peak_gpu_bytes
                    .or(r.peak_host_bytes)
                    .map(batchfit_plan::Bytes);
                p.peak_rss_bytes = r.peak_host_bytes.map(batchfit_plan::Bytes);
                p
            }
        },
        Outcome::OutOfMemory(why) => failed(format!("out of memory ({why})")),
        Outcome::Crashed(why) => failed(format!("crashed: {why}")),
        Outcome::TimedOut => failed("timed out".into()),
        Outcome::NotStarted(why) => failed(why.clone()),
    }
}
