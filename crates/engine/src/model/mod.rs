//! A batchfit graph as a trainable burn program.
//!
//! Parameters live in one burn [`Module`](burn::module::Module) ([`Params`],
//! grouped by rank so the optimizer sees ordinary tensors); the graph's nodes
//! become a list of kernels that read them. Every activation is kept as a
//! rank-2 tensor `[B, elements of one sample]` beside its logical sample shape,
//! and reshaped to the rank an op needs (a view in burn): elementwise ops then
//! work on any shape, and the batch stays the leading dimension throughout. The
//! one exception is a convolution of a batch input, whose output stays in the
//! layout its matrix product makes ([`Value::ConvRows`]) through element-wise
//! ops and pooling. On the CPU, LSTMs run as one fused op ([`crate::cpu::recurrent::lstm`]).
//!
//! Parameters start from the graph's trained values when its nodes carry them
//! ([`Node::weights`](batchfit_graph::Node::weights), read from an ONNX file)
//! and [`Init::FromGraph`] is asked for; otherwise, and for nodes without
//! values, they are drawn as PyTorch's default initialisation would. Their
//! shapes come from [`Op::params`](batchfit_graph::Op::params), the one place
//! that knows them.
//!
//! The files: `compile` turns the graph into a [`Program`], `params` makes its
//! parameters, `forward` runs it (a dispatch into one file per op family:
//! `conv`, `pool`, `dense`, `recurrent`, `norm`, `elementwise`, `reshape`) and
//! `loss` scores it.

mod compile;
mod conv;
mod dense;
mod elementwise;
mod forward;
mod kernel;
mod loss;
mod norm;
mod params;
mod pool;
mod recurrent;
mod reshape;
mod unsupported;

pub use compile::{Program, Unsupported, check_trainable, check_trainable_on_gpu};
pub use params::{Init, Params};

use burn::tensor::{Device, Int, Tensor};

/// A value flowing through the graph.
#[derive(Clone, Debug)]
pub enum Value {
    /// `[B, elements]` with the logical sample shape.
    Float(Tensor<2>),
    /// A convolution's output in the layout the im2col product makes it in;
    /// element-wise ops and average pooling keep it, every other op reads it as
    /// [`Value::Float`].
    ConvRows(ConvRows),
    /// Token ids `[B, T]`.
    Tokens(Tensor<2, Int>),
}

/// `[chunks · C · samples per chunk, spatial]`: one row of spatial values per
/// (chunk, channel, sample of the chunk), as the chunked im2col product leaves
/// them. Turning it into NCHW is a copy, which element-wise ops and pooling can
/// do without: they work on rows, and pooling shrinks the rows first.
#[derive(Clone, Debug)]
pub struct ConvRows {
    rows: Tensor<2>,
    chunks: usize,
    channels: usize,
    per_chunk: usize,
}

impl ConvRows {
    fn device(&self) -> Device {
        self.rows.device()
    }

    fn map(self, f: impl FnOnce(Tensor<2>) -> Tensor<2>) -> ConvRows {
        ConvRows {
            rows: f(self.rows),
            ..self
        }
    }

    /// `[B, C · spatial]` in NCHW order.
    fn canonical(self) -> Tensor<2> {
        let spatial = self.rows.dims()[1];
        let (c, per) = (self.channels, self.per_chunk);
        if crate::cpu::tensor::available(&self.rows) {
            // The same swap as one parallel copy each way (burn's: a serial one).
            let chunked = self.rows.reshape([self.chunks, c * per * spatial]);
            return crate::cpu::view::permute_cpu(chunked, &[c, per, spatial], &[1, 0, 2])
                .expect("a CPU tensor")
                .reshape([self.chunks * per, c * spatial]);
        }
        self.rows
            .reshape([self.chunks, self.channels, self.per_chunk, spatial])
            .swap_dims(1, 2)
            .reshape([self.chunks * self.per_chunk, self.channels * spatial])
    }
}

/// Targets of a batch.
// One per batch, beside tensors far larger than the enum: boxing buys nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Target {
    /// Regression target `[B, elements]`.
    Dense(Tensor<2>),
    /// One-hot classes `[B x frames, classes]`.
    OneHot(Tensor<2>),
    /// CTC label sequences `[B, L]` with their lengths.
    Ctc {
        /// Label ids `[B, L]`.
        labels: Tensor<2, Int>,
        /// The length of each sample's label sequence `[B]`.
        label_lengths: Tensor<1, Int>,
    },
}

/// One batch: a value per graph input, and the target.
#[derive(Clone, Debug)]
pub struct Batch {
    /// One value per graph input, in the graph's order.
    pub inputs: Vec<Value>,
    /// What the loss compares the output with.
    pub target: Target,
    /// Samples in the batch.
    pub size: usize,
}

impl Batch {
    /// The same batch on `device` (to feed two devices identical values).
    pub fn to_device(&self, device: &Device) -> Batch {
        let target = match &self.target {
            Target::Dense(t) => Target::Dense(t.clone().to_device(device)),
            Target::OneHot(t) => Target::OneHot(t.clone().to_device(device)),
            Target::Ctc {
                labels,
                label_lengths,
            } => Target::Ctc {
                labels: labels.clone().to_device(device),
                label_lengths: label_lengths.clone().to_device(device),
            },
        };
        Batch {
            inputs: self.inputs.iter().map(|v| v.to_device(device)).collect(),
            target,
            size: self.size,
        }
    }
}

impl Value {
    fn to_device(&self, device: &Device) -> Value {
        match self {
            Value::Float(t) => Value::Float(t.clone().to_device(device)),
            Value::Tokens(t) => Value::Tokens(t.clone().to_device(device)),
            Value::ConvRows(r) => Value::ConvRows(r.clone().map(|t| t.to_device(device))),
        }
    }
}

/// A value as `[B, elements]` in the logical (NCHW) layout.
fn float(v: Value) -> Tensor<2> {
    match v {
        Value::Float(t) => t,
        Value::ConvRows(r) => r.canonical(),
        Value::Tokens(_) => unreachable!("token ids feed only an embedding"),
    }
}

fn prod(d: &[usize]) -> usize {
    d.iter().product()
}

#[cfg(test)]
pub(crate) mod tests {
    use burn::tensor::Tensor;

    /// The largest difference of `a` from `b`, relative to `b`'s largest magnitude.
    pub(crate) fn max_rel_err<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> f32 {
        let scale = b.clone().abs().max().into_scalar::<f32>().max(1e-6);
        (a - b).abs().max().into_scalar::<f32>() / scale
    }
}
