//! Flags shared by several subcommands, and their parsing into library types.

use crate::error::{CliError, CliResult};
use batchfit_graph::Graph;
use batchfit_plan::{Bytes, Optimizer, Precision, Runtime, TrainOptions};
use clap::Args;

/// The model every command uses when none is given.
pub const DEFAULT_MODEL: &str = "zoo:digits-mlp";

/// How a step trains: the flags that change its memory.
#[derive(Args, Clone, Debug)]
pub struct TrainFlags {
    /// Optimizer: sgd, momentum, adam, adamw.
    #[arg(long, default_value = "adam", value_parser = parse_optimizer)]
    pub optimizer: Optimizer,
    /// Precision: fp32, fp16-mixed, bf16-mixed.
    #[arg(long, default_value = "fp32", value_parser = parse_precision)]
    pub precision: Precision,
    /// Recompute activations in sqrt(layers) segments instead of keeping them.
    #[arg(long)]
    pub checkpointing: bool,
    /// Samples per forward/backward with gradient accumulation.
    #[arg(long, value_name = "N", value_parser = positive_u64)]
    pub micro_batch: Option<u64>,
    /// Whose allocator and autograd to model: burn (batchfit's engine) or pytorch.
    #[arg(long, default_value = "burn", value_parser = parse_runtime)]
    pub runtime: Runtime,
    /// Sequence length T for recurrent models (default: the model's).
    #[arg(long, value_name = "T", value_parser = positive_usize)]
    pub seq_len: Option<usize>,
}

impl TrainFlags {
    pub fn options(&self, gpu: bool) -> TrainOptions {
        TrainOptions {
            optimizer: self.optimizer,
            precision: self.precision,
            checkpointing: self.checkpointing,
            micro_batch: self.micro_batch,
            runtime: self.runtime,
            seq_len: self.seq_len,
            gpu,
        }
    }
}

/// Loads MODEL (`zoo:NAME`, `.toml`, `.onnx`), the default if none.
pub fn load_model(model: Option<&str>) -> CliResult<Graph> {
    Ok(batchfit_graph::load(model.unwrap_or(DEFAULT_MODEL))?)
}

fn one_of<T>(s: &str, parse: fn(&str) -> Option<T>, names: &[&str]) -> Result<T, String> {
    parse(s).ok_or_else(|| format!("`{s}` is not one of {}", names.join(", ")))
}

fn parse_optimizer(s: &str) -> Result<Optimizer, String> {
    one_of(s, Optimizer::parse, Optimizer::NAMES)
}

fn parse_precision(s: &str) -> Result<Precision, String> {
    one_of(s, Precision::parse, Precision::NAMES)
}

fn parse_runtime(s: &str) -> Result<Runtime, String> {
    one_of(s, Runtime::parse, Runtime::NAMES)
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

/// Turns a library error message into bad input.
pub fn input<E: std::fmt::Display>(e: E) -> CliError {
    CliError::Input(e.to_string())
}

/// Checks an output file's folder exists before any work starts.
pub fn check_output_folder(flag: &str, path: &std::path::Path) -> CliResult {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() && !parent.is_dir() => Err(CliError::Input(
            format!("{flag}: folder {} does not exist", parent.display()),
        )),
        _ => Ok(()),
    }
}

/// Writes `contents` beside `path`, then renames: never a half-written file,
/// also when interrupted.
pub fn write_atomically(flag: &str, path: &std::path::Path, contents: &str) -> CliResult {
    let tmp = path.with_extension("partial");
    #[cfg(unix)]
    batchfit_exec::interrupt::register_partial(tmp.clone());
    let result = std::fs::write(&tmp, contents).and_then(|_| std::fs::rename(&tmp, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    #[cfg(unix)]
    batchfit_exec::interrupt::unregister_partial(&tmp);
    result.map_err(|e| CliError::Input(format!("{flag} {}: {e}", path.display())))
}

/// A command's result on stdout: JSON or the terminal text.
pub fn emit<T: serde::Serialize>(doc: &T, json: bool, text: fn(&T) -> String) -> CliResult {
    emit_with_html(doc, json, text, None, |_| String::new())
}

/// As [`emit`], after writing the HTML page to `html` when one is asked for.
pub fn emit_with_html<T: serde::Serialize>(
    doc: &T,
    json: bool,
    text: fn(&T) -> String,
    html: Option<&std::path::Path>,
    page: fn(&T) -> String,
) -> CliResult {
    if let Some(path) = html {
        write_atomically("--html", path, &page(doc))?;
    }
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(doc).expect("documents serialise")
        );
    } else {
        print!("{}", text(doc));
        if let Some(path) = html {
            println!("report written to {}", path.display());
        }
    }
    Ok(())
}
