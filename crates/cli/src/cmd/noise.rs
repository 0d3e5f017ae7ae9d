//! `batchfit noise`: the gradient noise scale on the user's data, the critical
//! batch, steps and epochs per batch size, and learning-rate scaling.

use crate::error::CliResult;
use crate::options::{DataFlags, emit, positive_u64, positive_usize, progress};
use batchfit_pipeline::noise::{Init, NoiseSettings, noise};
use batchfit_plan::Optimizer;
use batchfit_report::noise::{NoiseDocument, render};
use clap::Args;

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
    /// Optimizer of the run.
    #[arg(long, value_enum, default_value = "adam")]
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
    /// For ONNX models: start from the file's weights (checkpoint) or random ones.
    #[arg(long, value_enum, default_value = "checkpoint")]
    pub init: Init,
    /// Seed of the shuffling and of random initial weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// CPU threads.
    #[arg(long, value_parser = positive_usize)]
    pub threads: Option<usize>,
}

fn parse_k(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(k) if k >= 2 => Ok(k),
        _ => Err(format!("`{s}` must be an integer of at least 2")),
    }
}

impl NoiseFlags {
    fn settings(&self) -> NoiseSettings {
        NoiseSettings {
            lr: self.lr,
            optimizer: self.optimizer,
            steps: self.steps,
            b_small: self.b_small,
            k: self.k,
            beta: self.beta,
            batches: self.batches.clone(),
            reference: self.ref_batch.zip(self.ref_lr),
            init: self.init,
            seed: self.seed,
            threads: self.threads,
        }
    }
}

pub fn run(args: NoiseArgs) -> CliResult {
    let bar = progress(args.json);
    bar.0.set_length(args.noise.steps as u64);
    let doc = noise(
        args.model.as_deref(),
        &args.data.source(),
        &args.noise.settings(),
        |r| {
            bar.0.set_message(format!(
                "loss {:.4}, B_simple {}",
                r.loss,
                r.b_simple
                    .map(|b| format!("{b:.0}"))
                    .unwrap_or_else(|| "-".into())
            ));
            bar.0.inc(1);
        },
    )?;
    drop(bar);
    emit(&doc, &NoiseDocument::new(&doc), args.json, render)
}
