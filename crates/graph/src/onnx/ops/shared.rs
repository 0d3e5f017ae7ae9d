//! Batch-free tensors: computed once per step from constants and parameters, with no
//! batch axis (`Node::shared`). timm's relative-position MLP (ViT-relpos, MaxxViT-rmlp)
//! runs two linear layers over a constant table of relative coordinates, reads the
//! result at the index of every pair of positions and adds it to the attention scores;
//! PyTorch computes that table once per forward, not per sample.
//!
//! A float constant read by a `MatMul`, `Gemm` or `Conv` with a weight becomes an
//! [`Op::Constant`]; a learned tensor reparametrised alone (`exp`, `sigmoid`, `clip`)
//! becomes an [`Op::Parameter`], as do the learned parts of a bias joined with
//! constants. Ops that act on trailing axes (`MatMul`/`Gemm` with a weight,
//! element-wise ops with constants, activations, clip, exp, dropout) import as they do
//! on a batch, since their IR ops never read the batch axis; layout ops (`Reshape`,
//! `Transpose`, `Squeeze`, `Unsqueeze`, `Flatten`, `Gather` at constant indices) and a
//! softmax over the last axis are imported here, where every ONNX axis is an IR axis;
//! `Tile`/`Expand` over the batch of a leading axis of 1 keep the tensor. A shared
//! tensor meets the batch only in `Add`, `Mul` or `Div`, as a constant would:
//! right-aligned, its leading axes of size 1 dropped.

use crate::error::GraphError;
use crate::onnx::decode::{Attrs, tensor_f32, tensor_ints};
use crate::onnx::fold;
use crate::onnx::import::{Importer, label};
use crate::onnx::proto::NodeProto;
use crate::onnx::sym::Sym;
use crate::onnx::view::Val;
use crate::op::Op;

/// Ops that compute on a shared tensor's trailing axes (their IR ops never read the
/// batch axis): imported by their own families.
const TRAILING: &[&str] = &[
    "Add", "Sub", "Mul", "Div", "MatMul", "Gemm", "Relu", "Sigmoid", "Tanh", "Gelu", "Erf",
    "Dropout", "Clip", "Exp",
];

/// Element-wise functions a learned tensor goes through alone before it meets the batch:
/// a reparametrisation (`logit_scale.clamp(max=log 100).exp()`, a sigmoid gate).
const REPARAMETRISING: &[&str] = &["Clip", "Exp", "Sigmoid", "Tanh", "Relu"];

/// Ops that name a shared tensor's axes (they rearrange them, or a softmax normalises
/// one): imported here, where every ONNX axis is an IR axis.
const LAYOUT: &[&str] = &[
    "Reshape",
    "Transpose",
    "Squeeze",
    "Unsqueeze",
    "Flatten",
    "Gather",
    "Softmax",
];

impl Importer {
    /// Whether `name` is a shared IR tensor.
    fn is_shared(&self, name: &str) -> bool {
        matches!(self.vals.get(name), Some(Val::Ir(x)) if self.b.is_shared(x))
    }

    /// Before `n` imports: a float constant `MatMul`, `Gemm` or `Conv` reads with a weight
    /// becomes a shared [`Op::Constant`]; a shared input of an op that meets the batch
    /// loses its leading axes of size 1. Returns `true` when `n` was imported here (a
    /// layout op of a shared tensor, a convolution of a constant image).
    pub(super) fn shared_node(
        &mut self,
        i: usize,
        n: &NodeProto,
        a: &Attrs,
    ) -> Result<bool, GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        if matches!(n.op_type.as_str(), "MatMul" | "Gemm") {
            self.constant_input(n, false)?;
        }
        // XCiT's Fourier positions through a 1x1 convolution: the IR convolves a sample
        // (`[C, H, W]`), so the image's leading 1 goes before and comes back after.
        if n.op_type == "Conv" && self.constant_input(n, true)? {
            self.conv(i, n, a)?;
            let Some(Val::Ir(y)) = n.output.first().and_then(|o| self.vals.get(o)).cloned() else {
                return Err(err("a convolution without an output".into()));
            };
            let mut dims: Vec<i64> = self.fixed_dims(n, &y)?.iter().map(|&d| d as i64).collect();
            dims.insert(0, 1);
            let name = self.fresh_layout(n);
            self.b.push(&name, Op::Reshape { shape: dims }, &[&y])?;
            self.vals.insert(n.output[0].clone(), Val::Ir(name));
            return Ok(true);
        }
        let shared: Vec<usize> = (0..n.input.len())
            .filter(|&p| self.is_shared(&n.input[p]))
            .collect();
        if shared.is_empty() {
            return Ok(false);
        }
        let batched = (0..n.input.len()).any(|p| {
            matches!(
                self.vals.get(n.input[p].as_str()),
                Some(Val::Ir(_) | Val::View(_) | Val::Broadcast(_))
            ) && !shared.contains(&p)
        });
        if batched {
            if !matches!(n.op_type.as_str(), "Add" | "Mul" | "Div") {
                return Err(err(format!(
                    "{} of a tensor computed once per step (from constants and parameters) \
                     and a batch: only Add, Mul and Div broadcast one over the other",
                    n.op_type
                )));
            }
            for p in shared {
                self.drop_leading_ones(n, p)?;
            }
            return Ok(false);
        }
        if TRAILING.contains(&n.op_type.as_str()) {
            return Ok(false);
        }
        if matches!(n.op_type.as_str(), "Expand" | "Tile") {
            self.shared_repeat(n)?;
            return Ok(true);
        }
        if !LAYOUT.contains(&n.op_type.as_str()) {
            return Err(err(format!(
                "{} of a tensor computed once per step (from constants and parameters) is \
                 not supported; supported: {}",
                n.op_type,
                TRAILING
                    .iter()
                    .chain(LAYOUT)
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        self.shared_layout(n, a)?;
        Ok(true)
    }

    /// A float initializer that `n` reparametrises (see [`REPARAMETRISING`]) is a learned
    /// tensor: it becomes a shared [`Op::Parameter`] and `n` computes on it once per step.
    /// An initializer computed on with other tensors (a rotary table's frequencies times
    /// the positions) stays a buffer, folded.
    pub(super) fn learned_computed_on(&mut self, n: &NodeProto) -> Result<(), GraphError> {
        let Some(x) = n.input.first() else {
            return Ok(());
        };
        if !REPARAMETRISING.contains(&n.op_type.as_str()) {
            return Ok(());
        }
        // The initializer, or all of it in its order (`gating_param.view(1, -1, 1, 1)`).
        let source = match self.read_from.get(x) {
            Some(r) if r.is_whole() => r.table.clone(),
            Some(_) => return Ok(()),
            None if self.initializers.contains(x) => x.clone(),
            None => return Ok(()),
        };
        let Some(Val::Const(t)) = self.vals.get(x.as_str()).cloned() else {
            return Ok(());
        };
        let (Some(values), Some(any_input)) = (tensor_f32(&t), self.any_model_input()) else {
            return Ok(());
        };
        // A scalar is one element.
        let shape: Vec<usize> = match t.dims.is_empty() {
            true => vec![1],
            false => t.dims.iter().map(|&d| d as usize).collect(),
        };
        let name = self.fresh_from(format!("{x}/learned"));
        self.b.push(&name, Op::Parameter { shape }, &[&any_input])?;
        self.sources.insert(name.clone(), vec![source]);
        self.attach(&name, vec![Some(values)]);
        self.vals.insert(x.clone(), Val::Ir(name));
        Ok(())
    }

    /// A `Concat` of learned tensors and constants added to activations (timm's Swin V2
    /// joins `q_bias`, a zero `k_bias` buffer and `v_bias` into its qkv bias): the learned
    /// parts are parameters, the rest constants, joined once per step. Folded, the whole
    /// bias would count as learned. Returns whether it imported `n`.
    pub(super) fn learned_concat(&mut self, n: &NodeProto, a: &Attrs) -> Result<bool, GraphError> {
        let out = n.output.first().map_or("", String::as_str);
        let only_added = self.consumers.get(out).is_some_and(|uses| {
            uses.iter()
                .all(|&(node, _)| self.nodes[node].op_type == "Add")
        });
        if n.op_type != "Concat" || !only_added {
            return Ok(false);
        }
        // Each part: its values, dims and the initializer it is, if learned.
        let mut parts = Vec::new();
        for x in &n.input {
            let Some(Val::Const(t)) = self.vals.get(x.as_str()) else {
                return Ok(false);
            };
            let Some(values) = tensor_f32(t) else {
                return Ok(false);
            };
            let learned = match self.read_from.get(x) {
                Some(r) if r.is_whole() => Some(r.table.clone()),
                Some(_) => return Ok(false),
                None => self.initializers.contains(x).then(|| x.clone()),
            };
            let dims: Vec<usize> = t.dims.iter().map(|&d| d as usize).collect();
            parts.push((values, dims, learned));
        }
        let learned = parts.iter().filter(|p| p.2.is_some()).count();
        let Some(any_input) = self.any_model_input() else {
            return Ok(false);
        };
        if learned == 0 || learned == parts.len() {
            return Ok(false);
        }
        let rank = parts[0].1.len();
        let axis =
            fold::axis_of(a.int("axis", 0), rank).map_err(|why| GraphError::node(label(n), why))?;
        let mut names = Vec::new();
        for (values, shape, source) in parts {
            let name = self.fresh_from(format!("{}/part", label(n)));
            match source {
                Some(table) => {
                    self.b.push(&name, Op::Parameter { shape }, &[&any_input])?;
                    self.sources.insert(name.clone(), vec![table]);
                    self.attach(&name, vec![Some(values)]);
                }
                None => {
                    self.b
                        .push(&name, Op::Constant { shape, values }, &[&any_input])?;
                }
            }
            names.push(name);
        }
        let joined = self.fresh(n);
        let parts: Vec<&str> = names.iter().map(String::as_str).collect();
        let op = Op::Concat {
            axis: axis as i64 + 1,
        };
        self.b.push(&joined, op, &parts)?;
        self.define(n, Val::Ir(joined));
        Ok(true)
    }

    /// `MatMul`, `Gemm` (or `Conv`) of a float constant by a weight: the constant becomes a
    /// shared [`Op::Constant`] (read by any model input, for the IR's one-input rule),
    /// without its leading axis of 1 where `image` (a convolution's batch of one).
    /// Returns whether it did.
    fn constant_input(&mut self, n: &NodeProto, image: bool) -> Result<bool, GraphError> {
        let (Some(Val::Const(t)), Some(Val::Const(_))) = (
            n.input.first().and_then(|x| self.vals.get(x.as_str())),
            n.input.get(1).and_then(|w| self.vals.get(w.as_str())),
        ) else {
            return Ok(false);
        };
        // An initializer on the left is a buffer (Swin V2's coordinate table): like every
        // initializer computed on without a batch (see `fold`), it is not a parameter.
        // One read through folded indexing is refused by the MatMul as before.
        if self.read_from.contains_key(&n.input[0]) {
            return Ok(false);
        }
        let reads_weight =
            self.initializers.contains(&n.input[1]) || self.read_from.contains_key(&n.input[1]);
        let Some(values) = tensor_f32(t).filter(|_| reads_weight) else {
            return Ok(false);
        };
        let mut shape: Vec<usize> = t.dims.iter().map(|&d| d as usize).collect();
        if image && shape.first() != Some(&1) {
            return Ok(false);
        }
        if image {
            shape.remove(0);
        }
        let Some(any_input) = self.any_model_input() else {
            return Ok(false);
        };
        let name = self.fresh_from(format!("{}/constant", label(n)));
        self.b
            .push(&name, Op::Constant { shape, values }, &[&any_input])?;
        self.vals.insert(n.input[0].clone(), Val::Ir(name));
        Ok(true)
    }

    /// Input `pos`, a shared tensor, without its leading axes of size 1 (ONNX broadcasts
    /// from the right: they would align with the batch).
    fn drop_leading_ones(&mut self, n: &NodeProto, pos: usize) -> Result<(), GraphError> {
        let Some(Val::Ir(x)) = self.vals.get(n.input[pos].as_str()).cloned() else {
            unreachable!("a shared input")
        };
        let dims = self.fixed_dims(n, &x)?;
        let kept: Vec<i64> = dims
            .iter()
            .skip_while(|&&d| d == 1)
            .map(|&d| d as i64)
            .collect();
        if kept.len() == dims.len() {
            return Ok(());
        }
        let target = if kept.is_empty() { vec![1] } else { kept };
        let name = self.fresh_layout(n);
        self.b.push(&name, Op::Reshape { shape: target }, &[&x])?;
        self.vals.insert(n.input[pos].clone(), Val::Ir(name));
        Ok(())
    }

    fn fixed_dims(&self, n: &NodeProto, x: &str) -> Result<Vec<usize>, GraphError> {
        self.shape(x)?.all_fixed().ok_or_else(|| {
            GraphError::node(
                label(n),
                "a shared tensor with the symbolic sequence length",
            )
        })
    }

    /// Input 0 of `n`, the shared tensor it rearranges.
    fn shared_input(&self, n: &NodeProto) -> Result<String, GraphError> {
        match self.vals.get(n.input[0].as_str()) {
            Some(Val::Ir(x)) => Ok(x.clone()),
            _ => Err(GraphError::node(
                label(n),
                format!(
                    "{} reads a tensor computed once per step only as its first input",
                    n.op_type
                ),
            )),
        }
    }

    /// `Expand` or `Tile` of a shared tensor that repeats nothing but a leading axis of
    /// size 1, over the batch (XCiT's positions: `pos.repeat(B, 1, 1, 1)`): the tensor
    /// itself, its leading 1 standing for the batch; the op that meets the batch
    /// broadcasts it (PyTorch's copies are transient: `repeat`'s backward keeps no tensor).
    fn shared_repeat(&mut self, n: &NodeProto) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let x = self.shared_input(n)?;
        let dims = self.fixed_dims(n, &x)?;
        let (target, _) = self.ints_of(n, 1, &format!("{} sizes", n.op_type))?;
        let tile = n.op_type == "Tile";
        let kept = target.len() == dims.len()
            && target.iter().zip(&dims).enumerate().all(|(k, (t, &d))| {
                let same = *t == Sym::N(1) || (!tile && *t == Sym::N(d as i64));
                same || (k == 0 && d == 1 && *t == Sym::Batch)
            });
        if !kept {
            return Err(err(format!(
                "{} of a tensor computed once per step ({dims:?}) by {}: only a repeat \
                 over the batch of a leading axis of 1 is supported",
                n.op_type,
                target
                    .iter()
                    .map(Sym::to_string)
                    .collect::<Vec<_>>()
                    .join(" x ")
            )));
        }
        self.define(n, Val::Ir(x));
        Ok(())
    }

    /// A layout op of a shared tensor: every ONNX axis is an IR axis.
    fn shared_layout(&mut self, n: &NodeProto, a: &Attrs) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let x = self.shared_input(n)?;
        let dims = self.fixed_dims(n, &x)?;
        let rank = dims.len();
        let axis_of = |axis: i64, rank: usize| fold::axis_of(axis, rank).map_err(err);
        let reshape = |target: Vec<usize>| Op::Reshape {
            shape: target.into_iter().map(|d| d as i64).collect(),
        };
        let op = match n.op_type.as_str() {
            "Transpose" => {
                let perm = a
                    .ints("perm")
                    .unwrap_or_else(|| (0..rank as i64).rev().collect())
                    .iter()
                    .map(|&p| axis_of(p, rank))
                    .collect::<Result<Vec<_>, _>>()?;
                Op::Transpose { perm }
            }
            "Reshape" => {
                let (target, _) = self.ints_of(n, 1, "Reshape shape")?;
                let total: usize = dims.iter().product();
                let mut out = Vec::with_capacity(target.len());
                let mut infer = None;
                for (k, t) in target.iter().enumerate() {
                    match t {
                        Sym::N(0) => out.push(*dims.get(k).ok_or_else(|| {
                            err(format!("Reshape copies axis {k} of a rank-{rank} tensor"))
                        })?),
                        Sym::N(-1) if infer.is_none() => {
                            infer = Some(k);
                            out.push(1);
                        }
                        Sym::N(d) if *d > 0 => out.push(*d as usize),
                        // A leading 1 standing for the batch (see `shared_repeat`).
                        Sym::Batch if k == 0 && dims.first() == Some(&1) => out.push(1),
                        other => return Err(err(format!("Reshape to {other} of a table"))),
                    }
                }
                if let Some(k) = infer {
                    out[k] = total / out.iter().product::<usize>().max(1);
                }
                if out.iter().product::<usize>() != total {
                    return Err(err(format!("Reshape of {dims:?} to {out:?}")));
                }
                reshape(out)
            }
            // ConViT's positional attention: a softmax over a table's last axis.
            "Softmax" => {
                let axis = axis_of(a.int("axis", -1), rank)?;
                if axis + 1 != rank {
                    return Err(err(format!(
                        "Softmax over axis {axis} of a rank-{rank} tensor computed once per \
                         step: only its last axis is supported"
                    )));
                }
                Op::Softmax { axis: -1 }
            }
            "Flatten" => {
                let k = axis_of(a.int("axis", 1), rank + 1)?;
                reshape(vec![dims[..k].iter().product(), dims[k..].iter().product()])
            }
            "Squeeze" | "Unsqueeze" => {
                let axes = if Self::has_input(n, 1) {
                    self.const_ints(n, 1, "axes")?
                } else {
                    a.ints("axes").unwrap_or_default()
                };
                let mut out = dims.clone();
                if n.op_type == "Squeeze" {
                    let drop: Vec<usize> = if axes.is_empty() {
                        (0..dims.len()).filter(|&k| dims[k] == 1).collect()
                    } else {
                        axes.iter()
                            .map(|&ax| axis_of(ax, rank))
                            .collect::<Result<_, _>>()?
                    };
                    out = (0..dims.len())
                        .filter(|k| !drop.contains(k))
                        .map(|k| dims[k])
                        .collect();
                } else {
                    let out_rank = rank + axes.len();
                    let mut at = axes
                        .iter()
                        .map(|&ax| axis_of(ax, out_rank))
                        .collect::<Result<Vec<_>, _>>()?;
                    at.sort_unstable();
                    for k in at {
                        out.insert(k, 1);
                    }
                }
                reshape(out)
            }
            "Gather" => {
                let axis = axis_of(a.int("axis", 0), rank)?;
                let t = self.konst(n, 1, "Gather indices")?;
                let ids = tensor_ints(&t).map_err(|why| err(format!("Gather indices: {why}")))?;
                let indices = fold::gather_indices(&ids, dims[axis])
                    .map_err(|why| err(format!("Gather: {why}")))?;
                // IR axes count the batch as 0; a shared tensor's sample axes are all of
                // its ONNX axes.
                let op = Op::Take {
                    axis: axis as i64 + 1,
                    indices,
                };
                if t.dims.len() == 1 {
                    self.emit(n, op, &[&x])?;
                    return Ok(());
                }
                let taken = self.fresh(n);
                self.b.push(&taken, op, &[&x])?;
                // The index's axes replace the gathered one.
                let mut out: Vec<usize> = dims[..axis].to_vec();
                out.extend(t.dims.iter().map(|&d| d as usize));
                out.extend(&dims[axis + 1..]);
                self.emit(n, reshape(out), &[&taken])?;
                return Ok(());
            }
            _ => unreachable!("a layout op"),
        };
        self.emit(n, op, &[&x])?;
        Ok(())
    }
}
