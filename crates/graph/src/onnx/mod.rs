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
//!   the softmax's input.
//! * **Shape arithmetic.** `Shape` and the integer `Gather`, `Unsqueeze`,
//!   `Squeeze`, `Concat`, `Slice`, `Mul`, `Add` around it are evaluated with a
//!   symbolic batch, so PyTorch's `x.view(x.size(0), -1)` becomes a per-sample
//!   `Reshape`; they leave no IR node.
//!
//! Limitations: no transposes except the recurrent layout ones, no
//! element-wise arithmetic with constants except folded biases (or adding
//! zeros / multiplying by ones), no arithmetic on the symbolic batch in shape
//! computations, `Conv`/pools over 1 or 2 spatial dimensions only,
//! `LSTM` peepholes rejected, `direction = reverse` counted as forward (same
//! cost), a recurrent layer without `B` still counted with both bias vectors
//! (zeros), non-default recurrent activations and `GRU`
//! `linear_before_reset = 0` ignored (they do not change shapes or
//! parameters; the trained weights of such layers are attached all the same,
//! so the IR computes a somewhat different function from them).

pub mod proto;

use crate::error::GraphError;
use crate::graph::{Graph, GraphBuilder, InputKind, LossKind};
use crate::op::{Cell, Op, PoolKind, RnnBias, Window};
use crate::shape::{Dim, Shape};
use prost::Message;
use proto::tensor_shape_proto::dimension;
use proto::{AttributeProto, DataType, GraphProto, ModelProto, NodeProto, TensorProto, type_proto};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::rc::Rc;

/// ONNX op types the importer maps onto the IR (default `ai.onnx` domain).
pub const SUPPORTED_ONNX_OPS: &[&str] = &[
    "Add",
    "AveragePool",
    "BatchNormalization",
    "Cast",
    "Clip",
    "Concat",
    "Constant",
    "Conv",
    "Dropout",
    "Flatten",
    "Gather",
    "Gelu",
    "Gemm",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "GRU",
    "Identity",
    "LayerNormalization",
    "LogSoftmax",
    "LSTM",
    "MatMul",
    "MaxPool",
    "Mul",
    "Relu",
    "Reshape",
    "Shape",
    "Sigmoid",
    "Slice",
    "Softmax",
    "Squeeze",
    "Tanh",
    "Transpose",
    "Unsqueeze",
];

/// Loads an ONNX model file; the loss is chosen from the output's shape.
pub fn load(path: &Path) -> Result<Graph, GraphError> {
    load_with_loss(path, None)
}

/// Loads an ONNX model file with the given loss (`None`: chosen from the output's shape).
pub fn load_with_loss(path: &Path, loss: Option<LossKind>) -> Result<Graph, GraphError> {
    let shown = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| GraphError::File {
        path: shown.clone(),
        why: format!("cannot read: {e}"),
    })?;
    let mut graph = parse_with_loss(&bytes, loss).map_err(|e| e.in_file(&shown))?;
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
    let model = ModelProto::decode(bytes).map_err(|e| not_onnx(format!("cannot decode: {e}")))?;
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

/// An axis of the batch-first tensor `[B, T, F]` a recurrent layer reads or
/// writes, as ONNX lays it out; `F` may be split into directions `D` and hidden `H`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ax {
    B,
    T,
    F,
    D,
    H,
}

/// An IR tensor `[B, T, F]` that ONNX sees with permuted or split axes.
#[derive(Clone, Debug)]
struct View {
    ir: String,
    axes: Vec<Ax>,
    dirs: usize,
    hidden: usize,
}

impl View {
    fn describe(&self) -> String {
        let names: Vec<&str> = self
            .axes
            .iter()
            .map(|a| match a {
                Ax::B => "B",
                Ax::T => "T",
                Ax::F => "features",
                Ax::D => "dirs",
                Ax::H => "hidden",
            })
            .collect();
        format!("[{}]", names.join(", "))
    }

    /// Back to a plain IR tensor once the layout is batch-first again.
    fn settle(self) -> Val {
        if self.axes == [Ax::B, Ax::T, Ax::F] {
            Val::Ir(self.ir)
        } else {
            Val::View(self)
        }
    }
}

/// What an ONNX tensor name stands for.
#[derive(Clone, Debug)]
enum Val {
    /// A batch-first IR tensor (graph input or node output).
    Ir(String),
    /// A layout view of a batch-first IR tensor around a recurrent layer.
    View(View),
    /// A constant: initializer or `Constant` output.
    Const(Rc<TensorProto>),
    /// A small integer vector computed from shapes (`Shape`, `Gather`, `Concat`, ...),
    /// as PyTorch exports `x.view(x.size(0), -1)`; `scalar` when it has rank 0.
    Ints { v: Vec<Sym>, scalar: bool },
    /// A tensor the IR does not model, with the reason.
    Unusable(String),
}

/// One entry of a shape value: the symbolic batch or sequence length, or a number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sym {
    Batch,
    Seq,
    N(i64),
}

struct Importer {
    /// Shared so a node can be read while the importer changes.
    nodes: Rc<[NodeProto]>,
    inputs: Vec<proto::ValueInfoProto>,
    outputs: Vec<String>,
    opset: i64,
    loss: Option<LossKind>,
    b: GraphBuilder,
    vals: HashMap<String, Val>,
    used: HashSet<String>,
    live: Vec<bool>,
    consumers: HashMap<String, Vec<(usize, usize)>>,
    skip: HashSet<usize>,
    /// The IR names of the model inputs.
    graph_inputs: HashSet<String>,
    /// The batch size when an input fixes it (models exported with batch 1).
    batch: Option<i64>,
}

impl Importer {
    fn new(graph: GraphProto, opset: i64, loss: Option<LossKind>) -> Result<Importer, GraphError> {
        let name = if graph.name.is_empty() {
            "onnx".to_string()
        } else {
            graph.name.clone()
        };
        let mut vals = HashMap::new();
        for t in graph.initializer {
            vals.insert(t.name.clone(), Val::Const(Rc::new(t)));
        }
        let mut imp = Importer {
            b: GraphBuilder::new(name),
            nodes: topological(graph.node)?.into(),
            inputs: graph.input,
            outputs: graph.output.into_iter().map(|o| o.name).collect(),
            opset,
            loss,
            vals,
            used: HashSet::new(),
            live: Vec::new(),
            consumers: HashMap::new(),
            skip: HashSet::new(),
            graph_inputs: HashSet::new(),
            batch: None,
        };
        imp.constants();
        imp.liveness();
        imp.add_inputs()?;
        Ok(imp)
    }

    /// Evaluates every `Constant` node up front (they have no inputs).
    fn constants(&mut self) {
        for n in self.nodes.iter() {
            if !(is_default(n) && n.op_type == "Constant") {
                continue;
            }
            let Some(out) = n.output.first() else {
                continue;
            };
            let val = match constant_value(n) {
                Ok(t) => Val::Const(Rc::new(t)),
                Err(why) => Val::Unusable(format!("Constant `{}` {why}", label(n))),
            };
            self.vals.insert(out.clone(), val);
        }
    }

    /// Marks the nodes some graph output depends on and records their consumers.
    /// Recurrent initial states and sequence lengths do not count as uses.
    fn liveness(&mut self) {
        let mut needed: HashSet<&str> = self.outputs.iter().map(String::as_str).collect();
        let mut live = vec![false; self.nodes.len()];
        for (i, n) in self.nodes.iter().enumerate().rev() {
            if n.output.iter().any(|o| needed.contains(o.as_str())) {
                live[i] = true;
                for (p, input) in n.input.iter().enumerate() {
                    if !input.is_empty() && !is_rnn_state(n, p) {
                        needed.insert(input);
                    }
                }
            }
        }
        for (i, n) in self.nodes.iter().enumerate() {
            if !live[i] {
                continue;
            }
            for (p, input) in n.input.iter().enumerate() {
                if !input.is_empty() && !is_rnn_state(n, p) {
                    self.consumers
                        .entry(input.clone())
                        .or_default()
                        .push((i, p));
                }
            }
        }
        self.live = live;
    }

    fn add_inputs(&mut self) -> Result<(), GraphError> {
        let has_rnn = self
            .nodes
            .iter()
            .zip(&self.live)
            .any(|(n, &l)| l && is_default(n) && matches!(n.op_type.as_str(), "LSTM" | "GRU"));
        let tokens = self.token_inputs();
        let inputs = std::mem::take(&mut self.inputs);
        for vi in &inputs {
            if self.vals.contains_key(&vi.name) || !self.consumers.contains_key(&vi.name) {
                // An initializer listed as input (IR < 4), or an input nothing live reads.
                continue;
            }
            let vocab = tokens.get(&vi.name).copied();
            let shape = self.input_shape(vi, has_rnn || vocab.is_some())?;
            let kind = match vocab {
                Some(vocab) => InputKind::Tokens { vocab },
                None => InputKind::Float,
            };
            self.b.input_of(&vi.name, shape, kind)?;
            self.used.insert(vi.name.clone());
            self.graph_inputs.insert(vi.name.clone());
            self.vals.insert(vi.name.clone(), Val::Ir(vi.name.clone()));
        }
        Ok(())
    }

    /// Graph inputs whose ids feed an embedding (`Gather` of a constant table),
    /// with the smallest table's row count.
    fn token_inputs(&self) -> HashMap<String, usize> {
        let producer: HashMap<&str, &NodeProto> = self
            .nodes
            .iter()
            .flat_map(|n| n.output.iter().map(move |o| (o.as_str(), n)))
            .collect();
        let mut tokens: HashMap<String, usize> = HashMap::new();
        for (n, _) in self.nodes.iter().zip(&self.live).filter(|(_, l)| **l) {
            if !(is_default(n) && n.op_type == "Gather" && n.input.len() == 2) {
                continue;
            }
            let Some(Val::Const(table)) = self.vals.get(&n.input[0]) else {
                continue;
            };
            if table.dims.len() != 2 || table.dims[0] <= 0 {
                continue;
            }
            let mut ids = n.input[1].as_str();
            while let Some(p) = producer.get(ids) {
                if is_default(p) && matches!(p.op_type.as_str(), "Identity" | "Cast") {
                    ids = &p.input[0];
                } else {
                    break;
                }
            }
            let rows = table.dims[0] as usize;
            tokens
                .entry(ids.to_string())
                .and_modify(|v| *v = (*v).min(rows))
                .or_insert(rows);
        }
        tokens
    }

    fn input_shape(
        &mut self,
        vi: &proto::ValueInfoProto,
        second_is_seq: bool,
    ) -> Result<Shape, GraphError> {
        let bad = |why: String| GraphError::Invalid(format!("graph input `{}`: {why}", vi.name));
        let tensor = match vi.r#type.as_ref().and_then(|t| t.value.as_ref()) {
            Some(type_proto::Value::TensorType(t)) => t,
            None => return Err(bad("is not a tensor".into())),
        };
        let dims = &tensor
            .shape
            .as_ref()
            .ok_or_else(|| bad("has no shape; export the model with input shapes".into()))?
            .dim;
        if dims.is_empty() {
            return Err(bad(
                "is a scalar; a model input needs a batch dimension".into()
            ));
        }
        if let Some(dimension::Value::DimValue(v)) = dims[0].value
            && v > 0
            && self.batch.is_none()
        {
            self.batch = Some(v);
        }
        let mut shape = Vec::with_capacity(dims.len() - 1);
        for (k, d) in dims.iter().enumerate().skip(1) {
            shape.push(match &d.value {
                Some(dimension::Value::DimValue(v)) if *v > 0 => Dim::Fixed(*v as usize),
                Some(dimension::Value::DimParam(p)) if seq_like(p) => Dim::Seq,
                _ if k == 1 && second_is_seq => Dim::Seq,
                other => {
                    let what = match other {
                        Some(dimension::Value::DimParam(p)) => format!("symbolic (`{p}`)"),
                        _ => "unknown".to_string(),
                    };
                    return Err(bad(format!(
                        "dimension {k} is {what}; only the batch (dimension 0) and a sequence \
                         length (a name like `seq` or `time`) may be symbolic"
                    )));
                }
            });
        }
        Ok(Shape(shape))
    }

    fn run(mut self) -> Result<Graph, GraphError> {
        let nodes = Rc::clone(&self.nodes);
        for (i, n) in nodes.iter().enumerate() {
            if !self.live[i] || self.skip.contains(&i) {
                continue;
            }
            if !is_default(n) {
                return Err(GraphError::Unsupported {
                    node: label(n),
                    op_type: format!("{}.{}", n.domain, n.op_type),
                });
            }
            self.node(i, n)?;
        }
        let out = &self.outputs[0];
        let ir = match self.vals.get(out) {
            Some(Val::Ir(ir)) => ir.clone(),
            Some(Val::View(v)) => {
                return Err(GraphError::Invalid(format!(
                    "graph output `{out}` is `{}` in the recurrent layout {}; \
                     the loss needs it back as [B, T, features]",
                    v.ir,
                    v.describe()
                )));
            }
            Some(Val::Const(_) | Val::Ints { .. }) => {
                return Err(GraphError::Invalid(format!(
                    "graph output `{out}` is a constant or a shape"
                )));
            }
            Some(Val::Unusable(why)) => {
                return Err(GraphError::Invalid(format!("graph output `{out}`: {why}")));
            }
            None => {
                return Err(GraphError::Invalid(format!(
                    "graph output `{out}` is produced by no node"
                )));
            }
        };
        let kind = match self.loss {
            Some(kind) => kind,
            None => auto_loss(self.b.shape(&ir)?),
        };
        self.b.finish(kind, &ir)
    }

    // ----- lookups --------------------------------------------------------

    fn val(&self, n: &NodeProto, pos: usize) -> Result<&Val, GraphError> {
        let name = n.input.get(pos).map(String::as_str).unwrap_or_default();
        if name.is_empty() {
            return Err(GraphError::node(
                label(n),
                format!("{} needs input {pos}", n.op_type),
            ));
        }
        self.vals.get(name).ok_or_else(|| {
            GraphError::node(
                label(n),
                format!("input `{name}` is not a graph input, initializer or earlier node output"),
            )
        })
    }

    fn has_input(n: &NodeProto, pos: usize) -> bool {
        n.input.get(pos).is_some_and(|s| !s.is_empty())
    }

    /// The IR tensor behind activation input `pos`.
    fn act(&self, n: &NodeProto, pos: usize) -> Result<String, GraphError> {
        let val = self.val(n, pos)?;
        let name = &n.input[pos];
        match val {
            Val::Ir(ir) => Ok(ir.clone()),
            Val::View(v) => Err(GraphError::node(
                label(n),
                format!(
                    "input `{name}` is `{}` in the recurrent layout {}; only Transpose, Squeeze \
                     and Reshape back to [B, T, features] (or [T, B, features] into an LSTM/GRU \
                     with layout 0) are supported on it",
                    v.ir,
                    v.describe()
                ),
            )),
            Val::Const(_) => Err(GraphError::node(
                label(n),
                format!(
                    "input `{name}` is a constant where {} expects an activation",
                    n.op_type
                ),
            )),
            Val::Ints { .. } => Err(GraphError::node(
                label(n),
                format!(
                    "input `{name}` is computed from shapes where {} expects an activation",
                    n.op_type
                ),
            )),
            Val::Unusable(why) => Err(GraphError::node(label(n), format!("input `{name}`: {why}"))),
        }
    }

    /// The constant behind input `pos`.
    fn konst(&self, n: &NodeProto, pos: usize, what: &str) -> Result<Rc<TensorProto>, GraphError> {
        match self.val(n, pos)? {
            Val::Const(t) => Ok(t.clone()),
            _ => Err(GraphError::node(
                label(n),
                format!(
                    "{what} (input `{}`) must be an initializer or a Constant",
                    n.input[pos]
                ),
            )),
        }
    }

    fn const_ints(&self, n: &NodeProto, pos: usize, what: &str) -> Result<Vec<i64>, GraphError> {
        let t = self.konst(n, pos, what)?;
        tensor_ints(&t).map_err(|why| GraphError::node(label(n), format!("{what}: {why}")))
    }

    /// An integer vector input: an integer constant of rank 0 or 1, or a shape value.
    fn ints_of(
        &self,
        n: &NodeProto,
        pos: usize,
        what: &str,
    ) -> Result<(Vec<Sym>, bool), GraphError> {
        match self.val(n, pos)? {
            Val::Ints { v, scalar } => Ok((v.clone(), *scalar)),
            Val::Const(t) if t.dims.len() <= 1 => {
                let v = tensor_ints(t)
                    .map_err(|why| GraphError::node(label(n), format!("{what}: {why}")))?;
                Ok((v.into_iter().map(Sym::N).collect(), t.dims.is_empty()))
            }
            _ => Err(GraphError::node(
                label(n),
                format!(
                    "{what} (input `{}`) must be a constant or computed from shapes",
                    n.input[pos]
                ),
            )),
        }
    }

    /// Whether input `pos` is a small integer vector rather than an activation or a weight.
    fn is_ints(&self, n: &NodeProto, pos: usize) -> bool {
        match self.vals.get(n.input.get(pos).map_or("", String::as_str)) {
            Some(Val::Ints { .. }) => true,
            Some(Val::Const(t)) => t.dims.len() <= 1 && is_int_type(t.data_type),
            _ => false,
        }
    }

    /// A Reshape target; the symbolic batch may only stand first, where it means "keep".
    fn reshape_target(&self, n: &NodeProto) -> Result<Vec<i64>, GraphError> {
        let (v, _) = self.ints_of(n, 1, "Reshape shape")?;
        v.iter()
            .enumerate()
            .map(|(k, s)| match s {
                Sym::N(x) => Ok(*x),
                Sym::Batch if k == 0 => Ok(0),
                Sym::Batch => Err(GraphError::node(
                    label(n),
                    "Reshape moves the batch dimension away from axis 0",
                )),
                Sym::Seq => Err(GraphError::node(
                    label(n),
                    "Reshape to a size computed from the symbolic sequence length T",
                )),
            })
            .collect()
    }

    /// Ops on shape values: `Shape` and the integer ops PyTorch wraps around it
    /// (`Gather`, `Unsqueeze`, `Squeeze`, `Concat`, `Slice`, `Mul`, `Add`).
    /// Returns `false` when `n` does not compute a shape value.
    fn shape_op(&mut self, n: &NodeProto, a: &Attrs) -> Result<bool, GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let op = n.op_type.as_str();
        let (v, scalar) =
            match op {
                "Shape" => {
                    let x = self.act(n, 0)?;
                    let mut v = vec![Sym::Batch];
                    v.extend(self.shape(&x)?.0.iter().map(|d| match d {
                        Dim::Seq => Sym::Seq,
                        Dim::Fixed(k) => Sym::N(*k as i64),
                    }));
                    let len = v.len() as i64;
                    let clamp = |i: i64| (if i < 0 { i + len } else { i }).clamp(0, len) as usize;
                    let (start, end) = (clamp(a.int("start", 0)), clamp(a.int("end", len)));
                    (v[start..end.max(start)].to_vec(), false)
                }
                "Gather" if self.is_ints(n, 0) => {
                    let (data, _) = self.ints_of(n, 0, "Gather data")?;
                    let (idx, scalar) = self.ints_of(n, 1, "Gather indices")?;
                    let len = data.len() as i64;
                    let v = idx
                        .iter()
                        .map(|i| match i {
                            Sym::N(i) if (-len..len).contains(i) => {
                                Ok(data[((i + len) % len) as usize])
                            }
                            other => Err(err(format!("index {other:?} out of {len} values"))),
                        })
                        .collect::<Result<_, _>>()?;
                    (v, scalar)
                }
                "Unsqueeze" | "Squeeze" if self.is_ints(n, 0) => {
                    let (v, scalar) = self.ints_of(n, 0, "data")?;
                    match (op, scalar) {
                        ("Unsqueeze", true) => (v, false),
                        ("Squeeze", false) if v.len() == 1 => (v, true),
                        _ => return Err(err(format!("{op} of a shape value of rank > 1"))),
                    }
                }
                "Concat" if (0..n.input.len()).any(|p| self.is_ints(n, p)) => {
                    let mut v = Vec::new();
                    for p in 0..n.input.len() {
                        v.extend(self.ints_of(n, p, "Concat input")?.0);
                    }
                    (v, false)
                }
                "Slice" if self.is_ints(n, 0) => {
                    let (data, _) = self.ints_of(n, 0, "Slice data")?;
                    let arg = |pos: usize, attr: &str| -> Result<Option<i64>, GraphError> {
                        let v = if Self::has_input(n, pos) {
                            Some(self.ints_of(n, pos, attr)?.0)
                        } else {
                            a.ints(attr).map(|v| v.into_iter().map(Sym::N).collect())
                        };
                        match v.as_deref() {
                            None => Ok(None),
                            Some([Sym::N(x)]) => Ok(Some(*x)),
                            Some(other) => {
                                Err(err(format!("Slice {attr} {other:?} of a shape value")))
                            }
                        }
                    };
                    let len = data.len() as i64;
                    let clamp = |i: i64| (if i < 0 { i + len } else { i }).clamp(0, len);
                    let start = clamp(arg(1, "starts")?.unwrap_or(0));
                    let end = clamp(arg(2, "ends")?.unwrap_or(len));
                    let axis = arg(3, "axes")?.unwrap_or(0);
                    if (axis != 0 && axis != -1) || arg(4, "steps")?.unwrap_or(1) != 1 {
                        return Err(err("Slice of a shape value: only axis 0 with step 1".into()));
                    }
                    (
                        data[start as usize..end.max(start) as usize].to_vec(),
                        false,
                    )
                }
                "Mul" | "Add" if self.is_ints(n, 0) && self.is_ints(n, 1) => {
                    let (p, ps) = self.ints_of(n, 0, "operand")?;
                    let (q, qs) = self.ints_of(n, 1, "operand")?;
                    if p.is_empty()
                        || q.is_empty()
                        || !(p.len() == q.len() || p.len() == 1 || q.len() == 1)
                    {
                        return Err(err(format!(
                            "{op} of shape values of lengths {} and {}",
                            p.len(),
                            q.len()
                        )));
                    }
                    let v = (0..p.len().max(q.len()))
                    .map(|k| match (p[k.min(p.len() - 1)], q[k.min(q.len() - 1)]) {
                        (Sym::N(x), Sym::N(y)) => {
                            let r = if op == "Mul" { x.checked_mul(y) } else { x.checked_add(y) };
                            r.map(Sym::N)
                                .ok_or_else(|| err(format!("{op} of {x} and {y} overflows")))
                        }
                        _ => Err(err(format!(
                            "{op} of the symbolic batch or sequence length in a shape computation"
                        ))),
                    })
                    .collect::<Result<_, _>>()?;
                    (v, ps && qs)
                }
                _ => return Ok(false),
            };
        self.define(n, Val::Ints { v, scalar });
        Ok(true)
    }

    fn const_scalar(&self, n: &NodeProto, pos: usize, what: &str) -> Result<f64, GraphError> {
        let t = self.konst(n, pos, what)?;
        match tensor_floats(&t)
            .map_err(|why| GraphError::node(label(n), format!("{what}: {why}")))?[..]
        {
            [v] => Ok(v),
            ref v => Err(GraphError::node(
                label(n),
                format!("{what} must be one number, got {} values", v.len()),
            )),
        }
    }

    fn shape(&self, ir: &str) -> Result<&Shape, GraphError> {
        self.b.shape(ir)
    }

    fn channels(&self, n: &NodeProto, ir: &str) -> Result<usize, GraphError> {
        let s = self.shape(ir)?;
        s.0.first().and_then(|d| d.fixed()).ok_or_else(|| {
            GraphError::node(label(n), format!("needs a [B, C, ...] input, got {s}"))
        })
    }

    fn last_dim(&self, n: &NodeProto, ir: &str) -> Result<usize, GraphError> {
        let s = self.shape(ir)?;
        s.last().and_then(Dim::fixed).ok_or_else(|| {
            GraphError::node(
                label(n),
                format!("needs a concrete last dimension, got {s}"),
            )
        })
    }

    // ----- outputs --------------------------------------------------------

    /// A fresh IR node name for `n`.
    fn fresh(&mut self, n: &NodeProto) -> String {
        let base = label(n);
        let mut name = base.clone();
        let mut k = 1;
        while self.used.contains(&name) {
            k += 1;
            name = format!("{base}_{k}");
        }
        self.used.insert(name.clone());
        name
    }

    /// Pushes `op` as the IR node for `n`; output 0 maps to it, other outputs are unusable.
    fn emit(&mut self, n: &NodeProto, op: Op, inputs: &[&str]) -> Result<String, GraphError> {
        let name = self.fresh(n);
        self.b.push(&name, op, inputs)?;
        self.define(n, Val::Ir(name.clone()));
        Ok(name)
    }

    /// Maps output 0 of `n` to `val` and marks the other outputs unusable.
    fn define(&mut self, n: &NodeProto, val: Val) {
        for (k, out) in n.output.iter().enumerate() {
            if out.is_empty() {
                continue;
            }
            let v = if k == 0 {
                val.clone()
            } else {
                Val::Unusable(format!(
                    "output {k} of {} `{}` is not modelled by the IR",
                    n.op_type,
                    label(n)
                ))
            };
            self.vals.insert(out.clone(), v);
        }
    }

    /// If the only use of output 0 of node `i` is an `Add` of a constant whose
    /// shape `is_bias` accepts, skips that `Add` and returns its output and the constant.
    fn bias_fold(
        &mut self,
        i: usize,
        is_bias: impl Fn(&[i64]) -> bool,
    ) -> Option<(String, Rc<TensorProto>)> {
        let out = self.nodes[i].output.first()?;
        if self.outputs.contains(out) {
            return None;
        }
        let &[(j, pos)] = self.consumers.get(out)?.as_slice() else {
            return None;
        };
        let add = &self.nodes[j];
        if !(is_default(add) && add.op_type == "Add" && add.input.len() == 2) {
            return None;
        }
        let Some(Val::Const(c)) = self.vals.get(&add.input[1 - pos]) else {
            return None;
        };
        if !is_bias(&c.dims) {
            return None;
        }
        let c = Rc::clone(c);
        let folded = add.output.first()?.clone();
        self.skip.insert(j);
        Some((folded, c))
    }

    /// Attaches trained values to IR node `name` when every parameter could be read
    /// (in [`Op::params`] order and layout); otherwise the node keeps random initialisation.
    fn attach(&mut self, name: &str, weights: Vec<Option<Vec<f32>>>) {
        if let Some(weights) = weights.into_iter().collect::<Option<Vec<_>>>() {
            // Values whose sizes do not fit the op's parameters are not attached.
            let _ = self.b.set_weights(name, weights);
        }
    }

    /// The `f32` values of constant input `pos`, when it is one and they can be read.
    fn const_f32(&self, n: &NodeProto, pos: usize) -> Option<Vec<f32>> {
        if !Self::has_input(n, pos) {
            return None;
        }
        match self.vals.get(&n.input[pos])? {
            Val::Const(t) => tensor_f32(t),
            _ => None,
        }
    }

    // ----- ops ------------------------------------------------------------

    fn node(&mut self, i: usize, n: &NodeProto) -> Result<(), GraphError> {
        let a = Attrs(&n.attribute);
        if self.shape_op(n, &a)? {
            return Ok(());
        }
        let node = label(n);
        let err = |why: String| GraphError::node(&node, why);
        match n.op_type.as_str() {
            "Constant" => {}
            "Identity" | "Cast" => {
                let v = self.val(n, 0)?.clone();
                self.define(n, v);
            }
            "Gemm" => {
                let x = self.act(n, 0)?;
                if a.int("transA", 0) != 0 {
                    return Err(err("Gemm with transA = 1 is not supported".into()));
                }
                let s = self.shape(&x)?;
                if s.rank() != 1 {
                    return Err(err(format!("Gemm needs a [B, features] input, got {s}")));
                }
                let w = self.konst(n, 1, "Gemm weight B")?;
                let [d0, d1] = dims2(&w.dims)
                    .ok_or_else(|| err(format!("Gemm weight B must be 2-D, got {:?}", w.dims)))?;
                let trans_b = a.int("transB", 0) != 0;
                let (k, out) = if trans_b { (d1, d0) } else { (d0, d1) };
                // IR layout [out, in]: B itself with transB = 1, else its transpose.
                let weight = tensor_f32(&w).map(|v| {
                    let v = if trans_b { v } else { transpose2(&v, d0, d1) };
                    scaled(v, a.float("alpha", 1.0))
                });
                let beta = a.float("beta", 1.0);
                let bias = if Self::has_input(n, 2) && beta != 0.0 {
                    Some((self.konst(n, 2, "Gemm bias C")?, beta))
                } else {
                    None
                };
                self.linear(i, n, &x, k, out, weight, bias)?;
            }
            "MatMul" => match (self.val(n, 0)?, self.val(n, 1)?) {
                (_, Val::Const(w)) => {
                    let x = self.act(n, 0)?;
                    let [k, out] = dims2(&w.dims).ok_or_else(|| {
                        err(format!(
                            "MatMul with a constant right operand needs a 2-D weight, got {:?}",
                            w.dims
                        ))
                    })?;
                    // ONNX [in, out] -> IR [out, in].
                    let weight = tensor_f32(w).map(|v| transpose2(&v, k, out));
                    self.linear(i, n, &x, k, out, weight, None)?;
                }
                (Val::Const(_), _) => {
                    return Err(err(
                        "MatMul with a constant left operand is not supported".into()
                    ));
                }
                _ => {
                    let (x, y) = (self.act(n, 0)?, self.act(n, 1)?);
                    self.emit(n, Op::MatMul, &[&x, &y])?;
                }
            },
            "Conv" => self.conv(i, n, &a)?,
            "MaxPool" | "AveragePool" => {
                let x = self.act(n, 0)?;
                let kernel = a
                    .ints("kernel_shape")
                    .ok_or_else(|| err(format!("{} needs kernel_shape", n.op_type)))?;
                let kernel = positive(&kernel)
                    .ok_or_else(|| err(format!("kernel_shape {kernel:?} must be positive")))?;
                if !(1..=2).contains(&kernel.len()) {
                    return Err(err(format!(
                        "pooling over {} spatial dimensions is not supported (1 or 2)",
                        kernel.len()
                    )));
                }
                let window = self.window(n, &a, &x, kernel, a.int("ceil_mode", 0) != 0)?;
                let pool = if n.op_type == "MaxPool" {
                    PoolKind::Max
                } else {
                    PoolKind::Avg
                };
                self.emit(n, Op::Pool { pool, window }, &[&x])?;
            }
            "GlobalAveragePool" | "GlobalMaxPool" => {
                let x = self.act(n, 0)?;
                let pool = if n.op_type == "GlobalMaxPool" {
                    PoolKind::Max
                } else {
                    PoolKind::Avg
                };
                self.emit(n, Op::GlobalPool { pool }, &[&x])?;
            }
            "BatchNormalization" => {
                let x = self.act(n, 0)?;
                let features = self.channels(n, &x)?;
                if let Ok(Val::Const(scale)) = self.val(n, 1)
                    && numel(&scale.dims) != Some(features)
                {
                    return Err(err(format!(
                        "scale has shape {:?} but the input has {features} channels",
                        scale.dims
                    )));
                }
                let name = self.emit(n, Op::BatchNorm { features }, &[&x])?;
                let weights = vec![self.const_f32(n, 1), self.const_f32(n, 2)];
                self.attach(&name, weights);
            }
            "LayerNormalization" => {
                let x = self.act(n, 0)?;
                let rank = self.shape(&x)?.rank() as i64 + 1;
                let axis = a.int("axis", -1);
                if axis != -1 && axis != rank - 1 {
                    return Err(err(format!(
                        "LayerNormalization over axis {axis} of a rank-{rank} tensor: only the \
                         last axis is supported"
                    )));
                }
                let features = self.last_dim(n, &x)?;
                let name = self.emit(n, Op::LayerNorm { features }, &[&x])?;
                let bias = if Self::has_input(n, 2) {
                    self.const_f32(n, 2)
                } else {
                    Some(vec![0.0; features])
                };
                let weights = vec![self.const_f32(n, 1), bias];
                self.attach(&name, weights);
            }
            "Relu" | "Gelu" | "Tanh" | "Sigmoid" => {
                let x = self.act(n, 0)?;
                let op = match n.op_type.as_str() {
                    "Relu" => Op::Relu,
                    "Gelu" => Op::Gelu,
                    "Tanh" => Op::Tanh,
                    _ => Op::Sigmoid,
                };
                self.emit(n, op, &[&x])?;
            }
            "Clip" => {
                let x = self.act(n, 0)?;
                let bound = |pos: usize, attr: &str| -> Result<Option<f64>, GraphError> {
                    if Self::has_input(n, pos) {
                        Ok(Some(self.const_scalar(n, pos, &format!("Clip {attr}"))?))
                    } else {
                        Ok(a.get(attr).map(|v| v.f as f64))
                    }
                };
                let (min, max) = (bound(1, "min")?, bound(2, "max")?);
                let op = match (min, max) {
                    (Some(0.0), None) => Op::Relu,
                    (Some(lo), Some(hi)) if lo == 0.0 && hi > 0.0 => {
                        Op::ClippedRelu { max: hi as f32 }
                    }
                    _ => {
                        return Err(err(format!(
                            "Clip to [{}, {}]: only a ReLU clipped at 0 (min 0, max > 0) is \
                             supported",
                            min.map_or("-inf".into(), |v| v.to_string()),
                            max.map_or("inf".into(), |v| v.to_string())
                        )));
                    }
                };
                self.emit(n, op, &[&x])?;
            }
            "Softmax" | "LogSoftmax" => {
                let x = self.act(n, 0)?;
                let shape = self.shape(&x)?.clone();
                let default_axis = if self.opset < 13 { 1 } else { -1 };
                let axis = a.int("axis", default_axis);
                let full = shape.rank() as i64 + 1;
                let last = axis == -1 || axis == full - 1;
                let is_loss_input = n.output.first() == self.outputs.first()
                    && !self.consumers.contains_key(&n.output[0]);
                let classify = match self.loss {
                    Some(LossKind::Mse) => false,
                    Some(_) => true,
                    None => auto_loss(&shape) != LossKind::Mse,
                };
                // Keep a softmax applied straight to an input: the loss needs a node.
                let from_node = !self.graph_inputs.contains(&x);
                if is_loss_input && last && classify && from_node {
                    // Cross-entropy takes logits: drop the final softmax.
                    self.define(n, Val::Ir(x));
                } else if n.op_type == "LogSoftmax" {
                    return Err(err(
                        "LogSoftmax is only supported as the model's final op, after a layer \
                         and over the class axis, before a classification loss (where it is \
                         removed)"
                            .into(),
                    ));
                } else {
                    self.emit(n, Op::Softmax { axis }, &[&x])?;
                }
            }
            "Flatten" => {
                let x = self.act(n, 0)?;
                let full = self.shape(&x)?.rank() as i64 + 1;
                let axis = a.int("axis", 1);
                if axis != 1 && axis + full != 1 {
                    return Err(err(format!(
                        "Flatten with axis {axis}: only axis 1 (keep the batch) is supported"
                    )));
                }
                self.emit(n, Op::Flatten, &[&x])?;
            }
            "Reshape" => {
                let target = self.reshape_target(n)?;
                match self.val(n, 0)?.clone() {
                    Val::View(v) => {
                        let v = view_reshape(v, &target).map_err(err)?;
                        self.define(n, v);
                    }
                    _ => {
                        let x = self.act(n, 0)?;
                        let Some((&first, rest)) = target.split_first() else {
                            return Err(err("Reshape to a scalar drops the batch".into()));
                        };
                        if !(first == 0 || first == -1 || Some(first) == self.batch) {
                            return Err(err(format!(
                                "Reshape to {target:?} changes the batch dimension; only \
                                 reshapes of each sample (leading 0 or -1) are supported"
                            )));
                        }
                        if first == -1 && rest.contains(&-1) {
                            return Err(err(format!("Reshape to {target:?} has two -1")));
                        }
                        if a.int("allowzero", 0) != 0 && rest.contains(&0) {
                            return Err(err(format!(
                                "Reshape to {target:?} with allowzero makes an empty tensor"
                            )));
                        }
                        self.emit(
                            n,
                            Op::Reshape {
                                shape: rest.to_vec(),
                            },
                            &[&x],
                        )?;
                    }
                }
            }
            "Squeeze" | "Unsqueeze" => {
                let axes = if Self::has_input(n, 1) {
                    Some(self.const_ints(n, 1, "axes")?)
                } else {
                    a.ints("axes")
                };
                match self.val(n, 0)?.clone() {
                    Val::View(v) if n.op_type == "Squeeze" => {
                        let v = view_squeeze(v, axes.as_deref()).map_err(err)?;
                        self.define(n, v);
                    }
                    _ => {
                        let x = self.act(n, 0)?;
                        let s = self.shape(&x)?;
                        let dims = s.all_fixed().ok_or_else(|| {
                            err(format!(
                                "{} of {s}: the sequence length T is symbolic",
                                n.op_type
                            ))
                        })?;
                        let target = if n.op_type == "Squeeze" {
                            squeeze(&dims, axes.as_deref())
                        } else {
                            unsqueeze(&dims, axes.as_deref())
                        }
                        .map_err(|why| err(format!("{} of {s}: {why}", n.op_type)))?;
                        self.emit(n, Op::Reshape { shape: target }, &[&x])?;
                    }
                }
            }
            "Transpose" => {
                let v = self.val(n, 0)?.clone();
                let rank = match &v {
                    Val::View(v) => v.axes.len(),
                    Val::Const(t) => t.dims.len(),
                    _ => self.shape(&self.act(n, 0)?)?.rank() + 1,
                };
                let perm = a
                    .ints("perm")
                    .unwrap_or_else(|| (0..rank as i64).rev().collect());
                let out = match v {
                    Val::View(v) => view_transpose(v, &perm).map_err(err)?,
                    Val::Const(t) => Val::Const(Rc::new(transpose_const(&t, &perm).map_err(err)?)),
                    Val::Ir(x) if perm.iter().copied().eq(0..rank as i64) => Val::Ir(x),
                    Val::Ir(x) if perm == [1, 0, 2] => View {
                        ir: x,
                        axes: vec![Ax::T, Ax::B, Ax::F],
                        dirs: 1,
                        hidden: 0,
                    }
                    .settle(),
                    _ => {
                        return Err(err(format!(
                            "Transpose with perm {perm:?}: the IR has no transpose; only the \
                             batch/time swaps around LSTM and GRU layers are supported"
                        )));
                    }
                };
                self.define(n, out);
            }
            "Concat" => {
                let xs = (0..n.input.len())
                    .map(|p| self.act(n, p))
                    .collect::<Result<Vec<_>, _>>()?;
                if xs.len() == 1 {
                    self.define(n, Val::Ir(xs[0].clone()));
                } else {
                    let axis = a
                        .get("axis")
                        .map(|v| v.i)
                        .ok_or_else(|| err("Concat needs an axis".into()))?;
                    let refs: Vec<&str> = xs.iter().map(String::as_str).collect();
                    self.emit(n, Op::Concat { axis }, &refs)?;
                }
            }
            "Add" | "Mul" => {
                let (p, q) = (self.val(n, 0)?, self.val(n, 1)?);
                match (p, q) {
                    (Val::Const(c), _) | (_, Val::Const(c)) => {
                        let c = c.clone();
                        let pos = usize::from(matches!(p, Val::Const(_)));
                        let x = self.act(n, pos)?;
                        let neutral = if n.op_type == "Add" { 0.0 } else { 1.0 };
                        if self.neutral(&x, &c, neutral)? {
                            self.define(n, Val::Ir(x));
                        } else {
                            return Err(err(format!(
                                "{} of activation `{}` and constant `{}` {:?}: only a bias right \
                                 after MatMul/Gemm/Conv (folded into that layer) or two \
                                 activations are supported",
                                n.op_type, n.input[pos], c.name, c.dims
                            )));
                        }
                    }
                    _ => {
                        let (x, y) = (self.act(n, 0)?, self.act(n, 1)?);
                        let op = if n.op_type == "Add" { Op::Add } else { Op::Mul };
                        self.emit(n, op, &[&x, &y])?;
                    }
                }
            }
            "Dropout" => {
                let x = self.act(n, 0)?;
                let p = if Self::has_input(n, 1) {
                    self.const_scalar(n, 1, "Dropout ratio")?
                } else {
                    a.get("ratio").map_or(0.5, |v| v.f as f64)
                };
                self.emit(n, Op::Dropout { p: p as f32 }, &[&x])?;
            }
            "Gather" => {
                let table = match self.val(n, 0)? {
                    Val::Const(t) => t.clone(),
                    _ => {
                        return Err(err(
                            "Gather of an activation (indexing) is not supported; only \
                             embedding lookups in a constant table are"
                                .into(),
                        ));
                    }
                };
                let [vocab, dim] = dims2(&table.dims).ok_or_else(|| {
                    err(format!("embedding table must be 2-D, got {:?}", table.dims))
                })?;
                if a.int("axis", 0) != 0 {
                    return Err(err(
                        "Gather on an axis other than 0 is not an embedding".into()
                    ));
                }
                let ids = self.act(n, 1)?;
                let name = self.emit(n, Op::Embedding { vocab, dim }, &[&ids])?;
                self.attach(&name, vec![tensor_f32(&table)]);
            }
            "LSTM" | "GRU" => self.rnn(n, &a)?,
            other => {
                return Err(GraphError::Unsupported {
                    node,
                    op_type: other.to_string(),
                });
            }
        }
        Ok(())
    }

    /// A linear layer `k -> out` on `x`, folding a following bias `Add` when there is no bias.
    /// `weight` holds the trained values in IR layout `[out, k]` when readable; `bias` is
    /// the constant bias with the factor it is scaled by (Gemm's `beta`).
    #[allow(clippy::too_many_arguments)] // the layer's sizes and its two weights
    fn linear(
        &mut self,
        i: usize,
        n: &NodeProto,
        x: &str,
        k: usize,
        out: usize,
        weight: Option<Vec<f32>>,
        bias: Option<(Rc<TensorProto>, f32)>,
    ) -> Result<(), GraphError> {
        let have = self.last_dim(n, x)?;
        if have != k {
            return Err(GraphError::node(
                label(n),
                format!(
                    "the weight maps {k} features to {out} but the input {} has {have}",
                    self.shape(x)?
                ),
            ));
        }
        let folded = if bias.is_some() {
            None
        } else {
            self.bias_fold(i, |d| {
                d.last() == Some(&(out as i64)) && d.iter().rev().skip(1).all(|&v| v == 1)
            })
        };
        let bias = bias.or_else(|| folded.as_ref().map(|(_, t)| (Rc::clone(t), 1.0)));
        let op = Op::Linear {
            in_features: k,
            out_features: out,
            bias: bias.is_some(),
        };
        let name = self.emit(n, op, &[x])?;
        if let Some((f, _)) = folded {
            self.vals.insert(f, Val::Ir(name.clone()));
        }
        let mut weights = vec![weight];
        if let Some((t, beta)) = bias {
            weights.push(bias_values(&t, out).map(|v| scaled(v, beta)));
        }
        self.attach(&name, weights);
        Ok(())
    }

    fn conv(&mut self, i: usize, n: &NodeProto, a: &Attrs) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let x = self.act(n, 0)?;
        let w = self.konst(n, 1, "Conv weight W")?;
        let wd = positive(&w.dims)
            .filter(|d| (3..=4).contains(&d.len()))
            .ok_or_else(|| {
                err(format!(
                    "Conv weight W has shape {:?}; only 1-d and 2-d convolutions are supported",
                    w.dims
                ))
            })?;
        let spatial = wd.len() - 2;
        let in_channels = self.channels(n, &x)?;
        let groups = a.int("group", 1);
        if groups < 1 || wd[1] * groups as usize != in_channels {
            return Err(err(format!(
                "weight W {wd:?} with group {groups} does not fit {in_channels} input channels"
            )));
        }
        let kernel = wd[2..].to_vec();
        if let Some(ks) = a.ints("kernel_shape")
            && positive(&ks).as_deref() != Some(&kernel[..])
        {
            return Err(err(format!(
                "kernel_shape {ks:?} differs from the weight's kernel {kernel:?}"
            )));
        }
        let window = self.window(n, a, &x, kernel, false)?;
        let out_channels = wd[0];
        let mut bias = Self::has_input(n, 2);
        let mut bias_vals = if bias { self.const_f32(n, 2) } else { None };
        let mut folded = None;
        if !bias {
            folded = self.bias_fold(i, |d| {
                // Broadcasts as [1, C, 1, ...] against [B, C, spatial...].
                let mut full = vec![1i64; (spatial + 2).saturating_sub(d.len())];
                full.extend_from_slice(d);
                full.len() == spatial + 2
                    && full[1] == out_channels as i64
                    && full.iter().enumerate().all(|(k, &v)| k == 1 || v == 1)
            });
            bias = folded.is_some();
            if let Some((_, t)) = &folded {
                bias_vals = bias_values(t, out_channels);
            }
        }
        let op = Op::Conv {
            in_channels,
            out_channels,
            window,
            groups: groups as usize,
            bias,
        };
        let name = self.emit(n, op, &[&x])?;
        if let Some((f, _)) = folded {
            self.vals.insert(f, Val::Ir(name.clone()));
        }
        let mut weights = vec![tensor_f32(&w)];
        if bias {
            weights.push(bias_vals);
        }
        self.attach(&name, weights);
        Ok(())
    }

    /// The window of a Conv or pool: strides, dilations and pads or `auto_pad`.
    fn window(
        &self,
        n: &NodeProto,
        a: &Attrs,
        x: &str,
        kernel: Vec<usize>,
        ceil_mode: bool,
    ) -> Result<Window, GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let sp = kernel.len();
        let per_dim = |attr: &str| -> Result<Vec<usize>, GraphError> {
            match a.ints(attr) {
                None => Ok(vec![1; sp]),
                Some(v) => positive(&v)
                    .filter(|v| v.len() == sp)
                    .ok_or_else(|| err(format!("{attr} {v:?} must hold {sp} positive numbers"))),
            }
        };
        let stride = per_dim("strides")?;
        let dilation = per_dim("dilations")?;
        let s = self.shape(x)?;
        let input: Option<Vec<usize>> = s.0.iter().skip(1).map(|d| d.fixed()).collect();
        let input = input
            .filter(|i| i.len() == sp && s.rank() == sp + 1)
            .ok_or_else(|| {
                err(format!(
                    "{} over {sp} spatial dimension(s) needs a [B, C, ...] input of rank {} with \
                 concrete sizes, got {s}",
                    n.op_type,
                    sp + 2
                ))
            })?;
        let auto_pad = a.string("auto_pad").unwrap_or_default();
        let mut padding = match auto_pad.as_str() {
            "" | "NOTSET" => match a.ints("pads") {
                None => vec![[0, 0]; sp],
                Some(p) if p.len() == 2 * sp && p.iter().all(|&v| v >= 0) => (0..sp)
                    .map(|d| [p[d] as usize, p[d + sp] as usize])
                    .collect(),
                Some(p) => {
                    return Err(err(format!(
                        "pads {p:?} must hold {} non-negative numbers",
                        2 * sp
                    )));
                }
            },
            "VALID" => vec![[0, 0]; sp],
            "SAME_UPPER" | "SAME_LOWER" => (0..sp)
                .map(|d| {
                    let out = input[d].div_ceil(stride[d]);
                    let span = dilation[d] * (kernel[d] - 1) + 1;
                    let total = ((out - 1) * stride[d] + span).saturating_sub(input[d]);
                    let (small, big) = (total / 2, total - total / 2);
                    if auto_pad == "SAME_UPPER" {
                        [small, big]
                    } else {
                        [big, small]
                    }
                })
                .collect(),
            other => return Err(err(format!("unknown auto_pad `{other}`"))),
        };
        if ceil_mode {
            // Extra end padding makes the IR's floor division give ONNX's ceil output,
            // dropping a last window that would start in the end padding.
            for d in 0..sp {
                let span = dilation[d] * (kernel[d] - 1) + 1;
                let padded = input[d] + padding[d][0] + padding[d][1];
                if padded < span {
                    continue;
                }
                let mut out = (padded - span).div_ceil(stride[d]) + 1;
                if (out - 1) * stride[d] >= input[d] + padding[d][0] {
                    out -= 1;
                }
                let need = (out - 1) * stride[d] + span;
                padding[d][1] += need.saturating_sub(padded);
            }
        }
        Ok(Window {
            kernel,
            stride,
            padding,
            dilation,
        })
    }

    /// Whether adding (or multiplying by) constant `c` leaves `x` unchanged.
    fn neutral(&self, x: &str, c: &TensorProto, neutral: f64) -> Result<bool, GraphError> {
        let Ok(values) = tensor_floats(c) else {
            return Ok(false);
        };
        if values.iter().any(|&v| v != neutral) {
            return Ok(false);
        }
        let s = self.shape(x)?;
        let Some(mut dims) = positive(&c.dims) else {
            return Ok(false);
        };
        if dims.len() > s.rank() + 1 {
            return Ok(false);
        }
        if dims.len() == s.rank() + 1 {
            if dims[0] != 1 {
                return Ok(false);
            }
            dims.remove(0);
        }
        Ok(Op::Add.infer(&[s, &Shape::fixed(&dims)]).as_ref() == Ok(s))
    }

    fn rnn(&mut self, n: &NodeProto, a: &Attrs) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let cell = if n.op_type == "LSTM" {
            Cell::Lstm
        } else {
            Cell::Gru
        };
        let hidden = a
            .get("hidden_size")
            .map(|v| v.i)
            .filter(|&h| h > 0)
            .ok_or_else(|| err(format!("{} needs a positive hidden_size", n.op_type)))?
            as usize;
        let direction = a.string("direction").unwrap_or_else(|| "forward".into());
        let dirs = match direction.as_str() {
            "forward" | "reverse" => 1,
            "bidirectional" => 2,
            other => return Err(err(format!("unknown direction `{other}`"))),
        };
        let layout = a.int("layout", 0);
        let x = match (layout, self.val(n, 0)?.clone()) {
            (1, Val::Ir(x)) => x,
            (0, Val::View(v)) if v.axes == [Ax::T, Ax::B, Ax::F] => v.ir,
            (0, Val::Ir(_)) => {
                return Err(err(format!(
                    "{} with layout 0 reads [T, B, features]; its input `{}` must come through \
                     Transpose(perm = [1, 0, 2]) of a batch-first tensor",
                    n.op_type, n.input[0]
                )));
            }
            (0 | 1, _) => {
                self.act(n, 0)?;
                return Err(err(format!(
                    "input `{}` does not fit {} layout {layout}",
                    n.input[0], n.op_type
                )));
            }
            (other, _) => return Err(err(format!("unknown layout {other}"))),
        };
        if cell == Cell::Lstm && Self::has_input(n, 7) {
            return Err(err(
                "LSTM peephole weights (input P) are not supported".into()
            ));
        }
        let g = cell.gates() * hidden;
        let input_size = self.last_dim(n, &x)?;
        let check = |pos: usize, what: &str, want: Vec<usize>| -> Result<(), GraphError> {
            let t = self.konst(n, pos, what)?;
            if positive(&t.dims).as_deref() != Some(&want[..]) {
                return Err(err(format!(
                    "{what} has shape {:?}, expected {want:?} for {} hidden_size {hidden} \
                     direction {direction} and input size {input_size}",
                    t.dims, n.op_type
                )));
            }
            Ok(())
        };
        check(1, "weight W", vec![dirs, g, input_size])?;
        check(2, "recurrence weight R", vec![dirs, g, hidden])?;
        if Self::has_input(n, 3) {
            check(3, "bias B", vec![dirs, 2 * g])?;
        }
        let op = Op::Rnn {
            cell,
            input_size,
            hidden,
            bidirectional: dirs == 2,
            bias: RnnBias::Double,
        };
        let name = self.fresh(n);
        self.b.push(&name, op, &[&x])?;
        let b = if Self::has_input(n, 3) {
            self.const_f32(n, 3)
        } else {
            Some(vec![0.0; dirs * 2 * g])
        };
        if let (Some(w), Some(r), Some(b)) = (self.const_f32(n, 1), self.const_f32(n, 2), b) {
            let weights = rnn_weights(cell, dirs, hidden, input_size, &w, &r, &b);
            self.attach(&name, weights.into_iter().map(Some).collect());
        }
        let axes = if layout == 1 {
            vec![Ax::B, Ax::T, Ax::D, Ax::H]
        } else {
            vec![Ax::T, Ax::D, Ax::B, Ax::H]
        };
        self.define(
            n,
            Val::View(View {
                ir: name.clone(),
                axes,
                dirs,
                hidden,
            }),
        );
        for (k, out) in n.output.iter().enumerate().skip(1) {
            if !out.is_empty() {
                let state = if k == 1 { "hidden" } else { "cell" };
                self.vals.insert(
                    out.clone(),
                    Val::Unusable(format!(
                        "the final {state} state of {} `{name}` is not modelled by the IR \
                         (only the full output sequence Y is)",
                        n.op_type
                    )),
                );
            }
        }
        Ok(())
    }
}

// ----- layout views ---------------------------------------------------------

fn view_transpose(mut v: View, perm: &[i64]) -> Result<Val, String> {
    let rank = v.axes.len();
    let mut seen = vec![false; rank];
    let mut axes = Vec::with_capacity(rank);
    for &p in perm {
        let p = usize::try_from(p)
            .ok()
            .filter(|&p| p < rank && !seen[p])
            .ok_or_else(|| format!("perm {perm:?} is not a permutation of {rank} axes"))?;
        seen[p] = true;
        axes.push(v.axes[p]);
    }
    if axes.len() != rank {
        return Err(format!("perm {perm:?} is not a permutation of {rank} axes"));
    }
    v.axes = axes;
    Ok(v.settle())
}

fn view_squeeze(mut v: View, axes: Option<&[i64]>) -> Result<Val, String> {
    let rank = v.axes.len() as i64;
    let d = v.axes.iter().position(|&a| a == Ax::D);
    let want = match (axes, d) {
        (Some([a]), Some(d)) if (a + rank) % rank == d as i64 && v.dirs == 1 => d,
        (None, Some(d)) if v.dirs == 1 => d,
        _ => {
            return Err(format!(
                "Squeeze with axes {axes:?} of `{}` in the recurrent layout {}: only the \
                 directions axis of a unidirectional layer can be squeezed",
                v.ir,
                v.describe()
            ));
        }
    };
    v.axes.remove(want);
    for a in &mut v.axes {
        if *a == Ax::H {
            *a = Ax::F;
        }
    }
    Ok(v.settle())
}

fn view_reshape(mut v: View, target: &[i64]) -> Result<Val, String> {
    let bad = |v: &View| {
        format!(
            "Reshape of `{}` in the recurrent layout {} to {target:?}: only merging the \
             directions and hidden axes (like [0, 0, -1]) is supported",
            v.ir,
            v.describe()
        )
    };
    let Some(d) = v.axes.iter().position(|&a| a == Ax::D) else {
        return Err(bad(&v));
    };
    if v.axes.get(d + 1) != Some(&Ax::H) || target.len() != v.axes.len() - 1 {
        return Err(bad(&v));
    }
    let merged = target[d];
    let others_ok = target
        .iter()
        .enumerate()
        .all(|(k, &t)| k == d || (t == 0 && k < d) || t == -1 || t > 0);
    let minus_ones = target.iter().filter(|&&t| t == -1).count();
    if !others_ok || minus_ones > 1 || !(merged == -1 || merged == (v.dirs * v.hidden) as i64) {
        return Err(bad(&v));
    }
    v.axes.remove(d + 1);
    v.axes[d] = Ax::F;
    Ok(v.settle())
}

// ----- helpers --------------------------------------------------------------

/// The nodes in an order where every tensor is produced before it is read
/// (ONNX requires it, not every exporter keeps it); the file order when it does.
fn topological(nodes: Vec<NodeProto>) -> Result<Vec<NodeProto>, GraphError> {
    let producer: HashMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .flat_map(|(i, n)| n.output.iter().map(move |o| (o.as_str(), i)))
        .collect();
    let deps: Vec<Vec<usize>> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let mut d: Vec<usize> = n
                .input
                .iter()
                .filter_map(|t| producer.get(t.as_str()).copied())
                .filter(|&p| p != i)
                .collect();
            d.sort_unstable();
            d.dedup();
            d
        })
        .collect();
    if deps
        .iter()
        .enumerate()
        .all(|(i, d)| d.iter().all(|&p| p < i))
    {
        return Ok(nodes);
    }
    let mut users = vec![Vec::new(); nodes.len()];
    let mut waiting: Vec<usize> = deps.iter().map(Vec::len).collect();
    for (i, d) in deps.iter().enumerate() {
        for &p in d {
            users[p].push(i);
        }
    }
    // Ready nodes by file position, so the order changes as little as possible.
    let mut ready: std::collections::BTreeSet<usize> =
        (0..nodes.len()).filter(|&i| waiting[i] == 0).collect();
    let mut order = Vec::with_capacity(nodes.len());
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for &u in &users[i] {
            waiting[u] -= 1;
            if waiting[u] == 0 {
                ready.insert(u);
            }
        }
    }
    if order.len() != nodes.len() {
        return Err(not_onnx("its nodes form a cycle"));
    }
    let mut slots: Vec<Option<NodeProto>> = nodes.into_iter().map(Some).collect();
    Ok(order.into_iter().filter_map(|i| slots[i].take()).collect())
}

/// A constant with its axes permuted (old exports transpose weights in the graph).
/// The values of a `float`/`double` tensor move with its axes (as `float`, the
/// trained weights' type); those of other types of rank 2 or more are dropped,
/// as no op reads them as attributes.
fn transpose_const(t: &TensorProto, perm: &[i64]) -> Result<TensorProto, String> {
    let rank = t.dims.len();
    let mut seen = vec![false; rank];
    let mut dims = Vec::with_capacity(rank);
    let mut order = Vec::with_capacity(rank);
    for &p in perm {
        let p = usize::try_from(p)
            .ok()
            .filter(|&p| p < rank && !seen[p])
            .ok_or_else(|| format!("perm {perm:?} is not a permutation of {rank} axes"))?;
        seen[p] = true;
        dims.push(t.dims[p]);
        order.push(p);
    }
    if dims.len() != rank {
        return Err(format!("perm {perm:?} is not a permutation of {rank} axes"));
    }
    if rank <= 1 {
        return Ok(t.clone());
    }
    let values = tensor_f32(t).and_then(|v| {
        let sizes = positive(&t.dims)?;
        Some(permute(&v, &sizes, &order))
    });
    Ok(match values {
        Some(float_data) => TensorProto {
            dims,
            data_type: DataType::Float as i32,
            name: t.name.clone(),
            float_data,
            ..Default::default()
        },
        None => TensorProto {
            dims,
            data_type: t.data_type,
            name: t.name.clone(),
            ..Default::default()
        },
    })
}

/// Row-major `values` of shape `dims` with the axes reordered: output axis `k` is input axis `perm[k]`.
fn permute(values: &[f32], dims: &[usize], perm: &[usize]) -> Vec<f32> {
    let rank = dims.len();
    let mut strides = vec![1usize; rank];
    for d in (0..rank.saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * dims[d + 1];
    }
    let out_dims: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
    let in_strides: Vec<usize> = perm.iter().map(|&p| strides[p]).collect();
    let mut out = Vec::with_capacity(values.len());
    let mut idx = vec![0usize; rank];
    for _ in 0..values.len() {
        out.push(
            values[idx
                .iter()
                .zip(&in_strides)
                .map(|(i, s)| i * s)
                .sum::<usize>()],
        );
        for d in (0..rank).rev() {
            idx[d] += 1;
            if idx[d] < out_dims[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}

/// The transpose of a row-major `[rows, cols]` matrix.
fn transpose2(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    permute(values, &[rows, cols], &[1, 0])
}

fn scaled(mut v: Vec<f32>, factor: f32) -> Vec<f32> {
    if factor != 1.0 {
        v.iter_mut().for_each(|x| *x *= factor);
    }
    v
}

/// A bias constant broadcast to `[out]` (it may be `[out]`, `[1, out]`, `[1, out, 1, 1]`, a scalar, ...).
fn bias_values(t: &TensorProto, out: usize) -> Option<Vec<f32>> {
    let v = tensor_f32(t)?;
    match v.len() {
        n if n == out => Some(v),
        1 => Some(vec![v[0]; out]),
        _ => None,
    }
}

/// The IR parameters of an ONNX `LSTM`/`GRU` (see [`Op::params`]): per direction
/// `weight_ih [G*H, I]`, `weight_hh [G*H, H]`, `bias_ih [G*H]`, `bias_hh [G*H]`, from
/// `W [dirs, G*H, I]`, `R [dirs, G*H, H]` and `B [dirs, 2*G*H]`, with the gate blocks
/// moved from ONNX's order (LSTM `i, o, f, c`; GRU `z, r, h`) to PyTorch's
/// (LSTM `i, f, g, o`; GRU `r, z, n`).
fn rnn_weights(
    cell: Cell,
    dirs: usize,
    hidden: usize,
    input: usize,
    w: &[f32],
    r: &[f32],
    b: &[f32],
) -> Vec<Vec<f32>> {
    // For each PyTorch gate, the ONNX gate block it comes from.
    let from: &[usize] = match cell {
        Cell::Lstm => &[0, 2, 3, 1],
        Cell::Gru => &[1, 0, 2],
    };
    let g = cell.gates() * hidden;
    let reorder = |block: &[f32], cols: usize| -> Vec<f32> {
        from.iter()
            .flat_map(|&k| &block[k * hidden * cols..(k + 1) * hidden * cols])
            .copied()
            .collect()
    };
    let mut out = Vec::with_capacity(4 * dirs);
    for d in 0..dirs {
        out.push(reorder(&w[d * g * input..(d + 1) * g * input], input));
        out.push(reorder(&r[d * g * hidden..(d + 1) * g * hidden], hidden));
        let bd = &b[d * 2 * g..(d + 1) * 2 * g];
        out.push(reorder(&bd[..g], 1));
        out.push(reorder(&bd[g..], 1));
    }
    out
}

fn is_default(n: &NodeProto) -> bool {
    n.domain.is_empty() || n.domain == "ai.onnx"
}

/// Inputs of LSTM/GRU that only set up state (sequence_lens, initial_h, initial_c).
fn is_rnn_state(n: &NodeProto, pos: usize) -> bool {
    is_default(n) && matches!(n.op_type.as_str(), "LSTM" | "GRU") && (4..=6).contains(&pos)
}

/// The node's name, or its first output's name when it has none.
fn label(n: &NodeProto) -> String {
    if !n.name.is_empty() {
        n.name.clone()
    } else if let Some(o) = n.output.first().filter(|o| !o.is_empty()) {
        o.clone()
    } else {
        n.op_type.clone()
    }
}

fn seq_like(name: &str) -> bool {
    let l = name.to_ascii_lowercase();
    l == "t"
        || ["seq", "time", "len", "frame", "step", "token"]
            .iter()
            .any(|w| l.contains(w))
}

/// Cross-entropy for logits `[B, C]`, per-frame cross-entropy for `[B, T, C]`, else MSE.
fn auto_loss(shape: &Shape) -> LossKind {
    let classes = shape.last().and_then(Dim::fixed).unwrap_or(0);
    match shape.rank() {
        1 if classes > 1 => LossKind::CrossEntropy,
        2 if classes > 1 => LossKind::CrossEntropyPerFrame,
        _ => LossKind::Mse,
    }
}

fn positive(v: &[i64]) -> Option<Vec<usize>> {
    v.iter()
        .map(|&x| usize::try_from(x).ok().filter(|&x| x > 0))
        .collect()
}

fn dims2(d: &[i64]) -> Option<[usize; 2]> {
    match positive(d)?[..] {
        [a, b] => Some([a, b]),
        _ => None,
    }
}

fn numel(dims: &[i64]) -> Option<usize> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?))
}

/// Node attributes by name.
struct Attrs<'a>(&'a [AttributeProto]);

impl Attrs<'_> {
    fn get(&self, name: &str) -> Option<&AttributeProto> {
        self.0.iter().find(|a| a.name == name)
    }

    fn int(&self, name: &str, default: i64) -> i64 {
        self.get(name).map_or(default, |a| a.i)
    }

    fn float(&self, name: &str, default: f32) -> f32 {
        self.get(name).map_or(default, |a| a.f)
    }

    fn ints(&self, name: &str) -> Option<Vec<i64>> {
        self.get(name).map(|a| a.ints.clone())
    }

    fn string(&self, name: &str) -> Option<String> {
        self.get(name)
            .map(|a| String::from_utf8_lossy(&a.s).into_owned())
    }
}

/// The tensor a `Constant` node holds.
fn constant_value(n: &NodeProto) -> Result<TensorProto, String> {
    let a = n.attribute.first().ok_or("has no value")?;
    let mut t = TensorProto {
        name: n.output[0].clone(),
        ..Default::default()
    };
    match a.name.as_str() {
        "value" => {
            let mut v = a.t.clone().ok_or("has an empty value")?;
            v.name = t.name;
            return Ok(v);
        }
        "value_float" => {
            t.data_type = DataType::Float as i32;
            t.float_data = vec![a.f];
        }
        "value_floats" => {
            t.data_type = DataType::Float as i32;
            t.dims = vec![a.floats.len() as i64];
            t.float_data = a.floats.clone();
        }
        "value_int" => {
            t.data_type = DataType::Int64 as i32;
            t.int64_data = vec![a.i];
        }
        "value_ints" => {
            t.data_type = DataType::Int64 as i32;
            t.dims = vec![a.ints.len() as i64];
            t.int64_data = a.ints.clone();
        }
        other => return Err(format!("holds `{other}`, which is not a numeric tensor")),
    }
    Ok(t)
}

/// The values of an integer tensor.
fn tensor_ints(t: &TensorProto) -> Result<Vec<i64>, String> {
    let dt = DataType::try_from(t.data_type).unwrap_or(DataType::Undefined);
    let raw = &t.raw_data;
    let v: Vec<i64> = match dt {
        DataType::Int64 if raw.is_empty() => t.int64_data.clone(),
        DataType::Int64 => le_chunks::<8>(raw).map(i64::from_le_bytes).collect(),
        DataType::Int32 if raw.is_empty() => t.int32_data.iter().map(|&x| x as i64).collect(),
        DataType::Int32 => le_chunks::<4>(raw)
            .map(|b| i32::from_le_bytes(b) as i64)
            .collect(),
        _ => return tensor_floats(t).map(|v| v.iter().map(|&x| x as i64).collect()),
    };
    check_len(t, v)
}

/// The values of a numeric tensor, as `f64`.
fn tensor_floats(t: &TensorProto) -> Result<Vec<f64>, String> {
    if t.data_location == 1 {
        return Err(format!(
            "tensor `{}` keeps its data in an external file",
            t.name
        ));
    }
    let dt = DataType::try_from(t.data_type).unwrap_or(DataType::Undefined);
    let raw = &t.raw_data;
    let from_i32 = || t.int32_data.iter().map(|&x| x as f64).collect::<Vec<_>>();
    let v: Vec<f64> = match dt {
        DataType::Float if raw.is_empty() => t.float_data.iter().map(|&x| x as f64).collect(),
        DataType::Float => le_chunks::<4>(raw)
            .map(|b| f32::from_le_bytes(b) as f64)
            .collect(),
        DataType::Double if raw.is_empty() => t.double_data.clone(),
        DataType::Double => le_chunks::<8>(raw).map(f64::from_le_bytes).collect(),
        DataType::Int64 if raw.is_empty() => t.int64_data.iter().map(|&x| x as f64).collect(),
        DataType::Int64 => le_chunks::<8>(raw)
            .map(|b| i64::from_le_bytes(b) as f64)
            .collect(),
        DataType::Uint64 | DataType::Uint32 if raw.is_empty() => {
            t.uint64_data.iter().map(|&x| x as f64).collect()
        }
        DataType::Uint64 => le_chunks::<8>(raw)
            .map(|b| u64::from_le_bytes(b) as f64)
            .collect(),
        DataType::Uint32 => le_chunks::<4>(raw)
            .map(|b| u32::from_le_bytes(b) as f64)
            .collect(),
        DataType::Int32 if raw.is_empty() => from_i32(),
        DataType::Int32 => le_chunks::<4>(raw)
            .map(|b| i32::from_le_bytes(b) as f64)
            .collect(),
        DataType::Int16 | DataType::Uint16 | DataType::Int8 | DataType::Uint8 | DataType::Bool
            if raw.is_empty() =>
        {
            from_i32()
        }
        DataType::Int16 => le_chunks::<2>(raw)
            .map(|b| i16::from_le_bytes(b) as f64)
            .collect(),
        DataType::Uint16 => le_chunks::<2>(raw)
            .map(|b| u16::from_le_bytes(b) as f64)
            .collect(),
        DataType::Int8 => raw.iter().map(|&b| b as i8 as f64).collect(),
        DataType::Uint8 | DataType::Bool => raw.iter().map(|&b| b as f64).collect(),
        DataType::Float16 | DataType::Bfloat16 => {
            let bits: Vec<u16> = if raw.is_empty() {
                t.int32_data.iter().map(|&x| x as u16).collect()
            } else {
                le_chunks::<2>(raw).map(u16::from_le_bytes).collect()
            };
            bits.into_iter()
                .map(|b| {
                    if dt == DataType::Float16 {
                        f16_to_f64(b)
                    } else {
                        f32::from_bits((b as u32) << 16) as f64
                    }
                })
                .collect()
        }
        other => return Err(format!("tensor `{}` has element type {other:?}", t.name)),
    };
    check_len(t, v)
}

/// The values of a `float` or `double` tensor as `f32` (trained weights); `None` for
/// other element types, external data or a value count that does not fit the dims.
fn tensor_f32(t: &TensorProto) -> Option<Vec<f32>> {
    if t.data_location == 1 {
        return None;
    }
    let raw = &t.raw_data;
    let v: Vec<f32> = match DataType::try_from(t.data_type).ok()? {
        DataType::Float if raw.is_empty() => t.float_data.clone(),
        DataType::Float => le_chunks::<4>(raw).map(f32::from_le_bytes).collect(),
        DataType::Double if raw.is_empty() => t.double_data.iter().map(|&x| x as f32).collect(),
        DataType::Double => le_chunks::<8>(raw)
            .map(|b| f64::from_le_bytes(b) as f32)
            .collect(),
        _ => return None,
    };
    check_len(t, v).ok()
}

fn is_int_type(data_type: i32) -> bool {
    matches!(
        DataType::try_from(data_type),
        Ok(DataType::Int64
            | DataType::Int32
            | DataType::Int16
            | DataType::Int8
            | DataType::Uint64
            | DataType::Uint32
            | DataType::Uint16
            | DataType::Uint8)
    )
}

fn check_len<T>(t: &TensorProto, v: Vec<T>) -> Result<Vec<T>, String> {
    match numel(&t.dims) {
        Some(n) if n == v.len() => Ok(v),
        _ => Err(format!(
            "tensor `{}` holds {} values but its dims {:?} need {}",
            t.name,
            v.len(),
            t.dims,
            numel(&t.dims).map_or("an invalid count".into(), |n| n.to_string())
        )),
    }
}

fn le_chunks<const N: usize>(raw: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
    raw.chunks_exact(N)
        .map(|c| c.try_into().expect("chunks_exact"))
}

/// IEEE half precision to double.
fn f16_to_f64(bits: u16) -> f64 {
    let sign = if bits & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = ((bits >> 10) & 0x1f) as i32;
    let frac = (bits & 0x3ff) as f64;
    sign * match exp {
        0 => frac * 2f64.powi(-24),
        31 if frac == 0.0 => f64::INFINITY,
        31 => f64::NAN,
        e => (1.0 + frac / 1024.0) * 2f64.powi(e - 15),
    }
}

/// The sample shape after removing size-1 sample dimensions (`axes` count the batch as 0).
fn squeeze(dims: &[usize], axes: Option<&[i64]>) -> Result<Vec<i64>, String> {
    let full = dims.len() as i64 + 1;
    let remove: Vec<usize> = match axes {
        None => (0..dims.len()).filter(|&k| dims[k] == 1).collect(),
        Some(axes) => axes
            .iter()
            .map(|&a| {
                let a = if a < 0 { a + full } else { a };
                if a <= 0 || a >= full {
                    return Err(format!("axis {a} is not a sample axis"));
                }
                let k = a as usize - 1;
                if dims[k] != 1 {
                    return Err(format!("axis {a} has size {}, not 1", dims[k]));
                }
                Ok(k)
            })
            .collect::<Result<_, _>>()?,
    };
    Ok((0..dims.len())
        .filter(|k| !remove.contains(k))
        .map(|k| dims[k] as i64)
        .collect())
}

/// The sample shape after inserting size-1 dimensions at `axes` of the output.
fn unsqueeze(dims: &[usize], axes: Option<&[i64]>) -> Result<Vec<i64>, String> {
    let axes = axes.ok_or("needs axes")?;
    let full_out = (dims.len() + 1 + axes.len()) as i64;
    let mut at: Vec<usize> = Vec::with_capacity(axes.len());
    for &a in axes {
        let a = if a < 0 { a + full_out } else { a };
        if a <= 0 || a >= full_out {
            return Err(format!("axis {a} would move the batch"));
        }
        at.push(a as usize - 1);
    }
    let mut rest = dims.iter();
    Ok((0..dims.len() + axes.len())
        .map(|k| {
            if at.contains(&k) {
                1
            } else {
                rest.next().map_or(1, |&d| d as i64)
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_raw_and_typed_values() {
        let t = TensorProto {
            dims: vec![3],
            data_type: DataType::Int64 as i32,
            raw_data: [0i64, -1, 234]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
            ..Default::default()
        };
        assert_eq!(tensor_ints(&t).unwrap(), vec![0, -1, 234]);
        let h = TensorProto {
            data_type: DataType::Float16 as i32,
            int32_data: vec![0x4d00], // 20.0
            ..Default::default()
        };
        assert_eq!(tensor_floats(&h).unwrap(), vec![20.0]);
        let short = TensorProto {
            dims: vec![4],
            data_type: DataType::Float as i32,
            float_data: vec![1.0],
            ..Default::default()
        };
        assert!(tensor_floats(&short).unwrap_err().contains("need 4"));
    }

    #[test]
    fn squeeze_and_unsqueeze_keep_the_batch() {
        assert_eq!(squeeze(&[32, 1, 1], Some(&[2, 3])).unwrap(), vec![32]);
        assert_eq!(squeeze(&[32, 1, 1], None).unwrap(), vec![32]);
        assert!(squeeze(&[32, 1], Some(&[0])).is_err());
        assert_eq!(unsqueeze(&[32], Some(&[-1])).unwrap(), vec![32, 1]);
        assert_eq!(unsqueeze(&[32], Some(&[1])).unwrap(), vec![1, 32]);
    }

    #[test]
    fn pytorch_layout_views_return_to_batch_first() {
        let y = View {
            ir: "lstm".into(),
            axes: vec![Ax::T, Ax::D, Ax::B, Ax::H],
            dirs: 2,
            hidden: 8,
        };
        let Val::View(tb) = view_transpose(y, &[0, 2, 1, 3]).unwrap() else {
            panic!()
        };
        let Val::View(merged) = view_reshape(tb, &[0, 0, -1]).unwrap() else {
            panic!()
        };
        assert_eq!(merged.axes, [Ax::T, Ax::B, Ax::F]);
        assert!(matches!(view_transpose(merged, &[1, 0, 2]).unwrap(), Val::Ir(ir) if ir == "lstm"));
    }
}
