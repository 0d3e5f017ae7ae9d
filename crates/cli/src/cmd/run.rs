//! `batchfit run`: the user's own training command, once per batch size, each
//! in a fresh process tree: the largest batch that runs (exactly), the
//! throughput curve and its knee.

use crate::error::{CliError, CliResult};
use crate::options::{
    BatchesFlag, EfficiencyFlag, HtmlFlag, JsonFlag, LengthFlags, LossFlags, MemoryLimitFlag,
    OptimizerFlag, ReferenceFlags, RuntimeFlag, SeedsFlag, SeqLenFlag, TimeoutFlag, VerifyFlag,
    emit_json, emit_with_html, positive_u64, print, progress,
};
use batchfit_pipeline::lengths::run_lengths;
use batchfit_pipeline::run::{Launcher, LauncherKind, PerSampleHint, RunConfig, run as run_trials};
use batchfit_pipeline::run_verify::{read_run_advice, run_verify};
use batchfit_plan::{TrainOptions, plan};
use batchfit_report::lengths;
use batchfit_report::run::{RunDocument, RunVerifyDocument, html, render, render_verify};
use batchfit_tune::lr::{LrRule, LrScaling};
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args, Clone, Debug)]
#[command(
    after_help = "Example:\n  batchfit run -- python train.py --batch-size {batch} --steps 30\n\n\
Each trial runs the command with {batch} replaced (also exported as BATCHFIT_BATCH) in a fresh\n\
process group. Step times come from lines `BATCHFIT {\"seconds\": 0.031}` the command prints per\n\
step (docs/run.md, examples/) or from --throughput-regex.\n\n\
The learning rate: put {lr} where the command takes it and give --ref-lr (tuned at --ref-batch,\n\
default the first batch tried); each trial then trains at the rule's rate for its batch (also\n\
exported as BATCHFIT_LR), as the time-to-target prediction assumes.\n\n\
Several GPUs: batchfit run --launcher torchrun --nproc-per-node 2 -- python train.py --batch-size {batch}\n\
runs `torchrun --nproc-per-node 2 train.py --batch-size B` per trial; every rank is measured."
)]
pub struct RunArgs {
    #[command(flatten)]
    pub batches: BatchesFlag,
    /// Largest batch to try; the search stops there.
    #[arg(long, default_value_t = 1 << 20, value_parser = positive_u64)]
    pub max_batch: u64,
    /// First batch of the doubling search.
    #[arg(long, default_value_t = 1, value_parser = positive_u64)]
    pub start: u64,
    #[command(flatten)]
    pub timeout: TimeoutFlag,
    /// Read step times from output lines matching this regular expression, with a named
    /// group `seconds` (per step) or `samples_per_s`, optionally `samples`.
    #[arg(long)]
    pub throughput_regex: Option<String>,
    /// Reported steps left out of the statistics as warm-up.
    #[arg(long, default_value_t = 2)]
    pub warmup_steps: usize,
    #[command(flatten)]
    pub efficiency: EfficiencyFlag,
    /// Copy the command's output to stderr, each line prefixed with its batch.
    #[arg(long)]
    pub show_output: bool,
    /// Skip the noise trial: where the command prints noise measurements (the
    /// Python helper), `run` trains it once more at batch 128 (or the nearest
    /// that ran) measuring on every step, for the noise scale and the target;
    /// without it the trial with the most measurements stands in.
    #[arg(long)]
    pub no_noise_trial: bool,
    #[command(flatten)]
    pub memory_limit: MemoryLimitFlag,
    /// With --memory-limit: stop when the largest batch that ran is within this
    /// many percent of the smallest that did not.
    #[arg(long, default_value_t = 2.0, value_parser = parse_percent)]
    pub tolerance: f64,
    /// Also report the largest batch that leaves this many percent of the
    /// memory free (a run that grows later still fits).
    #[arg(long, value_parser = parse_percent)]
    pub margin: Option<f64>,
    #[command(flatten)]
    pub optimizer: OptimizerFlag,
    #[command(flatten)]
    pub reference: ReferenceFlags,
    #[command(flatten)]
    pub json: JsonFlag,
    #[command(flatten)]
    pub html: HtmlFlag,
    /// Run the command through a data-parallel launcher, {batch} per device (docs/run.md).
    #[arg(long, value_enum, requires = "nproc_per_node")]
    pub launcher: Option<LauncherKind>,
    /// Workers (GPUs) on this node; --num-gpus is DeepSpeed's name for it.
    #[arg(long, visible_alias = "num-gpus", value_name = "N", requires = "launcher", value_parser = clap::value_parser!(u32).range(1..))]
    pub nproc_per_node: Option<u32>,
    /// Nodes taking part (run batchfit on each, with the same flags).
    #[arg(long, value_name = "M", requires = "launcher", value_parser = clap::value_parser!(u32).range(1..))]
    pub nnodes: Option<u32>,
    /// This node's rank among the nodes (0-based).
    #[arg(long, value_name = "R", requires = "launcher")]
    pub node_rank: Option<u32>,
    /// Rendezvous address (node 0), passed to the launcher.
    #[arg(long, value_name = "ADDR", requires = "launcher")]
    pub master_addr: Option<String>,
    /// Rendezvous port, passed to the launcher.
    #[arg(long, value_name = "PORT", requires = "launcher")]
    pub master_port: Option<u16>,
    /// The launcher program to run instead of torchrun / deepspeed from PATH.
    #[arg(long, value_name = "PATH", requires = "launcher")]
    pub launcher_cmd: Option<PathBuf>,
    #[command(flatten)]
    pub lengths: LengthFlags,
    /// The same network as the command trains (zoo:NAME, .toml or .onnx): the plan's
    /// per-sample bytes let the memory search predict the limit from its first trial.
    #[arg(long, value_name = "MODEL")]
    pub model: Option<String>,
    /// --model's loss, where its output's shape does not say.
    #[command(flatten)]
    pub loss: LossFlags,
    /// --model's runtime: pytorch for a PyTorch command.
    #[command(flatten)]
    pub runtime: RuntimeFlag,
    #[command(flatten)]
    pub seq_len: SeqLenFlag,
    #[command(flatten)]
    pub verify: VerifyFlag,
    #[command(flatten)]
    pub seeds: SeedsFlag,
    /// The training command, after `--`, with {batch} where the batch size goes.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

pub fn run(args: RunArgs) -> CliResult {
    let lr_rule = LrRule::for_optimizer(args.optimizer.optimizer.is_adaptive());
    let cfg = RunConfig {
        command: args.command.clone(),
        batches: args.batches.batches.clone(),
        max_batch: args.max_batch,
        start: args.start,
        timeout: Duration::from_secs_f64(args.timeout.timeout),
        throughput_regex: args.throughput_regex.clone(),
        warmup_steps: args.warmup_steps,
        efficiency: args.efficiency.efficiency,
        show_output: args.show_output,
        html: args.html.html.clone(),
        lr_rule,
        lr: args.reference.ref_lr.map(|ref_lr| LrScaling {
            rule: lr_rule,
            // The rate was tuned at the first batch the trials start from.
            ref_batch: args.reference.ref_batch.unwrap_or_else(|| {
                args.batches
                    .batches
                    .iter()
                    .copied()
                    .min()
                    .unwrap_or(args.start)
            }),
            ref_lr,
            cap_batch: None,
        }),
        tuned_at: args.reference.ref_batch,
        memory_limit: args.memory_limit.memory_limit,
        tolerance: args.tolerance / 100.0,
        margin: args.margin.map(|m| m / 100.0),
        launcher: args.launcher.map(|kind| {
            let base = Launcher::new(kind, args.nproc_per_node.unwrap_or(1));
            Launcher {
                program: args
                    .launcher_cmd
                    .as_ref()
                    .map_or(base.program.clone(), |p| p.display().to_string()),
                nnodes: args.nnodes.unwrap_or(1),
                node_rank: args.node_rank.unwrap_or(0),
                master_addr: args.master_addr.clone(),
                master_port: args.master_port,
                ..base
            }
        }),
        search_only: false,
        noise_trial: !args.no_noise_trial,
        per_sample_hint: match &args.model {
            Some(source) => Some(per_sample_hint(source, &args)?),
            None => None,
        },
    };
    if let Some(path) = &args.verify.verify {
        if args.lengths.lengths.is_some() || args.html.html.is_some() || args.model.is_some() {
            return Err(CliError::Pipeline(batchfit_pipeline::Error::input(
                "--verify trains the advice's batches: leave out --lengths, --html and --model",
            )));
        }
        let advice = read_run_advice(path)?;
        let bar = progress(args.json.json || args.show_output);
        let report = run_verify(&cfg, &advice, &args.batches.batches, args.seeds.seeds, &bar)?;
        drop(bar);
        return if args.json.json {
            emit_json(&RunVerifyDocument::new(&report))
        } else {
            print(&render_verify(&report))
        };
    }
    if let Some(req) = args.lengths.request() {
        let bar = progress(args.json.json || args.show_output);
        let doc = run_lengths(&cfg, &req, &bar)?;
        drop(bar);
        let units = args.lengths.units();
        return if args.json.json {
            emit_json(&lengths::RunLengthsDocument::new(&doc))
        } else {
            print(&lengths::render_run(&doc, units))
        };
    }
    let bar = progress(args.json.json || args.show_output);
    let doc = run_trials(&cfg, &bar)?;
    drop(bar);
    emit_with_html(
        &doc,
        &RunDocument::new(&doc),
        args.json.json,
        render,
        args.html.html.as_deref(),
        html,
    )
}

/// The plan's bytes per sample of `--model` as the command trains it, on
/// the host and on a GPU.
fn per_sample_hint(source: &str, args: &RunArgs) -> Result<PerSampleHint, CliError> {
    let graph = batchfit_graph::load_with_loss(source, args.loss.request()?.as_ref())?;
    let per_sample = |gpu: bool| {
        let opts = TrainOptions {
            optimizer: args.optimizer.optimizer,
            runtime: args.runtime.runtime,
            seq_len: args.seq_len.seq_len,
            gpu,
            ..TrainOptions::default()
        };
        plan(&graph, &opts).memory.per_sample_bytes.as_f64()
    };
    Ok(PerSampleHint {
        host: per_sample(false),
        gpu: per_sample(true),
    })
}

/// A percentage in [0, 100).
fn parse_percent(s: &str) -> Result<f64, String> {
    match s.trim_end_matches('%').parse::<f64>() {
        Ok(x) if (0.0..100.0).contains(&x) => Ok(x),
        _ => Err(format!("`{s}` must be a percentage in [0, 100), e.g. 2")),
    }
}
