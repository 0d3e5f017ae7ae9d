//! Each measurement in a fresh child process.
//!
//! A step that runs out of memory aborts its process (Rust cannot unwind out of
//! a failed allocation, and a GPU backend may leave its device unusable), and a
//! long-lived process fragments its memory so a batch "found" late may not fit
//! a fresh run. So the parent (`probe`) sends a [`WorkerRequest`] to a child
//! (the same binary, hidden subcommand), which answers with one JSON line.

use crate::measure::{MeasureError, PointResult, measure_point};
use crate::{DeviceSpec, TrainConfig, Trainer, alloc};
use batchfit_plan::Optimizer;
use batchfit_tune::stats::StopRule;
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The hidden subcommand the parent starts.
pub const WORKER_SUBCOMMAND: &str = "__measure-worker";
/// Prefix of the child's answer line on stdout.
const ANSWER: &str = "BATCHFIT_WORKER ";

/// One batch size to measure.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkerRequest {
    pub model: String,
    pub device: DeviceSpec,
    pub batch: u64,
    pub optimizer: Optimizer,
    pub lr: f64,
    pub seq_len: usize,
    pub seed: u64,
    pub warmup: usize,
    pub min_steps: usize,
    /// Seconds of timed steps at least (0 for single-step trials).
    pub min_time_s: f64,
    pub max_steps: usize,
    pub time_cap_s: f64,
    pub target_rel_err: f64,
    /// Allocations beyond this many live bytes fail (CPU only).
    pub memory_limit: Option<u64>,
    pub threads: Option<usize>,
}

/// The child's answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum WorkerAnswer {
    Measured(PointResult),
    Failed(MeasureError),
}

/// What the parent learned from one child.
#[derive(Clone, Debug)]
pub enum Outcome {
    Measured(PointResult),
    /// The step ran out of memory; the message says how it was recognised.
    OutOfMemory(String),
    /// The loss turned NaN or infinite.
    Failed(MeasureError),
    /// The child crashed for another reason; the tail of its stderr.
    Crashed(String),
    /// The child did not finish in time.
    TimedOut,
}

/// Serves one request in this (child) process and prints the answer line.
pub fn serve(request_json: &str) -> Result<(), String> {
    let req: WorkerRequest =
        serde_json::from_str(request_json).map_err(|e| format!("bad worker request: {e}"))?;
    if let Some(n) = req.threads {
        crate::set_threads(n)?;
    }
    let graph = batchfit_graph::load(&req.model).map_err(|e| e.to_string())?;
    alloc::set_limit(req.memory_limit);
    alloc::keep_freed_memory();
    let mut trainer = Trainer::new(
        &graph,
        TrainConfig {
            optimizer: req.optimizer,
            lr: req.lr,
            seq_len: req.seq_len,
            seed: req.seed,
            device: req.device,
            init_random: false,
        },
    )
    .map_err(|e| e.to_string())?;
    let stop = StopRule {
        target_rel_err: req.target_rel_err,
        min_steps: req.min_steps,
        min_time_s: req.min_time_s,
        max_steps: req.max_steps,
        time_cap_s: req.time_cap_s,
    };
    let answer = match measure_point(&mut trainer, &graph, req.batch, req.warmup, &stop) {
        Ok(p) => WorkerAnswer::Measured(p),
        Err(e) => WorkerAnswer::Failed(e),
    };
    println!(
        "{ANSWER}{}",
        serde_json::to_string(&answer).expect("answer serialises")
    );
    Ok(())
}

/// Runs `req` in a child process of `exe` and classifies how it ended.
pub fn run_child(exe: &Path, req: &WorkerRequest, timeout: Duration) -> Outcome {
    let json = serde_json::to_string(req).expect("request serialises");
    let child = Command::new(exe)
        .arg(WORKER_SUBCOMMAND)
        .arg(json)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return Outcome::Crashed(format!("cannot start {}: {e}", exe.display())),
    };
    // Drain both pipes on threads so a chatty child cannot block on a full pipe.
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let out_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if start.elapsed() > timeout => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(_) => break None,
        }
    };
    let stdout = out_t.join().unwrap_or_default();
    let stderr = err_t.join().unwrap_or_default();
    let Some(status) = status else {
        return Outcome::TimedOut;
    };
    if let Some(line) = stdout.lines().find_map(|l| l.strip_prefix(ANSWER)) {
        return match serde_json::from_str::<WorkerAnswer>(line) {
            Ok(WorkerAnswer::Measured(p)) => Outcome::Measured(p),
            Ok(WorkerAnswer::Failed(e)) => Outcome::Failed(e),
            Err(e) => Outcome::Crashed(format!("unreadable answer from the worker: {e}")),
        };
    }
    #[cfg(unix)]
    let signal = std::os::unix::process::ExitStatusExt::signal(&status);
    #[cfg(not(unix))]
    let signal = None;
    if let Some(why) = batchfit_exec::looks_like_oom(&stderr, signal, status.code()) {
        return Outcome::OutOfMemory(why);
    }
    let tail: String = {
        let lines: Vec<&str> = stderr.lines().collect();
        lines[lines.len().saturating_sub(8)..].join("\n")
    };
    Outcome::Crashed(format!("worker exited with {status}: {tail}"))
}
