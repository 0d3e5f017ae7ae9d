//! What one trial measured and how it ended: the evidence every child process
//! batchfit starts leaves behind (the user's command in `run`, the measuring
//! worker in `probe`). `batchfit_exec` runs the processes and fills these in;
//! the decisions read them here, so they need no process to be tested.

use crate::search::{TrialReason, Verdict};
use crate::stats::Summary;
use serde::{Deserialize, Serialize};

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

/// How a trial that did not run ended, as a code: [`Outcome`] without its detail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    OutOfMemory,
    Crashed,
    Failed,
    TimedOut,
    NotStarted,
}

/// Everything measured in one trial.
#[derive(Clone, Debug, Serialize)]
pub struct TrialResult {
    pub batch: u64,
    /// The learning rate the trial was handed (`{lr}`, `BATCHFIT_LR`); null
    /// when the command sets its own.
    pub learning_rate: Option<f64>,
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
    pub reports: Vec<StepReport>,
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
    /// A trial whose program could not be started.
    pub fn not_started(batch: u64, why: String) -> TrialResult {
        TrialResult {
            batch,
            learning_rate: None,
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
    pub fn verdict(&self, peak: Option<batchfit_plan::Bytes>) -> Verdict {
        match self {
            Outcome::Ran => Verdict::Runs { peak },
            Outcome::OutOfMemory(_) => Verdict::OutOfMemory,
            Outcome::Crashed(_)
            | Outcome::Failed(_)
            | Outcome::TimedOut
            | Outcome::NotStarted(_) => Verdict::Broken,
        }
    }

    /// The failure, for every outcome but [`Outcome::Ran`].
    pub fn failure_kind(&self) -> Option<FailureKind> {
        match self {
            Outcome::Ran => None,
            Outcome::OutOfMemory(_) => Some(FailureKind::OutOfMemory),
            Outcome::Crashed(_) => Some(FailureKind::Crashed),
            Outcome::Failed(_) => Some(FailureKind::Failed),
            Outcome::TimedOut => Some(FailureKind::TimedOut),
            Outcome::NotStarted(_) => Some(FailureKind::NotStarted),
        }
    }

    /// Whether the trial ran to its end.
    pub fn ran(&self) -> bool {
        *self == Outcome::Ran
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

/// Step-time statistics of one trial, warm-up steps left out.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepStats {
    pub steps_reported: usize,
    /// Steps the statistics use (after the warm-up ones).
    pub steps_used: usize,
    pub step_time: Summary,
    /// Samples of the used steps / their seconds.
    pub samples_per_s: f64,
}

/// One training step as the command reported it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepReport {
    pub step: Option<u64>,
    pub samples: Option<u64>,
    pub seconds: f64,
    /// The step's mean training loss, when the command reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,
    /// The loss on fixed training rows after the step, in evaluation mode (the
    /// helper evaluates it every few steps): the loss `advise` judges a
    /// target by, where the command reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train_loss: Option<f64>,
    /// Gradient norms at two batch sizes, on the steps the helper measures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub noise: Option<NoiseReport>,
    /// The rank that ran the step (every rank of a launched trial prints its own lines).
    #[serde(default)]
    pub rank: Option<u32>,
}

/// Squared gradient norms of one step at two batch sizes, as the Python helper
/// (`python/`) measures them: the step's batch of `b_big` samples split into
/// micro-batches of `b_small`; `g_small_sq` is the mean of their gradients'
/// squared norms, `g_big_sq` the squared norm of the whole batch's gradient.
/// batchfit turns them into the noise scale with `batchfit_tune::noise`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct NoiseReport {
    pub b_small: f64,
    pub g_small_sq: f64,
    pub b_big: f64,
    pub g_big_sq: f64,
    /// The same two norms in the geometry of the step an adaptive optimizer
    /// takes (each coordinate weighted by 1 / (sqrt(v) + ε)², v its second
    /// moment), where the helper could read the optimizer's state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preconditioned: Option<SquaredNorms>,
    /// Rows of the data set the batch was drawn from without replacement (a
    /// shuffled loader's epoch), where the helper was told: |G|² is then
    /// corrected for the finite data as `advise`'s own runs correct it
    /// ([`crate::noise::without_replacement`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<f64>,
}

/// `g_small_sq` and `g_big_sq` of a [`NoiseReport`] in another geometry.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SquaredNorms {
    pub g_small_sq: f64,
    pub g_big_sq: f64,
}

impl NoiseReport {
    /// Usable by the two-batch estimator: finite, non-negative, `b_big > b_small > 0`.
    pub fn is_valid(&self) -> bool {
        let pre = self
            .preconditioned
            .map_or([0.0, 0.0], |p| [p.g_small_sq, p.g_big_sq]);
        [self.b_small, self.g_small_sq, self.b_big, self.g_big_sq]
            .iter()
            .chain(&pre)
            .all(|x| x.is_finite() && *x >= 0.0)
            && self.b_big > self.b_small
            && self.b_small > 0.0
    }

    /// [`NoiseReport::rows`] where it can be the rows of a without-replacement
    /// draw of `b_big` (a count below the batch is no such data set: left out).
    pub fn finite_rows(&self) -> Option<f64> {
        self.rows.filter(|n| n.is_finite() && *n >= self.b_big)
    }
}

/// One trial of a user's command and why it was run.
#[derive(Clone, Debug, Serialize)]
pub struct RunTrial {
    /// Why this batch was tried (the search's step, a knee refinement, listed).
    #[serde(flatten)]
    pub reason: TrialReason,
    #[serde(flatten)]
    pub result: TrialResult,
}
