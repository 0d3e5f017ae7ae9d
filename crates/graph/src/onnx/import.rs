//! The import driver: the importer's state, node order, liveness and the
//! lookups and outputs every op family uses.

use super::decode::{constant_value, tensor_f32, tensor_floats, tensor_ints};
use super::fold::ReadFrom;
use super::not_onnx;
use super::ops::StdWeight;
use super::proto::{self, GraphProto, NodeProto, TensorProto};
use super::view::{Lay, Val, View};
use crate::error::GraphError;
use crate::graph::{Graph, GraphBuilder, LossKind};
use crate::op::Op;
use crate::shape::{Dim, Shape};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

/// The state of one import: the ONNX graph, what each of its tensor names
/// stands for, and the IR being built.
pub(super) struct Importer {
    /// Shared so a node can be read while the importer changes.
    pub(super) nodes: Rc<[NodeProto]>,
    /// The graph inputs, taken by `add_inputs`.
    pub(super) inputs: Vec<proto::ValueInfoProto>,
    /// The graph outputs; the first one feeds the loss.
    pub(super) outputs: Vec<String>,
    /// The default domain's opset (some attribute defaults changed with it).
    pub(super) opset: i64,
    /// The caller's loss: MSE keeps a final softmax, any other drops it;
    /// `None` chooses from the output's shape.
    pub(super) loss: Option<LossKind>,
    /// The IR being built; it checks every node's shapes.
    pub(super) b: GraphBuilder,
    /// What each ONNX tensor name stands for.
    pub(super) vals: HashMap<String, Val>,
    /// IR names taken so far, so node names stay unique.
    pub(super) used: HashSet<String>,
    /// Per node: whether some graph output depends on it.
    pub(super) live: Vec<bool>,
    /// Per tensor: the live nodes reading it, with the input position.
    pub(super) consumers: HashMap<String, Vec<(usize, usize)>>,
    /// Nodes already folded into an earlier one (bias `Add`s).
    pub(super) skip: HashSet<usize>,
    /// The IR names of the model inputs.
    pub(super) graph_inputs: HashSet<String>,
    /// The batch size when an input fixes it (models exported with batch 1).
    pub(super) batch: Option<i64>,
    /// While an op runs on inputs aligned to a layout view: the layout its outputs
    /// are seen in (see [`Importer::prepare_views`]).
    pub(super) wrap: Option<Lay>,
    /// Layout views already aligned, by ONNX name: the IR tensor and its layout.
    pub(super) aligned: HashMap<String, (String, Lay)>,
    /// The initializers' names: the model's parameters and buffers (a `Constant`
    /// node or a folded value is neither).
    pub(super) initializers: HashSet<String>,
    /// Folded constants that read a float initializer's elements (see [`ReadFrom`]).
    pub(super) read_from: HashMap<String, ReadFrom>,
    /// The initializers each emitted IR node's ONNX node read, directly or through
    /// folded indexing: where its parameters may come from.
    pub(super) sources: HashMap<String, Vec<String>>,
    /// Per initializer, the IR parameters (node, index) already holding its values.
    pub(super) claims: HashMap<String, Vec<(String, usize)>>,
    /// Convolution weights on their way to being standardised, by ONNX name.
    pub(super) standardizing: HashMap<String, StdWeight>,
}

impl Importer {
    /// Reads the graph: constants, liveness and the model inputs.
    pub(super) fn new(
        graph: GraphProto,
        opset: i64,
        loss: Option<LossKind>,
    ) -> Result<Importer, GraphError> {
        let name = if graph.name.is_empty() {
            "onnx".to_string()
        } else {
            graph.name.clone()
        };
        let mut vals = HashMap::new();
        let mut initializers = HashSet::new();
        for t in graph.initializer {
            super::decode::check_stored(&t)
                .map_err(|e| GraphError::Invalid(format!("initializer: {e}")))?;
            initializers.insert(t.name.clone());
            vals.insert(t.name.clone(), Val::Const(Rc::new(t)));
        }
        let mut imp = Importer {
            b: GraphBuilder::new(name),
            // A node without outputs computes nothing a graph output can read (and the
            // rewrites below read every node's first output).
            nodes: super::einsum::lower(
                topological(
                    graph
                        .node
                        .into_iter()
                        .filter(|n| !n.output.is_empty())
                        .collect(),
                )?,
                opset,
                &graph
                    .input
                    .iter()
                    .map(|i| i.name.clone())
                    .collect::<Vec<_>>(),
                |name| initializers.contains(name),
            )?
            .into(),
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
            wrap: None,
            aligned: HashMap::new(),
            initializers,
            read_from: HashMap::new(),
            sources: HashMap::new(),
            claims: HashMap::new(),
            standardizing: HashMap::new(),
        };
        imp.constants();
        let nodes = super::fuse::fuse_gelu(imp.nodes.to_vec(), |name| match imp.vals.get(name) {
            Some(Val::Const(t)) => match tensor_floats(t).ok()?[..] {
                [v] => Some(v as f32),
                _ => None,
            },
            _ => None,
        });
        let scalar = |name: &str| match imp.vals.get(name) {
            Some(Val::Const(t)) => match tensor_floats(t).ok()?[..] {
                [v] => Some(v as f32),
                _ => None,
            },
            _ => None,
        };
        let ints = |name: &str| match imp.vals.get(name) {
            Some(Val::Const(t)) => tensor_ints(t).ok(),
            _ => None,
        };
        let is_weight = |name: &str| imp.initializers.contains(name);
        let nodes = super::fuse::fuse_layer_norm(nodes, scalar, ints, is_weight);
        let nodes = super::fuse::fuse_rms_norm(nodes, scalar, ints, is_weight);
        imp.nodes = nodes.into();
        imp.liveness();
        imp.add_inputs()?;
        Ok(imp)
    }

    /// Evaluates every `Constant` node up front (they have no inputs).
    pub(super) fn constants(&mut self) {
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
    /// Recurrent initial states and sequence lengths do not count as uses, nor the
    /// running statistics a training-mode `BatchNormalization` only updates (its
    /// outputs 1 and 2) when nothing reads the updated ones.
    pub(super) fn liveness(&mut self) {
        let mut needed: HashSet<&str> = self.outputs.iter().map(String::as_str).collect();
        let mut live = vec![false; self.nodes.len()];
        let mut unread: HashSet<(usize, usize)> = HashSet::new();
        for (i, n) in self.nodes.iter().enumerate().rev() {
            if n.output.iter().any(|o| needed.contains(o.as_str())) {
                live[i] = true;
                let stats_unread = n.op_type == "BatchNormalization"
                    && super::decode::Attrs(&n.attribute).int("training_mode", 0) == 1
                    && !n.output.iter().skip(1).any(|o| needed.contains(o.as_str()));
                for (p, input) in n.input.iter().enumerate() {
                    if stats_unread && p >= 3 {
                        unread.insert((i, p));
                    } else if !input.is_empty() && !is_rnn_state(n, p) {
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
                if !input.is_empty() && !is_rnn_state(n, p) && !unread.contains(&(i, p)) {
                    self.consumers
                        .entry(input.clone())
                        .or_default()
                        .push((i, p));
                }
            }
        }
        self.live = live;
    }

    /// Imports every live node in order and finishes the graph with its loss.
    pub(super) fn run(mut self) -> Result<Graph, GraphError> {
        let nodes = Rc::clone(&self.nodes);
        for (i, n) in nodes.iter().enumerate() {
            if !self.live[i] || self.skip.contains(&i) {
                continue;
            }
            if !is_default(n) {
                return Err(unsupported(n, format!("{}.{}", n.domain, n.op_type)));
            }
            self.node(i, n)?;
        }
        let out = self.outputs[0].clone();
        let ir = match self.vals.get(&out).cloned() {
            Some(Val::Ir(ir)) => ir,
            // Batch-first again, only split or merged differently: reshaped for the loss.
            Some(Val::View(v)) if v.batch_first() => {
                let at = NodeProto {
                    name: out.clone(),
                    ..NodeProto::default()
                };
                self.align(&at, &v)?.0
            }
            Some(Val::View(v)) => {
                return Err(GraphError::Invalid(format!(
                    "graph output `{out}` is `{}` seen as {} (the batch moved or merged); \
                     the loss needs the batch first",
                    v.ir,
                    v.describe()
                )));
            }
            Some(Val::Const(_) | Val::Ints { .. } | Val::Mask(_) | Val::Broadcast(_)) => {
                return Err(GraphError::Invalid(format!(
                    "graph output `{out}` is a constant, a shape or a random mask"
                )));
            }
            Some(Val::Unusable(why) | Val::Empty(why)) => {
                return Err(GraphError::Invalid(format!("graph output `{out}`: {why}")));
            }
            None => {
                return Err(GraphError::Invalid(format!(
                    "graph output `{out}` is produced by no node"
                )));
            }
        };
        // A classification loss asked for decided the final softmax above; its
        // kind by the output's layout is `Graph::with_loss`'s to set.
        let kind = match self.loss {
            Some(LossKind::Mse) => LossKind::Mse,
            Some(_) | None => crate::loss::by_layout(self.b.shape(&ir)?),
        };
        self.b.finish(kind, &ir)
    }

    // ----- lookups --------------------------------------------------------

    /// What input `pos` of `n` stands for.
    pub(super) fn val(&self, n: &NodeProto, pos: usize) -> Result<&Val, GraphError> {
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

    /// Whether `n` has a non-empty input `pos` (ONNX leaves optional inputs empty).
    pub(super) fn has_input(n: &NodeProto, pos: usize) -> bool {
        n.input.get(pos).is_some_and(|s| !s.is_empty())
    }

    /// The IR tensor behind activation input `pos`.
    pub(super) fn act(&self, n: &NodeProto, pos: usize) -> Result<String, GraphError> {
        let val = self.val(n, pos)?;
        let name = &n.input[pos];
        match val {
            Val::Ir(ir) => Ok(ir.clone()),
            Val::View(v) => Err(GraphError::node(
                label(n),
                format!(
                    "input `{name}` is `{}` seen as {} (the batch moved or merged); {} on it \
                     is supported only once Transpose/Reshape bring the batch back to axis 0, \
                     or where it computes on axes away from the batch",
                    v.ir,
                    v.describe(),
                    n.op_type
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
            Val::Mask(_) => Err(GraphError::node(
                label(n),
                format!(
                    "input `{name}` is a random mask where {} expects an activation; only \
                     `x * mask` (dropout, stochastic depth) is supported",
                    n.op_type
                ),
            )),
            Val::Broadcast(t) => Err(GraphError::node(
                label(n),
                format!(
                    "input `{name}` is initializer `{}` expanded over the batch where {} \
                     expects an activation; only a Concat of it (a class token) is supported",
                    t.name, n.op_type
                ),
            )),
            Val::Unusable(why) => Err(GraphError::node(label(n), format!("input `{name}`: {why}"))),
            Val::Empty(what) => Err(GraphError::node(
                label(n),
                format!(
                    "input `{name}` is {what}: only Concat of it (which drops it) is supported"
                ),
            )),
        }
    }

    /// Whether input `pos` is a constant with no elements (a `Resize`'s unused `roi` or
    /// `scales`, as exporters write them).
    pub(super) fn is_empty_const(&self, n: &NodeProto, pos: usize) -> bool {
        matches!(self.val(n, pos), Ok(Val::Const(t)) if t.dims.contains(&0) || t.dims.is_empty() && t.raw_data.is_empty() && t.float_data.is_empty() && t.int64_data.is_empty())
    }

    /// The constant behind input `pos`.
    pub(super) fn konst(
        &self,
        n: &NodeProto,
        pos: usize,
        what: &str,
    ) -> Result<Rc<TensorProto>, GraphError> {
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

    /// The values of integer constant input `pos`.
    pub(super) fn const_ints(
        &self,
        n: &NodeProto,
        pos: usize,
        what: &str,
    ) -> Result<Vec<i64>, GraphError> {
        let t = self.konst(n, pos, what)?;
        tensor_ints(&t).map_err(|why| GraphError::node(label(n), format!("{what}: {why}")))
    }

    /// The single number of constant input `pos`.
    pub(super) fn const_scalar(
        &self,
        n: &NodeProto,
        pos: usize,
        what: &str,
    ) -> Result<f64, GraphError> {
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

    /// The sample shape of IR tensor `ir`.
    pub(super) fn shape(&self, ir: &str) -> Result<&Shape, GraphError> {
        self.b.shape(ir)
    }

    /// The channel count of a `[B, C, ...]` IR tensor.
    pub(super) fn channels(&self, n: &NodeProto, ir: &str) -> Result<usize, GraphError> {
        let s = self.shape(ir)?;
        s.0.first().and_then(|d| d.fixed()).ok_or_else(|| {
            GraphError::node(label(n), format!("needs a [B, C, ...] input, got {s}"))
        })
    }

    /// The concrete last dimension of IR tensor `ir`.
    pub(super) fn last_dim(&self, n: &NodeProto, ir: &str) -> Result<usize, GraphError> {
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
    pub(super) fn fresh(&mut self, n: &NodeProto) -> String {
        self.fresh_from(label(n))
    }

    /// A fresh IR node name for a layout op `n`'s input needs (`<node>/layout`).
    pub(super) fn fresh_layout(&mut self, n: &NodeProto) -> String {
        self.fresh_from(format!("{}/layout", label(n)))
    }

    pub(super) fn fresh_from(&mut self, base: String) -> String {
        let mut name = base.clone();
        let mut k = 1;
        while self.used.contains(&name) {
            k += 1;
            name = format!("{base}_{k}");
        }
        self.used.insert(name.clone());
        name
    }

    /// A model input's IR name, for an op that reads only its batch (or nothing): the
    /// first by name, so imports repeat.
    pub(super) fn any_model_input(&self) -> Option<String> {
        self.graph_inputs.iter().min().cloned()
    }

    /// Pushes `op` as the IR node for `n`; output 0 maps to it, other outputs are unusable.
    pub(super) fn emit(
        &mut self,
        n: &NodeProto,
        op: Op,
        inputs: &[&str],
    ) -> Result<String, GraphError> {
        let name = self.fresh(n);
        self.b.push(&name, op, inputs)?;
        self.define(n, Val::Ir(name.clone()));
        let read: Vec<String> = n
            .input
            .iter()
            .filter_map(|i| match self.read_from.get(i) {
                Some(r) => Some(r.table.clone()),
                None => self.initializers.contains(i).then(|| i.clone()),
            })
            .collect();
        if !read.is_empty() {
            self.sources.insert(name.clone(), read);
        }
        Ok(name)
    }

    /// Maps output 0 of `n` to layout view `v`, or to its IR tensor when it is unchanged.
    pub(super) fn define_view(&mut self, n: &NodeProto, v: View) -> Result<(), GraphError> {
        let val = self.settle(v)?;
        self.define(n, val);
        Ok(())
    }

    /// A view as a plain IR tensor when it is one.
    fn settle(&self, v: View) -> Result<Val, GraphError> {
        Ok(if v.is_plain(self.shape(&v.ir)?) {
            Val::Ir(v.ir)
        } else {
            Val::View(v)
        })
    }

    /// Emits the IR ops that align view `v` to its ONNX axes with the batch pulled
    /// out (for a view with the batch first: the batch-first tensor itself).
    pub(super) fn align(&mut self, n: &NodeProto, v: &View) -> Result<(String, Lay), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let plan = v
            .align(self.shape(&v.ir)?)
            .map_err(|e| err(e.to_string()))?;
        let mut x = v.ir.clone();
        let ops = [
            plan.split.map(|shape| Op::Reshape { shape }),
            plan.perm.map(|perm| Op::Transpose { perm }),
            plan.merge.map(|shape| Op::Reshape { shape }),
        ];
        for op in ops.into_iter().flatten() {
            let name = self.fresh_layout(n);
            x = self.b.push(&name, op, &[&x])?;
        }
        Ok((x, plan.lay))
    }

    /// Before `n` computes: inputs seen through a layout view with the batch first
    /// become batch-first IR tensors; for an op that computes the same on the IR
    /// tensor aligned to the view (`touched` trailing axes, never the batch's), the
    /// inputs are aligned and the outputs will be seen through the same layout.
    /// Returns the input bindings to restore after the op.
    pub(super) fn prepare_views(
        &mut self,
        n: &NodeProto,
        touched: Option<usize>,
    ) -> Result<Vec<(String, Val)>, GraphError> {
        let mut restore = Vec::new();
        let mut lay: Option<Lay> = None;
        for name in &n.input {
            let Some(Val::View(v)) = self.vals.get(name.as_str()).cloned() else {
                continue;
            };
            if v.batch_first() {
                let (x, _) = self.align(n, &v)?;
                self.vals.insert(name.clone(), Val::Ir(x));
                continue;
            }
            let Some(touched) = touched else {
                continue;
            };
            let (x, l) = match self.aligned.get(name.as_str()) {
                Some(done) => done.clone(),
                None => {
                    let done = self.align(n, &v)?;
                    self.aligned.insert(name.clone(), done.clone());
                    done
                }
            };
            let same = |p: &Lay| {
                (p.b_from_end(), p.b_alone, p.b_first) == (l.b_from_end(), l.b_alone, l.b_first)
            };
            if l.b_from_end() < touched || lay.as_ref().is_some_and(|p| !same(p)) {
                // Left as a view: the op's own lookup names the layout.
                continue;
            }
            // Inputs broadcast from their last axes: the output has the layout
            // of the input of most axes.
            lay = Some(match lay {
                Some(p) if p.rank >= l.rank => p,
                _ => l,
            });
            restore.push((name.clone(), Val::View(v)));
            self.vals.insert(name.clone(), Val::Ir(x));
        }
        // A batch-first activation beside an aligned view would broadcast against the
        // wrong axes: leave the views, so the op's lookup names the layout.
        let plain = n
            .input
            .iter()
            .filter(|name| !restore.iter().any(|(r, _)| r == *name))
            .any(|name| matches!(self.vals.get(name.as_str()), Some(Val::Ir(x)) if !self.b.is_shared(x)));
        if lay.is_some() && plain {
            for (name, v) in restore.drain(..) {
                self.vals.insert(name, v);
            }
            lay = None;
        }
        self.wrap = lay;
        Ok(restore)
    }

    /// Maps output 0 of `n` to `val` and marks the other outputs unusable.
    pub(super) fn define(&mut self, n: &NodeProto, val: Val) {
        let val = match (val, self.wrap) {
            (Val::Ir(ir), Some(lay)) => match self.shape(&ir) {
                // An output of another rank than its inputs' layout (an op given
                // inputs it does not read) cannot be seen through that layout.
                Ok(s) if s.rank() + 1 != lay.ir_rank() => Val::Unusable(format!(
                    "output of {} `{}` has {} axes where its inputs' layout has {}",
                    n.op_type,
                    label(n),
                    s.rank() + 1,
                    lay.ir_rank()
                )),
                Ok(s) => {
                    let v = View::from_aligned(&ir, s, lay);
                    self.settle(v).unwrap_or(Val::Ir(ir))
                }
                Err(_) => Val::Ir(ir),
            },
            (val, _) => val,
        };
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
    pub(super) fn bias_fold(
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
    ///
    /// A parameter read from an initializer whose values an earlier parameter of the
    /// same shape already holds, element for element, is tied to it: one tensor read
    /// twice (a head tied to the token embedding, a position-bias table every layer
    /// adds), counted once as PyTorch counts it.
    pub(super) fn attach(&mut self, name: &str, weights: Vec<Option<Vec<f32>>>) {
        let Some(weights) = weights.into_iter().collect::<Option<Vec<_>>>() else {
            return;
        };
        // Values whose sizes do not fit the op's parameters are not attached.
        if self.b.set_weights(name, weights).is_err() {
            return;
        }
        let sources = self.sources.get(name).cloned().unwrap_or_default();
        let count = self.b.weights_of(name).map_or(0, <[_]>::len);
        for k in 0..count {
            let tied_to = sources.iter().find_map(|s| {
                self.claims.get(s)?.iter().find(|(other, j)| {
                    let (mine, theirs) = (self.b.weights_of(name), self.b.weights_of(other));
                    mine.zip(theirs).is_some_and(|(m, t)| t.get(*j) == m.get(k))
                })
            });
            match tied_to.cloned() {
                Some((other, j)) if self.b.tie(name, k, &other, j).is_ok() => {}
                _ => {
                    for s in &sources {
                        self.claims
                            .entry(s.clone())
                            .or_default()
                            .push((name.to_string(), k));
                    }
                }
            }
        }
    }

    /// The `f32` values of constant input `pos`, when it is one and they can be read.
    pub(super) fn const_f32(&self, n: &NodeProto, pos: usize) -> Option<Vec<f32>> {
        if !Self::has_input(n, pos) {
            return None;
        }
        match self.vals.get(&n.input[pos])? {
            Val::Const(t) => tensor_f32(t),
            _ => None,
        }
    }
}

// ----- helpers --------------------------------------------------------------

/// The nodes in an order where every tensor is produced before it is read
/// (ONNX requires it, not every exporter keeps it); the file order when it does.
pub(super) fn topological(nodes: Vec<NodeProto>) -> Result<Vec<NodeProto>, GraphError> {
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

/// Whether `n` is in the default `ai.onnx` domain.
pub(super) fn is_default(n: &NodeProto) -> bool {
    n.domain.is_empty() || n.domain == "ai.onnx"
}

/// Inputs of LSTM/GRU that only set up state (sequence_lens, initial_h, initial_c).
pub(super) fn is_rnn_state(n: &NodeProto, pos: usize) -> bool {
    is_default(n) && matches!(n.op_type.as_str(), "LSTM" | "GRU") && (4..=6).contains(&pos)
}

/// The node's name, or its first output's name when it has none.
pub(super) fn label(n: &NodeProto) -> String {
    if !n.name.is_empty() {
        n.name.clone()
    } else if let Some(o) = n.output.first().filter(|o| !o.is_empty()) {
        o.clone()
    } else {
        n.op_type.clone()
    }
}

/// The error for an op type the IR does not know (`op_type` may carry a domain).
pub(super) fn unsupported(n: &NodeProto, op_type: String) -> GraphError {
    GraphError::Unsupported {
        node: label(n),
        op_type,
        supported: super::SUPPORTED_ONNX_OPS,
    }
}
