//! The model intermediate representation of batchfit.
//!
//! A [`Graph`] is a trainable model: named inputs, nodes in execution order
//! (each an [`Op`] with its attributes and parameters), and one loss. Every
//! tensor is batch-first and its [`Shape`] holds one sample, so the batch
//! stays symbolic; recurrent models also carry a symbolic sequence length.
//!
//! Graphs come from three sources that all produce the same IR: the built-in
//! [`zoo`], a hand-written TOML [`spec`], and [`onnx`] files exported by any
//! framework. [`load`] picks the source from the model argument.

pub mod error;
pub mod graph;
pub mod loss;
pub mod onnx;
pub mod op;
pub mod shape;
pub mod spec;
pub mod zoo;

pub use error::GraphError;
pub use graph::{
    DEFAULT_SEQ_LEN, Graph, GraphBuilder, Input, InputKind, Loss, LossKind, Node, Tie,
};
pub use loss::{LossChoice, LossRequest};
pub use op::{
    Cell, Op, Param, PoolKind, ReduceKind, ResizeMode, RnnBias, ShapeError, Standardize, Window,
};
pub use shape::{Dim, Shape};

/// Loads a model from `zoo:NAME`, a `.toml` spec or an `.onnx` file, with the
/// loss chosen from its output's shape.
pub fn load(source: &str) -> Result<Graph, GraphError> {
    load_with_loss(source, None)
}

/// Loads a model to be trained, as [`load_with_loss`] does, and refuses one
/// whose loss depends on no trainable parameter ([`Graph::trains_a_parameter`]):
/// every training step would have no gradient to take.
pub fn load_trainable(source: &str, loss: Option<&LossRequest>) -> Result<Graph, GraphError> {
    let graph = load_with_loss(source, loss)?;
    if graph.trains_a_parameter() {
        return Ok(graph);
    }
    let why = GraphError::Invalid(format!(
        "the loss (on node `{}`) depends on no trainable parameter: no layer with weights lies between the inputs and it, so there is nothing to train",
        graph.loss.input
    ));
    Err(match source.strip_prefix("zoo:") {
        Some(_) => why,
        None => why.in_file(std::path::Path::new(source)),
    })
}

/// Loads a model as [`load`] does, trained with `loss` where one is given
/// ([`Graph::with_loss`]).
pub fn load_with_loss(source: &str, loss: Option<&LossRequest>) -> Result<Graph, GraphError> {
    let graph = if let Some(name) = source.strip_prefix("zoo:") {
        zoo::build(name)?
    } else {
        let path = std::path::Path::new(source);
        match path.extension().and_then(|e| e.to_str()) {
            Some("toml") => spec::load(path)?,
            Some("onnx") => onnx::load_with_loss(path, loss.map(LossRequest::import_hint))?,
            _ => {
                return Err(GraphError::NotAModel {
                    model: source.to_string(),
                    zoo: zoo::NAMES,
                });
            }
        }
    };
    match loss {
        Some(req) if source.starts_with("zoo:") => graph.with_loss(req),
        Some(req) => graph
            .with_loss(req)
            .map_err(|e| e.in_file(std::path::Path::new(source))),
        None => Ok(graph),
    }
}
