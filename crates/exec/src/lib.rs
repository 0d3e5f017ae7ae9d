//! Runs child processes and measures them: the one runner ([`process`]) that
//! every trial goes through (the user's own training command in `run`, the
//! measuring worker in `probe`), in a fresh process group each time; how it
//! ended ([`Outcome`]: out-of-memory told apart from other crashes); the step
//! times a command reports; the peak memory of its process tree; its GPU use
//! where NVML is present; under a data-parallel launcher ([`launcher`]),
//! each rank's.
//!
//! Fresh processes matter: an in-process batch finder measures a process
//! whose memory has been fragmented by every earlier try, so the batch it
//! finds may not fit a real run.
//!
//! Unix only (process groups, signals); the CLI says so elsewhere.

pub mod error;
#[cfg(unix)]
pub mod groups;
#[cfg(unix)]
pub mod interrupt;
pub mod launcher;
#[cfg(unix)]
pub mod monitor;
pub mod oom;
#[cfg(unix)]
pub mod process;
pub mod protocol;
#[cfg(unix)]
pub mod reaper;
pub mod template;
#[cfg(unix)]
pub mod trial;

pub use batchfit_tune::trial::{Outcome, RankResult, RunTrial, TrialResult};
pub use error::{ExecError, StepLineError};
pub use launcher::{Launcher, LauncherKind};
pub use oom::looks_like_oom;
#[cfg(unix)]
pub use process::{ExitInfo, Finished, LineHandler, ProcessOptions, run_process};
pub use protocol::{NoiseReport, StepReader, StepReport, StepStats};
pub use template::CommandTemplate;
#[cfg(unix)]
pub use trial::{TrialOptions, run_trial};
