//! How a trial ended ([`Outcome`], the one vocabulary for `run` and `probe`)
//! and what one trial of the user's command measured.

use crate::protocol::StepStats;
use serde::Serialize;

/// How a trial ended: the one outcome type of every child batchfit runs.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "outcome", content = "detail", rename_all = "snake_case")]
pub enum Outcome {
    /// Exited with status 0.
    Ran,
    /// Ran out of memory; how it was recognised.
    OutOfMemory(String),
    /// Failed for another reason: exit status and the tail of its output.
    /// Never called out of memory unless its output or signal says so.
    Crashed(String),
    /// Ran to its end but its measurement is unusable (e.g. the loss became NaN).
    Failed(String),
    /// Still running at the time-out; its process tree was ended.
    TimedOut,
    /// The program could not be started at all.
    NotStarted(String),
}

/// Everything measured in one trial.
#[derive(Clone, Debug, Serialize)]
pub struct TrialResult {
    pub batch: u64,
    #[serde(flatten)]
    pub outcome: Outcome,
    /// Wall time from start to exit, process start-up included.
    pub wall_s: f64,
    /// Statistics of the steps the command reported, warm-up left out.
    pub steps: Option<StepStats>,
    /// Output lines that looked like protocol lines but did not parse.
    pub bad_step_lines: usize,
    /// Peak resident memory of the whole process tree (sampled; at least the
    /// command's own peak from the kernel).
    pub peak_host_bytes: Option<u64>,
    /// Peak virtual size of the tree's largest process (VmPeak), sampled under
    /// `--memory-limit` (what RLIMIT_AS holds each process to); else null.
    pub peak_vm_bytes: Option<u64>,
    /// Peak GPU memory of the tree's processes (NVML), when on an NVIDIA GPU.
    pub peak_gpu_bytes: Option<u64>,
    /// Mean and highest utilisation of that GPU while the trial ran (whole device).
    pub gpu_util_mean_pct: Option<f64>,
    pub gpu_util_max_pct: Option<u32>,
    pub gpu_device: Option<u32>,
    /// Every step the command reported, in order (losses and noise
    /// measurements are read from these; not part of the JSON).
    #[serde(skip)]
    pub reports: Vec<crate::protocol::StepReport>,
    /// Each rank's own figures (one entry, rank 0, without a launcher).
    pub ranks: Vec<RankResult>,
}

/// What one rank (one worker of a launched trial) measured.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RankResult {
    pub rank: u32,
    /// Steps it reported.
    pub steps: usize,
    /// Its median step time, warm-up left out.
    pub median_step_s: Option<f64>,
    /// Peak resident memory of its processes (it and its children).
    pub peak_host_bytes: Option<u64>,
    /// Peak GPU memory of its processes (NVML).
    pub peak_gpu_bytes: Option<u64>,
}

impl TrialResult {
    pub(crate) fn not_started(batch: u64, why: String) -> TrialResult {
        TrialResult {
            batch,
            outcome: Outcome::NotStarted(why),
            wall_s: 0.0,
            steps: None,
            bad_step_lines: 0,
            peak_host_bytes: None,
            peak_vm_bytes: None,
            peak_gpu_bytes: None,
            gpu_util_mean_pct: None,
            gpu_util_max_pct: None,
            gpu_device: None,
            reports: Vec::new(),
            ranks: Vec::new(),
        }
    }
}

impl Outcome {
    /// How a max-batch search reads this outcome; `peak` is the measured
    /// high-water mark of a run. Only out-of-memory is evidence about memory:
    /// a crash, a failed measurement or a time-out stops a search.
    pub fn verdict(&self, peak: Option<batchfit_plan::Bytes>) -> batchfit_tune::search::Verdict {
        use batchfit_tune::search::Verdict;
        match self {
            Outcome::Ran => Verdict::Runs { peak },
            Outcome::OutOfMemory(_) => Verdict::OutOfMemory,
            Outcome::Crashed(_)
            | Outcome::Failed(_)
            | Outcome::TimedOut
            | Outcome::NotStarted(_) => Verdict::Broken,
        }
    }

    /// One line for tables: "ran", "out of memory", ...
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Ran => "ran",
            Outcome::OutOfMemory(_) => "out of memory",
            Outcome::Crashed(_) => "crashed",
            Outcome::Failed(_) => "failed",
            Outcome::TimedOut => "timed out",
            Outcome::NotStarted(_) => "not started",
        }
    }

    /// The detail: how out-of-memory was recognised, or the crash's output.
    pub fn detail(&self) -> Option<&str> {
        match self {
            Outcome::OutOfMemory(s)
            | Outcome::Crashed(s)
            | Outcome::Failed(s)
            | Outcome::NotStarted(s) => Some(s),
            _ => None,
        }
    }
}

impl std::fmt::Display for Outcome {
    /// The label and, where there is one, its detail: how a table row says it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Ran => write!(f, "ran"),
            Outcome::OutOfMemory(why) => write!(f, "out of memory ({why})"),
            Outcome::Crashed(why) => write!(f, "crashed: {why}"),
            Outcome::Failed(why) | Outcome::NotStarted(why) => write!(f, "{why}"),
            Outcome::TimedOut => write!(f, "timed out"),
        }
    }
}
