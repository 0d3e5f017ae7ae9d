//! Errors from building or loading a graph. Each names the file, node or
//! layer at fault.

/// Why a model could not be built or loaded.
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    /// A node whose op or shapes do not fit.
    #[error("node `{node}`: {why}")]
    Node { node: String, why: String },
    /// An ONNX node of a type the IR does not know.
    #[error(
        "node `{node}`: unsupported ONNX op type `{op_type}`; supported: {}",
        crate::onnx::SUPPORTED_ONNX_OPS.join(", ")
    )]
    Unsupported { node: String, op_type: String },
    /// A problem with the graph as a whole.
    #[error("{0}")]
    Invalid(String),
    /// A model file that cannot be read or parsed; the message names the file.
    #[error("{path}: {why}")]
    File { path: String, why: String },
    /// A `zoo:NAME` that does not exist.
    #[error("unknown zoo model `{0}`; available: {list}", list = crate::zoo::NAMES.join(", "))]
    UnknownZoo(String),
}

impl GraphError {
    /// An error about one node.
    pub fn node(node: impl Into<String>, why: impl Into<String>) -> GraphError {
        GraphError::Node {
            node: node.into(),
            why: why.into(),
        }
    }

    /// Prefixes the error with the file it came from.
    pub fn in_file(self, path: &str) -> GraphError {
        match self {
            GraphError::File { .. } => self,
            other => GraphError::File {
                path: path.to_string(),
                why: other.to_string(),
            },
        }
    }
}
