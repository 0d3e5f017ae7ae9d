//! The pipelines behind batchfit's commands, as a library. They load, spawn,
//! read and write; every decision is `batchfit_tune`'s, every word of a report
//! `batchfit_report`'s.
//!
//! Each command of the `batchfit` binary maps its flags to a typed
//! configuration, calls one function here, and renders what it returns
//! (ripgrep's split: the binary wires flags, the libraries decide):
//!
//! - [`probe`]: timed training steps across batch sizes on one device, each in
//!   a fresh worker process ([`probe::WorkerTrials`] under `batchfit_tune`'s
//!   measuring loop), the max-batch search under a memory budget;
//! - [`noise`]: the gradient noise scale of a real run on the user's data;
//! - [`advise`]: plan, noise run, probe on every device, then
//!   `batchfit_tune::decide` on the evidence;
//! - [`sweep`]: real short trainings per batch and seed, kept in `--out`;
//! - [`verify`]: an advice file read back for `sweep --verify` to check;
//! - [`run`]: the user's own training command per batch
//!   ([`run::CommandTrials`] under the same measuring loop);
//! - [`run_verify`]: `run`'s prediction held against trainings of the same command;
//! - [`lengths`]: the same over a distribution of sequence lengths.
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
mod rate_check;
#[cfg(unix)]
pub mod run;
#[cfg(unix)]
pub mod run_verify;
pub mod sweep;
mod sweep_out;
pub mod verify;

pub use error::{Error, Result};

/// The model every command uses when none is given: a digits MLP, trained on
/// the shipped digits data.
pub const DEFAULT_MODEL: &str = "zoo:digits-mlp";
pub use progress::{NoProgress, Progress};
