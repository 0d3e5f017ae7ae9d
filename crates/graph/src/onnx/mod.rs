//! ONNX import (placeholder until the importer lands).

use crate::error::GraphError;
use crate::graph::Graph;
use std::path::Path;

/// ONNX op types the importer maps onto the IR.
pub const SUPPORTED_ONNX_OPS: &[&str] = &[];

/// Loads an ONNX model file.
pub fn load(path: &Path) -> Result<Graph, GraphError> {
    Err(GraphError::File {
        path: path.display().to_string(),
        why: "ONNX import is not built yet".into(),
    })
}
