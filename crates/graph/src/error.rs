//! Errors from building or loading a graph. Each names the file, node or
//! layer at fault, and errors from files keep their cause as the source.
//!
//! Variants carry what their messages list (supported ops, zoo names), so this
//! module depends on no other part of the crate.

use std::path::{Path, PathBuf};

/// Why a model could not be built or loaded.
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    /// A node whose op or shapes do not fit.
    #[error("node `{node}`: {why}")]
    Node { node: String, why: String },
    /// An ONNX node of a type the IR does not know.
    #[error(
        "node `{node}`: unsupported ONNX op type `{op_type}`; supported: {}",
        .supported.join(", ")
    )]
    Unsupported {
        node: String,
        op_type: String,
        supported: &'static [&'static str],
    },
    /// A problem with the graph as a whole.
    #[error("{0}")]
    Invalid(String),
    /// An error in a model file; the message names the file, then the cause.
    #[error("{path}: {source}")]
    InFile {
        path: PathBuf,
        #[source]
        source: Box<GraphError>,
    },
    /// A model file that cannot be read.
    #[error("{path}: cannot read: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Bytes that are not an ONNX model's protobuf encoding.
    #[error("not a valid ONNX model: cannot decode: {source}")]
    OnnxDecode {
        #[source]
        source: prost::DecodeError,
    },
    /// A spec that is not valid TOML.
    #[error("not valid TOML: {source}")]
    Toml {
        #[source]
        source: toml::de::Error,
    },
    /// A model argument that is neither `zoo:NAME`, a `.toml` spec nor an `.onnx` file.
    #[error(
        "{model}: not a model: give zoo:NAME ({}), a .toml spec or an .onnx file",
        .zoo.join(", ")
    )]
    NotAModel {
        model: String,
        zoo: &'static [&'static str],
    },
    /// A `zoo:NAME` that does not exist.
    #[error("unknown zoo model `{name}`; available: {}", .available.join(", "))]
    UnknownZoo {
        name: String,
        available: &'static [&'static str],
    },
}

impl GraphError {
    /// An error about one node.
    pub fn node(node: impl Into<String>, why: impl Into<String>) -> GraphError {
        GraphError::Node {
            node: node.into(),
            why: why.into(),
        }
    }

    /// Wraps the error with the file it came from (once: an error that already
    /// names its file is returned as it is).
    pub fn in_file(self, path: &Path) -> GraphError {
        match self {
            GraphError::InFile { .. } | GraphError::Io { .. } => self,
            other => GraphError::InFile {
                path: path.to_path_buf(),
                source: Box::new(other),
            },
        }
    }
}
