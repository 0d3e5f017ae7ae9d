//! `batchfit noise`: the gradient noise scale on the user's data, the critical
//! batch, steps and epochs per batch size, and learning-rate scaling.

use crate::error::CliResult;
use crate::options::{
    BatchesFlag, DataFlags, EstimatorFlags, JsonFlag, LrFlag, OptimizerFlag, ReferenceFlags,
    SeedFlag, ThreadsFlag, emit, positive_usize, progress,
};
use batchfit_pipeline::noise::{Init, NoiseSettings, noise};
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
    #[command(flatten)]
    pub json: JsonFlag,
}

#[derive(Args, Clone, Debug)]
pub struct NoiseFlags {
    #[command(flatten)]
    pub lr: LrFlag,
    #[command(flatten)]
    pub optimizer: OptimizerFlag,
    /// Measurements (and optimizer steps) in the run.
    #[arg(long, default_value_t = batchfit_tune::noise::DEFAULT_STEPS, value_parser = positive_usize)]
    pub steps: usize,
    #[command(flatten)]
    pub estimator: EstimatorFlags,
    /// Smoothing factor of the moving averages (0 = none; default 0.95, or a plain mean at --lr 0).
    #[arg(long, value_parser = parse_beta)]
    pub beta: Option<f64>,
    #[command(flatten)]
    pub batches: BatchesFlag,
    #[command(flatten)]
    pub reference: ReferenceFlags,
    /// For ONNX models: start from the file's weights (checkpoint) or random ones.
    #[arg(long, value_enum, default_value = "checkpoint")]
    pub init: Init,
    #[command(flatten)]
    pub seed: SeedFlag,
    #[command(flatten)]
    pub threads: ThreadsFlag,
}

impl NoiseFlags {
    fn settings(&self) -> NoiseSettings {
        NoiseSettings {
            lr: self.lr.lr,
            optimizer: self.optimizer.optimizer,
            steps: self.steps,
            b_small: self.estimator.b_small,
            k: self.estimator.k,
            beta: self.beta,
            batches: self.batches.batches.clone(),
            reference: self
                .reference
                .pair(self.estimator.b_small as u64, self.lr.lr),
            init: self.init,
            seed: self.seed.seed,
            threads: self.threads.threads,
        }
    }
}

pub fn run(args: NoiseArgs) -> CliResult {
    let bar = progress(args.json.json);
    bar.0.set_length(args.noise.steps as u64);
    let (doc, profile) = noise(
        args.model.as_deref(),
        &args.data.source()?,
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
    let read = (doc, profile);
    emit(
        &read,
        &NoiseDocument::new(&read.0).with_data(&read.1),
        args.json.json,
        |(d, p)| render(d) + &batchfit_report::data::section(p),
    )
}

/// `--beta`: a smoothing factor in [0, 1).
fn parse_beta(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(b) if (0.0..1.0).contains(&b) => Ok(b),
        _ => Err(format!(
            "`{s}` must be a smoothing factor in [0, 1), e.g. 0.95"
        )),
    }
}
