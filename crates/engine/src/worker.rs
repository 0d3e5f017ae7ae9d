//! Each measurement in a fresh child process.
//!
//! A step that runs out of memory aborts its process (Rust cannot unwind out of
//! a failed allocation, and a GPU backend may leave its device unusable), and a
//! long-lived process fragments its memory so a batch "found" late may not fit
//! a fresh run. So the parent (`probe`) sends a [`WorkerRequest`] to a child
//! (the same binary, hidden subcommand), which answers with one JSON line.

use crate::measure::{MeasureError, PointResult, measure_point};
use crate::{DeviceSpec, TrainConfig, Trainer, alloc};
use batchfit_exec::{LineHandler, Outcome, ProcessOptions, run_process};
use batchfit_plan::Optimizer;
use batchfit_tune::stats::StopRule;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The hidden subcommand the parent starts.
pub const WORKER_SUBCOMMAND: &str = "__measure-worker";
/// Prefix of the child's answer line on stdout.
const ANSWER: &str = "BATCHFIT_WORKER ";

/// One batch size to measure.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkerRequest {
    pub model: String,
    /// The loss the user named, applied to the model as the parent applied it.
    #[serde(default)]
    pub loss: Option<batchfit_graph::LossRequest>,
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
    /// On the CPU, allocations beyond this many live bytes fail; on a GPU, a
    /// step after which the runtime reserves more fails as out of memory.
    pub memory_limit: Option<u64>,
    pub threads: Option<usize>,
}

/// The child's answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum WorkerAnswer {
    Measured(PointResult),
    Failed(MeasureError),
}

/// What the parent learned from one child: how it ended (the one outcome
/// type, [`batchfit_exec::Outcome`]) and, when it ran, what it measured.
#[derive(Clone, Debug)]
pub struct WorkerResult {
    pub outcome: Outcome,
    pub point: Option<PointResult>,
}

impl WorkerResult {
    fn ended(outcome: Outcome) -> WorkerResult {
        WorkerResult {
            outcome,
            point: None,
        }
    }
}

/// Why a worker could not serve its request (the child's own errors, printed
/// on its stderr; the parent reads them as a crash).
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("bad worker request")]
    Request(#[source] serde_json::Error),
    #[error(transparent)]
    Threads(#[from] crate::ThreadsError),
    #[error(transparent)]
    Model(#[from] batchfit_graph::GraphError),
    #[error(transparent)]
    Engine(#[from] crate::EngineError),
}

/// Serves one request in this (child) process and prints the answer line.
pub fn serve(request_json: &str) -> Result<(), WorkerError> {
    let req: WorkerRequest = serde_json::from_str(request_json).map_err(WorkerError::Request)?;
    crate::set_threads(req.threads.unwrap_or(0))?;
    let mut graph = batchfit_graph::load_with_loss(&req.model, req.loss.as_ref())?;
    let (host_limit, device_limit) = if req.device.is_gpu() {
        (None, req.memory_limit)
    } else {
        (req.memory_limit, None)
    };
    alloc::set_limit(host_limit);
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
    )?;
    graph.drop_weights();
    let stop = StopRule {
        target_rel_err: req.target_rel_err,
        min_steps: req.min_steps,
        min_time_s: req.min_time_s,
        max_steps: req.max_steps,
        time_cap_s: req.time_cap_s,
    };
    let answer = match measure_point(
        &mut trainer,
        &graph,
        req.batch,
        req.warmup,
        &stop,
        device_limit,
    ) {
        Ok(p) => WorkerAnswer::Measured(p),
        Err(e) => WorkerAnswer::Failed(e),
    };
    println!(
        "{ANSWER}{}",
        serde_json::to_string(&answer).expect("answer serialises")
    );
    Ok(())
}

/// Runs `req` in a child process of `exe` (through the one runner of
/// `batchfit_exec`: own process group, time-out, ended with batchfit) and reads how it
/// ended. A crash stays a crash: only the child's text or the OOM killer's
/// signal make it out of memory.
pub fn run_child(exe: &Path, req: &WorkerRequest, timeout: Duration) -> WorkerResult {
    let json = serde_json::to_string(req).expect("request serialises");
    let answer: Arc<Mutex<Option<String>>> = Arc::default();
    let on_line: LineHandler = {
        let answer = answer.clone();
        Arc::new(move |is_stderr, line| {
            if let (false, Some(a)) = (is_stderr, line.strip_prefix(ANSWER))
                && let Ok(mut slot) = answer.lock()
            {
                *slot = Some(a.to_string());
            }
        })
    };
    let finished = run_process(
        // No backtrace: a crash's last lines should be its panic message.
        Command::new(exe)
            .arg(WORKER_SUBCOMMAND)
            .arg(json)
            .env("RUST_BACKTRACE", "0"),
        ProcessOptions {
            timeout,
            on_line: Some(on_line),
            ..ProcessOptions::default()
        },
    );
    let finished = match finished {
        Ok(f) => f,
        Err(e) => {
            return WorkerResult::ended(Outcome::NotStarted(format!(
                "cannot start {}: {e}",
                exe.display()
            )));
        }
    };
    let answer = answer.lock().ok().and_then(|mut a| a.take());
    match (finished.outcome(), answer) {
        (Outcome::Ran, Some(line)) => match serde_json::from_str::<WorkerAnswer>(&line) {
            Ok(WorkerAnswer::Measured(p)) => WorkerResult {
                outcome: Outcome::Ran,
                point: Some(p),
            },
            Ok(WorkerAnswer::Failed(e @ MeasureError::DeviceOutOfMemory { .. })) => {
                WorkerResult::ended(Outcome::OutOfMemory(e.to_string()))
            }
            Ok(WorkerAnswer::Failed(e)) => WorkerResult::ended(Outcome::Failed(e.to_string())),
            Err(e) => WorkerResult::ended(Outcome::Crashed(format!(
                "unreadable answer from the worker: {e}"
            ))),
        },
        (Outcome::Ran, None) => WorkerResult::ended(Outcome::Crashed(
            "the worker exited without an answer".into(),
        )),
        (other, _) => WorkerResult::ended(other),
    }
}
