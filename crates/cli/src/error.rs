//! Errors and exit codes: 2 for bad input (a file, flag or model the user can fix), 1 for a failure.

use std::fmt;

/// Why a command stopped.
#[derive(Debug)]
pub enum CliError {
    /// Bad input: exit code 2.
    Input(String),
    /// Something failed that the input did not cause: exit code 1.
    Failure(String),
}

impl CliError {
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Input(_) => 2,
            CliError::Failure(_) => 1,
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Input(m) | CliError::Failure(m) => write!(f, "{m}"),
        }
    }
}

impl From<batchfit_graph::GraphError> for CliError {
    fn from(e: batchfit_graph::GraphError) -> Self {
        CliError::Input(e.to_string())
    }
}

pub type CliResult<T = ()> = Result<T, CliError>;
