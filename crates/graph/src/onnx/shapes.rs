//! Shape arithmetic: `Shape` and the integer ops PyTorch wraps around it,
//! evaluated with a symbolic batch so they leave no IR node.

use super::decode::{Attrs, is_int_type, tensor_ints};
use super::import::{Importer, label};
use super::proto::{DataType, NodeProto, TensorProto};
use super::sym::Sym;
use super::view::Val;
use crate::error::GraphError;
use crate::shape::Dim;

/// Why sample axes cannot be squeezed or unsqueezed.
#[derive(Debug, thiserror::Error)]
pub(super) enum AxisError {
    #[error("axis {0} is not a sample axis")]
    NotSampleAxis(i64),
    #[error("axis {axis} has size {size}, not 1")]
    NotOne { axis: i64, size: usize },
    #[error("needs axes")]
    NoAxes,
    #[error("axis {0} would move the batch")]
    MovesBatch(i64),
}

impl Importer {
    /// An integer vector input: an integer constant of rank 0 or 1, or a shape value.
    pub(super) fn ints_of(
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
    pub(super) fn is_ints(&self, n: &NodeProto, pos: usize) -> bool {
        match self.vals.get(n.input.get(pos).map_or("", String::as_str)) {
            Some(Val::Ints { .. }) => true,
            Some(Val::Const(t)) => t.dims.len() <= 1 && is_int_type(t.data_type),
            _ => false,
        }
    }

    /// A Reshape target; the symbolic batch may only stand first, where it means "keep".
    pub(super) fn reshape_target(&self, n: &NodeProto) -> Result<Vec<i64>, GraphError> {
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
                Sym::Seq | Sym::Prod { .. } => Err(GraphError::node(
                    label(n),
                    "Reshape to a size computed from the symbolic sequence length T",
                )),
            })
            .collect()
    }

    /// Ops on shape values: `Shape` and the integer ops PyTorch wraps around it
    /// (`Gather`, `Unsqueeze`, `Squeeze`, `Concat`, `Slice`, `Mul`, `Add`).
    /// Returns `false` when `n` does not compute a shape value.
    pub(super) fn shape_op(&mut self, n: &NodeProto, a: &Attrs) -> Result<bool, GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let op = n.op_type.as_str();
        let (v, scalar) = match op {
            "Shape" => {
                let v = match self.val(n, 0)? {
                    Val::View(view) => view.dims(),
                    Val::Ints { v, scalar } => {
                        if *scalar {
                            vec![]
                        } else {
                            vec![Sym::N(v.len() as i64)]
                        }
                    }
                    // A constant's shape is its dims (a buffer's, as `pos_embed` reads it).
                    Val::Const(t) => t.dims.iter().map(|&d| Sym::N(d)).collect(),
                    _ => {
                        let x = self.act(n, 0)?;
                        // A shared tensor (computed once per step) has no batch axis.
                        let mut v = match self.b.is_shared(&x) {
                            true => vec![],
                            false => vec![Sym::Batch],
                        };
                        v.extend(self.shape(&x)?.0.iter().map(|d| match d {
                            Dim::Seq => Sym::Seq,
                            Dim::Fixed(k) => Sym::N(*k as i64),
                        }));
                        v
                    }
                };
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
                    // Numbers unsqueezed to rank 2 (`F.unfold`'s indices: `arange(n)[:,
                    // None] + arange(k)[None]`): an integer constant from here on.
                    ("Unsqueeze", false) if numbers(&v) => {
                        self.numbers_unsqueezed(n, a, &v)?;
                        return Ok(true);
                    }
                    // Numbers of rank 2 and more (position ids `arange(T)[None]`): a
                    // constant, folded (`fold`).
                    _ if numbers(&v) => return Ok(false),
                    _ => return Err(err(format!("{op} of a shape value of rank > 1"))),
                }
            }
            // `Range` of numbers (`torch.arange(T)` with T from a shape): the values.
            "Range" if (0..3).all(|p| self.is_ints(n, p)) => {
                let arg = |pos: usize| -> Result<i64, GraphError> {
                    match self.ints_of(n, pos, "Range input")?.0[..] {
                        [Sym::N(k)] => Ok(k),
                        ref other => Err(err(format!(
                            "Range of {other:?}: only of numbers (not the symbolic batch or \
                             sequence length)"
                        ))),
                    }
                };
                let (start, limit, delta) = (arg(0)?, arg(1)?, arg(2)?);
                let len = if delta == 0 {
                    return Err(err("Range with delta 0".into()));
                } else {
                    ((limit - start) as f64 / delta as f64).ceil().max(0.0) as i64
                };
                if len > super::MAX_ELEMENTS as i64 {
                    return Err(err(format!("Range of {len} values")));
                }
                ((0..len).map(|k| Sym::N(start + k * delta)).collect(), false)
            }
            "Reshape" if self.is_ints(n, 0) => {
                let (v, _) = self.ints_of(n, 0, "data")?;
                let (target, _) = self.ints_of(n, 1, "Reshape shape")?;
                match target[..] {
                    [] if v.len() == 1 => (v, true),
                    [Sym::N(k)] if k == -1 || k == v.len() as i64 => (v, false),
                    _ if numbers(&v) => return Ok(false),
                    _ => {
                        return Err(err(format!(
                            "Reshape of a shape value of {} entries to {target:?}",
                            v.len()
                        )));
                    }
                }
            }
            // `expand(B, -1, -1)` exports `Where(shape == -1, 1, shape)`: the batch and
            // the sequence length are positive, so never equal to a number below 1.
            "Equal" if self.is_ints(n, 0) && self.is_ints(n, 1) => {
                let (p, ps) = self.ints_of(n, 0, "operand")?;
                let (q, qs) = self.ints_of(n, 1, "operand")?;
                let len = p.len().max(q.len());
                let v = (0..len)
                    .map(|k| match (p[k.min(p.len() - 1)], q[k.min(q.len() - 1)]) {
                        (Sym::N(x), Sym::N(y)) => Ok(Sym::N(i64::from(x == y))),
                        (Sym::N(x), _) | (_, Sym::N(x)) if x < 1 => Ok(Sym::N(0)),
                        (x, y) => Err(err(format!(
                            "Equal of {x} and {y} in a shape computation is not known"
                        ))),
                    })
                    .collect::<Result<_, _>>()?;
                (v, ps && qs)
            }
            "Where" if (0..3).all(|p| self.is_ints(n, p)) => {
                let (c, _) = self.ints_of(n, 0, "condition")?;
                let (x, _) = self.ints_of(n, 1, "operand")?;
                let (y, _) = self.ints_of(n, 2, "operand")?;
                let len = c.len().max(x.len()).max(y.len());
                let at = |v: &[Sym], k: usize| v[k.min(v.len() - 1)];
                let v = (0..len)
                    .map(|k| match at(&c, k) {
                        Sym::N(0) => Ok(at(&y, k)),
                        Sym::N(_) => Ok(at(&x, k)),
                        other => Err(err(format!("Where on condition {other}"))),
                    })
                    .collect::<Result<_, _>>()?;
                (v, false)
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
                        Some(other) => Err(err(format!("Slice {attr} {other:?} of a shape value"))),
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
            "Mul" | "Add" | "Div" | "Sub" | "Mod" if self.is_ints(n, 0) && self.is_ints(n, 1) => {
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
                    .map(|k| match (op, p[k.min(p.len() - 1)], q[k.min(q.len() - 1)]) {
                        ("Mul", x, y) => Ok(x.mul(y)),
                        // Integer Div truncates (the spec's integer division: PyTorch's
                        // `chunk` sizes its parts as `(d + chunks - 1) / chunks`).
                        ("Div", Sym::N(x), Sym::N(y)) if y != 0 => Ok(Sym::N(x / y)),
                        ("Div", x, y) => x.div(y).ok_or_else(|| {
                            err(format!("Div of {x} by {y} in a shape computation is not exact"))
                        }),
                        ("Mod", Sym::N(x), Sym::N(y)) if y != 0 => Ok(Sym::N(x.rem_euclid(y))),
                        (_, Sym::N(x), Sym::N(y)) => {
                            let r = if op == "Add" { x.checked_add(y) } else { x.checked_sub(y) };
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
}

/// The sample shape after removing size-1 sample dimensions (`axes` count the batch as 0).
pub(super) fn squeeze(dims: &[usize], axes: Option<&[i64]>) -> Result<Vec<i64>, AxisError> {
    let full = dims.len() as i64 + 1;
    let remove: Vec<usize> = match axes {
        None => (0..dims.len()).filter(|&k| dims[k] == 1).collect(),
        Some(axes) => axes
            .iter()
            .map(|&a| {
                let a = if a < 0 { a + full } else { a };
                if a <= 0 || a >= full {
                    return Err(AxisError::NotSampleAxis(a));
                }
                let k = a as usize - 1;
                if dims[k] != 1 {
                    return Err(AxisError::NotOne {
                        axis: a,
                        size: dims[k],
                    });
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
pub(super) fn unsqueeze(dims: &[usize], axes: Option<&[i64]>) -> Result<Vec<i64>, AxisError> {
    let axes = axes.ok_or(AxisError::NoAxes)?;
    let full_out = (dims.len() + 1 + axes.len()) as i64;
    let mut at: Vec<usize> = Vec::with_capacity(axes.len());
    for &a in axes {
        let a = if a < 0 { a + full_out } else { a };
        if a <= 0 || a >= full_out {
            return Err(AxisError::MovesBatch(a));
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

/// Whether every entry of a shape value is a number (neither the batch nor T).
impl Importer {
    /// `Unsqueeze` of a vector of numbers computed from shapes: the integer constant it
    /// makes (rank 2 or more), which `fold` computes on as on any other.
    fn numbers_unsqueezed(
        &mut self,
        n: &NodeProto,
        a: &Attrs,
        v: &[Sym],
    ) -> Result<(), GraphError> {
        let err = |why: String| GraphError::node(label(n), why);
        let axes = if Self::has_input(n, 1) {
            self.const_ints(n, 1, "axes")?
        } else {
            a.ints("axes").unwrap_or_default()
        };
        let rank = 1 + axes.len() as i64;
        let mut at: Vec<i64> = axes
            .iter()
            .map(|&k| if k < 0 { k + rank } else { k })
            .collect();
        at.sort_unstable();
        at.dedup();
        if at.len() != axes.len() || at.iter().any(|&k| !(0..rank).contains(&k)) {
            return Err(err(format!("Unsqueeze axes {axes:?} of a vector")));
        }
        let mut dims = vec![v.len() as i64];
        for k in at {
            dims.insert(k as usize, 1);
        }
        let values = v
            .iter()
            .map(|s| match s {
                Sym::N(k) => *k,
                _ => unreachable!("numbers"),
            })
            .collect();
        let t = TensorProto {
            name: n.output.first().cloned().unwrap_or_default(),
            dims,
            data_type: DataType::Int64 as i32,
            int64_data: values,
            ..TensorProto::default()
        };
        self.define(n, Val::Const(std::rc::Rc::new(t)));
        Ok(())
    }
}

fn numbers(v: &[Sym]) -> bool {
    v.iter().all(|s| matches!(s, Sym::N(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn squeeze_and_unsqueeze_keep_the_batch() {
        assert_eq!(squeeze(&[32, 1, 1], Some(&[2, 3])).unwrap(), vec![32]);
        assert_eq!(squeeze(&[32, 1, 1], None).unwrap(), vec![32]);
        assert!(squeeze(&[32, 1], Some(&[0])).is_err());
        assert_eq!(unsqueeze(&[32], Some(&[-1])).unwrap(), vec![32, 1]);
        assert_eq!(unsqueeze(&[32], Some(&[1])).unwrap(), vec![1, 32]);
    }
}
