//! `batchfit advise`: plan -> probe on each device -> noise on the data -> one recommendation.

use crate::error::CliResult;
use crate::options::{
    DataFlags, EstimatorFlags, HtmlFlag, JsonFlag, MeasureFlags, ParallelFlags, ReferenceFlags,
    emit, emit_with_html, progress,
};
use batchfit_pipeline::Error;
use batchfit_pipeline::advise::{AdviseConfig, advise};
use batchfit_pipeline::probe::parse_devices;
use batchfit_plan::distributed::{LinkPreset, Strategy};
use batchfit_report::advise::{AdviseDocument, ScheduleDocument, html, render, render_schedule};
use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
pub struct AdviseArgs {
    /// zoo:NAME, a .toml layer spec or an .onnx file [default: zoo:digits-mlp with the shipped digits data].
    pub model: Option<String>,
    #[command(flatten)]
    pub measure: MeasureFlags,
    #[command(flatten)]
    pub data: DataFlags,
    /// Steps of the noise-scale run (0 skips it).
    #[arg(long, default_value_t = batchfit_tune::noise::DEFAULT_STEPS)]
    pub noise_steps: usize,
    /// Noise runs, one per seed from --seed: pooled for the advice, and each
    /// decided on alone to show how far they agree.
    #[arg(long, default_value_t = batchfit_tune::noise::DEFAULT_NOISE_SEEDS, value_parser = crate::options::positive_usize)]
    pub noise_seeds: usize,
    #[command(flatten)]
    pub estimator: EstimatorFlags,
    #[command(flatten)]
    pub reference: ReferenceFlags,
    #[command(flatten)]
    pub parallel: ParallelFlags,
    /// A finished sweep's --out folder: its measured steps to target (S_min and B_noise
    /// fitted to them) replace the noise run's prediction, with its learning-rate rule.
    #[arg(long, value_name = "DIR")]
    pub from_sweep: Option<PathBuf>,
    #[command(flatten)]
    pub html: HtmlFlag,
    /// Wall-clock time the measurements may take: batches whose predicted cost would pass
    /// it are not measured (the report says which); 0 for no limit.
    #[arg(long, value_name = "DURATION", default_value = "3min", value_parser = parse_budget)]
    pub budget: f64,
    #[command(flatten)]
    pub json: JsonFlag,
}

/// `--budget`: seconds (`90`, `90s`), minutes (`3min`, `3m`) or hours (`1h`); 0 is no limit.
fn parse_budget(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let (number, unit) = match t.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => t.split_at(i),
        None => (t, "s"),
    };
    let scale = match unit {
        "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        other => return Err(format!("unknown unit `{other}`: use s, min or h")),
    };
    match number.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v * scale),
        _ => Err(format!(
            "`{s}` is not a duration (e.g. 90s, 3min, 1h; 0 for no limit)"
        )),
    }
}

/// `batchfit schedule`: the advice's measurements, its batch-size ramp only.
pub fn run_schedule(args: AdviseArgs) -> CliResult {
    let json = args.json.json;
    if args.html.html.is_some() || !args.parallel.gpus.is_empty() || args.from_sweep.is_some() {
        return Err(batchfit_pipeline::Error::input(
            "--html, --gpus and --from-sweep are advise's; `batchfit schedule` prints the schedule (--json for the file)",
        )
        .into());
    }
    if (args.model.is_some() && args.data.data.is_none()) || args.noise_steps == 0 {
        return Err(batchfit_pipeline::Error::input(
            "a schedule comes from the noise scale along a real run on your data: give --data PATH and --noise-steps above 0",
        )
        .into());
    }
    let doc = advise(&config(&args)?, &progress(json))?;
    let Some(schedule) = ScheduleDocument::of(&doc) else {
        // Why the run gave no stretches to ramp over, as far as it says.
        let why = match (doc.decision.learning, args.data.data.is_some()) {
            (Some(l), _) if !l.learned => format!(
                "its noise run learned nothing from the inputs (loss {:.4}, no lower than {:.4} for ignoring them): scale the inputs (--standardize) or lower --lr",
                l.run_loss, l.prior_loss
            ),
            (_, true) => "its noise run measured no noise scale along the way (too few rows or updates: more data, or more --noise-steps)".to_string(),
            _ => "give --data PATH (and --noise-steps above 0, a learning rate above 0)".to_string(),
        };
        return Err(batchfit_pipeline::Error::input(format!(
            "no schedule: it comes from the noise scale along a real run on your data; {why}"
        ))
        .into());
    };
    emit(&schedule, &schedule, json, render_schedule)
}

fn config(args: &AdviseArgs) -> CliResult<AdviseConfig> {
    let devices = if args.measure.device.device.is_empty() {
        Vec::new()
    } else {
        parse_devices(&args.measure.device.device)?
    };
    args.parallel.check()?;
    let strategy = match args.parallel.strategy.as_slice() {
        [] => Strategy::Ddp,
        [s] => *s,
        _ => {
            return Err(Error::input(
                "advise --strategy takes one strategy (`batchfit plan --gpus N` compares several)",
            )
            .into());
        }
    };
    let mut measure = args.measure.config()?;
    measure.budget_s = (args.budget > 0.0).then_some(args.budget);
    Ok(AdviseConfig {
        model: args.model.clone(),
        reference: args
            .reference
            .pair(args.estimator.b_small as u64, measure.lr),
        measure,
        data: args.data.source()?,
        devices,
        noise_steps: args.noise_steps,
        noise_seeds: args.noise_seeds,
        b_small: args.estimator.b_small,
        k: args.estimator.k,
        command: std::env::args().collect::<Vec<_>>().join(" "),
        gpus: args.parallel.gpus.clone(),
        strategy,
        link: args.parallel.link.unwrap_or(LinkPreset::Pcie4).link(),
        from_sweep: args.from_sweep.clone(),
    })
}

pub fn run(args: AdviseArgs) -> CliResult {
    if let Some(path) = &args.html.html {
        crate::options::check_html_output("--html", path)?;
    }
    let cfg = config(&args)?;
    let bar = progress(args.json.json);
    let doc = advise(&cfg, &bar)?;
    drop(bar);
    emit_with_html(
        &doc,
        &AdviseDocument::new(&doc),
        args.json.json,
        render,
        args.html.html.as_deref(),
        html,
    )
}
