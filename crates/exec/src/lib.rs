//! Runs the user's own training command once per batch size, each time in a
//! fresh process group, and measures it: how it ended (out-of-memory told
//! apart from other crashes), the step times it reports, the peak memory of
//! its process tree, and its GPU use where NVML is present.
//!
//! Fresh processes matter: an in-process batch finder measures a process
//! whose memory has been fragmented by every earlier try, so the batch it
//! finds may not fit a real run.
//!
//! Unix only (process groups, signals); the CLI says so elsewhere.

#[cfg(unix)]
pub mod interrupt;
#[cfg(unix)]
pub mod monitor;
pub mod oom;
pub mod protocol;
pub mod result;
pub mod template;
#[cfg(unix)]
pub mod trial;

pub use oom::looks_like_oom;
pub use protocol::{StepReader, StepReport, StepStats};
pub use result::{Outcome, TrialResult};
pub use template::CommandTemplate;
#[cfg(unix)]
pub use trial::{TrialOptions, run_trial};
