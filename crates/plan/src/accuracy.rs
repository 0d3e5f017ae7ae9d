//! How far the plan has been from each runtime's own count of the same training
//! step on bench/'s corpus: the margin a user should leave. The figures are
//! measurements, made by the bench scripts named in each entry; bench/README.md
//! keeps their tables.

use crate::options::Runtime;
use serde::Serialize;

/// The plan's error over a corpus: `planned / measured - 1` for each (model, batch).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct MeasuredError {
    /// What the plan was held against.
    pub reference: &'static str,
    /// Models compared.
    pub models: u32,
    /// The batches each model was compared at.
    pub batches: &'static str,
    /// The median error (0.01 = the plan 1 % above the reference).
    pub median: f64,
    /// The error furthest under the reference (negative: the plan was low).
    pub lowest: f64,
    /// The error furthest over it.
    pub highest: f64,
    /// Where the measurement and its table are.
    pub source: &'static str,
}

/// The measured error of the plan for `runtime` on a GPU or a CPU; `None` where the plan
/// has not been held against that runtime there.
pub fn measured_error(runtime: Runtime, gpu: bool) -> Option<MeasuredError> {
    match (runtime, gpu) {
        (Runtime::Pytorch, false) => Some(PYTORCH_CPU),
        (Runtime::Burn, false) => Some(BURN_CPU),
        (_, true) => None,
    }
}

/// `bench/pytorch_memory.py`: PyTorch 2.15's MemTracker peak over three Adam steps on the
/// CPU (live tensors; on a GPU, what `max_memory_allocated` counts).
const PYTORCH_CPU: MeasuredError = MeasuredError {
    reference: "PyTorch's own count of live tensors (MemTracker), on a CPU",
    models: 31,
    batches: "8 and 32",
    median: -0.0009,
    lowest: -0.029,
    highest: 0.029,
    source: "bench/pytorch_memory.py, bench/README.md section 5",
};

/// `bench/corpus.sh` at commit 3da00d5 (its latest full run): the engine's measured peak
/// (`probe`).
const BURN_CPU: MeasuredError = MeasuredError {
    reference: "batchfit's engine, measured by probe, on a CPU",
    models: 19,
    batches: "8 and 32",
    median: -0.0115,
    lowest: -0.052,
    highest: 0.040,
    source: "bench/corpus.sh at commit 3da00d5, bench/README.md section 4",
};

/// One line for a report: the measured error, or that there is none.
pub fn describe(runtime: Runtime, gpu: bool) -> String {
    let percent = |x: f64| format!("{:+.1} %", x * 100.0);
    match measured_error(runtime, gpu) {
        Some(e) => format!(
            "measured error: {} to {} (median {}) against {}; {} models at batch {} ({})",
            percent(e.lowest),
            percent(e.highest),
            percent(e.median),
            e.reference,
            e.models,
            e.batches,
            e.source
        ),
        None => format!(
            "measured error: none yet; the {} plan on a {} has not been held against the runtime itself: leave a margin",
            format!("{runtime:?}").to_lowercase(),
            if gpu { "GPU" } else { "CPU" }
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_measured_error_is_ordered() {
        for runtime in [Runtime::Burn, Runtime::Pytorch] {
            for gpu in [false, true] {
                if let Some(e) = measured_error(runtime, gpu) {
                    assert!(e.lowest <= e.median && e.median <= e.highest, "{e:?}");
                    assert!(e.models > 0);
                }
                assert!(!describe(runtime, gpu).is_empty());
            }
        }
        assert!(describe(Runtime::Pytorch, true).contains("none yet"));
    }
}
