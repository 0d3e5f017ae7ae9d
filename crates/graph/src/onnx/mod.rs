//! ONNX import: maps an exported model onto the IR.
//!
//! Any framework exports ONNX, so this is how PyTorch, TensorFlow/Keras and
//! MATLAB models reach `plan`, `probe` and `noise`. The file is decoded with
//! the hand-written prost messages of [`proto`]; every node goes through the
//! same [`GraphBuilder`] as the zoo and the TOML spec, so shapes are inferred
//! again with a symbolic batch and the first mismatch names its node.
//!
//! How the ONNX graph becomes the IR:
//!
//! * **Inputs.** Graph inputs that are not initializers are the model inputs.
//!   Their first dimension is the batch, whatever it holds. A symbolic
//!   dimension named like a sequence (`seq`, `time`, `len`, `frame`, `step`,
//!   `token`, `T`) becomes [`Dim::Seq`], and so does a symbolic second
//!   dimension when the model has an LSTM/GRU or the input holds token ids;
//!   any other symbolic dimension is an error. An input whose ids feed a
//!   `Gather` embedding is a token input.
//! * **Weights** come from initializers or `Constant` nodes. Their shapes
//!   give the IR's parameters; small tensors' values are read as attributes
//!   (Reshape targets, axes, Clip bounds, dropout ratios).
//! * **Trained values.** Each layer's weights are attached to its IR node
//!   ([`crate::graph::Node::weights`]) in the IR's PyTorch layout, so training
//!   can start from them: `Gemm` weights are transposed unless `transB = 1`
//!   and scaled by `alpha` (the bias by `beta`), `MatMul` weights `[in, out]`
//!   are transposed, folded biases are broadcast to `[out]`, `LSTM`/`GRU`
//!   gate blocks are reordered from ONNX's `i, o, f, c` / `z, r, h` to
//!   PyTorch's `i, f, g, o` / `r, z, n` and `B` is split into the input and
//!   recurrent biases (zeros when absent), a missing `LayerNormalization` bias
//!   is zeros. Values are read from `float` or `double` tensors (raw or typed
//!   data); a layer with any other element type, external data or a weight
//!   that is not a constant keeps `weights = None` (random initialisation).
//!   `BatchNormalization`'s running mean and variance are not kept.
//! * **Names.** An IR node is named like its ONNX node (the first output's
//!   name when the node has none); ONNX tensor names are mapped onto IR
//!   tensor names, so aliases (`Identity`, `Cast`, folded biases, layout
//!   transposes) cost nothing.
//! * **Folding.** `MatMul` with a constant 2-D right operand is a linear layer
//!   without bias; a following `Add` of a constant bias (the tensor's only
//!   consumer) becomes that layer's bias. The same holds for `Gemm` without
//!   `C` and `Conv` without `B`.
//! * **Recurrent layers.** `LSTM`/`GRU` become [`Op::Rnn`] on a batch-first
//!   `[B, T, features]` tensor. The ONNX layouts around them are views of that
//!   tensor, not ops: with `layout = 1` the input is batch-first and the output
//!   `Y [B, T, dirs, H]` comes back through `Reshape [0, 0, -1]` (or
//!   `Squeeze` of the dirs axis); with `layout = 0` (PyTorch's export) the
//!   input comes through `Transpose(perm = [1, 0, 2])` and `Y [T, dirs, B, H]`
//!   goes back through `Transpose(perm = [0, 2, 1, 3])`, `Reshape`/`Squeeze`
//!   and `Transpose(perm = [1, 0, 2])`. Initial states and sequence lengths
//!   are not modelled: the nodes computing them are skipped, and graph inputs
//!   used only there are not model inputs.
//! * **Liveness.** Only nodes that some graph output depends on are imported.
//! * **Loss.** ONNX has no loss, so one is chosen from the first graph output
//!   unless the caller gives one ([`parse_with_loss`]): logits `[B, C]` with
//!   `C > 1` get cross-entropy, `[B, T, C]` per-frame cross-entropy, anything
//!   else (a last dimension of 1, images, ...) mean squared error. A final
//!   `Softmax`/`LogSoftmax` over the class axis is **removed** when the loss
//!   is a classification loss, because the IR's cross-entropy takes logits
//!   (the same choice as PyTorch's `CrossEntropyLoss`); the loss then reads
//!   the softmax's input. A final one over another axis names the class axis
//!   (`[B, C, T]`, `[B, C, H, W]`): the classes move last and the positions
//!   become rows, read by the per-position cross-entropy.
//! * **Learned tensors.** A float initializer (more than one number) added to
//!   or multiplying an activation is a parameter, as PyTorch trains it: a
//!   positional embedding, a layer scale (`AddParam`, `MulParam`). Read through
//!   folded `Gather`/`Slice`/`Reshape`/`Transpose` at constant indices (position
//!   ids from a buffer or `Range`, token type ids expanded over the batch), the
//!   whole table is the parameter and the indices are kept (`AddTable`).
//! * **Einsum.** A product of two operands with at most one contracted label
//!   and one label of either operand alone is rewritten before import into
//!   `Transpose`/`Unsqueeze`/`MatMul`/`Squeeze` (see `einsum.rs`), so it is
//!   read like the written-out product (a weight operand: a linear layer).
//! * **Padding.** `Pad` with zeros over sample axes, its pads a constant or the
//!   shape arithmetic `F.pad` exports (pairs reshaped, reversed, transposed).
//! * **Shape arithmetic.** `Shape` and the integer `Gather`, `Unsqueeze`,
//!   `Squeeze`, `Concat`, `Slice`, `Mul`, `Add` around it are evaluated with a
//!   symbolic batch, so PyTorch's `x.view(x.size(0), -1)` becomes a per-sample
//!   `Reshape`; they leave no IR node.
//!
//! Limitations: no element-wise arithmetic with constants except folded biases,
//! learned tensors, scalars (or adding zeros / multiplying by ones), no
//! arithmetic on the symbolic batch in shape computations (integer `Div` of
//! numbers truncates, as the spec says), `Conv`/pools over 1 to 3 spatial
//! dimensions (the engine trains 1 and 2; 3-d is planned only), `Resize` of
//! the spatial axes only,
//! `LSTM` peepholes rejected, `direction = reverse` counted as forward (same
//! cost), a recurrent layer without `B` still counted with both bias vectors
//! (zeros), non-default recurrent activations and `GRU`
//! `linear_before_reset = 0` ignored (they do not change shapes or
//! parameters; the trained weights of such layers are attached all the same,
//! so the IR computes a somewhat different function from them).
//!
//! The code: `decode` reads tensors and attributes, `view` holds the recurrent
//! layout views, `shapes` the shape arithmetic, `inputs` the model inputs and
//! `import` the driver (node order, liveness, lookups and outputs); `ops` maps
//! each op type to its family's file (`ops/conv.rs`, `ops/recurrent.rs`, ...).
//! A new op is a function in one of those files and one line in `ops/mod.rs`.
//!
//! [`GraphBuilder`]: crate::GraphBuilder
//! [`Dim::Seq`]: crate::Dim::Seq
//! [`Op::Rnn`]: crate::Op::Rnn

pub mod proto;

mod decode;
mod einsum;
mod fold;
mod fuse;
mod import;
mod inputs;
mod ops;
mod shapes;
mod sym;
mod view;

use crate::error::GraphError;
use crate::graph::{Graph, LossKind};
use import::Importer;
use prost::Message;
use proto::ModelProto;
use std::path::Path;

/// The most elements one dimension, or one constant the importer builds
/// (`ConstantOfShape`), may have: 2^31, far above any real model's and far
/// below what would make a corrupt file allocate the machine's memory.
pub(crate) const MAX_ELEMENTS: u64 = 1 << 31;

/// ONNX op types the importer maps onto the IR (default `ai.onnx` domain).
pub const SUPPORTED_ONNX_OPS: &[&str] = &ops::NAMES;

/// Loads an ONNX model file; the loss is chosen from the output's shape.
pub fn load(path: &Path) -> Result<Graph, GraphError> {
    load_with_loss(path, None)
}

/// Loads an ONNX model file with the given loss (`None`: chosen from the output's shape).
pub fn load_with_loss(path: &Path, loss: Option<LossKind>) -> Result<Graph, GraphError> {
    let bytes = std::fs::read(path).map_err(|source| GraphError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut graph = parse_with_loss(&bytes, loss).map_err(|e| e.in_file(path))?;
    let generic = [
        "",
        "main_graph",
        "torch-jit-export",
        "torch_jit",
        "tf2onnx",
        "onnx",
    ];
    if generic.contains(&graph.name.as_str())
        && let Some(stem) = path.file_stem().and_then(|s| s.to_str())
    {
        graph.name = stem.to_string();
    }
    Ok(graph)
}

/// Builds a graph from the bytes of an ONNX model; the loss is chosen from the output's shape.
pub fn parse(bytes: &[u8]) -> Result<Graph, GraphError> {
    parse_with_loss(bytes, None)
}

/// Builds a graph from the bytes of an ONNX model with the given loss
/// (`None`: chosen from the output's shape, see the module docs).
pub fn parse_with_loss(bytes: &[u8], loss: Option<LossKind>) -> Result<Graph, GraphError> {
    let model = ModelProto::decode(bytes).map_err(|source| GraphError::OnnxDecode { source })?;
    let graph = model.graph.ok_or_else(|| not_onnx("it has no graph"))?;
    if graph.node.is_empty() {
        return Err(not_onnx("its graph has no nodes"));
    }
    if graph.output.is_empty() {
        return Err(not_onnx("its graph has no outputs"));
    }
    if model.opset_import.is_empty() {
        return Err(not_onnx("it imports no opset (the file may be truncated)"));
    }
    // A model without the default domain in opset_import is malformed; read it as recent.
    let opset = model
        .opset_import
        .iter()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map_or(i64::MAX, |o| o.version);
    Importer::new(graph, opset, loss)?.run()
}

fn not_onnx(why: impl std::fmt::Display) -> GraphError {
    GraphError::Invalid(format!("not a valid ONNX model: {why}"))
}
