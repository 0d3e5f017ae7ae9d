//! Shape inference: how each op maps one sample's input shapes to its output
//! shape, with the symbolic batch left out and a sequence length kept symbolic.

use super::{Op, Window};
use crate::shape::{Dim, Shape};

/// Why input shapes do not fit an op or a window; the message reads after the op's name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ShapeError(pub(super) String);

impl Op {
    /// The output shape for these input shapes, or why they do not fit.
    pub fn infer(&self, inputs: &[&Shape]) -> Result<Shape, ShapeError> {
        let n = inputs.len();
        if !self.arity().contains(&n) {
            return Err(ShapeError(format!(
                "takes {:?} inputs, got {n}",
                self.arity()
            )));
        }
        let x = inputs[0];
        match self {
            Op::Linear {
                in_features,
                out_features,
                ..
            } => {
                expect_last(x, *in_features, "in_features")?;
                Ok(with_last(x, *out_features))
            }
            Op::MatMul => {
                let (a, b) = (x, inputs[1]);
                if a.rank() < 2 || b.rank() < 2 || a.rank() != b.rank() {
                    return Err(ShapeError(format!(
                        "needs two inputs of equal rank >= 2 per sample, got {a} and {b}"
                    )));
                }
                let r = a.rank();
                if a.0[r - 1] != b.0[r - 2] || a.0[..r - 2] != b.0[..r - 2] {
                    return Err(ShapeError(format!("cannot multiply {a} by {b}")));
                }
                let mut out = a.0.clone();
                out[r - 1] = b.0[r - 1];
                Ok(Shape(out))
            }
            Op::Conv {
                standardize: Some(s),
                ..
            } if !(s.eps >= 0.0 && s.eps.is_finite() && s.scale.is_finite()) => {
                Err(ShapeError(format!(
                    "weight standardisation needs a finite eps >= 0 and a finite scale, \
                     got eps {} and scale {}",
                    s.eps, s.scale
                )))
            }
            Op::Conv {
                in_channels,
                out_channels,
                window,
                groups,
                ..
            } => {
                let spatial = window_output(x, window, "conv")?;
                expect_dim(x, 0, *in_channels, "input channels")?;
                if *groups == 0 || in_channels % groups != 0 || out_channels % groups != 0 {
                    return Err(ShapeError(format!(
                        "groups {groups} must divide in_channels {in_channels} and out_channels {out_channels}"
                    )));
                }
                let mut out = vec![Dim::Fixed(*out_channels)];
                out.extend(spatial);
                Ok(Shape(out))
            }
            Op::ConvTranspose {
                in_channels,
                out_channels,
                window,
                output_padding,
                groups,
                ..
            } => {
                // Leading axes before the channels are more batch (a batch merged with
                // sources: ConvTasNet's decoder runs over `[B·sources, C, L]`).
                let lead = x.rank().saturating_sub(window.spatial() + 1);
                expect_dim(x, lead, *in_channels, "input channels")?;
                if *groups == 0 || in_channels % groups != 0 || out_channels % groups != 0 {
                    return Err(ShapeError(format!(
                        "groups {groups} must divide in_channels {in_channels} and out_channels {out_channels}"
                    )));
                }
                let spatial = window.spatial();
                let sizes_fit = [
                    window.stride.len(),
                    window.padding.len(),
                    window.dilation.len(),
                ]
                .iter()
                .chain([&output_padding.len()])
                .all(|&l| l == spatial);
                if x.rank() < spatial + 1 || !sizes_fit {
                    return Err(ShapeError(format!(
                        "a transposed convolution over {spatial} spatial dimension(s) needs an \
                         input of rank {} or more per sample ([B, .., C, ...]) and one stride, \
                         padding, dilation and output padding per dimension, got {x}",
                        spatial + 1
                    )));
                }
                let mut out = x.0[..lead].to_vec();
                out.push(Dim::Fixed(*out_channels));
                for (d, dim) in x.0[lead + 1..].iter().enumerate() {
                    let Dim::Fixed(i) = *dim else {
                        return Err(ShapeError(
                            "a transposed convolution over the symbolic length T".into(),
                        ));
                    };
                    let grown = (i as u128).saturating_sub(1) * window.stride[d] as u128
                        + window.dilation[d] as u128 * (window.kernel[d] as u128).saturating_sub(1)
                        + output_padding[d] as u128
                        + 1;
                    let cropped = window.padding[d][0] as u128 + window.padding[d][1] as u128;
                    match grown.checked_sub(cropped) {
                        Some(o) if o >= 1 && i >= 1 && o <= usize::MAX as u128 => {
                            out.push(Dim::Fixed(o as usize))
                        }
                        _ => {
                            return Err(ShapeError(format!(
                                "a transposed convolution of {i} positions with kernel {}, \
                                 stride {} and padding {:?} has no output",
                                window.kernel[d], window.stride[d], window.padding[d]
                            )));
                        }
                    }
                }
                Ok(Shape(out))
            }
            Op::InstanceNorm { channels, .. } => {
                expect_dim(x, 0, *channels, "channels")?;
                if x.rank() < 2 {
                    return Err(ShapeError(format!(
                        "instance norm needs [C, spatial...] per sample, got {x}"
                    )));
                }
                Ok(x.clone())
            }
            // Statistics over no values (a zero-size axis) are not defined.
            Op::BatchNorm { features: 0 }
            | Op::LayerNorm { features: 0 }
            | Op::RmsNorm { features: 0 } => {
                Err(ShapeError(format!("normalises over 0 values: {x}")))
            }
            Op::BatchNorm { features } => {
                expect_dim(x, 0, *features, "channels")?;
                Ok(x.clone())
            }
            Op::LayerNorm { features } | Op::RmsNorm { features } => {
                expect_last(x, *features, "normalized size")?;
                Ok(x.clone())
            }
            // NaN bounds order with nothing: refused as empty.
            Op::Clamp { min, max } if min.partial_cmp(max).is_none_or(|o| o.is_gt()) => {
                Err(ShapeError(format!("to [{min}, {max}]: an empty range")))
            }
            Op::Relu
            | Op::Clamp { .. }
            | Op::LeakyRelu { .. }
            | Op::Gelu
            | Op::Tanh
            | Op::Sigmoid
            | Op::Exp
            | Op::HardSigmoid { .. }
            | Op::HardSwish
            | Op::Scale { .. } => Ok(x.clone()),
            // PyTorch's ranges: a dropout may drop everything; stochastic depth
            // divides what it keeps by 1 - p, so it must keep something.
            Op::Dropout { p } if !(0.0..=1.0).contains(p) => Err(ShapeError(format!(
                "a drop probability p in [0, 1], got {p}"
            ))),
            Op::DropPath { p } if !(0.0..1.0).contains(p) => Err(ShapeError(format!(
                "a drop probability p in [0, 1), got {p}"
            ))),
            Op::Dropout { .. } | Op::DropPath { .. } => Ok(x.clone()),
            Op::Lrn { size, .. } => {
                if x.rank() < 2 || *size == 0 {
                    return Err(ShapeError(format!(
                        "needs [B, C, spatial...] and a size of at least 1, got {x} and size {size}"
                    )));
                }
                Ok(x.clone())
            }
            Op::Slice { axis, start, end } => {
                let a = sample_axis(x, *axis)?;
                match x.0[a] {
                    Dim::Fixed(d) if start < end && *end <= d => {
                        let mut out = x.0.clone();
                        out[a] = Dim::Fixed(end - start);
                        Ok(Shape(out))
                    }
                    Dim::Fixed(d) => Err(ShapeError(format!(
                        "elements {start}..{end} of an axis of size {d} ({x})"
                    ))),
                    Dim::Seq => Err(ShapeError(format!(
                        "slicing the symbolic sequence axis of {x} is not supported"
                    ))),
                }
            }
            Op::Reduce {
                axes, keep_dims, ..
            } => {
                let mut picked = vec![false; x.rank()];
                for &axis in axes {
                    picked[sample_axis(x, axis)?] = true;
                }
                let out =
                    x.0.iter()
                        .zip(&picked)
                        .filter_map(|(&d, &p)| match (p, keep_dims) {
                            (false, _) => Some(d),
                            (true, true) => Some(Dim::Fixed(1)),
                            (true, false) => None,
                        })
                        .collect();
                Ok(Shape(out))
            }
            Op::Softmax { axis } => {
                sample_axis(x, *axis)?;
                Ok(x.clone())
            }
            Op::Transpose { perm } => {
                let mut seen = vec![false; x.rank()];
                for &p in perm {
                    if p >= x.rank() || std::mem::replace(&mut seen[p], true) {
                        return Err(ShapeError(format!(
                            "perm {perm:?} is not a permutation of the {} sample axes of {x}",
                            x.rank()
                        )));
                    }
                }
                if perm.len() != x.rank() {
                    return Err(ShapeError(format!(
                        "perm {perm:?} is not a permutation of the {} sample axes of {x}",
                        x.rank()
                    )));
                }
                Ok(Shape(perm.iter().map(|&p| x.0[p]).collect()))
            }
            Op::Pad { pads, .. } => {
                if pads.len() != x.rank() {
                    return Err(ShapeError(format!(
                        "{} pads for the {} sample axes of {x}",
                        pads.len(),
                        x.rank()
                    )));
                }
                let out = x.0.iter().zip(pads).map(|(d, &[lo, hi])| match d {
                    Dim::Fixed(k) => Ok(Dim::Fixed(k + lo + hi)),
                    Dim::Seq if lo + hi == 0 => Ok(Dim::Seq),
                    Dim::Seq => Err(ShapeError(format!(
                        "padding the symbolic sequence axis of {x} is not supported"
                    ))),
                });
                Ok(Shape(out.collect::<Result<_, _>>()?))
            }
            Op::Expand { shape } if shape.contains(&0) => Err(ShapeError(format!(
                "expand to {shape:?}: every size must be at least 1"
            ))),
            Op::Expand { shape } => {
                let out = broadcast(x, &Shape::fixed(shape))?;
                if out.rank() != x.rank() {
                    return Err(ShapeError(format!(
                        "expand of {x} to {shape:?}: the target has another rank"
                    )));
                }
                Ok(out)
            }
            Op::Resize { size, .. } => {
                let fixed = x.rank() == size.len() + 1 && size.iter().all(|&s| s > 0);
                if !fixed {
                    return Err(ShapeError(format!(
                        "resizing {x} to {size:?}: one positive size per spatial axis of [C, ...]"
                    )));
                }
                let mut out = vec![x.0[0]];
                out.extend(size.iter().map(|&s| Dim::Fixed(s)));
                Ok(Shape(out))
            }
            Op::AddParam { shape }
            | Op::MulParam { shape }
            | Op::PRelu { shape }
            | Op::AddTable { shape, .. } => {
                if !broadcasts_onto(shape, x) {
                    return Err(ShapeError(format!(
                        "a parameter of shape {shape:?} does not broadcast against {x}"
                    )));
                }
                Ok(x.clone())
            }
            Op::BroadcastParam { shape } | Op::Parameter { shape } => Ok(Shape::fixed(shape)),
            Op::Constant { shape, values } => {
                if values.len() != shape.iter().product::<usize>() {
                    return Err(ShapeError(format!(
                        "has {} values for shape {shape:?}",
                        values.len()
                    )));
                }
                Ok(Shape::fixed(shape))
            }
            Op::Take { axis, indices } => {
                let a = sample_axis(x, *axis)?;
                let Dim::Fixed(len) = x.0[a] else {
                    return Err(ShapeError(format!("axis {axis} of {x} has no fixed size")));
                };
                if let Some(&i) = indices.iter().find(|&&i| i >= len) {
                    return Err(ShapeError(format!(
                        "index {i} is out of range for axis {axis} of {x}"
                    )));
                }
                let mut out = x.0.clone();
                out[a] = Dim::Fixed(indices.len());
                Ok(Shape(out))
            }
            Op::ConcatParam { axis, shape, .. } => {
                let a = sample_axis(x, *axis)?;
                let fits = shape.len() == x.rank()
                    && (0..x.rank()).all(|k| k == a || x.0[k] == Dim::Fixed(shape[k]));
                match (fits, x.0[a]) {
                    (true, Dim::Fixed(d)) => {
                        let mut out = x.0.clone();
                        out[a] = Dim::Fixed(d + shape[a]);
                        Ok(Shape(out))
                    }
                    _ => Err(ShapeError(format!(
                        "cannot concatenate a parameter of shape {shape:?} with {x} along axis {axis}"
                    ))),
                }
            }
            Op::AddConst { shape, values } | Op::MulConst { shape, values } => {
                if !broadcasts_onto(shape, x) || values.len() != shape.iter().product::<usize>() {
                    return Err(ShapeError(format!(
                        "a constant of shape {shape:?} ({} values) does not broadcast onto {x} \
                         without enlarging it",
                        values.len()
                    )));
                }
                Ok(x.clone())
            }
            Op::CausalMask => {
                let r = x.rank();
                if r < 2 || x.0[r - 1] != x.0[r - 2] {
                    return Err(ShapeError(format!(
                        "needs square attention scores [.., T, T], got {x}"
                    )));
                }
                Ok(x.clone())
            }
            Op::Pool { window, .. } => {
                let spatial = window_output(x, window, "pool")?;
                let mut out = vec![x.0[0]];
                out.extend(spatial);
                Ok(Shape(out))
            }
            Op::GlobalPool { .. } => {
                if x.rank() < 2 {
                    return Err(ShapeError(format!("needs [B, C, spatial...], got {x}")));
                }
                let mut out = vec![x.0[0]];
                out.extend(std::iter::repeat_n(Dim::Fixed(1), x.rank() - 1));
                Ok(Shape(out))
            }
            Op::Flatten => {
                let dims = x.all_fixed().ok_or_else(|| {
                    ShapeError(format!(
                        "cannot flatten {x}: the sequence length T is symbolic"
                    ))
                })?;
                Ok(Shape::fixed(&[dims.iter().product()]))
            }
            Op::Reshape { shape } => reshape(x, shape),
            Op::Concat { axis } => {
                let a = sample_axis(x, *axis)?;
                let mut out = x.0.clone();
                for other in &inputs[1..] {
                    if other.rank() != x.rank() {
                        return Err(ShapeError(format!(
                            "cannot concatenate {x} and {other}: ranks differ"
                        )));
                    }
                    for d in 0..x.rank() {
                        if d != a && other.0[d] != x.0[d] {
                            return Err(ShapeError(format!(
                                "cannot concatenate {x} and {other} along axis {axis}: dimension {} differs",
                                d + 1
                            )));
                        }
                    }
                    out[a] = match (out[a], other.0[a]) {
                        (Dim::Fixed(p), Dim::Fixed(q)) => Dim::Fixed(p + q),
                        _ => {
                            return Err(ShapeError(
                                "cannot concatenate along the sequence axis".into(),
                            ));
                        }
                    };
                }
                Ok(Shape(out))
            }
            Op::Add | Op::Mul | Op::Div => broadcast(x, inputs[1]),
            Op::Embedding { dim, .. } => {
                let mut out = x.0.clone();
                out.push(Dim::Fixed(*dim));
                Ok(Shape(out))
            }
            Op::Rnn {
                input_size,
                hidden,
                bidirectional,
                ..
            } => {
                // `[sequences.., T, features]`: more than one sequence per sample where
                // the layer runs over a batch merged with another axis.
                if x.rank() < 2 {
                    return Err(ShapeError(format!(
                        "needs a sequence [B, T, features], got {x}"
                    )));
                }
                expect_last(x, *input_size, "input_size")?;
                let dirs = if *bidirectional { 2 } else { 1 };
                Ok(with_last(x, hidden * dirs))
            }
        }
    }
}

fn expect_last(x: &Shape, want: usize, what: &str) -> Result<(), ShapeError> {
    match x.last() {
        Some(Dim::Fixed(n)) if n == want => Ok(()),
        _ => Err(ShapeError(format!(
            "{what} is {want} but the input is {x} (its last dimension must be {want})"
        ))),
    }
}

fn expect_dim(x: &Shape, d: usize, want: usize, what: &str) -> Result<(), ShapeError> {
    match x.0.get(d) {
        Some(Dim::Fixed(n)) if *n == want => Ok(()),
        _ => Err(ShapeError(format!(
            "{what} is {want} but the input is {x} (dimension {} must be {want})",
            d + 1
        ))),
    }
}

fn with_last(x: &Shape, n: usize) -> Shape {
    let mut out = x.0.clone();
    if let Some(l) = out.last_mut() {
        *l = Dim::Fixed(n);
    }
    Shape(out)
}

/// The output's spatial dimensions of a window over `[C, spatial...]`, checking the
/// rank. A fixed size maps as the window says; the symbolic length T only where the
/// window keeps every length (stride 1, padding (kernel - 1) x dilation in total: a
/// "same" convolution over time), so the output's length is T again.
fn window_output(x: &Shape, window: &Window, what: &str) -> Result<Vec<Dim>, ShapeError> {
    let spatial = window.spatial();
    if x.rank() != spatial + 1 {
        return Err(ShapeError(format!(
            "{what} over {spatial} spatial dimension(s) needs an input of rank {} per sample ([B, C, ...]), got {x}",
            spatial + 1
        )));
    }
    let mut out = Vec::with_capacity(spatial);
    for (d, dim) in x.0[1..].iter().enumerate() {
        let one = Window {
            kernel: vec![window.kernel[d]],
            stride: vec![window.stride[d]],
            dilation: vec![window.dilation[d]],
            padding: vec![window.padding[d]],
        };
        out.push(match dim {
            Dim::Fixed(i) => Dim::Fixed(one.output(&[*i])?[0]),
            Dim::Seq => {
                let span = window.kernel[d]
                    .checked_sub(1)
                    .and_then(|k| k.checked_mul(window.dilation[d]));
                let padding = window.padding[d][0].checked_add(window.padding[d][1]);
                let keeps = window.stride[d] == 1 && span.is_some() && span == padding;
                if !keeps {
                    return Err(ShapeError(format!(
                        "{what} over the symbolic sequence length T must keep its length (stride 1, padding (kernel - 1) x dilation in total); kernel {}, stride {}, padding {:?}",
                        window.kernel[d], window.stride[d], window.padding[d]
                    )));
                }
                Dim::Seq
            }
        });
    }
    Ok(out)
}

/// Converts a full-tensor axis (batch = 0, negatives from the end) to a sample axis.
pub fn sample_axis(x: &Shape, axis: i64) -> Result<usize, ShapeError> {
    let full_rank = x.rank() as i64 + 1;
    let a = if axis < 0 { axis + full_rank } else { axis };
    if a <= 0 || a >= full_rank {
        return Err(ShapeError(format!(
            "axis {axis} is not a sample axis of {x} (axis 0 is the batch)"
        )));
    }
    Ok(a as usize - 1)
}

fn reshape(x: &Shape, shape: &[i64]) -> Result<Shape, ShapeError> {
    // With a symbolic T (at most once) the sizes count T as a factor: the T ends up
    // where a 0 copies it or, failing that, where the -1 is.
    let seqs = x.0.iter().filter(|d| **d == Dim::Seq).count();
    if seqs > 1 {
        return Err(ShapeError(format!(
            "cannot reshape {x}: the sequence length T appears twice"
        )));
    }
    let total: usize = x.0.iter().filter_map(|d| d.fixed()).product();
    let mut out: Vec<Dim> = Vec::with_capacity(shape.len());
    let mut infer_at = None;
    for (i, &s) in shape.iter().enumerate() {
        match s {
            -1 if infer_at.is_none() => {
                infer_at = Some(i);
                out.push(Dim::Fixed(1));
            }
            0 => out.push(*x.0.get(i).ok_or_else(|| {
                ShapeError(format!("reshape copies dimension {} that {x} lacks", i + 1))
            })?),
            s if s > 0 => out.push(Dim::Fixed(s as usize)),
            _ => return Err(ShapeError(format!("bad reshape target {shape:?}"))),
        }
    }
    let known: usize = out.iter().filter_map(|d| d.fixed()).product();
    let seq_placed = out.contains(&Dim::Seq);
    match infer_at {
        Some(i) if known != 0 && total.is_multiple_of(known) => {
            out[i] = match (seqs, seq_placed, total / known) {
                (1, false, 1) => Dim::Seq,
                (1, false, _) => {
                    return Err(ShapeError(format!(
                        "cannot reshape {x} to {shape:?}: T would merge with another axis"
                    )));
                }
                (_, _, k) => Dim::Fixed(k),
            };
        }
        Some(_) => return Err(ShapeError(format!("cannot reshape {x} to {shape:?}"))),
        None if known != total || (seqs == 1) != seq_placed => {
            return Err(ShapeError(format!(
                "cannot reshape {x} ({total} elements per sample) to {shape:?}"
            )));
        }
        None => {}
    }
    Ok(Shape(out))
}

/// Numpy broadcasting of two sample shapes.
fn broadcast(a: &Shape, b: &Shape) -> Result<Shape, ShapeError> {
    let r = a.rank().max(b.rank());
    let pad = |s: &Shape| -> Vec<Dim> {
        let mut v = vec![Dim::Fixed(1); r - s.rank()];
        v.extend(&s.0);
        v
    };
    let (pa, pb) = (pad(a), pad(b));
    let mut out = Vec::with_capacity(r);
    for (&p, &q) in pa.iter().zip(&pb) {
        out.push(match (p, q) {
            (p, q) if p == q => p,
            (Dim::Fixed(1), q) => q,
            (p, Dim::Fixed(1)) => p,
            _ => return Err(ShapeError(format!("cannot broadcast {a} with {b}"))),
        });
    }
    Ok(Shape(out))
}

/// Whether a tensor of `shape` broadcasts onto sample shape `x` (numpy's rules, from the
/// right) without enlarging it.
fn broadcasts_onto(shape: &[usize], x: &Shape) -> bool {
    shape.len() <= x.rank()
        && shape
            .iter()
            .rev()
            .zip(x.0.iter().rev())
            .all(|(&p, &d)| p == 1 || Dim::Fixed(p) == d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reshape_infers_minus_one_and_rejects_bad_sizes() {
        let x = Shape::fixed(&[26, 3, 3]);
        assert_eq!(
            reshape(&x, &[-1]).unwrap().to_string(),
            "[B, 234]".to_string()
        );
        assert!(reshape(&x, &[100]).is_err());
    }

    /// Settings a training cannot run with are refused with the shapes, not
    /// found by the engine: a drop probability out of range or NaN, an
    /// expansion to an empty axis.
    #[test]
    fn out_of_range_settings_are_refused() {
        let x = Shape::fixed(&[4]);
        for p in [1.5, -0.5, f32::NAN] {
            assert!(Op::Dropout { p }.infer(&[&x]).is_err(), "dropout {p}");
        }
        for p in [1.0, 2.0, f32::NAN] {
            assert!(Op::DropPath { p }.infer(&[&x]).is_err(), "drop_path {p}");
        }
        assert!(Op::Dropout { p: 1.0 }.infer(&[&x]).is_ok());
        assert!(Op::DropPath { p: 0.0 }.infer(&[&x]).is_ok());
        let e = Op::Expand { shape: vec![0, 4] }
            .infer(&[&Shape::fixed(&[1, 4])])
            .unwrap_err();
        assert!(e.to_string().contains("at least 1"), "{e}");
    }
}
