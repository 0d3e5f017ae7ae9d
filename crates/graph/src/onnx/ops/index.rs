//! Indexing and reductions of activations: `Slice`, `Split`, `Gather` with constant
//! indices (`y[:, -1]`, a CLS token) and `ReduceSum`/`ReduceMean`/`ReduceMax`.

use crate::error::GraphError;
use crate::onnx::decode::{Attrs, is_int_type, tensor_ints};
use crate::onnx::import::{Importer, label};
use crate::onnx::proto::NodeProto;
use crate::onnx::sym::Sym;
use crate::onnx::view::{Lay, Val, View};
use crate::op::{Op, ReduceKind, sample_axis};
use crate::shape::Dim;

impl Importer {
    /// `Slice` of an activation: one IR slice per sliced axis, a positive step through a
    /// reshape that splits the axis.
    pub(super) fn slice(&mut self, _i: usize, n: &NodeProto, a: &Attrs) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let list = |pos: usize, attr: &str| -> Result<Option<Vec<i64>>, GraphError> {
            if Self::has_input(n, pos) {
                let (v, _) = self.ints_of(n, pos, &format!("Slice {attr}"))?;
                v.into_iter()
                    .map(|s| match s {
                        Sym::N(k) => Ok(k),
                        _ => Err(err(format!(
                            "Slice {attr} computed from the symbolic batch or sequence length"
                        ))),
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map(Some)
            } else {
                Ok(a.ints(attr))
            }
        };
        let starts = list(1, "starts")?.ok_or_else(|| err("Slice needs starts".into()))?;
        let ends = list(2, "ends")?.ok_or_else(|| err("Slice needs ends".into()))?;
        let axes = list(3, "axes")?.unwrap_or_else(|| (0..starts.len() as i64).collect());
        let steps = list(4, "steps")?.unwrap_or_else(|| vec![1; starts.len()]);
        if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
            return Err(err(
                "Slice starts, ends, axes and steps differ in length".into()
            ));
        }
        self.align_unindexable(n, &axes)?;
        if let Val::View(v) = self.val(n, 0)?.clone() {
            let ([start], [end], [axis], [1]) = (&starts[..], &ends[..], &axes[..], &steps[..])
            else {
                return Err(err(format!(
                    "Slice of {} (the batch moved or merged): only one axis with step 1 \
                     is supported",
                    v.describe()
                )));
            };
            return self.index_view(n, v, *axis, (*start, *end), false);
        }
        let x = self.act(n, 0)?;
        let shape = self.shape(&x)?.clone();
        let mut dims: Vec<Dim> = shape.0.clone();
        let mut ops = Vec::new();
        for k in 0..starts.len() {
            let a = sample_axis(&shape, axes[k]).map_err(|e| err(format!("Slice: {e}")))?;
            let Dim::Fixed(d) = dims[a] else {
                return Err(err(format!(
                    "Slice of the symbolic sequence axis of {shape} is not supported"
                )));
            };
            let step = steps[k];
            if step < 1 {
                return Err(err(format!(
                    "Slice with step {step} on axis {}: only positive steps are supported",
                    axes[k]
                )));
            }
            // ONNX clamps starts and ends into [0, d] after counting negatives from the end.
            let clamp = |i: i64| (if i < 0 { i + d as i64 } else { i }).clamp(0, d as i64) as usize;
            let (start, end) = (clamp(starts[k]), clamp(ends[k]));
            let step = step as usize;
            let count = end.saturating_sub(start).div_ceil(step);
            if count == 0 {
                let what = format!(
                    "a slice of no elements ({start}..{end} of axis {})",
                    axes[k]
                );
                self.define(n, Val::Empty(what));
                return Ok(());
            }
            let axis = a as i64 + 1;
            if step == 1 {
                if (start, end) != (0, d) {
                    ops.push(Op::Slice { axis, start, end });
                }
            } else {
                // Every step-th element as plain ops: the axis split into [d / step, step],
                // one inner index, a run of outer ones, the axis merged back (Swin's patch
                // merging, `x[:, 0::2, 1::2]`).
                let fixed = dims
                    .iter()
                    .map(|d| d.fixed().map(|v| v as i64))
                    .collect::<Option<Vec<i64>>>();
                let (Some(fixed), 0) = (fixed, d % step) else {
                    return Err(err(format!(
                        "Slice with step {step} of an axis of {d}: only a step that divides \
                         the axis of a tensor without a symbolic length is supported"
                    )));
                };
                let mut split = fixed.clone();
                split.splice(a..=a, [(d / step) as i64, step as i64]);
                let mut merged = fixed;
                merged[a] = count as i64;
                let first = start / step;
                ops.push(Op::Reshape { shape: split });
                ops.push(Op::Slice {
                    axis: axis + 1,
                    start: start % step,
                    end: start % step + 1,
                });
                if (first, first + count) != (0, d / step) {
                    ops.push(Op::Slice {
                        axis,
                        start: first,
                        end: first + count,
                    });
                }
                ops.push(Op::Reshape { shape: merged });
            }
            dims[a] = Dim::Fixed(count);
        }
        self.emit_chain(n, x, ops)
    }

    /// Input 0 of `n` as the batch-first IR tensor when it is a layout view with the
    /// batch first whose `axes` are not each one atom of the view (channels merged from a
    /// transpose, ShuffleNet's channel shuffle): the view is materialised and indexed as
    /// a plain tensor.
    fn align_unindexable(&mut self, n: &NodeProto, axes: &[i64]) -> Result<(), GraphError> {
        let Some(name) = n.input.first() else {
            return Ok(());
        };
        let Some(Val::View(v)) = self.vals.get(name.as_str()).cloned() else {
            return Ok(());
        };
        if v.batch_first() && axes.iter().any(|&a| v.index_atom(a, "Slice").is_err()) {
            let (x, _) = self.align(n, &v)?;
            self.vals.insert(name.clone(), Val::Ir(x));
        }
        Ok(())
    }

    /// `Split` of an activation (or of a layout view) along one axis: one `Slice` per
    /// output, of the sizes the `split` input (or attribute) gives, else of `num_outputs`
    /// (opset 18) or the output count equal parts (the last one smaller where the axis does
    /// not divide, as the spec says).
    pub(super) fn split(&mut self, _i: usize, n: &NodeProto, a: &Attrs) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let axis = a.int("axis", 0);
        self.align_unindexable(n, &[axis])?;
        let view = match self.val(n, 0)? {
            Val::View(v) => Some(v.clone()),
            _ => None,
        };
        let len = match &view {
            Some(v) => {
                let atom = v
                    .index_atom(axis, "Split")
                    .map_err(|e| err(e.to_string()))?;
                match v.atoms[atom] {
                    Sym::N(d) => d as usize,
                    _ => unreachable!("index_atom returns fixed atoms"),
                }
            }
            None => {
                let x = self.act(n, 0)?;
                let shape = self.shape(&x)?;
                let ax = sample_axis(shape, axis).map_err(|e| err(format!("Split: {e}")))?;
                match shape.0[ax] {
                    Dim::Fixed(d) => d,
                    Dim::Seq => {
                        return Err(err(format!(
                            "Split of the symbolic sequence axis of {shape} is not supported"
                        )));
                    }
                }
            }
        };
        let sizes: Vec<i64> = if Self::has_input(n, 1) {
            self.const_ints(n, 1, "Split split")?
        } else if let Some(s) = a.ints("split") {
            s
        } else {
            let parts = a.int("num_outputs", n.output.len() as i64).max(1) as usize;
            let chunk = len.div_ceil(parts);
            (0..parts)
                .map(|k| chunk.min(len.saturating_sub(k * chunk)) as i64)
                .collect()
        };
        if sizes.len() != n.output.len()
            || sizes.iter().any(|&s| s < 0)
            || sizes.iter().sum::<i64>() != len as i64
        {
            return Err(err(format!(
                "Split of an axis of {len} into {sizes:?} for {} outputs: the sizes must \
                 cover the axis, one per output",
                n.output.len()
            )));
        }
        let mut start = 0i64;
        for (k, out) in n.output.iter().enumerate() {
            let end = start + sizes[k];
            if !out.is_empty() {
                // Each output is the Slice of its part.
                let part = NodeProto {
                    output: vec![out.clone()],
                    ..n.clone()
                };
                match &view {
                    Some(v) => self.index_view(&part, v.clone(), axis, (start, end), false)?,
                    None => {
                        let x = self.act(n, 0)?;
                        let ax = sample_axis(self.shape(&x)?, axis)
                            .map_err(|e| err(format!("Split: {e}")))?;
                        let full = (start, end) == (0, len as i64);
                        let slices = match full {
                            true => vec![],
                            false => vec![(ax as i64 + 1, start as usize, end as usize)],
                        };
                        self.chain(&part, x, slices)?;
                    }
                }
            }
            start = end;
        }
        Ok(())
    }

    /// `Gather` of an activation at constant indices along a sample axis: a slice
    /// (the indices must be consecutive), then a reshape for a scalar index.
    pub(super) fn gather_activation(&mut self, n: &NodeProto, a: &Attrs) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        self.align_unindexable(n, &[a.int("axis", 0)])?;
        if let Val::View(v) = self.val(n, 0)?.clone() {
            let (idx, scalar) = self.ints_of(n, 1, "Gather indices")?;
            let ([Sym::N(i)], true) = (&idx[..], scalar) else {
                return Err(err(format!(
                    "Gather of {} (the batch moved or merged): only one constant index is \
                     supported",
                    v.describe()
                )));
            };
            return self.index_view(n, v, a.int("axis", 0), (*i, *i + 1), true);
        }
        let x = self.act(n, 0)?;
        let shape = self.shape(&x)?.clone();
        let axis = a.int("axis", 0);
        let ax = sample_axis(&shape, axis).map_err(|e| {
            err(format!(
                "Gather of an activation along axis {axis}: {e}; only indexing a sample axis \
                 at constant indices is supported"
            ))
        })?;
        let Dim::Fixed(d) = shape.0[ax] else {
            return Err(err(format!(
                "Gather along the symbolic sequence axis of {shape} is not supported"
            )));
        };
        // Indices of any rank (`F.unfold`'s sliding windows, exported as a `Gather` at
        // a 2-d table of positions): the axis read at them, then their shape in its place.
        let (idx, index_dims) = match self.val(n, 1)? {
            Val::Const(t) if t.dims.len() > 1 && is_int_type(t.data_type) => {
                let v = tensor_ints(t).map_err(|why| err(format!("Gather indices: {why}")))?;
                (v.into_iter().map(Sym::N).collect(), Some(t.dims.clone()))
            }
            _ => (self.ints_of(n, 1, "Gather indices")?.0, None),
        };
        let scalar = index_dims.is_none() && self.ints_of(n, 1, "Gather indices")?.1;
        let idx = idx
            .iter()
            .map(|i| match i {
                Sym::N(i) if (-(d as i64)..d as i64).contains(i) => {
                    Ok(((i + d as i64) % d as i64) as usize)
                }
                other => Err(err(format!("Gather index {other:?} out of an axis of {d}"))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let run = idx.windows(2).all(|w| w[1] == w[0] + 1);
        let (Some(&start), true) = (idx.first(), run && index_dims.is_none()) else {
            let Some(mut dims) = shape.all_fixed() else {
                return Err(err(format!(
                    "Gather at a table of indices of {shape}: the sequence length T is symbolic"
                )));
            };
            let take = Op::Take {
                axis: ax as i64 + 1,
                indices: idx.clone(),
            };
            let mut ops = vec![take];
            if let Some(index_dims) = index_dims {
                dims.splice(ax..=ax, index_dims.iter().map(|&k| k as usize));
                ops.push(Op::Reshape {
                    shape: dims.into_iter().map(|d| d as i64).collect(),
                });
            }
            return self.emit_chain(n, x, ops);
        };
        let end = start + idx.len();
        let mut ops = Vec::new();
        if (start, end) != (0, d) {
            ops.push(Op::Slice {
                axis: ax as i64 + 1,
                start,
                end,
            });
        }
        if scalar {
            let Some(mut dims) = shape.all_fixed() else {
                return Err(err(format!(
                    "Gather dropping an axis of {shape}: the sequence length T is symbolic"
                )));
            };
            dims.remove(ax);
            ops.push(Op::Reshape {
                shape: dims.into_iter().map(|d| d as i64).collect(),
            });
        }
        self.emit_chain(n, x, ops)
    }

    /// `ReduceSum`, `ReduceMean` and `ReduceMax` over sample axes.
    pub(super) fn reduce(&mut self, _i: usize, n: &NodeProto, a: &Attrs) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        // Of a layout view: on the tensor aligned to it, its axes renumbered, and the
        // result seen through the layout less the reduced axes.
        let view = match self.val(n, 0)?.clone() {
            Val::View(v) => Some(v),
            _ => None,
        };
        let (x, lay) = match &view {
            Some(v) => {
                let (x, lay) = self.align(n, v)?;
                (x, Some(lay))
            }
            None => (self.act(n, 0)?, None),
        };
        // Axes are an input from opset 18 (13 for ReduceSum), an attribute before.
        let axes = if Self::has_input(n, 1) {
            Some(self.const_ints(n, 1, "axes")?)
        } else {
            a.ints("axes")
        };
        let rank = match lay {
            Some(l) => l.rank as i64,
            None => self.shape(&x)?.rank() as i64 + 1,
        };
        let keep_dims = a.int("keepdims", 1) != 0;
        let axes = match axes {
            Some(v) if !v.is_empty() => v,
            _ if a.int("noop_with_empty_axes", 0) != 0 => {
                self.define(n, Val::Ir(x));
                return Ok(());
            }
            _ => (0..rank).collect(),
        };
        let b_axis = lay.map_or(0, |l| l.b_axis) as i64;
        let normal: Vec<i64> = axes
            .iter()
            .map(|&k| if k < 0 { k + rank } else { k })
            .collect();
        if normal
            .iter()
            .any(|&k| k == b_axis || !(0..rank).contains(&k))
        {
            return Err(err(format!(
                "{} over axes {axes:?} reduces the batch axis; only sample axes are supported",
                n.op_type
            )));
        }
        let (axes, wrap) = match lay {
            None => (axes, None),
            Some(l) => {
                // The aligned tensor's axes: the view's, the batch pulled out first.
                let ir_axis = |k: i64| if l.b_alone && k > b_axis { k } else { k + 1 };
                let before = normal.iter().filter(|&&k| k < b_axis).count();
                let out = Lay {
                    rank: if keep_dims {
                        l.rank
                    } else {
                        l.rank - normal.len()
                    },
                    b_axis: if keep_dims {
                        l.b_axis
                    } else {
                        l.b_axis - before
                    },
                    ..l
                };
                (normal.iter().map(|&k| ir_axis(k)).collect(), Some(out))
            }
        };
        let reduce = match n.op_type.as_str() {
            "ReduceSum" => ReduceKind::Sum,
            "ReduceMean" => ReduceKind::Mean,
            "ReduceL2" => ReduceKind::L2,
            _ => ReduceKind::Max,
        };
        let op = Op::Reduce {
            reduce,
            axes,
            keep_dims,
        };
        self.wrap = wrap;
        let done = self.emit(n, op, &[&x]);
        self.wrap = None;
        done.map(|_| ())
    }

    /// Elements `start..end` (ONNX `Slice` bounds) of axis `axis` of layout view `v`;
    /// `drop` removes the axis (`Gather` of one index).
    fn index_view(
        &mut self,
        n: &NodeProto,
        v: View,
        axis: i64,
        (start, end): (i64, i64),
        drop: bool,
    ) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let what = if drop { "Gather" } else { "Slice" };
        let (atom, start, end, d) = match drop {
            true => {
                let atom = v.index_atom(axis, what).map_err(|e| err(e.to_string()))?;
                let Sym::N(d) = v.atoms[atom] else {
                    unreachable!("index_atom returns fixed atoms")
                };
                let clamp = |i: i64| (if i < 0 { i + d } else { i }).clamp(0, d) as usize;
                (atom, clamp(start), clamp(end), d as usize)
            }
            false => {
                let (atom, s, e, _) = v
                    .index_range(axis, (start, end), what)
                    .map_err(|e| err(e.to_string()))?;
                let Sym::N(d) = v.atoms[atom] else {
                    unreachable!("index_range returns fixed atoms")
                };
                (atom, s, e, d as usize)
            }
        };
        if start >= end && !drop {
            let what = format!("a slice of no elements ({start}..{end} of axis {axis})");
            self.define(n, Val::Empty(what));
            return Ok(());
        }
        if start >= end || (drop && end - start != 1) {
            return Err(err(format!(
                "{what} of elements {start}..{end} of an axis of {d} of {}",
                v.describe()
            )));
        }
        let mut x = v.ir.clone();
        let split = v
            .split_dims(self.shape(&x)?)
            .map_err(|e| err(e.to_string()))?;
        if let Some(shape) = split {
            let name = self.fresh(n);
            x = self.b.push(&name, Op::Reshape { shape }, &[&x])?;
        }
        if (start, end) != (0, d) {
            let name = self.fresh(n);
            let op = Op::Slice {
                axis: atom as i64,
                start,
                end,
            };
            x = self.b.push(&name, op, &[&x])?;
        }
        let v = v.sliced(x, atom, end - start, axis, drop);
        self.define_view(n, v)
    }

    /// Slices `(axis, start, end)` of `x` one after another, the last one as `n`'s output.
    fn chain(
        &mut self,
        n: &NodeProto,
        x: String,
        slices: Vec<(i64, usize, usize)>,
    ) -> Result<(), GraphError> {
        let ops = slices
            .into_iter()
            .map(|(axis, start, end)| Op::Slice { axis, start, end })
            .collect();
        self.emit_chain(n, x, ops)
    }

    /// `ops` applied to `x` one after another, the last one as `n`'s output (`x` itself when
    /// there are none).
    pub(super) fn emit_chain(
        &mut self,
        n: &NodeProto,
        x: String,
        ops: Vec<Op>,
    ) -> Result<(), GraphError> {
        let mut acc = x;
        let count = ops.len();
        for (k, op) in ops.into_iter().enumerate() {
            if k + 1 == count {
                self.emit(n, op, &[&acc])?;
                return Ok(());
            }
            let name = self.fresh(n);
            acc = self.b.push(&name, op, &[&acc])?;
        }
        self.define(n, Val::Ir(acc));
        Ok(())
    }
}
