//! Exit codes and how an error is printed: 2 for bad input (a file, flag or
//! model the user can fix), 1 for a failure, 0 quietly when stdout's reader
//! went away (`batchfit plan | head -1`).

use batchfit_pipeline::Error;
use std::fmt::Write as _;

/// Why a command stopped.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Pipeline(#[from] Error),
    /// Writing the result failed (a closed pipe is not an error: see [`CliError::exit_code`]).
    #[error("cannot write the result")]
    Output(#[source] std::io::Error),
}

impl From<batchfit_graph::GraphError> for CliError {
    fn from(e: batchfit_graph::GraphError) -> Self {
        CliError::Pipeline(e.into())
    }
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Pipeline(e) if e.is_input() => 2,
            CliError::Output(e) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
            _ => 1,
        }
    }

    /// The message and every cause under it that adds something, as
    /// "what failed: because: because".
    pub fn report(&self) -> String {
        let mut out = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(s) = source {
            let text = s.to_string();
            if !out.contains(&text) {
                let _ = write!(out, ": {text}");
            }
            source = s.source();
        }
        out
    }
}

pub type CliResult<T = ()> = Result<T, CliError>;
