//! Why a pipeline stopped: bad input the user can fix, or a failure that the
//! input did not cause. Causes are kept as sources, never flattened to text.

use std::error::Error as StdError;

/// A boxed cause.
pub type Cause = Box<dyn StdError + Send + Sync + 'static>;

/// Why a pipeline stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A flag, file, model or data set the user can fix (the binary exits 2).
    #[error("{message}")]
    Input {
        message: String,
        #[source]
        source: Option<Cause>,
    },
    /// Something failed that the input did not cause (the binary exits 1).
    #[error("{message}")]
    Failure {
        message: String,
        #[source]
        source: Option<Cause>,
    },
}

/// A pipeline's result.
pub type Result<T = (), E = Error> = std::result::Result<T, E>;

impl Error {
    /// Bad input, said in `message`.
    pub fn input(message: impl Into<String>) -> Error {
        Error::Input {
            message: message.into(),
            source: None,
        }
    }

    /// Bad input: `message`, because of `source`.
    pub fn input_because(message: impl Into<String>, source: impl Into<Cause>) -> Error {
        Error::Input {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// A failure the input did not cause.
    pub fn failure(message: impl Into<String>, source: impl Into<Cause>) -> Error {
        Error::Failure {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// Whether the user's input was at fault.
    pub fn is_input(&self) -> bool {
        matches!(self, Error::Input { .. })
    }
}

/// Errors of the model, its data and the engine's support for it are bad
/// input: each names the file, node or row at fault.
macro_rules! input_errors {
    ($($t:ty),* $(,)?) => {$(
        impl From<$t> for Error {
            fn from(e: $t) -> Self {
                // The message is the error's own text; the error itself stays the
                // source, so its chain of causes is not lost.
                Error::Input { message: e.to_string(), source: Some(Box::new(e)) }
            }
        }
    )*};
}

input_errors!(
    batchfit_graph::GraphError,
    batchfit_data::DataError,
    batchfit_engine::EngineError,
    batchfit_engine::model::Unsupported,
    batchfit_engine::noise::NoiseError,
    batchfit_engine::DeviceError,
    batchfit_exec::ExecError,
    batchfit_plan::PresetError,
);
