//! `batchfit sweep`: real short trainings at several batch sizes and seeds on
//! real data, with validation, to test the noise-scale predictions and answer
//! "does this batch size hurt quality?".

use crate::cmd::noise::{DataFlags, NoiseFlags, apply_loss, load_data, run_noise};
use crate::error::{CliError, CliResult};
use crate::options::{check_output_folder, input, positive_u64, positive_usize, write_atomically};
use batchfit_data::Dataset;
use batchfit_engine::sweep::{RunSpec, train_run};
use batchfit_engine::{DeviceSpec, TrainConfig};
use batchfit_plan::Optimizer;
use batchfit_report::sweep::{
    BatchSummary, MeasuredNoise, SweepDocument, SweepRun, SweepSettings, html, quality_statement,
    render,
};
use batchfit_tune::lr::{LrRule, scale};
use batchfit_tune::sweep::{
    RunRecord, RunStatus, first_reach, fit_s_min, fit_steps, mean_std, quality,
};
use clap::Args;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Args)]
pub struct SweepArgs {
    /// zoo:NAME, a .toml layer spec or an .onnx file [default: zoo:digits-mlp].
    pub model: Option<String>,
    #[command(flatten)]
    pub data: DataFlags,
    /// Batch sizes to train with (comma-separated).
    #[arg(long, value_delimiter = ',', value_parser = positive_u64, default_value = "16,64,256")]
    pub batches: Vec<u64>,
    /// How the learning rate follows the batch: linear, sqrt or fixed [default: sqrt for
    /// Adam-family optimizers, linear for SGD].
    #[arg(long, value_parser = parse_rule)]
    pub lr_rule: Option<LrRule>,
    /// The batch size the reference learning rate belongs to [default: the smallest batch].
    #[arg(long, value_parser = positive_u64)]
    pub ref_batch: Option<u64>,
    /// The learning rate at --ref-batch.
    #[arg(long, default_value_t = 1e-3, value_parser = positive_f64)]
    pub ref_lr: f64,
    /// Optimizer: sgd, momentum, adam, adamw.
    #[arg(long, default_value = "adam", value_parser = parse_optimizer)]
    pub optimizer: Optimizer,
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
    #[arg(long, default_value_t = 0.1, value_parser = parse_split)]
    pub val_split: f64,
    /// Seeds per batch size (0, 1, ...): initial weights and data order. Every batch
    /// starts from the same weights for a given seed.
    #[arg(long, default_value_t = 3, value_parser = positive_u64)]
    pub seeds: u64,
    /// Seed of the train/validation split.
    #[arg(long, default_value_t = 0)]
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
    /// CPU threads.
    #[arg(long, value_parser = positive_usize)]
    pub threads: Option<usize>,
    /// Print the result as JSON (schema: docs/json.md).
    #[arg(long)]
    pub json: bool,
    /// Also write an HTML report with learning curves to this file.
    #[arg(long)]
    pub html: Option<PathBuf>,
}

fn parse_rule(s: &str) -> Result<LrRule, String> {
    LrRule::parse(s).ok_or_else(|| format!("`{s}` is not one of linear, sqrt, fixed"))
}

fn parse_optimizer(s: &str) -> Result<Optimizer, String> {
    Optimizer::parse(s)
        .ok_or_else(|| format!("`{s}` is not one of {}", Optimizer::NAMES.join(", ")))
}

fn positive_f64(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x > 0.0 && x.is_finite() => Ok(x),
        _ => Err(format!("`{s}` must be a positive number")),
    }
}

fn non_negative_f64(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x >= 0.0 && x.is_finite() => Ok(x),
        _ => Err(format!("`{s}` must be a number of at least 0")),
    }
}

fn parse_split(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x > 0.0 && x <= 0.5 => Ok(x),
        _ => Err(format!("`{s}` must be a share in (0, 0.5], e.g. 0.1")),
    }
}

const SETTINGS_FILE: &str = "sweep.json";

fn run_file(dir: &Path, batch: u64, seed: u64) -> PathBuf {
    dir.join(format!("run-b{batch}-s{seed}.json"))
}

/// Checks `--out DIR` against the settings: a new sweep needs an empty (or new)
/// folder; a resumed one the same settings.
fn prepare_out(dir: &Path, settings: &SweepSettings, resume: bool) -> CliResult {
    let file = dir.join(SETTINGS_FILE);
    if file.exists() {
        if !resume {
            return Err(CliError::Input(format!(
                "--out {}: it already holds a sweep; add --resume to continue it, or choose another folder",
                dir.display()
            )));
        }
        let text = std::fs::read_to_string(&file)
            .map_err(|e| CliError::Input(format!("{}: {e}", file.display())))?;
        let old: SweepSettings = serde_json::from_str(&text).map_err(|e| {
            CliError::Input(format!("{}: not a batchfit sweep: {e}", file.display()))
        })?;
        if &old != settings {
            return Err(CliError::Input(format!(
                "--resume: {} was written by a sweep with other settings ({}); rerun with the same flags or another --out",
                file.display(),
                settings_difference(&old, settings)
            )));
        }
        return Ok(());
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| CliError::Input(format!("--out {}: {e}", dir.display())))?;
    write_atomically(
        "--out",
        &file,
        &serde_json::to_string_pretty(settings).expect("serialises"),
    )
}

/// The fields that differ, named as in the JSON.
fn settings_difference(a: &SweepSettings, b: &SweepSettings) -> String {
    let (a, b) = (
        serde_json::to_value(a).expect("serialises"),
        serde_json::to_value(b).expect("serialises"),
    );
    let (a, b) = (
        a.as_object().expect("object"),
        b.as_object().expect("object"),
    );
    a.iter()
        .filter(|(k, v)| b.get(*k) != Some(v))
        .map(|(k, v)| format!("{k}: {v} there, {} now", b[k]))
        .collect::<Vec<_>>()
        .join("; ")
}

pub fn run(args: SweepArgs) -> CliResult {
    let started = Instant::now();
    let default_model = args.model.is_none();
    let mut graph = crate::options::load_model(args.model.as_deref())?;
    apply_loss(&mut graph, args.data.loss.as_deref())?;
    batchfit_engine::model::check_trainable(&graph).map_err(input)?;
    let seq_len = graph.default_seq_len.unwrap_or(1);
    let data = load_data(&args.data, &graph, seq_len, default_model)?;
    if data.rows < 4 {
        return Err(CliError::Input(format!(
            "{}: {} rows are too few to split into training and validation",
            data.source, data.rows
        )));
    }
    let (train, val) = data.split(args.val_split, args.split_seed);
    // In the order given (the runs train in it), each once.
    let mut batches: Vec<u64> = Vec::new();
    for &b in &args.batches {
        if !batches.contains(&b) {
            batches.push(b);
        }
    }
    if let Some(&b) = batches.iter().find(|&&b| b as usize > train.rows) {
        return Err(CliError::Input(format!(
            "--batches: {b} exceeds the {} training rows of {}",
            train.rows, data.source
        )));
    }
    if let Some(p) = &args.html {
        check_output_folder("--html", p)?;
    }
    if let Some(n) = args.threads {
        let _ = batchfit_engine::set_threads(n);
    }

    let rule = args
        .lr_rule
        .unwrap_or_else(|| LrRule::for_optimizer(args.optimizer.is_adaptive()));
    let ref_batch = args
        .ref_batch
        .unwrap_or_else(|| *batches.iter().min().expect("clap requires a batch"));
    let seeds: Vec<u64> = (0..args.seeds).collect();
    let settings = SweepSettings {
        model: graph.name.clone(),
        data: data.source.clone(),
        train_rows: train.rows,
        val_rows: val.rows,
        val_split: args.val_split,
        split_seed: args.split_seed,
        batches: batches.clone(),
        seeds: seeds.clone(),
        optimizer: args.optimizer.name().to_string(),
        lr_rule: format!("{rule:?}").to_lowercase(),
        ref_batch,
        ref_lr: args.ref_lr,
        warmup_epochs: args.warmup_epochs,
        target_loss: args.target_loss,
        max_epochs: args.epochs,
    };
    if let Some(dir) = &args.out {
        prepare_out(dir, &settings, args.resume)?;
    }
    #[cfg(unix)]
    batchfit_exec::interrupt::install(match &args.out {
        Some(d) => format!(
            "the runs finished so far are in {}; add --resume to the same command to train only the rest",
            d.display()
        ),
        None => "nothing was written (--out DIR keeps finished runs)".into(),
    })
    .map_err(CliError::Failure)?;

    let base = TrainConfig {
        optimizer: args.optimizer,
        lr: args.ref_lr,
        seq_len,
        seed: 0,
        device: DeviceSpec::Cpu,
        init_random: true,
    };
    let bar = crate::cmd::probe::progress(args.json);
    // Seed-major: an interrupted sweep has whole comparisons across batches.
    let plan: Vec<(u64, u64)> = seeds
        .iter()
        .flat_map(|&s| batches.iter().map(move |&b| (b, s)))
        .collect();
    const UNIT: u64 = 1000;
    bar.set_length(plan.len() as u64 * UNIT);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} run {msg} (about {eta} left)",
        )
        .expect("valid template"),
    );
    let mut runs: Vec<SweepRun> = Vec::new();
    for (i, &(batch, seed)) in plan.iter().enumerate() {
        let file = args.out.as_ref().map(|d| run_file(d, batch, seed));
        if args.resume
            && let Some(f) = &file
            && let Ok(text) = std::fs::read_to_string(f)
            && let Ok(record) = serde_json::from_str::<RunRecord>(&text)
        {
            runs.push(sweep_run(record, true));
            bar.set_position((i as u64 + 1) * UNIT);
            continue;
        }
        let lr = scale(rule, ref_batch, args.ref_lr, batch);
        let warmup_steps = if batch > ref_batch {
            (args.warmup_epochs * (train.rows as u64 / batch) as f64).round() as u64
        } else {
            0
        };
        let spec = RunSpec {
            batch: batch as usize,
            lr,
            lr_start: args.ref_lr.min(lr),
            warmup_steps,
            seed,
            target_loss: args.target_loss,
            max_epochs: args.epochs,
        };
        bar.set_message(format!(
            "{}/{}: batch {batch}, seed {seed}, lr {lr:.2e}",
            i + 1,
            plan.len()
        ));
        let record = train_run(&graph, &base, &train, &val, &spec, |done| {
            bar.set_position(i as u64 * UNIT + (done * UNIT as f64) as u64);
        })
        .map_err(input)?;
        if let Some(f) = &file {
            write_atomically(
                "--out",
                f,
                &serde_json::to_string_pretty(&record).expect("serialises"),
            )?;
        }
        runs.push(sweep_run(record, false));
        bar.set_position((i as u64 + 1) * UNIT);
    }
    bar.finish_and_clear();

    let noise = if args.no_noise {
        None
    } else {
        measure_noise(&args, &graph, &train, seq_len)?
    };
    let doc = document(settings, runs, noise, started);
    crate::options::emit_with_html(&doc, args.json, render, args.html.as_deref(), html)?;
    Ok(())
}

fn sweep_run(record: RunRecord, resumed: bool) -> SweepRun {
    SweepRun {
        resumed,
        steps_to_target: None,
        seconds_to_target: None,
        samples_to_target: None,
        record,
    }
}

/// B_simple on the training split, with `noise`'s defaults at the reference learning rate.
fn measure_noise(
    args: &SweepArgs,
    graph: &batchfit_graph::Graph,
    train: &Dataset,
    seq_len: usize,
) -> CliResult<Option<(f64, f64, f64)>> {
    let flags = NoiseFlags {
        lr: args.ref_lr,
        optimizer: args.optimizer,
        steps: 200,
        b_small: 16,
        k: 8,
        beta: None,
        batches: Vec::new(),
        ref_batch: None,
        ref_lr: None,
        init: "random".into(),
        seed: 0,
        threads: args.threads,
    };
    if flags.b_small * flags.k > train.rows {
        return Ok(None);
    }
    Ok(run_noise(&flags, graph, train, seq_len, |_| {})?.b_simple)
}

/// Target, steps to it, fits and the quality verdicts.
fn document(
    settings: SweepSettings,
    mut runs: Vec<SweepRun>,
    noise: Option<(f64, f64, f64)>,
    started: Instant,
) -> SweepDocument {
    let finished = |r: &SweepRun| !matches!(r.record.status, RunStatus::Diverged { .. });
    let (target, source) = match settings.target_loss {
        Some(t) => (Some(t), "--target-loss".to_string()),
        None => {
            // The lowest loss every finished run reached: all can be compared at it.
            let t = runs
                .iter()
                .filter(|r| finished(r))
                .map(|r| {
                    r.record
                        .curve
                        .iter()
                        .map(|p| p.loss)
                        .fold(f64::INFINITY, f64::min)
                })
                .fold(f64::NEG_INFINITY, f64::max);
            (
                t.is_finite().then_some(t),
                format!(
                    "the lowest loss every run reached within {} epochs",
                    settings.max_epochs
                ),
            )
        }
    };
    for r in &mut runs {
        if let Some(t) = target
            && finished(r)
            && let Some((steps, seconds, samples)) = first_reach(&r.record.curve, t)
        {
            r.steps_to_target = Some(steps);
            r.seconds_to_target = Some(seconds);
            r.samples_to_target = Some(samples);
        }
    }
    let points: Vec<(f64, f64)> = runs
        .iter()
        .filter_map(|r| r.steps_to_target.map(|s| (r.record.batch as f64, s)))
        .collect();
    let fit = fit_steps(&points);
    let noise = noise.map(|(b, low, high)| MeasuredNoise {
        b_simple: b,
        low,
        high: high.is_finite().then_some(high),
        s_min: fit_s_min(b, &points),
    });

    let stat = |v: Vec<f64>| -> (Option<f64>, Option<f64>) {
        if v.is_empty() {
            (None, None)
        } else {
            let (m, s) = mean_std(&v);
            (Some(m), Some(s))
        }
    };
    let steps_per_epoch = |b: u64| (settings.train_rows as u64 / b).max(1) as f64;
    let per_batch: Vec<BatchSummary> = settings
        .batches
        .iter()
        .map(|&b| {
            let of_b: Vec<&SweepRun> = runs.iter().filter(|r| r.record.batch == b).collect();
            let steps: Vec<f64> = of_b.iter().filter_map(|r| r.steps_to_target).collect();
            let (steps_mean, steps_std) = stat(steps.clone());
            let err = |pred: Option<f64>| pred.zip(steps_mean).map(|(p, m)| 100.0 * (p - m) / m);
            let steps_fitted = fit.map(|f| f.steps(b as f64));
            let steps_from_noise = noise
                .as_ref()
                .and_then(|n| n.s_min.map(|s| s * (1.0 + n.b_simple / b as f64)));
            let (val_loss_mean, val_loss_std) = stat(
                of_b.iter()
                    .filter_map(|r| r.record.final_val_loss)
                    .collect(),
            );
            let (val_accuracy_mean, val_accuracy_std) = stat(
                of_b.iter()
                    .filter_map(|r| r.record.final_val_accuracy)
                    .collect(),
            );
            BatchSummary {
                batch: b,
                lr: of_b.first().map_or(f64::NAN, |r| r.record.lr),
                runs: of_b.len(),
                reached: steps.len(),
                diverged: of_b.iter().filter(|r| !finished(r)).count(),
                steps_mean,
                steps_std,
                seconds_mean: stat(of_b.iter().filter_map(|r| r.seconds_to_target).collect()).0,
                epochs_mean: steps_mean.map(|s| s / steps_per_epoch(b)),
                steps_fitted,
                fitted_error_pct: err(steps_fitted),
                steps_from_noise,
                noise_error_pct: err(steps_from_noise),
                val_loss_mean,
                val_loss_std,
                val_accuracy_mean,
                val_accuracy_std,
            }
        })
        .collect();
    let groups = |f: fn(&RunRecord) -> Option<f64>| -> Vec<(u64, Vec<f64>)> {
        settings
            .batches
            .iter()
            .map(|&b| {
                (
                    b,
                    runs.iter()
                        .filter(|r| r.record.batch == b)
                        .filter_map(|r| f(&r.record))
                        .collect(),
                )
            })
            .collect()
    };
    let quality_loss = quality(&groups(|r| r.final_val_loss), false);
    let quality_accuracy = quality(&groups(|r| r.final_val_accuracy), true);
    SweepDocument {
        schema_version: batchfit_report::SCHEMA_VERSION,
        kind: "sweep",
        quality_statement: quality_statement(
            quality_loss.as_ref(),
            quality_accuracy.as_ref(),
            settings.seeds.len(),
        ),
        settings,
        target_loss: target,
        target_source: source,
        runs,
        per_batch,
        fit,
        noise,
        quality_loss,
        quality_accuracy,
        seconds: started.elapsed().as_secs_f64(),
    }
}
