//! The pipelines behind batchfit's commands, as a library.
//!
//! Each command of the `batchfit` binary maps its flags to a typed
//! configuration, calls one function here, and emits the document it returns
//! (ripgrep's split: the binary wires flags, the libraries decide):
//!
//! - [`probe`]: timed training steps across batch sizes on one device, each in
//!   a fresh worker process, the max-batch search under a memory budget, the knee;
//! - [`noise`]: the gradient noise scale of a real run on the user's data;
//! - [`advise`]: plan, probe on every device, noise, then the recommendation and
//!   the time-to-target table (the decisions themselves are pure functions in
//!   `batchfit_tune::advice` and `batchfit_tune::target`);
//! - [`sweep`]: real short trainings per batch and seed, fitted against S(B);
//! - [`verify`]: an advice file's prediction for `sweep --verify` to check;
//! - [`run`]: the user's own training command per batch, through the one runner
//!   of `batchfit_exec`.
//!
//! Progress goes through the [`Progress`] trait, so the pipelines know nothing
//! of terminals; errors say whether the input was at fault ([`Error::is_input`]).

pub mod advise;
pub mod error;
pub mod lengths;
pub mod noise;
pub mod output;
pub mod probe;
pub mod progress;
#[cfg(unix)]
pub mod run;
pub mod sweep;
mod sweep_out;
pub mod verify;

pub use error::{Error, Result};

/// The model every command uses when none is given: a digits MLP, trained on
/// the shipped digits data.
pub const DEFAULT_MODEL: &str = "zoo:digits-mlp";
pub use progress::{NoProgress, Progress};
