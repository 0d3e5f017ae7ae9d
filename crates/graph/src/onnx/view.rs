//! Layout views: how ONNX sees the batch-first IR tensors when a graph moves
//! the batch away from axis 0 or merges it with another axis (the `[T, B, F]`
//! around LSTMs and attention, attention's `[B·heads, T, d]`).
//!
//! A [`View`] splits the IR tensor's axes into *atoms* (in memory order; atom 0
//! is the batch), permutes them and groups consecutive ones into the ONNX axes.
//! `Transpose`, `Reshape`, `Squeeze`/`Unsqueeze` and `Shape` work on the view
//! alone; an op that computes either reads it back batch-first (one IR
//! `Transpose` between free reshapes) or, when it acts on axes away from the
//! batch, runs on the IR tensor aligned to the ONNX axes with the batch pulled
//! out ([`Align`]), and its output is seen through the same layout again.

use super::proto::TensorProto;
use super::sym::Sym;
use crate::shape::{Dim, Shape};
use std::rc::Rc;

/// Why a layout view or a constant cannot be rearranged as asked.
#[derive(Debug, thiserror::Error)]
pub(super) enum LayoutError {
    #[error("perm {perm:?} is not a permutation of {rank} axes")]
    NotPermutation { perm: Vec<i64>, rank: usize },
    #[error("Squeeze of axis {axis} of {layout}: it does not have size 1")]
    Squeeze { axis: i64, layout: String },
    #[error("axis {axis} is out of range for {layout}")]
    Axis { axis: i64, layout: String },
    #[error(
        "Reshape of {layout} to {target}: the new axes are not products of the old ones \
         (the batch cannot be split)"
    )]
    Reshape { layout: String, target: String },
    #[error("the batch is merged into the middle of axis {axis} of {layout}")]
    BatchInMiddle { axis: usize, layout: String },
    #[error("{what} of axis {axis} of {layout}: only an axis of one fixed size can be indexed")]
    Index {
        what: &'static str,
        axis: i64,
        layout: String,
    },
}

/// An IR tensor seen by ONNX with its axes split, permuted and regrouped.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct View {
    pub(super) ir: String,
    /// The IR tensor's axes split into atoms, in memory order; atom 0 is the batch.
    pub(super) atoms: Vec<Sym>,
    /// Atom indices in ONNX order (a permutation of every atom).
    pub(super) order: Vec<usize>,
    /// How many consecutive entries of `order` each ONNX axis takes (0: an axis of size 1).
    pub(super) groups: Vec<usize>,
}

/// Where the batch sits in a layout once the IR tensor is aligned to its axes:
/// ONNX axis `b_axis` of `rank` is the batch alone, or the batch merged before
/// (`b_first`) or after the IR axis at that place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Lay {
    pub(super) rank: usize,
    pub(super) b_axis: usize,
    pub(super) b_alone: bool,
    pub(super) b_first: bool,
}

impl Lay {
    /// The batch axis counted from the end (0: the last axis).
    pub(super) fn b_from_end(&self) -> usize {
        self.rank - 1 - self.b_axis
    }

    /// Axes of the IR tensor aligned to this layout: the ONNX axes, and the
    /// batch as one more where it is merged with another.
    pub(super) fn ir_rank(&self) -> usize {
        self.rank + usize::from(!self.b_alone)
    }
}

/// The IR ops that align an IR tensor to a view's axes: a reshape into the atoms,
/// a transpose of the sample atoms, a reshape into the ONNX axes without the batch.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Align {
    pub(super) split: Option<Vec<i64>>,
    pub(super) perm: Option<Vec<usize>>,
    pub(super) merge: Option<Vec<i64>>,
    pub(super) lay: Lay,
}

/// `dims` as IR reshape targets (the one symbolic sequence length as -1).
fn reshape_dims(dims: &[Sym]) -> Option<Vec<i64>> {
    let seqs = dims.iter().filter(|d| **d != Sym::N(1) && d.parts().1 > 0);
    if seqs.count() > 1 {
        return None;
    }
    dims.iter()
        .map(|d| match d.parts() {
            (0, 0, n) => Some(n),
            (0, 1, 1) => Some(-1),
            _ => None,
        })
        .collect()
}

fn sym_of(d: Dim) -> Sym {
    match d {
        Dim::Seq => Sym::Seq,
        Dim::Fixed(k) => Sym::N(k as i64),
    }
}

impl View {
    /// The plain batch-first view of IR tensor `ir` of sample shape `s`.
    pub(super) fn of(ir: &str, s: &Shape) -> View {
        let mut atoms = vec![Sym::Batch];
        atoms.extend(s.0.iter().map(|&d| sym_of(d)));
        View {
            ir: ir.to_string(),
            order: (0..atoms.len()).collect(),
            groups: vec![1; atoms.len()],
            atoms,
        }
    }

    /// The entries of `order` each ONNX axis takes.
    fn ranges(&self) -> Vec<std::ops::Range<usize>> {
        let mut start = 0;
        self.groups
            .iter()
            .map(|&g| {
                start += g;
                start - g..start
            })
            .collect()
    }

    /// The ONNX dims, symbolic in the batch and the sequence length.
    pub(super) fn dims(&self) -> Vec<Sym> {
        self.ranges()
            .into_iter()
            .map(|r| {
                self.order[r]
                    .iter()
                    .fold(Sym::N(1), |acc, &a| acc.mul(self.atoms[a]))
            })
            .collect()
    }

    /// The axes as ONNX sees them, like `[T, B·4, 16]`.
    pub(super) fn describe(&self) -> String {
        let dims: Vec<String> = self.dims().iter().map(Sym::to_string).collect();
        format!("[{}]", dims.join(", "))
    }

    /// Whether the view is its IR tensor of sample shape `s` unchanged.
    pub(super) fn is_plain(&self, s: &Shape) -> bool {
        let dims = self.dims();
        self.order.iter().copied().eq(0..self.order.len())
            && dims.first() == Some(&Sym::Batch)
            && dims[1..].iter().copied().eq(s.0.iter().map(|&d| sym_of(d)))
    }

    /// Whether the batch is ONNX axis 0, alone (with size-1 atoms at most).
    pub(super) fn batch_first(&self) -> bool {
        self.ranges().first().is_some_and(|r| {
            self.order[r.clone()].contains(&0)
                && self.order[r.clone()]
                    .iter()
                    .all(|&a| a == 0 || self.atoms[a] == Sym::N(1))
        })
    }

    /// Axes permuted: ONNX `Transpose(perm)`.
    pub(super) fn transpose(&self, perm: &[i64]) -> Result<View, LayoutError> {
        let p = permutation(perm, self.groups.len())?;
        let ranges = self.ranges();
        let mut v = self.clone();
        v.order = p
            .iter()
            .flat_map(|&k| self.order[ranges[k].clone()].iter().copied())
            .collect();
        v.groups = p.iter().map(|&k| self.groups[k]).collect();
        Ok(v)
    }

    /// Replaces atom `a` by atoms of sizes `q` and `size / q`, in that memory order.
    fn split_atom(&mut self, a: usize, q: i64) {
        let Sym::N(size) = self.atoms[a] else {
            unreachable!("only fixed atoms split")
        };
        self.atoms[a] = Sym::N(q);
        self.atoms.insert(a + 1, Sym::N(size / q));
        let pos = self
            .order
            .iter()
            .position(|&x| x == a)
            .expect("atom ordered");
        for x in &mut self.order {
            if *x > a {
                *x += 1;
            }
        }
        self.order.insert(pos + 1, a + 1);
        // The caller regroups; keep the counts consistent meanwhile.
        let mut start = 0;
        for g in &mut self.groups {
            if (start..start + *g).contains(&pos) {
                *g += 1;
                break;
            }
            start += *g;
        }
    }

    /// ONNX `Reshape` to `target` (0 copies the old size, -1 is inferred), splitting
    /// atoms where a new axis needs part of one.
    pub(super) fn reshape(&self, target: &[Sym]) -> Result<View, LayoutError> {
        let bad = || LayoutError::Reshape {
            layout: self.describe(),
            target: format!(
                "[{}]",
                target
                    .iter()
                    .map(Sym::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        let old = self.dims();
        let total = old.iter().fold(Sym::N(1), |acc, d| acc.mul(*d));
        let mut want: Vec<Sym> = target
            .iter()
            .enumerate()
            .map(|(k, &t)| match t {
                Sym::N(0) => old.get(k).copied().ok_or_else(bad),
                t => Ok(t),
            })
            .collect::<Result<_, _>>()?;
        if let Some(k) = want.iter().position(|&t| t == Sym::N(-1)) {
            let known = want
                .iter()
                .filter(|&&t| t != Sym::N(-1))
                .fold(Sym::N(1), |acc, d| acc.mul(*d));
            want[k] = total.div(known).ok_or_else(bad)?;
        }
        if want.iter().any(|t| t.parts().2 <= 0) {
            return Err(bad());
        }
        let mut v = self.clone();
        v.groups = vec![v.order.len()];
        let mut groups = Vec::with_capacity(want.len());
        let mut i = 0;
        for &d in &want {
            let (mut acc, mut count) = (Sym::N(1), 0);
            while acc != d {
                let a = *v.order.get(i).ok_or_else(bad)?;
                let next = acc.mul(v.atoms[a]);
                if next.divides(d) {
                    acc = next;
                } else {
                    let (Sym::N(size), Some(Sym::N(q))) = (v.atoms[a], d.div(acc)) else {
                        return Err(bad());
                    };
                    if q <= 1 || size % q != 0 {
                        return Err(bad());
                    }
                    v.split_atom(a, q);
                    acc = acc.mul(Sym::N(q));
                }
                i += 1;
                count += 1;
            }
            groups.push(count);
        }
        // Size-1 atoms left over join the last axis.
        while let Some(&a) = v.order.get(i) {
            if v.atoms[a] != Sym::N(1) {
                return Err(bad());
            }
            *groups.last_mut().ok_or_else(bad)? += 1;
            i += 1;
        }
        v.groups = groups;
        Ok(v)
    }

    /// ONNX axis `axis` (negative from the end) as an index.
    fn axis(&self, axis: i64) -> Result<usize, LayoutError> {
        let rank = self.groups.len() as i64;
        let a = if axis < 0 { axis + rank } else { axis };
        if !(0..rank).contains(&a) {
            return Err(LayoutError::Axis {
                axis,
                layout: self.describe(),
            });
        }
        Ok(a as usize)
    }

    /// Removes ONNX axis `k`; its atoms (of size 1) join a neighbouring axis.
    fn drop_axis(&mut self, k: usize) {
        let g = self.groups.remove(k);
        if let Some(prev) = k.checked_sub(1).and_then(|p| self.groups.get_mut(p)) {
            *prev += g;
        } else if let Some(next) = self.groups.get_mut(k) {
            *next += g;
        }
    }

    /// ONNX `Squeeze` (every axis of size 1 when `axes` is `None`).
    pub(super) fn squeeze(&self, axes: Option<&[i64]>) -> Result<View, LayoutError> {
        let dims = self.dims();
        let mut drop: Vec<usize> = match axes {
            None => (0..dims.len()).filter(|&k| dims[k] == Sym::N(1)).collect(),
            Some(axes) => axes
                .iter()
                .map(|&a| {
                    let k = self.axis(a)?;
                    if dims[k] != Sym::N(1) {
                        return Err(LayoutError::Squeeze {
                            axis: a,
                            layout: self.describe(),
                        });
                    }
                    Ok(k)
                })
                .collect::<Result<_, _>>()?,
        };
        drop.sort_unstable();
        drop.dedup();
        let mut v = self.clone();
        for &k in drop.iter().rev() {
            v.drop_axis(k);
        }
        Ok(v)
    }

    /// ONNX `Unsqueeze`: new axes of size 1 at `axes` of the output.
    pub(super) fn unsqueeze(&self, axes: &[i64]) -> Result<View, LayoutError> {
        let rank = (self.groups.len() + axes.len()) as i64;
        let mut at: Vec<usize> = axes
            .iter()
            .map(|&a| {
                let k = if a < 0 { a + rank } else { a };
                usize::try_from(k)
                    .ok()
                    .filter(|&k| (k as i64) < rank)
                    .ok_or_else(|| LayoutError::Axis {
                        axis: a,
                        layout: self.describe(),
                    })
            })
            .collect::<Result<_, _>>()?;
        at.sort_unstable();
        // The spec asks for distinct axes; inserting a repeated one would run
        // past the end of the growing list.
        if let Some(w) = at.windows(2).find(|w| w[0] == w[1]) {
            return Err(LayoutError::Axis {
                axis: w[0] as i64,
                layout: format!("{} (Unsqueeze's axes repeat it)", self.describe()),
            });
        }
        let mut v = self.clone();
        for k in at {
            v.groups.insert(k, 0);
        }
        Ok(v)
    }

    /// The atom behind ONNX axis `axis`, for indexing it: an axis of one fixed-size
    /// atom (besides atoms of size 1), never the batch.
    pub(super) fn index_atom(&self, axis: i64, what: &'static str) -> Result<usize, LayoutError> {
        let k = self.axis(axis)?;
        let bad = || LayoutError::Index {
            what,
            axis,
            layout: self.describe(),
        };
        let r = self.ranges()[k].clone();
        let mut real = self.order[r]
            .iter()
            .copied()
            .filter(|&a| self.atoms[a] != Sym::N(1));
        match (real.next(), real.next()) {
            (Some(a), None) if a != 0 && matches!(self.atoms[a], Sym::N(_)) => Ok(a),
            _ => Err(bad()),
        }
    }

    /// The atom holding elements `start..end` of ONNX axis `axis` and that range in it:
    /// the axis's one atom of more than one element, or, where the axis merges several,
    /// its first when the range covers whole blocks of the others (`y[:, :, :H]` of a
    /// bidirectional RNN's `[T, B, 2H]` picks the first direction). Also the axis's size.
    pub(super) fn index_range(
        &self,
        axis: i64,
        (start, end): (i64, i64),
        what: &'static str,
    ) -> Result<(usize, usize, usize, usize), LayoutError> {
        let bad = || LayoutError::Index {
            what,
            axis,
            layout: self.describe(),
        };
        let k = self.axis(axis)?;
        let r = self.ranges()[k].clone();
        let real: Vec<usize> = self.order[r]
            .iter()
            .copied()
            .filter(|&a| self.atoms[a] != Sym::N(1))
            .collect();
        let sizes = real
            .iter()
            .map(|&a| match self.atoms[a] {
                Sym::N(d) if a != 0 => Some(d),
                _ => None,
            })
            .collect::<Option<Vec<i64>>>()
            .ok_or_else(bad)?;
        let (Some(&first), Some(&outer)) = (real.first(), sizes.first()) else {
            return Err(bad());
        };
        let inner: i64 = sizes[1..].iter().product();
        let d = outer * inner;
        // ONNX clamps starts and ends into [0, d] after counting negatives from the end.
        let clamp = |i: i64| (if i < 0 { i + d } else { i }).clamp(0, d);
        let (start, end) = (clamp(start), clamp(end));
        if start % inner != 0 || end % inner != 0 {
            return Err(bad());
        }
        Ok((
            first,
            (start / inner) as usize,
            (end / inner) as usize,
            d as usize,
        ))
    }

    /// After the IR sliced atom `a` to `len` elements; `drop` removes the ONNX axis
    /// holding it (`Gather` of one index).
    pub(super) fn sliced(&self, ir: String, a: usize, len: usize, axis: i64, drop: bool) -> View {
        let mut v = self.clone();
        v.ir = ir;
        v.atoms[a] = Sym::N(len as i64);
        if drop {
            let k = self.axis(axis).expect("checked by index_atom");
            v.drop_axis(k);
        }
        v
    }

    /// The IR reshape into the atoms, if the IR tensor (sample shape `s`) is not already so.
    pub(super) fn split_dims(&self, s: &Shape) -> Result<Option<Vec<i64>>, LayoutError> {
        let atoms = &self.atoms[1..];
        if atoms.iter().copied().eq(s.0.iter().map(|&d| sym_of(d))) {
            return Ok(None);
        }
        reshape_dims(atoms)
            .map(Some)
            .ok_or_else(|| LayoutError::Reshape {
                layout: self.describe(),
                target: "its atoms".into(),
            })
    }

    /// How to align the IR tensor (sample shape `s`) to this view's axes.
    pub(super) fn align(&self, s: &Shape) -> Result<Align, LayoutError> {
        let split = self.split_dims(s)?;
        let samples: Vec<usize> = self
            .order
            .iter()
            .filter(|&&a| a != 0)
            .map(|&a| a - 1)
            .collect();
        let perm = (!samples.iter().copied().eq(0..samples.len())).then_some(samples);
        let ranges = self.ranges();
        let b_axis = ranges
            .iter()
            .position(|r| self.order[r.clone()].contains(&0))
            .expect("the batch is an atom");
        let real: Vec<usize> = self.order[ranges[b_axis].clone()]
            .iter()
            .copied()
            .filter(|&a| self.atoms[a] != Sym::N(1))
            .collect();
        let at = real
            .iter()
            .position(|&a| a == 0)
            .expect("batch in its group");
        let (b_alone, b_first) = match (at, real.len()) {
            (_, 1) => (true, true),
            (0, _) => (false, true),
            (k, n) if k + 1 == n => (false, false),
            _ => {
                return Err(LayoutError::BatchInMiddle {
                    axis: b_axis,
                    layout: self.describe(),
                });
            }
        };
        let mut grouped: Vec<Sym> = Vec::new();
        for (k, r) in ranges.iter().enumerate() {
            if k == b_axis && b_alone {
                continue;
            }
            let size = self.order[r.clone()]
                .iter()
                .filter(|&&a| a != 0)
                .fold(Sym::N(1), |acc, &a| acc.mul(self.atoms[a]));
            grouped.push(size);
        }
        // Without a transpose the atoms stay where they are: one reshape at most.
        let split = if perm.is_some() { split } else { None };
        let after: Vec<Sym> = match (&perm, &split) {
            (Some(_), _) => self
                .order
                .iter()
                .filter(|&&a| a != 0)
                .map(|&a| self.atoms[a])
                .collect(),
            (None, _) => s.0.iter().map(|&d| sym_of(d)).collect(),
        };
        let merge = if grouped == after {
            None
        } else {
            Some(reshape_dims(&grouped).ok_or_else(|| LayoutError::Reshape {
                layout: self.describe(),
                target: "its axes without the batch".into(),
            })?)
        };
        Ok(Align {
            split,
            perm,
            merge,
            lay: Lay {
                rank: self.groups.len(),
                b_axis,
                b_alone,
                b_first,
            },
        })
    }

    /// IR tensor `ir` of sample shape `s`, aligned to a layout `lay`, seen as ONNX does.
    pub(super) fn from_aligned(ir: &str, s: &Shape, lay: Lay) -> View {
        let mut atoms = vec![Sym::Batch];
        atoms.extend(s.0.iter().map(|&d| sym_of(d)));
        let (mut order, mut groups) = (Vec::new(), Vec::new());
        let mut next = 1;
        for k in 0..lay.rank {
            if k == lay.b_axis {
                if lay.b_alone {
                    order.push(0);
                } else if lay.b_first {
                    order.extend([0, next]);
                    next += 1;
                } else {
                    order.extend([next, 0]);
                    next += 1;
                }
                groups.push(order.len() - groups.iter().sum::<usize>());
            } else {
                order.push(next);
                next += 1;
                groups.push(1);
            }
        }
        View {
            ir: ir.to_string(),
            atoms,
            order,
            groups,
        }
    }
}

/// What an ONNX tensor name stands for.
#[derive(Clone, Debug)]
pub(super) enum Val {
    /// A batch-first IR tensor (graph input or node output).
    Ir(String),
    /// An IR tensor seen with the batch moved or merged.
    View(View),
    /// A constant: initializer or `Constant` output.
    Const(Rc<TensorProto>),
    /// A small integer vector computed from shapes (`Shape`, `Gather`, `Concat`, ...),
    /// as PyTorch exports `x.view(x.size(0), -1)`; `scalar` when it has rank 0.
    Ints { v: Vec<Sym>, scalar: bool },
    /// A random mask being built (stochastic depth, dropout written out): a tensor of
    /// `shape` filled by `ConstantOfShape`, made uniform by `RandomUniformLike`, compared
    /// with `Less` (`keep`), scaled by `Div`/`Mul` (`scale`).
    Mask(Mask),
    /// An initializer `[1, dims..]` expanded over the batch (`cls_token.expand(B, -1, -1)`):
    /// a learned tensor the same for every sample, until a `Concat` takes it.
    Broadcast(Rc<TensorProto>),
    /// A tensor the IR does not model, with the reason.
    Unusable(String),
    /// A slice of no elements (`torch.roll` by 0 exports one): `Concat` drops it; read
    /// anywhere else it is refused with this description.
    Empty(String),
}

/// How far a random mask has been built; see [`Val::Mask`].
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Mask {
    pub(super) shape: Vec<Sym>,
    /// `false` while it is the filled tensor, `true` once uniform in [0, 1).
    pub(super) uniform: bool,
    /// The probability of a one, once compared.
    pub(super) keep: Option<f64>,
    pub(super) scale: f64,
}

/// `perm` as axis indices, checked to be a permutation of `0..rank`.
pub(crate) fn permutation(perm: &[i64], rank: usize) -> Result<Vec<usize>, LayoutError> {
    let bad = || LayoutError::NotPermutation {
        perm: perm.to_vec(),
        rank,
    };
    let mut seen = vec![false; rank];
    let mut order = Vec::with_capacity(rank);
    for &p in perm {
        let p = usize::try_from(p)
            .ok()
            .filter(|&p| p < rank && !seen[p])
            .ok_or_else(bad)?;
        seen[p] = true;
        order.push(p);
    }
    if order.len() != rank {
        return Err(bad());
    }
    Ok(order)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lstm_output() -> View {
        // IR [B, T, 2·8] seen by ONNX as Y [T, dirs, B, hidden].
        View {
            ir: "lstm".into(),
            atoms: vec![Sym::Batch, Sym::Seq, Sym::N(2), Sym::N(8)],
            order: vec![1, 2, 0, 3],
            groups: vec![1, 1, 1, 1],
        }
    }

    #[test]
    fn pytorch_lstm_layout_returns_to_batch_first() {
        let tb = lstm_output().transpose(&[0, 2, 1, 3]).unwrap();
        let merged = tb.reshape(&[Sym::N(0), Sym::N(0), Sym::N(-1)]).unwrap();
        assert_eq!(merged.describe(), "[T, B, 16]");
        let back = merged.transpose(&[1, 0, 2]).unwrap();
        assert!(back.is_plain(&Shape(vec![Dim::Seq, Dim::Fixed(16)])));
    }

    #[test]
    fn attention_head_split_merges_the_batch_with_heads() {
        // [B, T, 64] -> [T, B, 64] -> [T, B·4, 16] -> [B·4, T, 16]
        let x = View::of("x", &Shape::fixed(&[10, 64]));
        let tb = x.transpose(&[1, 0, 2]).unwrap();
        let heads = tb
            .reshape(&[Sym::N(10), Sym::Batch.mul(Sym::N(4)), Sym::N(16)])
            .unwrap();
        let bh = heads.transpose(&[1, 0, 2]).unwrap();
        assert_eq!(bh.describe(), "[B·4, 10, 16]");
        let a = bh.align(&Shape::fixed(&[10, 64])).unwrap();
        assert_eq!(a.split, Some(vec![10, 4, 16]));
        assert_eq!(a.perm, Some(vec![1, 0, 2]));
        assert_eq!(a.merge, None);
        assert_eq!(
            a.lay,
            Lay {
                rank: 3,
                b_axis: 0,
                b_alone: false,
                b_first: true
            }
        );
        // [B, 4, 10, 16] is batch-first: one transpose of [B, 10, 4, 16].
        let b4 = bh
            .reshape(&[Sym::Batch, Sym::N(4), Sym::N(10), Sym::N(16)])
            .unwrap();
        assert!(b4.batch_first());
        let back = View::from_aligned("y", &Shape::fixed(&[4, 10, 16]), a.lay);
        assert_eq!(back.describe(), "[B·4, 10, 16]");
        // The batch cannot be split.
        assert!(
            tb.reshape(&[Sym::N(10), Sym::N(-1), Sym::N(2), Sym::N(32)])
                .is_ok()
        );
        assert!(x.reshape(&[Sym::N(2), Sym::N(-1)]).is_err());
    }

    #[test]
    fn squeeze_unsqueeze_and_indexing() {
        let v = lstm_output();
        let one_dir = View {
            atoms: vec![Sym::Batch, Sym::Seq, Sym::N(1), Sym::N(8)],
            ..v.clone()
        };
        assert_eq!(one_dir.squeeze(Some(&[1])).unwrap().describe(), "[T, B, 8]");
        assert!(v.squeeze(Some(&[1])).is_err());
        let u = v.unsqueeze(&[0]).unwrap();
        assert_eq!(u.describe(), "[1, T, 2, B, 8]");
        assert_eq!(u.index_atom(2, "Gather").unwrap(), 2);
        assert!(u.index_atom(3, "Gather").is_err());
        assert!(u.index_atom(1, "Gather").is_err());
        let g = u.sliced("s".into(), 2, 1, 2, true);
        assert_eq!(g.describe(), "[1, T, B, 8]");
    }
}
