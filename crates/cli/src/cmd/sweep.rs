//! `batchfit sweep`: real short trainings at several batch sizes and seeds on
//! real data, with validation, to test the noise-scale predictions and answer
//! "does this batch size hurt quality?".

use crate::error::CliResult;
use crate::options::{
    BatchesFlag, DataFlags, DeviceFlag, HtmlFlag, JsonFlag, OptimizerFlag, ReferenceFlags,
    ThreadsFlag, emit_with_html, non_negative_f64, positive_f64, positive_u64, progress,
};
use crate::options::{SeedsFlag, VerifyFlag};
use batchfit_pipeline::probe::parse_devices;
use batchfit_pipeline::sweep::{
    DEFAULT_SPLIT_SEED, DEFAULT_VAL_SPLIT, ScheduleChoice, SweepConfig, sweep,
};
use batchfit_pipeline::verify::{data_source, read_advice};
use batchfit_report::sweep::{SweepDocument, html, render};
use batchfit_tune::lr::LrRule;
use batchfit_tune::schedule::Schedule;
use batchfit_tune::verify::CheckedAdvice;
use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
// An advice under check sets the rates, target and device itself.
#[command(group(clap::ArgGroup::new("set_by_advice").multiple(true).conflicts_with("verify").args(["lr_rule", "ref_batch", "ref_lr", "lr_cap", "optimizer", "warmup_epochs", "target_loss", "device"])))]
pub struct SweepArgs {
    /// zoo:NAME, a .toml layer spec or an .onnx file [default: zoo:digits-mlp].
    pub model: Option<String>,
    #[command(flatten)]
    pub data: DataFlags,
    #[command(flatten)]
    pub batches: BatchesFlag,
    /// Also train a batch-size schedule on every seed, beside the fixed batches: `ramp` (from
    /// the noise scale along a run on the training split: the batch doubles as the noise scale
    /// grows, within the batches swept) or FILE (the JSON of `batchfit schedule --json`, or
    /// `{"stages": [{"from_samples": 0, "batch": 32, "lr": 0.001}, ...]}`).
    #[arg(long, value_name = "ramp|FILE")]
    pub schedule: Option<String>,
    #[command(flatten)]
    pub verify: VerifyFlag,
    /// How the learning rate follows the batch [default: sqrt for Adam-family
    /// optimizers, linear for SGD].
    #[arg(long, value_enum)]
    pub lr_rule: Option<LrRule>,
    #[command(flatten)]
    pub reference: ReferenceFlags,
    /// Hold the learning rate above this batch: larger batches train at its rate (the best
    /// rate stops growing near B_noise; `advise` predicts with such a cap).
    #[arg(long, value_parser = positive_u64)]
    pub lr_cap: Option<u64>,
    #[command(flatten)]
    pub optimizer: OptimizerFlag,
    /// Epochs over which the learning rate rises linearly from the reference rate to the
    /// scaled one, for batches above --ref-batch (Goyal et al. use 5 of 90).
    #[arg(long, default_value_t = 1.0, value_parser = non_negative_f64)]
    pub warmup_epochs: f64,
    /// Train each run until this training loss (on a fixed training subset); without it the
    /// target is the lowest loss every run reached within --epochs.
    #[arg(long, value_parser = positive_f64)]
    pub target_loss: Option<f64>,
    /// Epoch budget of each run.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub epochs: u32,
    /// Share of the rows held out for validation (the same split for every run).
    #[arg(long, default_value_t = DEFAULT_VAL_SPLIT, value_parser = parse_split)]
    pub val_split: f64,
    #[command(flatten)]
    pub seeds: SeedsFlag,
    /// Seed of the train/validation split.
    #[arg(long, default_value_t = DEFAULT_SPLIT_SEED)]
    pub split_seed: u64,
    /// Skip the noise-scale measurement the fitted B_noise is compared with.
    #[arg(long)]
    pub no_noise: bool,
    /// Write each run's record to DIR as it finishes (one JSON per run).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// With --out: keep the runs already in DIR and train only the missing ones.
    #[arg(long, requires = "out")]
    pub resume: bool,
    #[command(flatten)]
    pub threads: ThreadsFlag,
    #[command(flatten)]
    pub device: DeviceFlag,
    #[command(flatten)]
    pub json: JsonFlag,
    #[command(flatten)]
    pub html: HtmlFlag,
}

fn parse_split(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x > 0.0 && x <= 0.5 => Ok(x),
        _ => Err(format!("`{s}` must be a share in (0, 0.5], e.g. 0.1")),
    }
}

pub fn run(args: SweepArgs) -> CliResult {
    let cfg = match &args.verify.verify {
        Some(path) => verifying(&args, read_advice(path)?)?,
        None => config(&args)?,
    };
    let bar = progress(args.json.json);
    bar.0.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} run {msg} (about {eta} left)",
        )
        .expect("valid template"),
    );
    let doc = sweep(&cfg, &bar)?;
    drop(bar);
    emit_with_html(
        &doc,
        &SweepDocument::new(&doc),
        args.json.json,
        render,
        args.html.html.as_deref(),
        html,
    )
}

/// The sweep that checks `advice`: its model and data unless given, its
/// device, rule, reference, cap and target; no warm-up; no second noise run.
fn verifying(args: &SweepArgs, advice: CheckedAdvice) -> CliResult<SweepConfig> {
    let lr = advice.basis.lr;
    Ok(SweepConfig {
        model: args.model.clone().or_else(|| advice.inputs.model.clone()),
        data: data_source(&advice, &args.data.source()?)?,
        batches: if args.batches.batches.is_empty() {
            advice.default_batches()
        } else {
            args.batches.batches.clone()
        },
        lr_rule: Some(lr.rule),
        ref_batch: Some(lr.ref_batch),
        ref_lr: lr.ref_lr,
        lr_cap: lr.cap_batch,
        optimizer: advice.inputs.optimizer,
        warmup_epochs: 0.0,
        target_loss: Some(advice.basis.target_loss),
        no_noise: true,
        devices: vec![advice.device],
        verify: Some(advice),
        ..config(args)?
    })
}

/// The sweep the flags describe.
fn config(args: &SweepArgs) -> CliResult<SweepConfig> {
    Ok(SweepConfig {
        model: args.model.clone(),
        data: args.data.source()?,
        batches: if args.batches.batches.is_empty() {
            vec![16, 64, 256]
        } else {
            args.batches.batches.clone()
        },
        lr_rule: args.lr_rule,
        ref_batch: args.reference.ref_batch,
        ref_lr: args.reference.ref_lr.unwrap_or(1e-3),
        lr_cap: args.lr_cap,
        optimizer: args.optimizer.optimizer,
        warmup_epochs: args.warmup_epochs,
        target_loss: args.target_loss,
        epochs: args.epochs,
        val_split: args.val_split,
        seeds: args.seeds.seeds,
        split_seed: args.split_seed,
        no_noise: args.no_noise,
        out: args.out.clone(),
        resume: args.resume,
        threads: args.threads.threads,
        devices: if args.device.device.is_empty() {
            vec![batchfit_engine::DeviceSpec::Cpu]
        } else {
            parse_devices(&args.device.device)?
        },
        html: args.html.html.clone(),
        verify: None,
        schedule: args.schedule.as_deref().map(schedule_choice).transpose()?,
    })
}

/// `--schedule ramp` or a schedule file: a bare `{"stages": [...]}` or a
/// document holding one under `schedule` (`batchfit schedule --json`).
fn schedule_choice(arg: &str) -> CliResult<ScheduleChoice> {
    if arg == "ramp" {
        return Ok(ScheduleChoice::Ramp);
    }
    let bad = |why: String| batchfit_pipeline::Error::input(format!("--schedule {arg}: {why}"));
    let text = std::fs::read_to_string(arg)
        .map_err(|e| batchfit_pipeline::Error::input_because(format!("--schedule {arg}"), e))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("not JSON ({e})")))?;
    let inner = value.get("schedule").cloned().unwrap_or(value);
    let schedule: Schedule = serde_json::from_value(inner).map_err(|e| {
        bad(format!(
            "not a schedule ({e}); give `ramp`, or {{\"stages\": [{{\"from_samples\": 0, \"batch\": 32, \"lr\": 0.001}}]}}"
        ))
    })?;
    schedule.check().map_err(bad)?;
    Ok(ScheduleChoice::Given {
        schedule,
        source: arg.to_string(),
    })
}
