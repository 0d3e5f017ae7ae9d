//! Op kinds, their attributes, the parameters they own and how they map
//! input shapes to an output shape. This file is the one place that knows an
//! op's parameters; what its backward pass keeps lives in `batchfit-plan`.

use crate::shape::{Dim, Shape};
use serde::Serialize;

/// Max or average pooling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolKind {
    Max,
    Avg,
}

/// Recurrent cell type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Cell {
    Lstm,
    Gru,
}

impl Cell {
    /// Gates per cell: 4 for LSTM (i, f, g, o), 3 for GRU (r, z, n).
    pub fn gates(self) -> usize {
        match self {
            Cell::Lstm => 4,
            Cell::Gru => 3,
        }
    }
}

/// How many bias vectors a recurrent layer has per direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RnnBias {
    /// One bias per gate (TensorFlow's BasicLSTMCell, Keras).
    Single,
    /// Input and recurrent bias per gate (PyTorch, ONNX, cuDNN).
    Double,
}

/// A spatial window: kernel, stride, padding (begin, end) and dilation per spatial dimension.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Window {
    pub kernel: Vec<usize>,
    pub stride: Vec<usize>,
    pub padding: Vec<[usize; 2]>,
    pub dilation: Vec<usize>,
}

impl Window {
    /// A square window with the same value on every one of `spatial` dimensions.
    pub fn square(spatial: usize, kernel: usize, stride: usize, pad: usize) -> Window {
        Window {
            kernel: vec![kernel; spatial],
            stride: vec![stride; spatial],
            padding: vec![[pad, pad]; spatial],
            dilation: vec![1; spatial],
        }
    }

    /// Padding that keeps `ceil(in / stride)` outputs (ONNX `SAME_UPPER`, Keras/MATLAB 'same').
    pub fn same(spatial_in: &[usize], kernel: &[usize], stride: &[usize]) -> Vec<[usize; 2]> {
        spatial_in
            .iter()
            .zip(kernel)
            .zip(stride)
            .map(|((&i, &k), &s)| {
                let out = i.div_ceil(s);
                let total = ((out - 1) * s + k).saturating_sub(i);
                [total / 2, total - total / 2]
            })
            .collect()
    }

    /// Number of spatial dimensions.
    pub fn spatial(&self) -> usize {
        self.kernel.len()
    }

    /// Output size of every spatial dimension, or an error if the window does not fit.
    pub fn output(&self, input: &[usize]) -> Result<Vec<usize>, ShapeError> {
        let mut out = Vec::with_capacity(input.len());
        for (d, &i) in input.iter().enumerate() {
            let span = self.dilation[d] * (self.kernel[d] - 1) + 1;
            let padded = i + self.padding[d][0] + self.padding[d][1];
            if padded < span || self.stride[d] == 0 {
                return Err(ShapeError(format!(
                    "window of {} (dilation {}) does not fit spatial size {} with padding {:?}",
                    self.kernel[d], self.dilation[d], i, self.padding[d]
                )));
            }
            out.push((padded - span) / self.stride[d] + 1);
        }
        Ok(out)
    }

    /// Kernel elements (product of the kernel sizes).
    pub fn kernel_elements(&self) -> usize {
        self.kernel.iter().product()
    }
}

/// Why input shapes do not fit an op or a window; the message reads after the op's name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ShapeError(String);

/// An operation of the training graph, with its attributes.
///
/// Axes in attributes count the batch as axis 0, as ONNX and PyTorch do.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Op {
    /// `y = x W^T + b` over the last dimension (Gemm, Dense, fully connected).
    Linear {
        in_features: usize,
        out_features: usize,
        bias: bool,
    },
    /// Batched matrix product of two activations.
    MatMul,
    /// 1-d or 2-d convolution over `[C, L]` or `[C, H, W]`.
    Conv {
        in_channels: usize,
        out_channels: usize,
        window: Window,
        groups: usize,
        bias: bool,
    },
    /// Batch normalisation over the channel dimension (axis 1).
    BatchNorm {
        features: usize,
    },
    /// Layer normalisation over the last dimension.
    LayerNorm {
        features: usize,
    },
    Relu,
    /// `min(max(x, 0), max)` (DeepSpeech's ReLU clipped at 20).
    ClippedRelu {
        max: f32,
    },
    Gelu,
    Tanh,
    Sigmoid,
    /// Softmax along `axis` (negative counts from the end).
    Softmax {
        axis: i64,
    },
    /// Max or average pooling over the spatial dimensions.
    Pool {
        pool: PoolKind,
        window: Window,
    },
    /// Pooling over all spatial dimensions to size 1.
    GlobalPool {
        pool: PoolKind,
    },
    /// Collapse every sample dimension into one.
    Flatten,
    /// Reshape one sample to `shape` (`-1` inferred, `0` copies the input size).
    Reshape {
        shape: Vec<i64>,
    },
    /// Concatenation along `axis`.
    Concat {
        axis: i64,
    },
    /// Element-wise sum with broadcasting.
    Add,
    /// Element-wise product with broadcasting.
    Mul,
    /// Dropout with drop probability `p`.
    Dropout {
        p: f32,
    },
    /// Token embedding lookup.
    Embedding {
        vocab: usize,
        dim: usize,
    },
    /// LSTM or GRU over `[T, input_size]`, batch-first, returning every step's output.
    Rnn {
        cell: Cell,
        input_size: usize,
        hidden: usize,
        bidirectional: bool,
        bias: RnnBias,
    },
}

/// One parameter tensor owned by an op.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Param {
    pub name: String,
    pub shape: Vec<usize>,
}

impl Param {
    fn new(name: impl Into<String>, shape: &[usize]) -> Param {
        Param {
            name: name.into(),
            shape: shape.to_vec(),
        }
    }

    /// Number of scalars.
    pub fn elements(&self) -> u64 {
        self.shape.iter().map(|&d| d as u64).product()
    }
}

/// The op names the IR understands, for error messages.
pub const OP_NAMES: &[&str] = &[
    "linear",
    "matmul",
    "conv1d",
    "conv2d",
    "batchnorm",
    "layernorm",
    "relu",
    "clipped_relu",
    "gelu",
    "tanh",
    "sigmoid",
    "softmax",
    "maxpool",
    "avgpool",
    "global_maxpool",
    "global_avgpool",
    "flatten",
    "reshape",
    "concat",
    "add",
    "mul",
    "dropout",
    "embedding",
    "lstm",
    "gru",
];

impl Op {
    /// A short lower-case name (`conv2d`, `lstm`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Op::Linear { .. } => "linear",
            Op::MatMul => "matmul",
            Op::Conv { window, .. } if window.spatial() == 1 => "conv1d",
            Op::Conv { .. } => "conv2d",
            Op::BatchNorm { .. } => "batchnorm",
            Op::LayerNorm { .. } => "layernorm",
            Op::Relu => "relu",
            Op::ClippedRelu { .. } => "clipped_relu",
            Op::Gelu => "gelu",
            Op::Tanh => "tanh",
            Op::Sigmoid => "sigmoid",
            Op::Softmax { .. } => "softmax",
            Op::Pool {
                pool: PoolKind::Max,
                ..
            } => "maxpool",
            Op::Pool { .. } => "avgpool",
            Op::GlobalPool {
                pool: PoolKind::Max,
            } => "global_maxpool",
            Op::GlobalPool { .. } => "global_avgpool",
            Op::Flatten => "flatten",
            Op::Reshape { .. } => "reshape",
            Op::Concat { .. } => "concat",
            Op::Add => "add",
            Op::Mul => "mul",
            Op::Dropout { .. } => "dropout",
            Op::Embedding { .. } => "embedding",
            Op::Rnn {
                cell: Cell::Lstm, ..
            } => "lstm",
            Op::Rnn { .. } => "gru",
        }
    }

    /// Number of inputs the op takes.
    pub fn arity(&self) -> std::ops::RangeInclusive<usize> {
        match self {
            Op::MatMul | Op::Add | Op::Mul => 2..=2,
            Op::Concat { .. } => 2..=usize::MAX,
            _ => 1..=1,
        }
    }

    /// The trainable parameter tensors, in the order PyTorch lists them.
    pub fn params(&self) -> Vec<Param> {
        match *self {
            Op::Linear {
                in_features,
                out_features,
                bias,
            } => {
                let mut p = vec![Param::new("weight", &[out_features, in_features])];
                if bias {
                    p.push(Param::new("bias", &[out_features]));
                }
                p
            }
            Op::Conv {
                in_channels,
                out_channels,
                ref window,
                groups,
                bias,
            } => {
                let mut shape = vec![out_channels, in_channels / groups];
                shape.extend(&window.kernel);
                let mut p = vec![Param::new("weight", &shape)];
                if bias {
                    p.push(Param::new("bias", &[out_channels]));
                }
                p
            }
            Op::BatchNorm { features } | Op::LayerNorm { features } => vec![
                Param::new("weight", &[features]),
                Param::new("bias", &[features]),
            ],
            Op::Embedding { vocab, dim } => vec![Param::new("weight", &[vocab, dim])],
            Op::Rnn {
                cell,
                input_size,
                hidden,
                bidirectional,
                bias,
            } => {
                let g = cell.gates() * hidden;
                let dirs: &[&str] = if bidirectional {
                    &["", "_reverse"]
                } else {
                    &[""]
                };
                let mut p = Vec::new();
                for d in dirs {
                    p.push(Param::new(format!("weight_ih{d}"), &[g, input_size]));
                    p.push(Param::new(format!("weight_hh{d}"), &[g, hidden]));
                    match bias {
                        RnnBias::Single => p.push(Param::new(format!("bias{d}"), &[g])),
                        RnnBias::Double => {
                            p.push(Param::new(format!("bias_ih{d}"), &[g]));
                            p.push(Param::new(format!("bias_hh{d}"), &[g]));
                        }
                    }
                }
                p
            }
            _ => Vec::new(),
        }
    }

    /// Scalars held as non-trainable state (BatchNorm's running mean and variance).
    pub fn buffer_elements(&self) -> u64 {
        match *self {
            Op::BatchNorm { features } => 2 * features as u64,
            _ => 0,
        }
    }

    /// Total trainable scalars.
    pub fn param_count(&self) -> u64 {
        self.params().iter().map(Param::elements).sum()
    }

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
                in_channels,
                out_channels,
                window,
                groups,
                ..
            } => {
                let spatial = spatial_dims(x, window.spatial(), "conv")?;
                expect_dim(x, 0, *in_channels, "input channels")?;
                if *groups == 0 || in_channels % groups != 0 || out_channels % groups != 0 {
                    return Err(ShapeError(format!(
                        "groups {groups} must divide in_channels {in_channels} and out_channels {out_channels}"
                    )));
                }
                let mut out = vec![Dim::Fixed(*out_channels)];
                out.extend(window.output(&spatial)?.into_iter().map(Dim::Fixed));
                Ok(Shape(out))
            }
            Op::BatchNorm { features } => {
                expect_dim(x, 0, *features, "channels")?;
                Ok(x.clone())
            }
            Op::LayerNorm { features } => {
                expect_last(x, *features, "normalized size")?;
                Ok(x.clone())
            }
            Op::Relu
            | Op::ClippedRelu { .. }
            | Op::Gelu
            | Op::Tanh
            | Op::Sigmoid
            | Op::Dropout { .. } => Ok(x.clone()),
            Op::Softmax { axis } => {
                sample_axis(x, *axis)?;
                Ok(x.clone())
            }
            Op::Pool { window, .. } => {
                let spatial = spatial_dims(x, window.spatial(), "pool")?;
                let mut out = vec![x.0[0]];
                out.extend(window.output(&spatial)?.into_iter().map(Dim::Fixed));
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
            Op::Add | Op::Mul => broadcast(x, inputs[1]),
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
                if x.rank() != 2 {
                    return Err(ShapeError(format!(
                        "needs a sequence [B, T, features], got {x}"
                    )));
                }
                expect_last(x, *input_size, "input_size")?;
                let dirs = if *bidirectional { 2 } else { 1 };
                Ok(Shape(vec![x.0[0], Dim::Fixed(hidden * dirs)]))
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

/// The spatial sizes of `[C, spatial...]`, checking the rank.
fn spatial_dims(x: &Shape, spatial: usize, what: &str) -> Result<Vec<usize>, ShapeError> {
    if x.rank() != spatial + 1 {
        return Err(ShapeError(format!(
            "{what} over {spatial} spatial dimension(s) needs an input of rank {} per sample ([B, C, ...]), got {x}",
            spatial + 1
        )));
    }
    x.0[1..]
        .iter()
        .map(|d| {
            d.fixed().ok_or_else(|| {
                ShapeError(format!(
                    "{what} over a symbolic sequence length is not supported"
                ))
            })
        })
        .collect()
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
    let total = x
        .all_fixed()
        .ok_or_else(|| {
            ShapeError(format!(
                "cannot reshape {x}: the sequence length T is symbolic"
            ))
        })?
        .iter()
        .product::<usize>();
    let mut out = Vec::with_capacity(shape.len());
    let mut infer_at = None;
    for (i, &s) in shape.iter().enumerate() {
        match s {
            -1 if infer_at.is_none() => {
                infer_at = Some(i);
                out.push(1);
            }
            0 => out.push(x.0.get(i).and_then(|d| d.fixed()).ok_or_else(|| {
                ShapeError(format!("reshape copies dimension {} that {x} lacks", i + 1))
            })?),
            s if s > 0 => out.push(s as usize),
            _ => return Err(ShapeError(format!("bad reshape target {shape:?}"))),
        }
    }
    let known: usize = out.iter().product();
    if let Some(i) = infer_at {
        if known == 0 || total % known != 0 {
            return Err(ShapeError(format!("cannot reshape {x} to {shape:?}")));
        }
        out[i] = total / known;
    } else if known != total {
        return Err(ShapeError(format!(
            "cannot reshape {x} ({total} elements per sample) to {shape:?}"
        )));
    }
    Ok(Shape::fixed(&out))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conv_output_and_params() {
        let op = Op::Conv {
            in_channels: 26,
            out_channels: 26,
            window: Window::square(2, 3, 1, 1),
            groups: 1,
            bias: true,
        };
        let out = op.infer(&[&Shape::fixed(&[26, 9, 9])]).unwrap();
        assert_eq!(out, Shape::fixed(&[26, 9, 9]));
        assert_eq!(op.param_count(), 26 * 26 * 9 + 26);
    }

    #[test]
    fn same_padding_matches_onnx_same_upper() {
        // 9 with kernel 3 stride 3: out 3, no padding needed.
        assert_eq!(Window::same(&[9], &[3], &[3]), vec![[0, 0]]);
        // 10 with kernel 3 stride 2: out 5, total pad 1, extra at the end.
        assert_eq!(Window::same(&[10], &[3], &[2]), vec![[0, 1]]);
    }

    #[test]
    fn lstm_with_single_bias_counts_like_tensorflow() {
        let op = Op::Rnn {
            cell: Cell::Lstm,
            input_size: 2048,
            hidden: 1024,
            bidirectional: true,
            bias: RnnBias::Single,
        };
        assert_eq!(op.param_count(), 2 * (4 * 1024 * (2048 + 1024) + 4 * 1024));
        let out = op.infer(&[&Shape(vec![Dim::Seq, Dim::Fixed(2048)])]);
        assert_eq!(out.unwrap(), Shape(vec![Dim::Seq, Dim::Fixed(2048)]));
    }

    #[test]
    fn reshape_infers_minus_one_and_rejects_bad_sizes() {
        let x = Shape::fixed(&[26, 3, 3]);
        assert_eq!(
            reshape(&x, &[-1]).unwrap().to_string(),
            "[B, 234]".to_string()
        );
        assert!(reshape(&x, &[100]).is_err());
    }

    #[test]
    fn linear_rejects_wrong_input_width() {
        let op = Op::Linear {
            in_features: 10,
            out_features: 2,
            bias: true,
        };
        let err = op.infer(&[&Shape::fixed(&[11])]).unwrap_err();
        assert!(err.to_string().contains("in_features is 10"), "{err}");
    }
}
