//! `batchfit noise`: the gradient noise scale on the user's data, the critical
//! batch, steps and epochs per batch size, and learning-rate scaling.

use crate::error::{CliError, CliResult};
use crate::options::{input, positive_u64, positive_usize};
use batchfit_data::{Dataset, ReadOptions};
use batchfit_engine::noise::{NoiseConfig, measure_noise};
use batchfit_engine::{DeviceSpec, TrainConfig, Trainer};
use batchfit_graph::{Graph, LossKind};
use batchfit_plan::Optimizer;
use batchfit_report::noise::{LrAdvice, NoiseDocument, render};
use batchfit_tune::lr::{LrRule, scale};
use batchfit_tune::noise::{NoiseRecord, critical_batch, predict};
use clap::Args;

#[derive(Args, Clone, Debug)]
pub struct DataFlags {
    /// Training data: .npy, .npz (keys = model input names + `target`), .csv
    /// (.csv.gz), IDX (MNIST), or builtin:digits [default for the default model].
    #[arg(long)]
    pub data: Option<String>,
    /// Labels for single-array formats (.npy, IDX).
    #[arg(long)]
    pub labels: Option<String>,
    /// CSV column holding the label (negative counts from the end) [default: last].
    #[arg(long, allow_hyphen_values = true)]
    pub label_col: Option<isize>,
    /// Override the model's loss: mse or ce.
    #[arg(long, value_parser = ["mse", "ce"])]
    pub loss: Option<String>,
}

#[derive(Args)]
pub struct NoiseArgs {
    /// zoo:NAME, a .toml layer spec or an .onnx file [default: zoo:digits-mlp].
    pub model: Option<String>,
    #[command(flatten)]
    pub data: DataFlags,
    #[command(flatten)]
    pub noise: NoiseFlags,
    /// Print the result as JSON (schema: docs/json.md).
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Clone, Debug)]
pub struct NoiseFlags {
    /// Learning rate of the run; 0 measures at fixed weights.
    #[arg(long, default_value_t = 1e-3)]
    pub lr: f64,
    /// Optimizer of the run: sgd, momentum, adam, adamw.
    #[arg(long, default_value = "adam", value_parser = parse_optimizer)]
    pub optimizer: Optimizer,
    /// Measurements (and optimizer steps) in the run.
    #[arg(long, default_value_t = 200, value_parser = positive_usize)]
    pub steps: usize,
    /// Samples in each small batch of the estimator.
    #[arg(long, default_value_t = 16, value_parser = positive_usize)]
    pub b_small: usize,
    /// Small batches per measurement: B_big = k x B_small.
    #[arg(long, default_value_t = 8, value_parser = parse_k)]
    pub k: usize,
    /// Smoothing factor of the moving averages (0 = none; default 0.95, or a plain mean at --lr 0).
    #[arg(long)]
    pub beta: Option<f64>,
    /// Batch sizes to predict steps and epochs for (default: powers of two up to the data size).
    #[arg(long, value_delimiter = ',', value_parser = positive_u64)]
    pub batches: Vec<u64>,
    /// The batch size your learning rate was tuned at.
    #[arg(long, value_parser = positive_u64, requires = "ref_lr")]
    pub ref_batch: Option<u64>,
    /// The learning rate tuned at --ref-batch.
    #[arg(long, requires = "ref_batch")]
    pub ref_lr: Option<f64>,
    /// For ONNX models: ignore the file's weights and start from random ones.
    #[arg(long, value_parser = ["checkpoint", "random"], default_value = "checkpoint")]
    pub init: String,
    /// Seed of the shuffling and of random initial weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// CPU threads.
    #[arg(long, value_parser = positive_usize)]
    pub threads: Option<usize>,
}

fn parse_optimizer(s: &str) -> Result<Optimizer, String> {
    Optimizer::parse(s)
        .ok_or_else(|| format!("`{s}` is not one of {}", Optimizer::NAMES.join(", ")))
}

fn parse_k(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(k) if k >= 2 => Ok(k),
        _ => Err(format!("`{s}` must be an integer of at least 2")),
    }
}

/// Applies `--loss`, checking the output fits it.
pub fn apply_loss(graph: &mut Graph, loss: Option<&str>) -> CliResult {
    let Some(loss) = loss else { return Ok(()) };
    let rank = graph.output().shape.rank();
    graph.loss.kind = match (loss, rank) {
        ("mse", _) => LossKind::Mse,
        ("ce", 1) => LossKind::CrossEntropy,
        ("ce", 2) => LossKind::CrossEntropyPerFrame,
        _ => {
            return Err(CliError::Input(format!(
                "--loss ce needs logits [B, classes] or [B, T, classes]; the model outputs {}",
                graph.output().shape
            )));
        }
    };
    Ok(())
}

/// Loads `--data` (the shipped digits for the default model when none is given).
pub fn load_data(
    flags: &DataFlags,
    graph: &Graph,
    seq_len: usize,
    default_model: bool,
) -> CliResult<Dataset> {
    let path = match (&flags.data, default_model) {
        (Some(p), _) => p.clone(),
        (None, true) => batchfit_data::digits::NAME.to_string(),
        (None, false) => {
            return Err(CliError::Input(
                "this needs --data PATH: the noise scale is a property of your data (use --data builtin:digits for the shipped digits with a 64-input, 10-class model)".into(),
            ));
        }
    };
    let result = if path == batchfit_data::digits::NAME {
        batchfit_data::digits::load(graph)
    } else {
        Dataset::load(
            &path,
            &ReadOptions {
                labels: flags.labels.clone(),
                label_col: flags.label_col,
            },
            graph,
            seq_len,
        )
    };
    result.map_err(input)
}

/// Result of a noise measurement with its predictions.
pub struct NoiseOutcome {
    pub history: Vec<NoiseRecord>,
    pub b_simple: Option<(f64, f64, f64)>,
}

/// Runs the measurement on `data`.
pub fn run_noise(
    flags: &NoiseFlags,
    graph: &Graph,
    data: &Dataset,
    seq_len: usize,
    mut progress: impl FnMut(&NoiseRecord),
) -> CliResult<NoiseOutcome> {
    if let Some(n) = flags.threads {
        // Fails only if already set in this process, which is harmless.
        let _ = batchfit_engine::set_threads(n);
    }
    let g = graph;
    let mut trainer = Trainer::new(
        g,
        TrainConfig {
            optimizer: flags.optimizer,
            lr: flags.lr,
            seq_len,
            seed: flags.seed,
            device: DeviceSpec::Cpu,
            init_random: flags.init == "random",
        },
    )
    .map_err(input)?;
    let beta = match flags.beta {
        Some(b) if b > 0.0 && b < 1.0 => Some(b),
        Some(_) => None,
        None if flags.lr == 0.0 => None,
        None => Some(0.95),
    };
    let cfg = NoiseConfig {
        b_small: flags.b_small,
        k: flags.k,
        steps: flags.steps,
        beta,
        seed: flags.seed,
    };
    let (history, est) =
        measure_noise(&mut trainer, g, data, &cfg, &mut progress).map_err(input)?;
    Ok(NoiseOutcome {
        history,
        b_simple: est.estimate().map(|e| (e.b_simple, e.low, e.high)),
    })
}

pub fn run(args: NoiseArgs) -> CliResult {
    let default_model = args.model.is_none();
    let mut graph = crate::options::load_model(args.model.as_deref())?;
    apply_loss(&mut graph, args.data.loss.as_deref())?;
    let seq_len = graph.default_seq_len.unwrap_or(1);
    let data = load_data(&args.data, &graph, seq_len, default_model)?;
    let bar = crate::cmd::probe::progress(args.json);
    bar.set_length(args.noise.steps as u64);
    let outcome = run_noise(&args.noise, &graph, &data, seq_len, |r| {
        bar.set_message(format!(
            "loss {:.4}, B_simple {}",
            r.loss,
            r.b_simple
                .map(|b| format!("{b:.0}"))
                .unwrap_or_else(|| "-".into())
        ));
        bar.inc(1);
    })?;
    bar.finish_and_clear();
    let doc = document(&args.noise, &graph, &data, outcome);
    crate::options::emit(&doc, args.json, render)?;
    Ok(())
}

/// The report of a measurement.
pub fn document(
    flags: &NoiseFlags,
    graph: &Graph,
    data: &Dataset,
    outcome: NoiseOutcome,
) -> NoiseDocument {
    let batches: Vec<u64> = if flags.batches.is_empty() {
        let mut v = Vec::new();
        let mut b = 1u64;
        while b <= data.rows as u64 {
            v.push(b);
            b *= 2;
        }
        v
    } else {
        flags.batches.clone()
    };
    let (b_simple, low, high) = match outcome.b_simple {
        Some((b, l, h)) => (Some(b), Some(l), h.is_finite().then_some(h)),
        None => (None, None, None),
    };
    let rule = LrRule::for_optimizer(flags.optimizer.is_adaptive());
    let lr = match (flags.ref_batch, flags.ref_lr) {
        (Some(rb), Some(rl)) => Some(LrAdvice {
            rule,
            source: rule.source().to_string(),
            ref_batch: rb,
            ref_lr: rl,
            per_batch: batches
                .iter()
                .map(|&b| (b, scale(rule, rb, rl, b)))
                .collect(),
        }),
        _ => None,
    };
    NoiseDocument {
        schema_version: batchfit_report::SCHEMA_VERSION,
        kind: "noise",
        model: graph.name.clone(),
        data: data.source.clone(),
        rows: data.rows,
        b_small: flags.b_small,
        b_big: flags.b_small * flags.k,
        lr: flags.lr,
        optimizer: flags.optimizer.name().to_string(),
        steps: flags.steps,
        b_simple,
        b_simple_low: low,
        b_simple_high: high,
        critical_batch: b_simple.map(critical_batch),
        history: outcome.history,
        predictions: b_simple.map(|b| predict(b, &batches)).unwrap_or_default(),
        lr_advice: lr,
    }
}
