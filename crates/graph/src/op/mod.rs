//! Op kinds, their attributes, the parameters they own and (in `infer`) how
//! they map input shapes to an output shape. This module is the one place that
//! knows an op's parameters; what its backward pass keeps lives in `batchfit-plan`.

use serde::Serialize;

mod constants;
mod infer;

pub use infer::{ShapeError, sample_axis};

/// Max or average pooling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolKind {
    Max,
    Avg,
}

/// How [`Op::Resize`] interpolates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ResizeMode {
    Nearest,
    Linear,
    Cubic,
}

/// How [`Op::Reduce`] combines the values along its axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ReduceKind {
    Sum,
    Mean,
    Max,
    /// The Euclidean norm, `sqrt(sum(x^2))` (`torch.norm`, ONNX `ReduceL2`).
    L2,
}

/// Recurrent cell type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Cell {
    Lstm,
    Gru,
    /// The plain (Elman) cell `h_t = tanh(x W_ih + b_ih + h_{t-1} W_hh + b_hh)`
    /// (`nn.RNN`'s default).
    #[serde(rename = "rnn_tanh")]
    RnnTanh,
    /// The plain cell with ReLU (`nn.RNN(nonlinearity="relu")`, DeepSpeech).
    #[serde(rename = "rnn_relu")]
    RnnRelu,
}

impl Cell {
    /// Gates per cell: 4 for LSTM (i, f, g, o), 3 for GRU (r, z, n), 1 for the plain cell.
    pub fn gates(self) -> usize {
        match self {
            Cell::Lstm => 4,
            Cell::Gru => 3,
            Cell::RnnTanh | Cell::RnnRelu => 1,
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

/// Weight standardisation (timm's `StdConv2d` and `ScaledStdConv2d`: BiT, NFNet, the
/// ResNet stems of hybrid ViTs): each output channel's weights are normalised over
/// its fan-in before the convolution, `w' = (w - mean) / sqrt(var + eps) · gain · scale`
/// with the biased variance, and the gradient flows through it to the raw weight.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Standardize {
    pub eps: f32,
    /// A learned gain per output channel (the parameter `gain`, after the bias).
    pub gain: bool,
    /// A constant factor on every output channel (NFNet's `gamma / sqrt(fan_in)`).
    pub scale: f32,
}

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
    /// 1-d, 2-d or 3-d convolution over `[C, L]`, `[C, H, W]` or `[C, D, H, W]`.
    Conv {
        in_channels: usize,
        out_channels: usize,
        window: Window,
        groups: usize,
        bias: bool,
        /// The weight standardised before it convolves, every step (BiT's and NFNet's
        /// convolutions); `None` for a plain one.
        #[serde(skip_serializing_if = "Option::is_none")]
        standardize: Option<Standardize>,
    },
    /// The transpose of a 1-d, 2-d or 3-d convolution (`nn.ConvTranspose2d`, ONNX
    /// `ConvTranspose`): each input position spreads the kernel over outputs `stride`
    /// apart, `window.padding` crops the output and `output_padding` adds to its end:
    /// `out = (in - 1) stride - pads + dilation (kernel - 1) + output_padding + 1`.
    /// Weight `[in_channels, out_channels / groups, kernel...]`. Axes before the
    /// channels are more batch (a batch merged with separated sources).
    ConvTranspose {
        in_channels: usize,
        out_channels: usize,
        window: Window,
        output_padding: Vec<usize>,
        groups: usize,
        bias: bool,
    },
    /// Batch normalisation over the channel dimension (axis 1).
    BatchNorm {
        features: usize,
    },
    /// Instance normalisation: each channel of each sample normalised over its spatial
    /// positions (ONNX `InstanceNormalization`; GroupNorm exports as one over `[G, ...]`
    /// between reshapes), with a per-channel scale and shift when `affine`.
    InstanceNorm {
        channels: usize,
        affine: bool,
    },
    /// Layer normalisation over the last dimension.
    LayerNorm {
        features: usize,
    },
    /// Root-mean-square normalisation over the last dimension with a learned scale and no
    /// shift (`x / sqrt(mean(x^2) + eps) * g`: T5, LLaMA; ONNX `RMSNormalization`).
    RmsNorm {
        features: usize,
    },
    Relu,
    /// `min(max(x, min), max)`, a missing bound the largest finite float (JSON, which
    /// carries the graph to a worker, has no infinity): DeepSpeech's ReLU clipped
    /// at 20 (`min` 0), `F.normalize`'s norm kept from zero (`clamp_min(eps)`).
    Clamp {
        min: f32,
        max: f32,
    },
    /// `x` where positive, else `alpha x` (CSP networks, YOLO, GAN discriminators).
    LeakyRelu {
        alpha: f32,
    },
    /// `x` where positive, else `a x` for a learned slope `a` of `shape`, broadcast as
    /// [`Op::AddParam`]'s (`nn.PReLU`: one slope, or one per channel as `[C, 1, 1]`).
    PRelu {
        shape: Vec<usize>,
    },
    Gelu,
    Tanh,
    Sigmoid,
    /// `e^x` (a learned log-scale made positive: Swin V2's logit scale).
    Exp,
    /// `clamp(alpha x + beta, 0, 1)` (ONNX HardSigmoid; PyTorch's Hardsigmoid is alpha 1/6,
    /// beta 1/2).
    HardSigmoid {
        alpha: f32,
        beta: f32,
    },
    /// `x * clamp(x / 6 + 1/2, 0, 1)` (MobileNetV3's hard swish).
    HardSwish,
    /// `x * factor` for a constant scalar (a `Mul` or `Div` by a scalar constant, a `Mean`
    /// of several tensors).
    Scale {
        factor: f32,
    },
    /// Local response normalisation across channels (AlexNet, GoogLeNet v1):
    /// `x / (bias + alpha / size * sum of x^2 over size neighbouring channels)^beta`.
    Lrn {
        size: usize,
        alpha: f32,
        beta: f32,
        bias: f32,
    },
    /// Elements `start..end` of sample axis `axis` (negative counts from the end); indexing
    /// (`y[:, -1]`, a CLS token) is a slice of length 1 and a reshape.
    Slice {
        axis: i64,
        start: usize,
        end: usize,
    },
    /// Sum, mean or max over sample axes, keeping them with size 1 or dropping them.
    Reduce {
        reduce: ReduceKind,
        axes: Vec<i64>,
        keep_dims: bool,
    },
    /// Sample axes reordered: output axis `k` is sample axis `perm[k]` of the input (the
    /// batch stays first). Attention's head split, `[T, heads, d]` to `[heads, T, d]`.
    Transpose {
        perm: Vec<usize>,
    },
    /// `x + p` for a learned tensor `p` of `shape`, broadcast against the sample from the
    /// right (a learned positional embedding, `nn.Parameter(torch.zeros(1, T, d))`).
    AddParam {
        shape: Vec<usize>,
    },
    /// `x + t[index]` for a learned table `t` of `table` numbers read at constant indices,
    /// shaped `shape` and broadcast as [`Op::AddParam`]'s: position embeddings looked up at
    /// the position ids, a relative position bias (Swin, CoAtNet). Built by the ONNX import
    /// where a parameter reaches an activation through `Gather`/`Slice`/`Reshape`/...
    AddTable {
        shape: Vec<usize>,
        table: usize,
        index: Vec<usize>,
    },
    /// `x * p` for a learned tensor `p` of `shape`, broadcast as [`Op::AddParam`]'s (a layer
    /// scale: ConvNeXt's `gamma [C, 1, 1]`, timm's `LayerScale`).
    MulParam {
        shape: Vec<usize>,
    },
    /// A learned tensor of `shape`, the same for every sample, concatenated with the input
    /// along `axis`, before it (`first`) or after: ViT's class token
    /// (`torch.cat((cls_token.expand(B, -1, -1), x), dim=1)`).
    ConcatParam {
        axis: i64,
        shape: Vec<usize>,
        first: bool,
    },
    /// A learned tensor of `shape`, the same for every sample, repeated over the batch of
    /// its input (whose values it does not read): an attention pool's latent query
    /// (`latent.expand(B, -1, -1)` read by a linear layer: SigLIP's MAP head).
    BroadcastParam {
        shape: Vec<usize>,
    },
    /// A learned tensor of `shape` computed on before it meets the batch (Swin V2's
    /// `logit_scale.clamp(max=log 100).exp()`). Its output is shared
    /// ([`crate::Node::shared`]); its input, any model input, is not read.
    Parameter {
        shape: Vec<usize>,
    },
    /// A constant tensor of `shape` (row-major `values`), the same in every step and not
    /// trained: the relative coordinates a relative-position MLP reads. Its output is
    /// shared ([`crate::Node::shared`]); its input, any model input, is not read.
    Constant {
        shape: Vec<usize>,
        #[serde(skip)]
        values: Vec<f32>,
    },
    /// Elements gathered along axis `axis` (0 is the batch) at constant `indices` (ONNX `Gather`
    /// with a constant rank-1 index): a relative-position table read at the index of
    /// every pair of positions.
    Take {
        axis: i64,
        indices: Vec<usize>,
    },
    /// A causal attention mask over the last two axes `[.., T, T]`: entries above the
    /// diagonal become -inf (`scores + generate_square_subsequent_mask(T)`, `is_causal`).
    CausalMask,
    /// `x + c` for a constant `c` of `shape` (row-major `values`), broadcast against the
    /// sample by numpy's rules without enlarging it, and not trained: an attention mask
    /// built from constants (Swin's shifted windows).
    AddConst {
        shape: Vec<usize>,
        #[serde(skip)]
        values: Vec<f32>,
    },
    /// `x * c` for a constant `c` of `shape`, broadcast as [`Op::AddConst`]'s and not
    /// trained: a rotary position embedding's cosines and sines (LLaMA, GPT-NeoX).
    MulConst {
        shape: Vec<usize>,
        #[serde(skip)]
        values: Vec<f32>,
    },
    /// Softmax along `axis` (negative counts from the end).
    Softmax {
        axis: i64,
    },
    /// Max or average pooling over the spatial dimensions.
    Pool {
        pool: PoolKind,
        window: Window,
    },
    /// The spatial dimensions of `[C, spatial...]` resized to `size` (ONNX `Resize` and
    /// `Upsample`, `F.interpolate`): `align_corners` maps the corner pixels onto each other,
    /// else pixel centres (half-pixel; nearest takes the floor, as PyTorch).
    Resize {
        size: Vec<usize>,
        mode: ResizeMode,
        align_corners: bool,
    },
    /// Pooling over all spatial dimensions to size 1.
    GlobalPool {
        pool: PoolKind,
    },
    /// `value` (zero unless given) added before and after each sample axis (`F.pad`, ONNX
    /// `Pad` in constant mode; EfficientViT's linear attention pads with ones): one
    /// `[before, after]` per sample axis.
    Pad {
        pads: Vec<[usize; 2]>,
        #[serde(skip_serializing_if = "is_zero")]
        value: f32,
    },
    /// Each sample repeated along its axes of size 1 to `shape` (ONNX `Expand`,
    /// `x.expand(...)` read by an op that does not broadcast: BoTNet's relative
    /// logits, a decoder's grouped keys): numpy broadcasting from the right, 1 where
    /// an axis keeps its size.
    Expand {
        shape: Vec<usize>,
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
    /// Element-wise quotient with broadcasting (ConvNeXt V2's `Gx / Gx.mean()`, an
    /// L2-normalised embedding).
    Div,
    /// Dropout with drop probability `p`.
    Dropout {
        p: f32,
    },
    /// Stochastic depth: while training, the whole sample is zeroed with probability `p`
    /// and kept ones are scaled by `1 / (1 - p)` (torchvision's `StochasticDepth`, "row").
    DropPath {
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

fn is_zero(v: &f32) -> bool {
    *v == 0.0
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
    "conv3d",
    "conv_transpose",
    "batchnorm",
    "layernorm",
    "rmsnorm",
    "instance_norm",
    "relu",
    "clipped_relu",
    "leaky_relu",
    "prelu",
    "gelu",
    "tanh",
    "sigmoid",
    "hardsigmoid",
    "hardswish",
    "scale",
    "lrn",
    "slice",
    "reduce_sum",
    "reduce_mean",
    "reduce_max",
    "reduce_l2",
    "transpose",
    "add_param",
    "mul_param",
    "add_table",
    "causal_mask",
    "add_const",
    "mul_const",
    "concat_param",
    "softmax",
    "maxpool",
    "avgpool",
    "resize",
    "global_maxpool",
    "global_avgpool",
    "pad",
    "flatten",
    "reshape",
    "concat",
    "add",
    "mul",
    "div",
    "dropout",
    "drop_path",
    "embedding",
    "lstm",
    "gru",
    "rnn",
];

impl Op {
    /// Whether the op applies one function to each element of one tensor (the
    /// ReLU family, GELU, tanh, the sigmoids, a fixed scale), so that it computes
    /// the same on any layout of its input.
    pub fn is_activation(&self) -> bool {
        matches!(
            self,
            Op::Relu
                | Op::Clamp { .. }
                | Op::LeakyRelu { .. }
                | Op::Gelu
                | Op::Tanh
                | Op::Sigmoid
                | Op::Exp
                | Op::HardSigmoid { .. }
                | Op::HardSwish
                | Op::Scale { .. }
        )
    }

    /// A short lower-case name (`conv2d`, `lstm`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Op::Linear { .. } => "linear",
            Op::MatMul => "matmul",
            Op::Conv { window, .. } if window.spatial() == 1 => "conv1d",
            Op::Conv { window, .. } if window.spatial() == 2 => "conv2d",
            Op::Conv { .. } => "conv3d",
            Op::ConvTranspose { .. } => "conv_transpose",
            Op::BatchNorm { .. } => "batchnorm",
            Op::InstanceNorm { .. } => "instance_norm",
            Op::LayerNorm { .. } => "layernorm",
            Op::RmsNorm { .. } => "rmsnorm",
            Op::Relu => "relu",
            Op::Clamp { min, .. } if *min == 0.0 => "clipped_relu",
            Op::Clamp { .. } => "clamp",
            Op::LeakyRelu { .. } => "leaky_relu",
            Op::PRelu { .. } => "prelu",
            Op::Gelu => "gelu",
            Op::Tanh => "tanh",
            Op::Sigmoid => "sigmoid",
            Op::Exp => "exp",
            Op::HardSigmoid { .. } => "hardsigmoid",
            Op::HardSwish => "hardswish",
            Op::Scale { .. } => "scale",
            Op::Lrn { .. } => "lrn",
            Op::Slice { .. } => "slice",
            Op::Reduce {
                reduce: ReduceKind::Sum,
                ..
            } => "reduce_sum",
            Op::Reduce {
                reduce: ReduceKind::Mean,
                ..
            } => "reduce_mean",
            Op::Reduce {
                reduce: ReduceKind::L2,
                ..
            } => "reduce_l2",
            Op::Reduce { .. } => "reduce_max",
            Op::Transpose { .. } => "transpose",
            Op::AddParam { .. } => "add_param",
            Op::Resize { .. } => "resize",
            Op::Pad { .. } => "pad",
            Op::Expand { .. } => "expand",
            Op::MulParam { .. } => "mul_param",
            Op::AddTable { .. } => "add_table",
            Op::CausalMask => "causal_mask",
            Op::AddConst { .. } => "add_const",
            Op::MulConst { .. } => "mul_const",
            Op::ConcatParam { .. } => "concat_param",
            Op::BroadcastParam { .. } => "broadcast_param",
            Op::Constant { .. } => "constant",
            Op::Parameter { .. } => "parameter",
            Op::Take { .. } => "take",
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
            Op::Div => "div",
            Op::Dropout { .. } => "dropout",
            Op::DropPath { .. } => "drop_path",
            Op::Embedding { .. } => "embedding",
            Op::Rnn {
                cell: Cell::Lstm, ..
            } => "lstm",
            Op::Rnn {
                cell: Cell::Gru, ..
            } => "gru",
            Op::Rnn { .. } => "rnn",
        }
    }

    /// Number of inputs the op takes.
    pub fn arity(&self) -> std::ops::RangeInclusive<usize> {
        match self {
            Op::MatMul | Op::Add | Op::Mul | Op::Div => 2..=2,
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
                ref standardize,
            } => {
                let mut shape = vec![out_channels, in_channels / groups];
                shape.extend(&window.kernel);
                let mut p = vec![Param::new("weight", &shape)];
                if bias {
                    p.push(Param::new("bias", &[out_channels]));
                }
                if standardize.as_ref().is_some_and(|s| s.gain) {
                    p.push(Param::new("gain", &[out_channels]));
                }
                p
            }
            Op::ConvTranspose {
                in_channels,
                out_channels,
                ref window,
                groups,
                bias,
                ..
            } => {
                let mut shape = vec![in_channels, out_channels / groups];
                shape.extend(&window.kernel);
                let mut p = vec![Param::new("weight", &shape)];
                if bias {
                    p.push(Param::new("bias", &[out_channels]));
                }
                p
            }
            Op::InstanceNorm {
                channels,
                affine: true,
            } => vec![
                Param::new("weight", &[channels]),
                Param::new("bias", &[channels]),
            ],
            Op::BatchNorm { features } | Op::LayerNorm { features } => vec![
                Param::new("weight", &[features]),
                Param::new("bias", &[features]),
            ],
            Op::RmsNorm { features } => vec![Param::new("weight", &[features])],
            Op::Embedding { vocab, dim } => vec![Param::new("weight", &[vocab, dim])],
            Op::AddParam { ref shape }
            | Op::MulParam { ref shape }
            | Op::PRelu { ref shape }
            | Op::ConcatParam { ref shape, .. }
            | Op::BroadcastParam { ref shape }
            | Op::Parameter { ref shape } => {
                vec![Param::new("weight", shape)]
            }
            Op::AddTable { table, .. } => vec![Param::new("weight", &[table])],
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shape::{Dim, Shape};

    #[test]
    fn conv_output_and_params() {
        let op = Op::Conv {
            in_channels: 26,
            out_channels: 26,
            window: Window::square(2, 3, 1, 1),
            groups: 1,
            bias: true,
            standardize: None,
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
