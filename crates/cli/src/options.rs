//! Flags shared by several subcommands, their parsing into the library's
//! types, the progress bar, and how results are emitted.

use crate::error::{CliError, CliResult};
use batchfit_pipeline::Progress;
use batchfit_pipeline::noise::{DataSource, LossChoice, LossRequest};
use batchfit_pipeline::probe::MeasureConfig;
use batchfit_plan::distributed::{LinkPreset, Strategy};
use batchfit_plan::{Bytes, Optimizer, Precision, Runtime, TrainOptions};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;
use std::time::Instant;

pub use batchfit_pipeline::DEFAULT_MODEL;
pub use batchfit_pipeline::output::check_html_output;

// Every flag that more than one command takes is defined once, here, as a
// group the commands flatten: one help text, one default, one validation
// (`tests::a_flag_means_the_same_in_every_command` holds them to it).

/// `--optimizer`.
#[derive(Args, Clone, Debug)]
pub struct OptimizerFlag {
    /// Optimizer of the training steps (run: the command's, for the learning-rate rule of
    /// the advice: square root for Adam-family, linear for SGD).
    #[arg(long, value_enum, default_value = "adam")]
    pub optimizer: Optimizer,
}

/// `--threads`.
#[derive(Args, Clone, Debug)]
pub struct ThreadsFlag {
    /// CPU threads for the training steps [default: all cores].
    #[arg(long, value_parser = positive_usize)]
    pub threads: Option<usize>,
}

/// `--seq-len`.
#[derive(Args, Clone, Debug)]
pub struct SeqLenFlag {
    /// Sequence length T for recurrent models [default: the model's].
    #[arg(long, value_name = "T", value_parser = parse_seq_len)]
    pub seq_len: Option<usize>,
}

/// `--gpus` and `--nodes`: at least 1 and at most 2^20 each, so their
/// product times a batch stays a count (the largest clusters hold 10^5 GPUs).
pub fn parse_device_count(s: &str) -> Result<u64, String> {
    match positive_u64(s)? {
        n if n <= 1 << 20 => Ok(n),
        _ => Err(format!("`{s}` is more than 2^20 devices")),
    }
}

/// `--seq-len`: at least 1 and at most 2^24 steps (16.7 million frames), past
/// which the plan's products of sizes would no longer be a length's.
fn parse_seq_len(s: &str) -> Result<usize, String> {
    match positive_usize(s)? {
        t if t <= 1 << 24 => Ok(t),
        _ => Err(format!("`{s}` is more than 2^24 steps")),
    }
}

/// `--lr`.
#[derive(Args, Clone, Debug)]
pub struct LrFlag {
    /// Learning rate of the training steps (noise: 0 measures the noise scale at fixed weights).
    #[arg(long, default_value_t = 1e-3, value_parser = non_negative_f64)]
    pub lr: f64,
}

/// `--seed`.
#[derive(Args, Clone, Debug)]
pub struct SeedFlag {
    /// Seed of the data (synthetic inputs, or the shuffling) and of random initial weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// `--ref-batch`, `--ref-lr`: the user's tuned learning rate.
#[derive(Args, Clone, Debug)]
pub struct ReferenceFlags {
    /// The batch size your learning rate was tuned at [default: the smallest batch the
    /// command trains: --b-small for advise and noise, the smallest of --batches for sweep
    /// and run (else run's --start)].
    #[arg(long, value_parser = positive_u64)]
    pub ref_batch: Option<u64>,
    /// The learning rate tuned at --ref-batch [default: --lr for advise and noise, 0.001 for
    /// sweep; run: none, the command sets its own, unless it takes {lr}, which needs this].
    #[arg(long, value_parser = positive_f64)]
    pub ref_lr: Option<f64>,
}

impl ReferenceFlags {
    /// The tuned (batch, rate), when either was given; the other from the defaults.
    pub fn pair(&self, batch: u64, lr: f64) -> Option<(u64, f64)> {
        (self.ref_batch.is_some() || self.ref_lr.is_some())
            .then(|| (self.ref_batch.unwrap_or(batch), self.ref_lr.unwrap_or(lr)))
    }
}

/// `--b-small`, `--k`: the two-batch noise estimator.
#[derive(Args, Clone, Debug)]
pub struct EstimatorFlags {
    /// Samples in each small batch of the noise-scale estimator.
    #[arg(long, default_value_t = batchfit_tune::noise::DEFAULT_B_SMALL, value_parser = positive_usize)]
    pub b_small: usize,
    /// Small batches per noise measurement: B_big = k x B_small.
    #[arg(long, default_value_t = batchfit_tune::noise::DEFAULT_K, value_parser = parse_k)]
    pub k: usize,
}

/// `--device`.
#[derive(Args, Clone, Debug)]
pub struct DeviceFlag {
    /// Devices, comma-separated: cpu, cuda:0, wgpu:0 (a GPU needs a GPU build) [probe and sweep:
    /// cpu; advise: every device present]. sweep trains every run on each.
    #[arg(long, value_delimiter = ',')]
    pub device: Vec<String>,
}

/// `--batches`.
#[derive(Args, Clone, Debug)]
pub struct BatchesFlag {
    /// Batch sizes, comma-separated: exactly these instead of a search or a sample (probe,
    /// advise, run), the batches trained (sweep) [16,64,256; with --verify the recommended
    /// batch and its neighbours in the advice's table], or predicted for (noise) [powers of two
    /// up to the data size].
    #[arg(long, value_delimiter = ',', value_parser = positive_u64)]
    pub batches: Vec<u64>,
}

/// `--memory-limit`.
#[derive(Args, Clone, Debug)]
pub struct MemoryLimitFlag {
    /// Memory budget of each trial, e.g. 6GiB; with it the largest batch that fits is searched
    /// for. probe and advise: the engine's memory (on the CPU batchfit's allocator holds it to the
    /// budget, on a GPU the runtime's pools); run: each process's address space (RLIMIT_AS, as
    /// `ulimit -v`), the search then predicts from the measured peaks instead of doubling.
    #[arg(long, value_parser = parse_bytes)]
    pub memory_limit: Option<Bytes>,
}

/// `--efficiency`.
#[derive(Args, Clone, Debug)]
pub struct EfficiencyFlag {
    /// The knee is the smallest batch reaching this share of the best throughput.
    #[arg(long, default_value_t = 0.9, value_parser = parse_share)]
    pub efficiency: f64,
}

/// `--timeout`.
#[derive(Args, Clone, Debug)]
pub struct TimeoutFlag {
    /// A trial (one process per batch) still running after this long is ended and reported,
    /// e.g. 120s.
    #[arg(long, default_value = "600s", value_parser = parse_seconds)]
    pub timeout: f64,
}

/// `--json`.
#[derive(Args, Clone, Debug)]
pub struct JsonFlag {
    /// Print the result as JSON (schema: docs/json.md).
    #[arg(long)]
    pub json: bool,
}

/// `--html`.
#[derive(Args, Clone, Debug)]
pub struct HtmlFlag {
    /// Also write a self-contained HTML report with plots to this file. A file already there is
    /// replaced only if it is empty or an earlier batchfit report; a symlink is written through.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
}

/// `--gpus`, `--strategy`, `--link`: data parallelism over several GPUs (docs/scale.md).
#[derive(Args, Clone, Debug)]
pub struct ParallelFlags {
    /// Data-parallel GPUs, comma-separated for several: plan: GPUs per node (x --nodes), memory
    /// per device, micro-batch, accumulation and communication; advise: world sizes of devices
    /// like the first one measured, with their time to target.
    #[arg(long, value_name = "N", value_delimiter = ',', value_parser = parse_device_count)]
    pub gpus: Vec<u64>,
    /// How model states are sharded, comma-separated (fsdp is FULL_SHARD) [plan: all; advise,
    /// which takes one: ddp].
    #[arg(long, value_enum, value_delimiter = ',')]
    pub strategy: Vec<Strategy>,
    /// The link of the ring: between GPUs on one node; between nodes with --nodes > 1
    /// [default: pcie4 on one node, ib100 between nodes].
    #[arg(long, value_enum)]
    pub link: Option<LinkPreset>,
}

impl ParallelFlags {
    /// Without --gpus, neither --strategy nor --link may be given.
    pub fn check(&self) -> CliResult {
        let given = [
            (!self.strategy.is_empty(), "--strategy"),
            (self.link.is_some(), "--link"),
        ];
        match given.iter().find(|(g, _)| *g) {
            Some((_, flag)) if self.gpus.is_empty() => Err(CliError::Pipeline(
                batchfit_pipeline::Error::input(format!("{flag} needs --gpus N")),
            )),
            _ => Ok(()),
        }
    }
}

/// `--verify`: check an advice by training what it predicted (sweep, run).
#[derive(Args, Clone, Debug)]
pub struct VerifyFlag {
    /// Check an advice: train its recommended batch and neighbours (or --batches) as it
    /// predicted, to its target loss, and print predicted beside measured with a verdict.
    /// FILE is the output of `batchfit advise --json` for sweep (its model, data,
    /// learning-rate rule and target, no warm-up) or of `batchfit run --json` for run (the
    /// command at the run's rates, each training ended at the target).
    #[arg(long, value_name = "FILE")]
    pub verify: Option<PathBuf>,
}

/// `--seeds`: trainings per batch (sweep, run --verify).
#[derive(Args, Clone, Debug)]
pub struct SeedsFlag {
    /// Seeds per batch size (0, 1, ...). sweep: initial weights and data order, every
    /// batch from the same weights for a given seed; run --verify: `{seed}` in the
    /// command (and BATCHFIT_SEED).
    #[arg(long, default_value_t = 3, value_parser = positive_u64)]
    pub seeds: u64,
}

/// Whose runtime a plan models.
#[derive(Args, Clone, Debug)]
pub struct RuntimeFlag {
    /// Whose allocator and autograd to model: burn (batchfit's engine) or pytorch.
    #[arg(long, value_enum, default_value = "burn")]
    pub runtime: Runtime,
}

/// How a step trains: the flags that change its memory.
#[derive(Args, Clone, Debug)]
pub struct TrainFlags {
    #[command(flatten)]
    pub optimizer: OptimizerFlag,
    /// Precision of weights and activations.
    #[arg(long, value_enum, default_value = "fp32")]
    pub precision: Precision,
    /// Recompute activations in sqrt(layers) segments instead of keeping them.
    #[arg(long)]
    pub checkpointing: bool,
    /// Samples per forward/backward with gradient accumulation.
    #[arg(long, value_name = "N", value_parser = positive_u64)]
    pub micro_batch: Option<u64>,
    #[command(flatten)]
    pub runtime: RuntimeFlag,
    #[command(flatten)]
    pub seq_len: SeqLenFlag,
}

impl TrainFlags {
    pub fn options(&self, gpu: bool) -> TrainOptions {
        TrainOptions {
            optimizer: self.optimizer.optimizer,
            precision: self.precision,
            checkpointing: self.checkpointing,
            micro_batch: self.micro_batch,
            runtime: self.runtime.runtime,
            seq_len: self.seq_len.seq_len,
            gpu,
        }
    }
}

/// Variable-length sequences: the lengths of the user's data instead of one --seq-len.
#[derive(Args, Clone, Debug)]
pub struct LengthFlags {
    /// Sequence lengths of the training data, in the model's sequence steps (frames,
    /// tokens): a text file with one per line, FILE.csv:COLUMN, FILE.npy, or FILE.npz:KEY
    /// (lengths, or a padding mask). Plans the batch that survives the longest sequence,
    /// a bucket table and a frame budget (docs/lengths.md).
    #[arg(long, value_name = "FILE[:KEY]")]
    pub lengths: Option<String>,
    /// Length buckets (of about equal counts) for --lengths.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = positive_usize)]
    pub buckets: usize,
    /// Sequence steps per second (e.g. 100 for 10 ms frames): lengths are shown in seconds
    /// too; the lengths themselves are always in steps.
    #[arg(long, value_name = "FPS", value_parser = positive_f64, requires = "lengths")]
    pub frames_per_second: Option<f64>,
}

impl LengthFlags {
    /// The request, when --lengths is given.
    pub fn request(&self) -> Option<batchfit_pipeline::lengths::LengthsRequest> {
        self.lengths
            .as_ref()
            .map(|source| batchfit_pipeline::lengths::LengthsRequest {
                source: source.clone(),
                buckets: self.buckets,
                measure_epochs: 0,
            })
    }

    pub fn units(&self) -> batchfit_report::lengths::LengthUnits {
        batchfit_report::lengths::LengthUnits {
            frames_per_second: self.frames_per_second,
        }
    }
}

/// Flags of every command that measures training steps on the engine.
#[derive(Args, Clone, Debug)]
pub struct MeasureFlags {
    #[command(flatten)]
    pub device: DeviceFlag,
    #[command(flatten)]
    pub batches: BatchesFlag,
    #[command(flatten)]
    pub memory_limit: MemoryLimitFlag,
    #[command(flatten)]
    pub efficiency: EfficiencyFlag,
    #[command(flatten)]
    pub threads: ThreadsFlag,
    /// Untimed steps before timing each batch size.
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    /// Seconds of timed steps per batch size at most.
    #[arg(long, default_value_t = 2.0, value_parser = parse_seconds)]
    pub time_cap: f64,
    /// Seconds of timed steps per batch size at least (within --time-cap). On a
    /// shared virtual machine whose speed moves in phases of a fraction of a
    /// second, 1 or 2 makes one batch's time repeat closer from run to run
    /// (docs/time-to-target.md), at that much more time per batch.
    #[arg(long, default_value_t = 0.25, value_parser = parse_seconds)]
    pub min_time: f64,
    /// Largest batch sampled when no --memory-limit bounds it.
    #[arg(long, default_value_t = 1024, value_parser = positive_u64)]
    pub up_to: u64,
    #[command(flatten)]
    pub optimizer: OptimizerFlag,
    #[command(flatten)]
    pub lr: LrFlag,
    #[command(flatten)]
    pub seq_len: SeqLenFlag,
    #[command(flatten)]
    pub seed: SeedFlag,
    #[command(flatten)]
    pub timeout: TimeoutFlag,
}

impl MeasureFlags {
    /// The typed configuration; the worker is this very binary.
    pub fn config(&self) -> CliResult<MeasureConfig> {
        let worker = std::env::current_exe().map_err(|e| {
            CliError::Pipeline(batchfit_pipeline::Error::failure(
                "cannot find the batchfit binary",
                e,
            ))
        })?;
        Ok(MeasureConfig {
            batches: self.batches.batches.clone(),
            memory_limit: self.memory_limit.memory_limit,
            efficiency: self.efficiency.efficiency,
            threads: self.threads.threads,
            warmup: self.warmup,
            time_cap_s: self.time_cap,
            min_time_s: self.min_time,
            up_to: self.up_to,
            optimizer: self.optimizer.optimizer,
            lr: self.lr.lr,
            seq_len: self.seq_len.seq_len,
            seed: self.seed.seed,
            timeout: Duration::from_secs_f64(self.timeout.timeout),
            worker,
            budget_s: None,
        })
    }
}

/// Where the training data comes from.
#[derive(Args, Clone, Debug)]
pub struct DataFlags {
    /// Training data: .npy, .npz (keys = model input names + `target`), .csv or
    /// .tsv (gzipped or not), IDX (MNIST), or builtin:digits [default for the default model].
    #[arg(long)]
    pub data: Option<String>,
    /// Labels for single-array formats (.npy, IDX).
    #[arg(long)]
    pub labels: Option<String>,
    /// CSV column holding the label: a 0-based index (negative counts from the end) or its name in the header [default: last].
    #[arg(long, allow_hyphen_values = true)]
    pub label_col: Option<batchfit_tune::dataset::LabelCol>,
    #[command(flatten)]
    pub loss: LossFlags,
    /// Standardise every input feature (and regression targets) to zero mean
    /// and unit spread for batchfit's own runs, as a fix for unscaled data.
    #[arg(long)]
    pub standardize: bool,
}

impl DataFlags {
    pub fn source(&self) -> Result<DataSource, CliError> {
        Ok(DataSource {
            data: self.data.clone(),
            labels: self.labels.clone(),
            label_col: self.label_col.clone(),
            loss: self.loss.request()?,
            standardize: self.standardize,
        })
    }
}

/// `--loss`, `--class-axis`, `--blank`: the loss the model trains with, where
/// the one chosen from its output's shape is not it (docs/model-spec.md).
#[derive(Args, Clone, Debug, Default)]
pub struct LossFlags {
    /// The loss to train with, replacing the one chosen from the output's shape:
    /// mse, ce (cross-entropy; per position for [B, T, C] or [B, C, H, W]) or ctc.
    #[arg(long, value_parser = parse_loss)]
    pub loss: Option<LossChoice>,
    /// The output's class axis, numbered as PyTorch numbers the output's dims
    /// (1: the first after the batch, -1: the last) [default: -1 for [B, C] and
    /// [B, T, C], 1 for [B, C, H, W] and more axes].
    #[arg(long, allow_hyphen_values = true, requires = "loss")]
    pub class_axis: Option<i64>,
    /// The blank class of --loss ctc [default: 0, as PyTorch's CTCLoss].
    #[arg(long, requires = "loss")]
    pub blank: Option<usize>,
}

impl LossFlags {
    /// The loss asked for, if any; `--blank` belongs to `--loss ctc` alone.
    pub fn request(&self) -> Result<Option<LossRequest>, CliError> {
        let Some(choice) = self.loss else {
            return Ok(None);
        };
        if self.blank.is_some() && choice != LossChoice::Ctc {
            return Err(CliError::Pipeline(batchfit_pipeline::Error::input(
                format!(
                    "--blank is the blank class of --loss ctc, not of --loss {}",
                    choice.name()
                ),
            )));
        }
        Ok(Some(LossRequest {
            choice,
            class_axis: self.class_axis,
            blank: self.blank,
        }))
    }
}

fn parse_loss(s: &str) -> Result<LossChoice, String> {
    LossChoice::parse(s).ok_or_else(|| format!("`{s}` is not a loss: mse, ce or ctc"))
}

/// A size such as `6GiB`; zero and negative sizes are refused.
pub fn parse_bytes(s: &str) -> Result<Bytes, batchfit_plan::ParseBytesError> {
    Bytes::parse(s)
}

pub fn positive_u64(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("`{s}` must be a positive integer")),
    }
}

pub fn positive_usize(s: &str) -> Result<usize, String> {
    positive_u64(s).map(|n| n as usize)
}

pub fn positive_f64(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x > 0.0 && x.is_finite() => Ok(x),
        _ => Err(format!("`{s}` must be a positive number")),
    }
}

pub fn non_negative_f64(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x >= 0.0 && x.is_finite() => Ok(x),
        _ => Err(format!("`{s}` must be a number of at least 0")),
    }
}

/// Small batches per noise measurement: at least 2, so B_big exceeds B_small.
pub fn parse_k(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(k) if k >= 2 => Ok(k),
        _ => Err(format!("`{s}` must be an integer of at least 2")),
    }
}

pub fn parse_share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x > 0.0 && x <= 1.0 => Ok(x),
        _ => Err(format!("`{s}` must be a share in (0, 1], e.g. 0.9")),
    }
}

/// The longest duration a flag takes, in seconds.
const MAX_SECONDS: f64 = 1e9;

pub fn parse_seconds(s: &str) -> Result<f64, String> {
    let t = s.trim_end_matches('s');
    match t.parse::<f64>() {
        // A duration becomes a deadline (now + it): at most about 31 years,
        // which neither `Duration` nor an `Instant` overflows.
        Ok(x) if x > 0.0 && x <= MAX_SECONDS => Ok(x),
        Ok(x) if x > 0.0 => Err(format!("`{s}` is more than {MAX_SECONDS:e} seconds")),
        _ => Err(format!("`{s}` must be a positive number of seconds")),
    }
}

/// A progress bar on stderr (hidden when asked, e.g. for JSON output). When stderr is
/// not a terminal (a log file, CI, `nohup`), where a bar draws nothing, each new
/// message is printed as a plain line with the time since the start instead.
pub fn progress(hidden: bool) -> Bar {
    if hidden {
        return Bar(ProgressBar::hidden(), None);
    }
    if !std::io::stderr().is_terminal() {
        return Bar(
            ProgressBar::hidden(),
            Some(Lines {
                start: Instant::now(),
                last: Mutex::default(),
            }),
        );
    }
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .expect("valid template"),
    );
    bar.enable_steady_tick(Duration::from_millis(120));
    Bar(bar, None)
}

/// The terminal's view of a pipeline's progress: a bar, or plain lines off a terminal.
pub struct Bar(pub ProgressBar, Option<Lines>);

/// Plain progress lines: the last message printed, so each is printed once.
pub struct Lines {
    start: Instant,
    last: Mutex<String>,
}

impl Progress for Bar {
    fn message(&self, msg: String) {
        if let Some(lines) = &self.1 {
            let mut last = lines.last.lock().unwrap_or_else(|e| e.into_inner());
            if *last != msg {
                let t = lines.start.elapsed().as_secs();
                let done = match self.0.length() {
                    Some(len) if len > 0 => format!(" {}/{len}", self.0.position()),
                    _ => String::new(),
                };
                let _ = writeln!(
                    std::io::stderr(),
                    "[{:02}:{:02}:{:02}]{done} {msg}",
                    t / 3600,
                    t / 60 % 60,
                    t % 60
                );
                last.clone_from(&msg);
            }
        }
        self.0.set_message(msg);
    }
    fn set_length(&self, len: u64) {
        self.0.set_length(len);
    }
    fn add_length(&self, more: u64) {
        self.0.inc_length(more);
    }
    fn set_position(&self, pos: u64) {
        self.0.set_position(pos);
    }
    fn advance(&self, n: u64) {
        self.0.inc(n);
    }
    fn warn(&self, msg: String) {
        use std::io::Write as _;
        // Above the bar, which redraws below it.
        self.0
            .suspend(|| writeln!(std::io::stderr(), "warning: {msg}"))
            .ok();
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}

/// Writes `text` to stdout; a closed pipe ends the command quietly.
pub fn print(text: &str) -> CliResult {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|_| out.flush())
        .map_err(CliError::Output)
}

/// A document as pretty JSON on stdout.
pub fn emit_json<T: serde::Serialize>(doc: &T) -> CliResult {
    print(&format!(
        "{}\n",
        serde_json::to_string_pretty(doc).expect("documents serialise")
    ))
}

/// A command's result on stdout: its JSON document `doc`, or `value` as terminal text.
pub fn emit<T, D: serde::Serialize>(
    value: &T,
    doc: &D,
    json: bool,
    text: fn(&T) -> String,
) -> CliResult {
    emit_with_html(value, doc, json, text, None, |_| String::new())
}

/// As [`emit`], after writing the HTML page to `html` when one is asked for.
pub fn emit_with_html<T, D: serde::Serialize>(
    value: &T,
    doc: &D,
    json: bool,
    text: fn(&T) -> String,
    html: Option<&Path>,
    page: fn(&T) -> String,
) -> CliResult {
    if let Some(path) = html {
        batchfit_pipeline::output::write_atomically("--html", path, &page(value))?;
    }
    if json {
        emit_json(doc)
    } else {
        print(&text(value))?;
        match html {
            Some(path) => print(&format!("report written to {}\n", path.display())),
            None => Ok(()),
        }
    }
}
