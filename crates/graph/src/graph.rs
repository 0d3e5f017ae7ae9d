//! The graph: inputs, nodes in execution order, and one loss.

use crate::error::GraphError;
use crate::op::{Cell, Op, PoolKind, RnnBias, Window};
use crate::shape::{Dim, Shape};
use serde::Serialize;
use std::collections::HashMap;

/// What a graph input holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum InputKind {
    /// Real-valued features.
    Float,
    /// Integer token ids below `vocab` (for an embedding).
    Tokens { vocab: usize },
}

/// One input of the model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Input {
    pub name: String,
    pub shape: Shape,
    pub kind: InputKind,
}

/// One op applied to named tensors, producing the tensor named like the node.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Node {
    pub name: String,
    pub op: Op,
    pub inputs: Vec<String>,
    /// The shape of one sample of the output; of the whole tensor where `shared`.
    pub shape: Shape,
    /// The output does not depend on the batch: computed once per step from constants
    /// and parameters (a relative-position MLP's table), with no batch axis. A node is
    /// shared when every input is (an [`Op::Constant`] always is); a shared tensor meets
    /// the batch through a broadcasting [`Op::Add`]/[`Op::Mul`]/[`Op::Div`].
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub shared: bool,
    /// Trained values of the op's parameters, when the source has them (ONNX
    /// initializers): one flat row-major vector per [`Op::params`] entry, in that
    /// order and shape. `None`: the engine initialises randomly.
    #[serde(skip)]
    pub weights: Option<Vec<Vec<f32>>>,
    /// Parameters of this op that are the same tensor as an earlier node's (a language
    /// model's head tied to its token embedding, one relative-position table read by
    /// every layer): counted once, as PyTorch's `model.parameters()` does.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tied: Vec<Tie>,
}

/// One parameter of a node that is the same tensor as parameter `to_param` of the
/// earlier node `to`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Tie {
    /// Index into the node's [`Op::params`].
    pub param: usize,
    pub to: String,
    pub to_param: usize,
}

impl Node {
    /// Trainable parameters this node owns: its op's, less those tied to an earlier
    /// node's.
    pub fn own_param_count(&self) -> u64 {
        let params = self.op.params();
        let tied: u64 = self
            .tied
            .iter()
            .filter_map(|t| params.get(t.param))
            .map(|p| p.elements())
            .sum();
        self.op.param_count() - tied
    }
}

/// The training objective.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum LossKind {
    /// Mean squared error against a target of the output's shape.
    Mse,
    /// Cross-entropy of logits `[C]` against one class index per sample.
    CrossEntropy,
    /// Cross-entropy of logits `[T, C]` against one class index per frame.
    CrossEntropyPerFrame,
    /// Connectionist temporal classification over logits `[T, C]`; class `blank` is the blank.
    Ctc { blank: usize },
}

impl LossKind {
    /// Short name (`mse`, `cross_entropy`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            LossKind::Mse => "mse",
            LossKind::CrossEntropy => "cross_entropy",
            LossKind::CrossEntropyPerFrame => "cross_entropy_per_frame",
            LossKind::Ctc { .. } => "ctc",
        }
    }
}

/// The loss and the tensor it reads.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Loss {
    pub kind: LossKind,
    pub input: String,
}

/// A trainable model: inputs, nodes in execution order, one loss.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Graph {
    pub name: String,
    pub inputs: Vec<Input>,
    pub nodes: Vec<Node>,
    pub loss: Loss,
    /// The sequence length `T` used when none is given (recurrent models only).
    pub default_seq_len: Option<usize>,
}

/// What `plan` and `probe` say about an ONNX model with convolutions and no
/// normalisation layer: `torch.onnx.export` in eval mode (its default) folds
/// BatchNorm into the convolutions and drops Dropout.
pub const EVAL_EXPORT_NOTE: &str = "this ONNX model has convolutions and no normalisation layer. If it came from torch.onnx.export in eval mode (the default), its BatchNorm layers were folded into the convolutions and its Dropout dropped, so the model measured here is not the one you train. Export it with training=torch.onnx.TrainingMode.TRAINING and do_constant_folding=False (docs/model-spec.md).";

impl Graph {
    /// Forgets the trained weights the nodes carry (ONNX initializers) and the constants
    /// their ops carry ([`Op::constant_bytes`]), once a trainer holds its own copy: a
    /// measured peak should count the model's tensors once, as the user's framework
    /// holds them. The graph's shapes stay; its ops no longer compute.
    pub fn drop_weights(&mut self) {
        for node in &mut self.nodes {
            node.weights = None;
            node.op.drop_constants();
        }
    }

    /// Trainable parameters, a tied tensor counted once.
    pub fn param_count(&self) -> u64 {
        self.nodes.iter().map(Node::own_param_count).sum()
    }

    /// [`EVAL_EXPORT_NOTE`] when `source` is an ONNX file and the graph has a
    /// convolution but no BatchNorm or LayerNorm.
    pub fn export_note(&self, source: &str) -> Option<&'static str> {
        let onnx = std::path::Path::new(source)
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("onnx"));
        let conv = self.nodes.iter().any(|n| matches!(n.op, Op::Conv { .. }));
        let norm = self
            .nodes
            .iter()
            .any(|n| matches!(n.op, Op::BatchNorm { .. } | Op::LayerNorm { .. }));
        (onnx && conv && !norm).then_some(EVAL_EXPORT_NOTE)
    }

    /// The shape of a named tensor (an input or a node output).
    pub fn shape_of(&self, tensor: &str) -> Option<&Shape> {
        self.inputs
            .iter()
            .find(|i| i.name == tensor)
            .map(|i| &i.shape)
            .or_else(|| {
                self.nodes
                    .iter()
                    .find(|n| n.name == tensor)
                    .map(|n| &n.shape)
            })
    }

    /// The node producing the loss's input.
    pub fn output(&self) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.name == self.loss.input)
            .expect("the builder checks the loss input")
    }

    /// Whether the loss depends on a trainable parameter: some node with
    /// parameters lies on a path from the inputs to the loss's input. A
    /// model without one (no weights, or weights only on a branch the output
    /// never reads) has nothing to train and no gradient to take.
    pub fn trains_a_parameter(&self) -> bool {
        let mut wanted = vec![self.loss.input.as_str()];
        let mut seen = std::collections::HashSet::new();
        while let Some(name) = wanted.pop() {
            if !seen.insert(name) {
                continue;
            }
            if let Some(node) = self.nodes.iter().find(|n| n.name == name) {
                if node.op.param_count() > 0 {
                    return true;
                }
                wanted.extend(node.inputs.iter().map(String::as_str));
            }
        }
        false
    }

    /// Whether any tensor has the symbolic sequence length.
    pub fn has_seq(&self) -> bool {
        self.inputs.iter().any(|i| i.shape.has_seq())
    }

    /// Number of classes for classification losses.
    pub fn classes(&self) -> Option<usize> {
        match self.loss.kind {
            LossKind::Mse => None,
            _ => self.output().shape.last().and_then(Dim::fixed),
        }
    }
}

/// Builds a [`Graph`] node by node, inferring every shape as it goes so the
/// first mistake is reported with the node's name.
pub struct GraphBuilder {
    name: String,
    inputs: Vec<Input>,
    nodes: Vec<Node>,
    shapes: HashMap<String, Shape>,
    /// The shared tensors (see [`Node::shared`]).
    shared: std::collections::HashSet<String>,
    default_seq_len: Option<usize>,
}

/// The most values one sample of a tensor, or one parameter, may hold: 2^40
/// (4 TiB of fp32), far past any device; sizes beyond it are typos, and their
/// products would wrap around in the plan's arithmetic.
const MAX_ELEMENTS: u64 = 1 << 40;

/// Refuses a node whose output (per sample, the sequence length at 1) or
/// parameters hold more than [`MAX_ELEMENTS`] values.
fn check_size(node: &str, shape: &Shape, params: &[crate::op::Param]) -> Result<(), GraphError> {
    let product = |dims: &[usize]| {
        dims.iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
            .filter(|&n| n <= MAX_ELEMENTS)
    };
    if product(&shape.resolve(1)).is_none() {
        return Err(GraphError::node(
            node,
            format!("a sample of {shape} holds more than 2^40 values"),
        ));
    }
    for p in params {
        if product(&p.shape).is_none() {
            return Err(GraphError::node(
                node,
                format!(
                    "parameter `{}` of {:?} holds more than 2^40 values",
                    p.name, p.shape
                ),
            ));
        }
    }
    Ok(())
}

impl GraphBuilder {
    /// An empty graph called `name`.
    pub fn new(name: impl Into<String>) -> GraphBuilder {
        GraphBuilder {
            name: name.into(),
            inputs: Vec::new(),
            nodes: Vec::new(),
            shapes: HashMap::new(),
            shared: Default::default(),
            default_seq_len: None,
        }
    }

    /// A finished graph opened again to add nodes after its output (its loss is
    /// set anew by [`GraphBuilder::finish`]).
    pub fn reopen(graph: Graph) -> GraphBuilder {
        let shapes = graph
            .inputs
            .iter()
            .map(|i| (i.name.clone(), i.shape.clone()))
            .chain(
                graph
                    .nodes
                    .iter()
                    .map(|n| (n.name.clone(), n.shape.clone())),
            )
            .collect();
        let shared = graph
            .nodes
            .iter()
            .filter(|n| n.shared)
            .map(|n| n.name.clone())
            .collect();
        GraphBuilder {
            name: graph.name,
            inputs: graph.inputs,
            nodes: graph.nodes,
            shapes,
            shared,
            default_seq_len: graph.default_seq_len,
        }
    }

    /// Sets the default sequence length of a recurrent model.
    pub fn seq_len(&mut self, t: usize) -> &mut Self {
        self.default_seq_len = Some(t);
        self
    }

    /// Adds an input of real-valued features and returns its name.
    pub fn input(&mut self, name: &str, shape: Shape) -> Result<String, GraphError> {
        self.input_of(name, shape, InputKind::Float)
    }

    /// Adds an input of the given kind and returns its name.
    pub fn input_of(
        &mut self,
        name: &str,
        shape: Shape,
        kind: InputKind,
    ) -> Result<String, GraphError> {
        self.claim(name)?;
        check_size(name, &shape, &[])?;
        self.shapes.insert(name.to_string(), shape.clone());
        self.inputs.push(Input {
            name: name.to_string(),
            shape,
            kind,
        });
        Ok(name.to_string())
    }

    fn claim(&self, name: &str) -> Result<(), GraphError> {
        if name.is_empty() {
            return Err(GraphError::node("<unnamed>", "a tensor needs a name"));
        }
        if self.shapes.contains_key(name) {
            return Err(GraphError::node(name, "the name is used twice"));
        }
        Ok(())
    }

    /// The shape of a tensor added so far.
    pub fn shape(&self, tensor: &str) -> Result<&Shape, GraphError> {
        self.shapes.get(tensor).ok_or_else(|| {
            GraphError::node(tensor, "no input or earlier node produces this tensor")
        })
    }

    /// The most recently added tensor (node output, or input if no node yet).
    pub fn last(&self) -> Option<&str> {
        self.nodes
            .last()
            .map(|n| n.name.as_str())
            .or_else(|| self.inputs.last().map(|i| i.name.as_str()))
    }

    /// Whether `tensor` is shared (see [`Node::shared`]).
    pub fn is_shared(&self, tensor: &str) -> bool {
        self.shared.contains(tensor)
    }

    /// Adds a node applying `op` to `inputs`; returns the output's name (= `name`).
    pub fn push(&mut self, name: &str, op: Op, inputs: &[&str]) -> Result<String, GraphError> {
        self.claim(name)?;
        let mut shapes = Vec::with_capacity(inputs.len());
        for i in inputs {
            shapes.push(self.shape(i).map_err(|_| {
                GraphError::node(
                    name,
                    format!("input `{i}` is not produced before this node"),
                )
            })?);
        }
        let shape = op
            .infer(&shapes)
            .map_err(|why| GraphError::node(name, format!("{} {why}", op.name())))?;
        check_size(name, &shape, &op.params())?;
        if let Op::Embedding { vocab, .. } = op {
            self.check_tokens(name, inputs[0], vocab)?;
        }
        let shared = matches!(op, Op::Constant { .. } | Op::Parameter { .. })
            || inputs.iter().all(|i| self.shared.contains(*i));
        let mixes = inputs.iter().any(|i| self.shared.contains(*i));
        if !shared && mixes && !matches!(op, Op::Add | Op::Mul | Op::Div) {
            return Err(GraphError::node(
                name,
                format!(
                    "{} of a shared tensor (computed once per step) and a batch: only add, \
                     mul and div broadcast one over the other",
                    op.name()
                ),
            ));
        }
        if shared {
            if matches!(op, Op::BroadcastParam { .. }) {
                return Err(GraphError::node(
                    name,
                    "broadcast_param repeats over the batch of a batch input",
                ));
            }
            self.shared.insert(name.to_string());
        }
        self.shapes.insert(name.to_string(), shape.clone());
        self.nodes.push(Node {
            name: name.to_string(),
            op,
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            shape,
            shared,
            weights: None,
            tied: Vec::new(),
        });
        Ok(name.to_string())
    }

    /// Attaches trained parameter values to the node `name` (see [`Node::weights`]).
    pub fn set_weights(&mut self, name: &str, weights: Vec<Vec<f32>>) -> Result<(), GraphError> {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.name == name)
            .ok_or_else(|| GraphError::node(name, "no such node"))?;
        let params = node.op.params();
        if params.len() != weights.len()
            || params
                .iter()
                .zip(&weights)
                .any(|(p, w)| p.elements() as usize != w.len())
        {
            return Err(GraphError::node(
                name,
                "weights do not match the op's parameter shapes",
            ));
        }
        node.weights = Some(weights);
        Ok(())
    }

    /// Records that parameter `param` of node `name` is the same tensor as parameter
    /// `to_param` of the earlier node `to`: both of one shape.
    pub fn tie(
        &mut self,
        name: &str,
        param: usize,
        to: &str,
        to_param: usize,
    ) -> Result<(), GraphError> {
        let shape_of = |node: &Node, k: usize| node.op.params().get(k).map(|p| p.shape.clone());
        let target = self
            .nodes
            .iter()
            .position(|n| n.name == to)
            .ok_or_else(|| GraphError::node(to, "no such node"))?;
        let at = self
            .nodes
            .iter()
            .position(|n| n.name == name)
            .ok_or_else(|| GraphError::node(name, "no such node"))?;
        let (mine, theirs) = (
            shape_of(&self.nodes[at], param),
            shape_of(&self.nodes[target], to_param),
        );
        if target >= at || mine.is_none() || mine != theirs {
            return Err(GraphError::node(
                name,
                format!("parameter {param} cannot be tied to parameter {to_param} of `{to}`"),
            ));
        }
        self.nodes[at].tied.push(Tie {
            param,
            to: to.to_string(),
            to_param,
        });
        Ok(())
    }

    /// The trained values of node `name`'s parameters, when it has them.
    pub fn weights_of(&self, name: &str) -> Option<&[Vec<f32>]> {
        self.nodes
            .iter()
            .find(|n| n.name == name)?
            .weights
            .as_deref()
    }

    fn check_tokens(&self, node: &str, input: &str, vocab: usize) -> Result<(), GraphError> {
        match self.inputs.iter().find(|i| i.name == input).map(|i| i.kind) {
            Some(InputKind::Tokens { vocab: v }) if v <= vocab => Ok(()),
            Some(InputKind::Tokens { vocab: v }) => Err(GraphError::node(
                node,
                format!("embedding has {vocab} rows but input `{input}` has token ids up to {v}"),
            )),
            _ => Err(GraphError::node(
                node,
                format!("embedding needs a token input, `{input}` is not one"),
            )),
        }
    }

    fn last_dim(&self, node: &str, input: &str) -> Result<usize, GraphError> {
        let s = self.shape(input)?;
        s.last().and_then(Dim::fixed).ok_or_else(|| {
            GraphError::node(node, format!("needs a concrete last dimension, got {s}"))
        })
    }

    fn channels(&self, node: &str, input: &str) -> Result<usize, GraphError> {
        let s = self.shape(input)?;
        s.0.first()
            .and_then(|d| d.fixed())
            .ok_or_else(|| GraphError::node(node, format!("needs [B, C, ...] input, got {s}")))
    }

    /// Fully connected layer on the last dimension of `input`.
    pub fn linear(&mut self, name: &str, input: &str, out: usize) -> Result<String, GraphError> {
        self.linear_with(name, input, out, true)
    }

    /// Fully connected layer, with or without bias.
    pub fn linear_with(
        &mut self,
        name: &str,
        input: &str,
        out: usize,
        bias: bool,
    ) -> Result<String, GraphError> {
        let op = Op::Linear {
            in_features: self.last_dim(name, input)?,
            out_features: out,
            bias,
        };
        self.push(name, op, &[input])
    }

    /// Convolution with a square kernel; `pad = None` means 'same' padding.
    #[allow(clippy::too_many_arguments)] // mirrors a layer list: name, input, sizes
    pub fn conv(
        &mut self,
        name: &str,
        input: &str,
        out_channels: usize,
        spatial: usize,
        kernel: usize,
        stride: usize,
        pad: Option<usize>,
    ) -> Result<String, GraphError> {
        let mut window = Window::square(spatial, kernel, stride, pad.unwrap_or(0));
        if pad.is_none() {
            window.padding = self.same_padding(name, input, &window)?;
        }
        let op = Op::Conv {
            in_channels: self.channels(name, input)?,
            out_channels,
            window,
            groups: 1,
            bias: true,
            standardize: None,
        };
        self.push(name, op, &[input])
    }

    /// Pooling with a square window; `pad = None` means 'same' padding.
    #[allow(clippy::too_many_arguments)] // mirrors a layer list: name, input, sizes
    pub fn pool(
        &mut self,
        name: &str,
        input: &str,
        pool: PoolKind,
        spatial: usize,
        kernel: usize,
        stride: usize,
        pad: Option<usize>,
    ) -> Result<String, GraphError> {
        let mut window = Window::square(spatial, kernel, stride, pad.unwrap_or(0));
        if pad.is_none() {
            window.padding = self.same_padding(name, input, &window)?;
        }
        self.push(name, Op::Pool { pool, window }, &[input])
    }

    /// The padding that makes `window` 'same' on `input`'s spatial dimensions.
    pub fn same_padding(
        &self,
        name: &str,
        input: &str,
        window: &Window,
    ) -> Result<Vec<[usize; 2]>, GraphError> {
        let s = self.shape(input)?;
        let spatial: Option<Vec<usize>> = s.0.iter().skip(1).map(|d| d.fixed()).collect();
        match spatial {
            Some(sp) if sp.len() == window.spatial() => {
                Ok(Window::same(&sp, &window.kernel, &window.stride))
            }
            _ => Err(GraphError::node(
                name,
                format!(
                    "'same' padding needs [B, C] and {} concrete spatial dimension(s), got {s}",
                    window.spatial()
                ),
            )),
        }
    }

    /// A recurrent layer over `[B, T, features]`.
    pub fn rnn(
        &mut self,
        name: &str,
        input: &str,
        cell: Cell,
        hidden: usize,
        bidirectional: bool,
        bias: RnnBias,
    ) -> Result<String, GraphError> {
        let op = Op::Rnn {
            cell,
            input_size: self.last_dim(name, input)?,
            hidden,
            bidirectional,
            bias,
        };
        self.push(name, op, &[input])
    }

    /// Batch normalisation over `input`'s channels.
    pub fn batch_norm(&mut self, name: &str, input: &str) -> Result<String, GraphError> {
        let features = self.channels(name, input)?;
        self.push(name, Op::BatchNorm { features }, &[input])
    }

    /// Layer normalisation over `input`'s last dimension.
    pub fn layer_norm(&mut self, name: &str, input: &str) -> Result<String, GraphError> {
        let features = self.last_dim(name, input)?;
        self.push(name, Op::LayerNorm { features }, &[input])
    }

    /// Root-mean-square normalisation over `input`'s last dimension.
    pub fn rms_norm(&mut self, name: &str, input: &str) -> Result<String, GraphError> {
        let features = self.last_dim(name, input)?;
        self.push(name, Op::RmsNorm { features }, &[input])
    }

    /// Finishes the graph with `kind` applied to tensor `input`.
    pub fn finish(self, kind: LossKind, input: &str) -> Result<Graph, GraphError> {
        let shape = self
            .nodes
            .iter()
            .find(|n| n.name == input)
            .map(|n| &n.shape)
            .ok_or_else(|| GraphError::node(input, "the loss reads a tensor no node produces"))?;
        let why = match kind {
            LossKind::Mse => None,
            LossKind::CrossEntropy if shape.rank() != 1 => Some(format!(
                "cross-entropy needs logits [B, classes], got {shape}"
            )),
            LossKind::CrossEntropyPerFrame | LossKind::Ctc { .. } if shape.rank() != 2 => Some(
                format!("{} needs logits [B, T, classes], got {shape}", kind.name()),
            ),
            LossKind::Ctc { blank } if shape.last().and_then(Dim::fixed) <= Some(blank) => {
                Some(format!("CTC blank {blank} is not a class of {shape}"))
            }
            _ => None,
        };
        if let Some(why) = why {
            return Err(GraphError::node(input, why));
        }
        if self.inputs.is_empty() {
            return Err(GraphError::Invalid(format!(
                "model `{}` has no inputs",
                self.name
            )));
        }
        let has_seq = self.inputs.iter().any(|i| i.shape.has_seq());
        let default_seq_len = match (has_seq, self.default_seq_len) {
            (true, None) => Some(DEFAULT_SEQ_LEN),
            (true, t) => t,
            (false, _) => None,
        };
        Ok(Graph {
            name: self.name,
            inputs: self.inputs,
            nodes: self.nodes,
            loss: Loss {
                kind,
                input: input.to_string(),
            },
            default_seq_len,
        })
    }
}

/// Sequence length assumed for a recurrent model that names none: 100 frames
/// (one second of audio at the usual 10 ms hop).
pub const DEFAULT_SEQ_LEN: usize = 100;
