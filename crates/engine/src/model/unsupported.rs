//! The one error of compiling a graph for the engine.

/// Why a graph cannot be turned into a program.
#[derive(Debug, thiserror::Error)]
#[error("node `{node}`: the engine cannot train {what} yet")]
pub struct Unsupported {
    /// The node's name.
    pub node: String,
    /// What about it the engine lacks.
    pub what: String,
}
