//! Batch-free tensors: computed once per step from constants and parameters, with no
//! batch axis (`Node::shared`). timm's relative-position MLP (ViT-relpos, MaxxViT-rmlp)
//! runs two linear layers over a constant table of relative coordinates, reads the
//! result at the index of every pair of positions and adds it to the attention scores;
//! PyTorch computes that table once per forward, not per sample.
//!
//! A float constant read by a `MatMul` with a weight becomes an [`Op::Constant`]; ops
//! that act on trailing axes (`MatMul` with a weight, element-wise ops with constants,
//! activations, dropout) import as they do on a batch, since their IR ops never read
//! the batch axis; layout ops (`Reshape`, `Transpose`, `Squeeze`, `Unsqueeze`,
//! `Flatten`, `Gather` at constant indices) are imported here, where every ONNX axis
//! is an IR axis. A shared tensor meets the batch only in `Add`, `Mul` or `Div`, as a
//! constant would: right-aligned, its leading axes of size 1 dropped.

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
    "Add", "Sub", "Mul", "Div", "MatMul", "Relu", "Sigmoid", "Tanh", "Gelu", "Erf", "Dropout",
];

/// Ops that rearrange a shared tensor's axes: imported here.
const LAYOUT: &[&str] = &[
    "Reshape",
    "Transpose",
    "Squeeze",
    "Unsqueeze",
    "Flatten",
    "Gather",
];

impl Importer {
    /// Whether `name` is a shared IR tensor.
    fn is_shared(&self, name: &str) -> bool {
        matches!(self.vals.get(name), Some(Val::Ir(x)) if self.b.is_shared(x))
    }

    /// Before `n` imports: a float constant `MatMul` reads with a weight becomes a
    /// shared [`Op::Constant`]; a shared input of an op that meets the batch loses its
    /// leading axes of size 1. Returns `true` when `n` was imported here (a layout op of
    /// a shared tensor).
    pub(super) fn shared_node(&mut self, n: &NodeProto, a: &Attrs) -> Result<bool, GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        if n.op_type == "MatMul" {
            self.constant_rows(n)?;
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

    /// `MatMul` of a float constant by a weight: the constant becomes a shared
    /// [`Op::Constant`] (read by any model input, for the IR's one-input rule).
    fn constant_rows(&mut self, n: &NodeProto) -> Result<(), GraphError> {
        let (Some(Val::Const(t)), Some(Val::Const(_))) = (
            n.input.first().and_then(|x| self.vals.get(x.as_str())),
            n.input.get(1).and_then(|w| self.vals.get(w.as_str())),
        ) else {
            return Ok(());
        };
        // A parameter on the left is a parameter computed on, not a table of constants.
        if self.initializers.contains(&n.input[0]) || self.read_from.contains_key(&n.input[0]) {
            return Ok(());
        }
        let reads_weight =
            self.initializers.contains(&n.input[1]) || self.read_from.contains_key(&n.input[1]);
        let Some(values) = tensor_f32(t).filter(|_| reads_weight) else {
            return Ok(());
        };
        let shape: Vec<usize> = t.dims.iter().map(|&d| d as usize).collect();
        let Some(any_input) = self.any_model_input() else {
            return Ok(());
        };
        let name = self.fresh_from(format!("{}/constant", label(n)));
        self.b
            .push(&name, Op::Constant { shape, values }, &[&any_input])?;
        self.vals.insert(n.input[0].clone(), Val::Ir(name));
        Ok(())
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

    /// A layout op of a shared tensor: every ONNX axis is an IR axis.
    fn shared_layout(&mut self, n: &NodeProto, a: &Attrs) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let Some(Val::Ir(x)) = self.vals.get(n.input[0].as_str()).cloned() else {
            return Err(err(format!(
                "{} reads a tensor computed once per step only as its first input",
                n.op_type
            )));
        };
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
