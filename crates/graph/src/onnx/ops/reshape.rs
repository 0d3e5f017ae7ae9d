//! Reshaping ops: `Flatten`, `Reshape`, `Squeeze`/`Unsqueeze`, `Transpose`
//! (of constants, or of activations as layout views) and `Concat` of activations.

use crate::error::GraphError;
use crate::onnx::decode::{Attrs, is_int_type, positive, tensor_f32};
use crate::onnx::fold::permute;
use crate::onnx::import::{Importer, label};
use crate::onnx::proto::{DataType, NodeProto, TensorProto};
use crate::onnx::shapes::{squeeze, unsqueeze};
use crate::onnx::sym::Sym;
use crate::onnx::view::{Lay, LayoutError, Val, View, permutation};
use crate::op::Op;
use crate::shape::Dim;
use std::rc::Rc;

impl Importer {
    /// `Flatten` that keeps the batch.
    pub(super) fn flatten(
        &mut self,
        _i: usize,
        n: &NodeProto,
        a: &Attrs,
    ) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        // Of a layout view: the reshape to the two products it names.
        if let Val::View(v) = self.val(n, 0)?.clone() {
            let dims = v.dims();
            let rank = dims.len() as i64;
            let axis = a.int("axis", 1);
            let axis = if axis < 0 { axis + rank } else { axis };
            if !(0..=rank).contains(&axis) {
                return Err(err(format!("Flatten with axis {axis} of rank {rank}")));
            }
            let product = |ds: &[Sym]| ds.iter().fold(Sym::N(1), |p, &d| p.mul(d));
            let (head, tail) = dims.split_at(axis as usize);
            let v = v
                .reshape(&[product(head), product(tail)])
                .map_err(|e| err(e.to_string()))?;
            return self.define_view(n, v);
        }
        let x = self.act(n, 0)?;
        let full = self.shape(&x)?.rank() as i64 + 1;
        let axis = a.int("axis", 1);
        if axis != 1 && axis + full != 1 {
            return Err(err(format!(
                "Flatten with axis {axis}: only axis 1 (keep the batch) is supported"
            )));
        }
        self.emit(n, Op::Flatten, &[&x])?;
        Ok(())
    }

    /// `Reshape` of each sample, or of a layout view (a reshape that moves or merges
    /// the batch makes one).
    pub(super) fn reshape(
        &mut self,
        _i: usize,
        n: &NodeProto,
        a: &Attrs,
    ) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        if let Val::View(v) = self.val(n, 0)?.clone() {
            let (target, _) = self.ints_of(n, 1, "Reshape shape")?;
            let v = match v.reshape(&target) {
                Ok(v) => v,
                // An axis made of atoms in another order than the new axes split it
                // (MaxViT's grid partition of a window partition's 8 x 7 as 7 x 8):
                // ONNX reshapes the logical order, so the tensor is aligned to the
                // ONNX axes first (a copy), and each axis is one atom again.
                Err(first) => {
                    let (x, lay) = self.align(n, &v)?;
                    View::from_aligned(&x, self.shape(&x)?, lay)
                        .reshape(&target)
                        .map_err(|_| err(first.to_string()))?
                }
            };
            return self.define_view(n, v);
        }
        let x = self.act(n, 0)?;
        let target = match self.reshape_target(n) {
            Ok(target) => target,
            Err(simple) => {
                // The batch moves or merges: a view, or the reason of the plain reshape.
                let (target, _) = self.ints_of(n, 1, "Reshape shape")?;
                let s = self.shape(&x)?.clone();
                let v = View::of(&x, &s).reshape(&target).map_err(|_| simple)?;
                return self.define_view(n, v);
            }
        };
        let Some((&first, rest)) = target.split_first() else {
            return Err(err("Reshape to a scalar drops the batch".into()));
        };
        // A leading -1 keeps the batch only where the rest holds one sample; otherwise it
        // merges the batch with sample axes (GPT-2's `x.view(-1, x.size(-1))`): a view.
        let s = self.shape(&x)?.clone();
        let sample_fits = Op::Reshape {
            shape: rest.to_vec(),
        }
        .infer(&[&s])
        .is_ok();
        if first == -1 && !sample_fits {
            let (target, _) = self.ints_of(n, 1, "Reshape shape")?;
            if let Ok(v) = View::of(&x, &s).reshape(&target) {
                return self.define_view(n, v);
            }
        }
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
        let op = Op::Reshape {
            shape: rest.to_vec(),
        };
        // A reshape that keeps the sample's shape is the same tensor (GPT-2's
        // `input_ids.view(-1, T)` of a token input stays the token input).
        let s = self.shape(&x)?;
        if op.infer(&[s]).as_ref() == Ok(s) {
            self.define(n, Val::Ir(x));
            return Ok(());
        }
        self.emit(n, op, &[&x])?;
        Ok(())
    }

    /// `Squeeze` and `Unsqueeze` of sample axes, or of a layout view (an `Unsqueeze`
    /// before the batch makes one).
    pub(super) fn squeeze(
        &mut self,
        _i: usize,
        n: &NodeProto,
        a: &Attrs,
    ) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let axes = if Self::has_input(n, 1) {
            Some(self.const_ints(n, 1, "axes")?)
        } else {
            a.ints("axes")
        };
        let on_view = |v: &View| {
            if n.op_type == "Squeeze" {
                v.squeeze(axes.as_deref())
            } else {
                v.unsqueeze(axes.as_deref().unwrap_or_default())
            }
        };
        if let Val::View(v) = self.val(n, 0)? {
            let v = on_view(v).map_err(|e| err(e.to_string()))?;
            return self.define_view(n, v);
        }
        // A learned tensor expanded over the batch keeps its batch axis of 1 first.
        if let Val::Broadcast(t) = self.val(n, 0)?.clone() {
            let sample = positive(&t.dims).unwrap_or_default()[1..].to_vec();
            let dims = match n.op_type.as_str() {
                "Squeeze" => squeeze(&sample, axes.as_deref()),
                _ => unsqueeze(&sample, axes.as_deref()),
            }
            .map_err(|e| err(format!("{} of `{}`: {e}", n.op_type, t.name)))?;
            let mut with_batch = vec![1];
            with_batch.extend(dims);
            let t = Rc::new(TensorProto {
                dims: with_batch,
                ..(*t).clone()
            });
            self.define(n, Val::Broadcast(t));
            return Ok(());
        }
        let x = self.act(n, 0)?;
        let s = self.shape(&x)?.clone();
        let target = match s.all_fixed() {
            None => Err(format!(
                "{} of {s}: the sequence length T is symbolic",
                n.op_type
            )),
            Some(dims) if n.op_type == "Squeeze" => squeeze(&dims, axes.as_deref())
                .map_err(|why| format!("{} of {s}: {why}", n.op_type)),
            Some(dims) => unsqueeze(&dims, axes.as_deref())
                .map_err(|why| format!("{} of {s}: {why}", n.op_type)),
        };
        match target {
            Ok(target) => {
                self.emit(n, Op::Reshape { shape: target }, &[&x])?;
                Ok(())
            }
            Err(why) => match on_view(&View::of(&x, &s)) {
                Ok(v) if !(n.op_type == "Squeeze" && v.dims().len() == s.rank() + 1) => {
                    self.define_view(n, v)
                }
                _ => Err(err(why)),
            },
        }
    }

    /// `Transpose` of a constant, or of an activation (a layout view until an op
    /// computes on it).
    pub(super) fn transpose(
        &mut self,
        _i: usize,
        n: &NodeProto,
        a: &Attrs,
    ) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let v = match self.val(n, 0)?.clone() {
            Val::Const(t) => {
                let rank = t.dims.len();
                let perm = a
                    .ints("perm")
                    .unwrap_or_else(|| (0..rank as i64).rev().collect());
                let t = transpose_const(&t, &perm).map_err(|e| err(e.to_string()))?;
                self.define(n, Val::Const(Rc::new(t)));
                return Ok(());
            }
            Val::View(v) => v,
            _ => {
                let x = self.act(n, 0)?;
                View::of(&x, &self.shape(&x)?.clone())
            }
        };
        let rank = v.groups.len();
        let perm = a
            .ints("perm")
            .unwrap_or_else(|| (0..rank as i64).rev().collect());
        let v = v.transpose(&perm).map_err(|e| err(e.to_string()))?;
        self.define_view(n, v)
    }

    /// `Expand` of an initializer `[1, dims..]` to `[B, dims..]` (`cls_token.expand(B, -1,
    /// -1)`): a learned tensor the same for every sample, for a `Concat` to take.
    pub(super) fn expand(
        &mut self,
        _i: usize,
        n: &NodeProto,
        _a: &Attrs,
    ) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let (target, _) = self.ints_of(n, 1, "Expand shape")?;
        // Repeating over the batch only: each axis of the target is the input's, or the
        // input's is 1 (numpy broadcasting from the right).
        let over_batch = |dims: &[Sym]| {
            let lead = target.len().saturating_sub(dims.len());
            target.first() == Some(&Sym::Batch)
                && target.len() >= dims.len()
                && dims
                    .iter()
                    .zip(&target[lead..])
                    .enumerate()
                    .all(|(k, (d, t))| {
                        d == t || *d == Sym::N(1) || (k + lead == 0 && *t == Sym::Batch)
                    })
        };
        match self.val(n, 0)?.clone() {
            // A computed constant or an integer buffer, the same for every sample (token
            // type ids, a mask): consumers broadcast it over the batch as they would the
            // expanded one. (A float initializer is a learned tensor: below.)
            Val::Const(t)
                if !self.initializers.contains(&n.input[0]) || is_int_type(t.data_type) =>
            {
                let dims: Vec<Sym> = t.dims.iter().map(|&d| Sym::N(d)).collect();
                // A target entry of 1 keeps the axis (ConViT's `rel_indices.expand(B, -1,
                // -1, -1)` is written `[B, 1, 1, 1]`).
                let batch_only = dims.first() == Some(&Sym::N(1))
                    && dims.len() == target.len()
                    && dims[1..]
                        .iter()
                        .zip(&target[1..])
                        .all(|(d, t)| d == t || *t == Sym::N(1));
                if batch_only {
                    self.define(n, Val::Const(t));
                    return Ok(());
                }
            }
            // An activation expanded before a broadcasting op (`x * gate.expand_as(x)`):
            // PyTorch's expand is a view, the op broadcasts the same values.
            Val::Ir(x) => {
                let s = self.shape(&x)?;
                let mut dims = vec![Sym::Batch];
                dims.extend(s.0.iter().map(|d| match d {
                    Dim::Fixed(k) => Sym::N(*k as i64),
                    Dim::Seq => Sym::Seq,
                }));
                let broadcasting = self.feeds_broadcast_only(n);
                if self.wrap.is_none() && over_batch(&dims) && (dims == target || broadcasting) {
                    self.define(n, Val::Ir(x));
                    return Ok(());
                }
                return self.expand_activation(n, &x);
            }
            // The same on a layout view (`F.normalize`'s norm expanded to the windows'
            // keys): the target only repeats axes of size 1 the broadcasting op repeats.
            Val::View(v) if self.feeds_broadcast_only(n) => {
                let dims = v.dims();
                if dims.len() == target.len()
                    && dims
                        .iter()
                        .zip(&target)
                        .all(|(d, t)| d == t || *d == Sym::N(1))
                {
                    self.define(n, Val::View(v));
                    return Ok(());
                }
            }
            _ => {}
        }
        let t = match self.val(n, 0)? {
            Val::Const(t) if self.initializers.contains(&n.input[0]) => t.clone(),
            _ => {
                return Err(err(format!(
                    "Expand of `{}` to {target:?}: only an initializer [1, ...] repeated over \
                     the batch (a class token) is supported",
                    n.input[0]
                )));
            }
        };
        // Expand broadcasts both ways (numpy): the initializer's dims, padded with leading
        // ones to the target's rank (`cls.expand(B, -1)` of a `[C]` token is [B, C]).
        let mut dims = positive(&t.dims).unwrap_or_default();
        if dims.len() < target.len() {
            let mut padded = vec![1; target.len() - dims.len()];
            padded.extend(&dims);
            dims = padded;
        }
        let fits = dims.len() == target.len()
            && dims.first() == Some(&1)
            && target.first() == Some(&Sym::Batch)
            && dims
                .iter()
                .zip(&target)
                .skip(1)
                .all(|(&d, s)| *s == Sym::N(1) || *s == Sym::N(d as i64));
        let t = match fits && dims.len() != t.dims.len() {
            true => Rc::new(TensorProto {
                dims: dims.iter().map(|&d| d as i64).collect(),
                ..(*t).clone()
            }),
            false => t,
        };
        if !fits {
            return Err(err(format!(
                "Expand of initializer `{}` {:?} to {}: only repeating it over the batch \
                 is supported",
                n.input[0],
                t.dims,
                target
                    .iter()
                    .map(Sym::to_string)
                    .collect::<Vec<_>>()
                    .join(" x ")
            )));
        }
        self.define(n, Val::Broadcast(t));
        Ok(())
    }

    /// Whether every consumer of `n`'s output broadcasts its operands (an `Expand` before
    /// it changes no value).
    fn feeds_broadcast_only(&self, n: &NodeProto) -> bool {
        let out = n.output.first().map_or("", String::as_str);
        self.consumers.get(out).is_some_and(|uses| {
            uses.iter().all(|&(node, _)| {
                matches!(
                    self.nodes[node].op_type.as_str(),
                    "Mul" | "Add" | "Sub" | "Div"
                )
            })
        })
    }

    /// How many trailing axes of its input an `Expand` repeats (for
    /// [`Importer::axes_touched`]): from the first whose target is not 1 to the last.
    pub(super) fn expand_touched(&self, n: &NodeProto) -> Option<usize> {
        let Val::View(v) = self.vals.get(n.input.first()?.as_str())? else {
            return None;
        };
        let rank = v.groups.len();
        let (target, _) = self.ints_of(n, 1, "Expand shape").ok()?;
        let lead = rank.checked_sub(target.len())?;
        Some(
            target
                .iter()
                .position(|t| *t != Sym::N(1))
                .map_or(0, |first| rank - lead - first),
        )
    }

    /// `Expand` of activation `x` (batch-first, or aligned to a layout view whose axes
    /// the target names): each sample repeated along its axes of size 1. The target's
    /// entries for the batch's axis and any before it must keep their size (1, or the
    /// batch itself).
    fn expand_activation(&mut self, n: &NodeProto, x: &str) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let (target, _) = self.ints_of(n, 1, "Expand shape")?;
        let sample = self.shape(x)?.clone();
        let (rank, batch_axis) = match self.wrap {
            Some(lay) => (lay.rank, lay.b_axis),
            None => (sample.rank() + 1, 0),
        };
        if target.len() > rank {
            return Err(err(format!(
                "Expand to {target:?}: more axes than its input's {rank} (new leading axes \
                 would come before the batch)"
            )));
        }
        // The target's entry for each of the input's axes, from the right.
        let lead = rank - target.len();
        let entry = |axis: usize| axis.checked_sub(lead).map_or(Sym::N(1), |k| target[k]);
        if let Some(a) = (0..=batch_axis).find(|&a| !matches!(entry(a), Sym::N(1) | Sym::Batch)) {
            return Err(err(format!(
                "Expand to {target:?} repeats axis {a}, the batch's or one before it"
            )));
        }
        let mut shape = vec![1usize; sample.rank()];
        let trailing = rank - 1 - batch_axis;
        for (j, slot) in shape.iter_mut().rev().take(trailing).enumerate() {
            *slot = match entry(rank - 1 - j) {
                Sym::N(k) if k >= 1 => k as usize,
                other => {
                    return Err(err(format!(
                        "Expand to {target:?}: entry {other} is not a size"
                    )));
                }
            };
        }
        self.emit(n, Op::Expand { shape }, &[x])?;
        Ok(())
    }

    /// `Concat` of tensors seen through one layout view (CrossViT stacks its branches'
    /// logits before the batch, `[2, B, classes]`), along an axis other than the batch's:
    /// the tensors aligned to the view, concatenated on the matching sample axis, and the
    /// result seen through the same layout.
    fn concat_views(&mut self, n: &NodeProto, a: &Attrs) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let mut xs = Vec::with_capacity(n.input.len());
        let mut lay: Option<Lay> = None;
        for (p, name) in n.input.iter().enumerate() {
            let Val::View(v) = self.val(n, p)?.clone() else {
                return Err(err(format!(
                    "Concat of `{name}` with a tensor whose batch moved or merged: only \
                     tensors seen through one layout are concatenated"
                )));
            };
            let (x, l) = self.align(n, &v)?;
            if lay.is_some_and(|q| q != l) {
                return Err(err(format!(
                    "Concat of `{name}` {} with tensors whose batch sits elsewhere",
                    v.describe()
                )));
            }
            lay = Some(l);
            xs.push(x);
        }
        let lay = lay.ok_or_else(|| err("Concat of nothing".into()))?;
        let axis = a
            .get("axis")
            .map(|v| v.i)
            .ok_or_else(|| err("Concat needs an axis".into()))?;
        let k = if axis < 0 {
            axis + lay.rank as i64
        } else {
            axis
        };
        if !(0..lay.rank as i64).contains(&k) || k as usize == lay.b_axis {
            return Err(err(format!(
                "Concat along axis {axis} of a layout whose batch is axis {}: only along \
                 another axis",
                lay.b_axis
            )));
        }
        let k = k as usize;
        // The aligned sample has the view's axes in order, less the batch's where the
        // batch is alone.
        let sample_axis = if lay.b_alone && k > lay.b_axis {
            k - 1
        } else {
            k
        };
        let refs: Vec<&str> = xs.iter().map(String::as_str).collect();
        self.wrap = Some(lay);
        let done = self.emit(
            n,
            Op::Concat {
                axis: sample_axis as i64 + 1,
            },
            &refs,
        );
        self.wrap = None;
        done.map(|_| ())
    }

    /// `Pad` in constant mode with its value (`F.pad`): the pads of the sample axes (the
    /// batch's, and any before it in a layout view, must be 0).
    pub(super) fn pad(&mut self, _i: usize, n: &NodeProto, a: &Attrs) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let x = self.act(n, 0)?;
        let sample_rank = self.shape(&x)?.rank();
        // On a tensor aligned to a layout view the pads name the view's axes; the
        // padded ones trail the batch's and are the aligned tensor's last axes.
        let (rank, batch_axis) = match self.wrap {
            Some(lay) => (lay.rank, lay.b_axis),
            None => (sample_rank + 1, 0),
        };
        let mode = a.string("mode").unwrap_or_else(|| "constant".into());
        if mode != "constant" {
            return Err(err(format!("Pad in mode `{mode}`: only constant padding")));
        }
        let value = match Self::has_input(n, 2) && !self.is_empty_const(n, 2) {
            true => self.const_scalar(n, 2, "Pad constant_value")?,
            false => f64::from(a.float("value", 0.0)),
        };
        // -inf is what `pad_same` pads before a max pool.
        if value.is_nan() {
            return Err(err("Pad with NaN".into()));
        }
        let per_axis = self.pads_per_axis(n, a, rank)?;
        let pads = &per_axis;
        if per_axis[..=batch_axis].iter().any(|p| *p != [0, 0]) {
            return Err(err(format!(
                "Pad of {pads:?} pads the batch axis or an axis before it"
            )));
        }
        if per_axis.iter().all(|p| *p == [0, 0]) {
            self.define(n, Val::Ir(x));
            return Ok(());
        }
        // The axes after the batch's, as the sample's last axes.
        let mut sample = vec![[0usize; 2]; sample_rank];
        for (to, from) in sample.iter_mut().rev().zip(per_axis.iter().rev()) {
            *to = *from;
        }
        let op = Op::Pad {
            pads: sample,
            value: value as f32,
        };
        self.emit(n, op, &[&x])?;
        Ok(())
    }

    /// How many trailing axes of its input a `Pad` pads (for [`Importer::axes_touched`]):
    /// from the first padded axis to the last.
    pub(super) fn pad_touched(&self, n: &NodeProto, a: &Attrs) -> Option<usize> {
        let rank = match self.vals.get(n.input.first()?.as_str())? {
            Val::View(v) => v.groups.len(),
            Val::Ir(x) => self.shape(x).ok()?.rank() + 1,
            _ => return None,
        };
        let per_axis = self.pads_per_axis(n, a, rank).ok()?;
        Some(
            per_axis
                .iter()
                .position(|p| *p != [0, 0])
                .map_or(0, |first| rank - first),
        )
    }

    /// `Pad`'s (before, after) per axis of an input of `rank` axes, from the `pads`
    /// input (opset 11+, a constant or computed from shapes and folded) or
    /// attribute, for every axis or the `axes` given.
    fn pads_per_axis(
        &self,
        n: &NodeProto,
        a: &Attrs,
        rank: usize,
    ) -> Result<Vec<[usize; 2]>, GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        // Numbers from a constant or a shape value (swin's pads computed from sizes).
        let numbers = |pos: usize, what: &str| -> Result<Vec<i64>, GraphError> {
            let (v, _) = self.ints_of(n, pos, what)?;
            v.into_iter()
                .map(|s| match s {
                    Sym::N(k) => Ok(k),
                    other => Err(err(format!("{what} holds {other}: only numbers"))),
                })
                .collect()
        };
        let pads = match Self::has_input(n, 1) {
            true => numbers(1, "Pad pads")?,
            false => a.ints("pads").ok_or_else(|| err("Pad needs pads".into()))?,
        };
        let axes: Vec<usize> = match Self::has_input(n, 3) {
            true => numbers(3, "Pad axes")?
                .iter()
                .map(|&k| (if k < 0 { k + rank as i64 } else { k }) as usize)
                .collect(),
            false => (0..rank).collect(),
        };
        let k = axes.len();
        if pads.len() != 2 * k || axes.iter().any(|&ax| ax >= rank) {
            return Err(err(format!(
                "Pad of {pads:?} over axes {axes:?} of rank {rank}"
            )));
        }
        let mut per_axis = vec![[0usize; 2]; rank];
        for (j, &ax) in axes.iter().enumerate() {
            let (lo, hi) = (pads[j], pads[j + k]);
            if lo < 0 || hi < 0 {
                return Err(err(format!(
                    "Pad of {pads:?}: negative pads crop, not supported"
                )));
            }
            per_axis[ax] = [lo as usize, hi as usize];
        }
        Ok(per_axis)
    }

    /// `Concat` of activations, or of an activation and a learned tensor expanded over
    /// the batch (a class token).
    pub(super) fn concat(&mut self, _i: usize, n: &NodeProto, a: &Attrs) -> Result<(), GraphError> {
        // Inputs of no elements add nothing.
        let empty = |v: Option<&Val>| matches!(v, Some(Val::Empty(_)));
        let kept;
        let n = if n.input.iter().any(|x| empty(self.vals.get(x.as_str()))) {
            let mut k = n.clone();
            k.input.retain(|x| !empty(self.vals.get(x.as_str())));
            if k.input.is_empty() {
                return Err(GraphError::node(
                    label(n),
                    "Concat of slices of no elements",
                ));
            }
            kept = k;
            &kept
        } else {
            n
        };
        let err = |why: String| GraphError::node(label(n), why);
        if n.input
            .iter()
            .any(|x| matches!(self.vals.get(x.as_str()), Some(Val::View(_))))
        {
            return self.concat_views(n, a);
        }
        let learned: Vec<usize> = (0..n.input.len())
            .filter(|&p| matches!(self.vals.get(n.input[p].as_str()), Some(Val::Broadcast(_))))
            .collect();
        if !learned.is_empty() {
            return self.concat_learned(n, a, &learned);
        }
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
        Ok(())
    }
}

impl Importer {
    /// `Concat` of one activation with initializers expanded over the batch before
    /// and after it (ViT's class token; a class token and register tokens, DeiT's
    /// class and distillation tokens): each run of learned tensors is one
    /// [`Op::ConcatParam`], its tensors joined along the axis (one parameter of
    /// their summed size, as PyTorch counts them).
    fn concat_learned(
        &mut self,
        n: &NodeProto,
        a: &Attrs,
        learned: &[usize],
    ) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let acts: Vec<usize> = (0..n.input.len())
            .filter(|p| !learned.contains(p))
            .collect();
        let [at] = acts[..] else {
            return Err(err(format!(
                "Concat of {} initializers expanded over the batch with {} activations: \
                 only with one activation is supported",
                learned.len(),
                acts.len()
            )));
        };
        let axis = a
            .get("axis")
            .map(|v| v.i)
            .ok_or_else(|| err("Concat needs an axis".into()))?;
        let mut x = self.act(n, at)?;
        let runs = [(0..at, true), (at + 1..n.input.len(), false)];
        let last_run = if at + 1 < n.input.len() { 1 } else { 0 };
        for (k, (run, first)) in runs.into_iter().enumerate() {
            if run.is_empty() {
                continue;
            }
            let tensors: Vec<Rc<TensorProto>> = run
                .map(|p| match self.vals.get(n.input[p].as_str()) {
                    Some(Val::Broadcast(t)) => t.clone(),
                    _ => unreachable!("the inputs but one are learned"),
                })
                .collect();
            let (dims, values) = join_learned(&tensors, axis).map_err(err)?;
            let op = Op::ConcatParam {
                axis,
                shape: dims[1..].to_vec(),
                first,
            };
            let name = if k == last_run {
                self.emit(n, op, &[&x])?
            } else {
                let name = self.fresh(n);
                self.b.push(&name, op, &[&x])?;
                name
            };
            self.attach(&name, vec![values]);
            x = name;
        }
        Ok(())
    }
}

/// Initializers `[1, dims..]` joined along ONNX axis `axis`: their dims and values
/// (`None` where one has no float values).
fn join_learned(
    tensors: &[Rc<TensorProto>],
    axis: i64,
) -> Result<(Vec<usize>, Option<Vec<f32>>), String> {
    let dims: Vec<Vec<usize>> = tensors
        .iter()
        .map(|t| positive(&t.dims).unwrap_or_default())
        .collect();
    let rank = dims[0].len();
    let ax = if axis < 0 { axis + rank as i64 } else { axis };
    let ax = usize::try_from(ax)
        .ok()
        .filter(|&k| (1..rank).contains(&k))
        .ok_or_else(|| format!("Concat axis {axis} of learned tensors of rank {rank}"))?;
    for (t, d) in tensors.iter().zip(&dims) {
        let mismatched = d.len() != rank || (0..rank).any(|k| k != ax && d[k] != dims[0][k]);
        if mismatched {
            return Err(format!(
                "initializer `{}` {:?} does not join {:?} along axis {axis}",
                t.name, t.dims, tensors[0].dims
            ));
        }
    }
    let mut out = dims[0].clone();
    out[ax] = dims.iter().map(|d| d[ax]).sum();
    let values: Option<Vec<Vec<f32>>> = tensors.iter().map(|t| tensor_f32(t)).collect();
    let values = values.map(|vs| {
        let outer: usize = out[..ax].iter().product();
        let mut joined = Vec::with_capacity(vs.iter().map(Vec::len).sum());
        for o in 0..outer {
            for (v, d) in vs.iter().zip(&dims) {
                let chunk: usize = d[ax..].iter().product();
                joined.extend_from_slice(&v[o * chunk..(o + 1) * chunk]);
            }
        }
        joined
    });
    Ok((out, values))
}

/// A constant with its axes permuted (old exports transpose weights in the graph).
/// The values of a `float`/`double` tensor move with its axes (as `float`, the
/// trained weights' type); those of other types of rank 2 or more are dropped,
/// as no op reads them as attributes.
pub(super) fn transpose_const(t: &TensorProto, perm: &[i64]) -> Result<TensorProto, LayoutError> {
    let rank = t.dims.len();
    let order = permutation(perm, rank)?;
    let dims: Vec<i64> = order.iter().map(|&p| t.dims[p]).collect();
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
