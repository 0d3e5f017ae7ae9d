//! Layout views: how ONNX sees the batch-first tensors around recurrent layers.

use super::proto::TensorProto;
use super::shapes::Sym;
use std::rc::Rc;

/// Why a layout view or a constant cannot be rearranged as asked.
#[derive(Debug, thiserror::Error)]
pub(super) enum LayoutError {
    #[error("perm {perm:?} is not a permutation of {rank} axes")]
    NotPermutation { perm: Vec<i64>, rank: usize },
    #[error(
        "Squeeze with axes {axes:?} of `{ir}` in the recurrent layout {layout}: only the \
         directions axis of a unidirectional layer can be squeezed"
    )]
    Squeeze {
        axes: Option<Vec<i64>>,
        ir: String,
        layout: String,
    },
    #[error(
        "Reshape of `{ir}` in the recurrent layout {layout} to {target:?}: only merging the \
         directions and hidden axes (like [0, 0, -1]) is supported"
    )]
    Reshape {
        ir: String,
        layout: String,
        target: Vec<i64>,
    },
}

/// An axis of the batch-first tensor `[B, T, F]` a recurrent layer reads or
/// writes, as ONNX lays it out; `F` may be split into directions `D` and hidden `H`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ax {
    B,
    T,
    F,
    D,
    H,
}

/// An IR tensor `[B, T, F]` that ONNX sees with permuted or split axes.
#[derive(Clone, Debug)]
pub(super) struct View {
    pub(super) ir: String,
    pub(super) axes: Vec<Ax>,
    pub(super) dirs: usize,
    pub(super) hidden: usize,
}

impl View {
    /// The axes as ONNX sees them, like `[T, dirs, B, hidden]`.
    pub(super) fn describe(&self) -> String {
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
    pub(super) fn settle(self) -> Val {
        if self.axes == [Ax::B, Ax::T, Ax::F] {
            Val::Ir(self.ir)
        } else {
            Val::View(self)
        }
    }
}

/// What an ONNX tensor name stands for.
#[derive(Clone, Debug)]
pub(super) enum Val {
    /// A batch-first IR tensor (graph input or node output).
    Ir(String),
    /// A layout view of a batch-first IR tensor around a recurrent layer.
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
    /// A tensor the IR does not model, with the reason.
    Unusable(String),
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

/// A view with its axes permuted.
pub(super) fn view_transpose(mut v: View, perm: &[i64]) -> Result<Val, LayoutError> {
    let order = permutation(perm, v.axes.len())?;
    v.axes = order.iter().map(|&p| v.axes[p]).collect();
    Ok(v.settle())
}

/// A view without the directions axis of a unidirectional layer.
pub(super) fn view_squeeze(mut v: View, axes: Option<&[i64]>) -> Result<Val, LayoutError> {
    let rank = v.axes.len() as i64;
    let d = v.axes.iter().position(|&a| a == Ax::D);
    let want = match (axes, d) {
        (Some([a]), Some(d)) if (a + rank) % rank == d as i64 && v.dirs == 1 => d,
        (None, Some(d)) if v.dirs == 1 => d,
        _ => {
            return Err(LayoutError::Squeeze {
                axes: axes.map(<[i64]>::to_vec),
                layout: v.describe(),
                ir: v.ir,
            });
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

/// A view with the directions and hidden axes merged into features.
pub(super) fn view_reshape(mut v: View, target: &[i64]) -> Result<Val, LayoutError> {
    let bad = |v: &View| LayoutError::Reshape {
        ir: v.ir.clone(),
        layout: v.describe(),
        target: target.to_vec(),
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

#[cfg(test)]
mod tests {
    use super::*;

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
