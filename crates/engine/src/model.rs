//! A batchfit graph as a trainable burn program.
//!
//! Parameters live in one burn [`Module`] ([`Params`], grouped by rank so the
//! optimizer sees ordinary tensors); the graph's nodes become a list of
//! [`Kernel`]s that read them. Every activation is kept as a rank-2 tensor
//! `[B, elements of one sample]` beside its logical sample shape, and reshaped
//! to the rank an op needs (a view in burn): elementwise ops then work on any
//! shape, and the batch stays the leading dimension throughout. The one
//! exception is a convolution of a batch input, whose output stays in the
//! layout its matrix product makes ([`Value::ConvRows`]) through element-wise
//! ops and pooling. On the CPU, LSTMs run as one fused op ([`crate::lstm`]).
//!
//! Parameters start from the graph's trained values when its nodes carry them
//! ([`Node::weights`], read from an ONNX file) and [`Init::FromGraph`] is
//! asked for; otherwise, and for nodes without values, they are drawn as
//! PyTorch's default initialisation would.

#[cfg(test)]
use crate::im2col::im2col_host;
use crate::im2col::{conv_product_cpu, im2col_views};
use batchfit_graph::{Cell, Graph, LossKind, Node, Op, PoolKind, RnnBias, Window};
use batchfit_plan::rules::{POOL_MATRIX_MAX, im2col_chunks};
use burn::module::{Module, Param};
use burn::nn::loss::{CTCLossConfig, Reduction};
use burn::tensor::activation::{gelu, log_softmax, relu, sigmoid, softmax, tanh};
use burn::tensor::module::{
    avg_pool1d, avg_pool2d, conv1d, conv2d, embedding, max_pool1d, max_pool2d,
};
use burn::tensor::ops::{AvgPoolOptions, ConvOptions, MaxPoolOptions};
use burn::tensor::{Device, Distribution, Int, Tensor, TensorData};

/// Every trainable tensor of the model, grouped by rank.
#[derive(Module, Debug)]
pub struct Params {
    pub r1: Vec<Param<Tensor<1>>>,
    pub r2: Vec<Param<Tensor<2>>>,
    pub r3: Vec<Param<Tensor<3>>>,
    pub r4: Vec<Param<Tensor<4>>>,
}

/// Index of a parameter in [`Params`].
#[derive(Clone, Copy, Debug)]
enum P {
    R1(usize),
    R2(usize),
    R3(usize),
    R4(usize),
}

impl Params {
    fn t1(&self, p: P) -> Tensor<1> {
        match p {
            P::R1(i) => self.r1[i].val(),
            _ => unreachable!("rank-1 parameter expected"),
        }
    }
    fn t2(&self, p: P) -> Tensor<2> {
        match p {
            P::R2(i) => self.r2[i].val(),
            _ => unreachable!("rank-2 parameter expected"),
        }
    }
    fn t3(&self, p: P) -> Tensor<3> {
        match p {
            P::R3(i) => self.r3[i].val(),
            _ => unreachable!("rank-3 parameter expected"),
        }
    }
    fn t4(&self, p: P) -> Tensor<4> {
        match p {
            P::R4(i) => self.r4[i].val(),
            _ => unreachable!("rank-4 parameter expected"),
        }
    }

    fn push(&mut self, shape: &[usize], fan_in: usize, device: &Device) -> P {
        // PyTorch's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
        let k = 1.0 / (fan_in.max(1) as f64).sqrt();
        let dist = Distribution::Uniform(-k, k);
        match *shape {
            [a] => {
                self.r1
                    .push(Param::from_tensor(Tensor::random([a], dist, device)));
                P::R1(self.r1.len() - 1)
            }
            [a, b] => {
                self.r2
                    .push(Param::from_tensor(Tensor::random([a, b], dist, device)));
                P::R2(self.r2.len() - 1)
            }
            [a, b, c] => {
                self.r3
                    .push(Param::from_tensor(Tensor::random([a, b, c], dist, device)));
                P::R3(self.r3.len() - 1)
            }
            [a, b, c, d] => {
                self.r4.push(Param::from_tensor(Tensor::random(
                    [a, b, c, d],
                    dist,
                    device,
                )));
                P::R4(self.r4.len() - 1)
            }
            _ => unreachable!("parameters have rank 1 to 4"),
        }
    }

    /// A parameter holding `values` (row-major, `shape.iter().product()` of them).
    fn load(&mut self, shape: &[usize], values: Vec<f32>, device: &Device) -> P {
        let data = TensorData::new(values, shape.to_vec());
        match shape.len() {
            1 => {
                self.r1
                    .push(Param::from_tensor(Tensor::from_data(data, device)));
                P::R1(self.r1.len() - 1)
            }
            2 => {
                self.r2
                    .push(Param::from_tensor(Tensor::from_data(data, device)));
                P::R2(self.r2.len() - 1)
            }
            3 => {
                self.r3
                    .push(Param::from_tensor(Tensor::from_data(data, device)));
                P::R3(self.r3.len() - 1)
            }
            4 => {
                self.r4
                    .push(Param::from_tensor(Tensor::from_data(data, device)));
                P::R4(self.r4.len() - 1)
            }
            _ => unreachable!("parameters have rank 1 to 4"),
        }
    }

    fn constant(&mut self, len: usize, value: f32, device: &Device) -> P {
        self.r1
            .push(Param::from_tensor(Tensor::full([len], value, device)));
        P::R1(self.r1.len() - 1)
    }
}

/// Where a program's parameters start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Init {
    /// From the trained values the graph's nodes carry ([`Node::weights`]);
    /// randomly for nodes without them.
    #[default]
    FromGraph,
    /// Randomly everywhere (PyTorch's default initialisation), ignoring any values.
    Random,
}

/// The trained values of one node's parameters, handed out in [`Op::params`] order.
struct Values<'a> {
    weights: Option<&'a [Vec<f32>]>,
    next: usize,
}

impl Values<'_> {
    /// The next parameter: `shape` in the engine's layout, `fan_in` for random
    /// initialisation; `transposed` when the engine stores the transpose of the
    /// IR's `[shape[1], shape[0]]` matrix.
    fn param(
        &mut self,
        params: &mut Params,
        shape: &[usize],
        fan_in: usize,
        transposed: bool,
        device: &Device,
    ) -> P {
        match self.take(shape, transposed) {
            Some(v) => params.load(shape, v, device),
            None => params.push(shape, fan_in, device),
        }
    }

    /// Like [`Values::param`] for a norm's scale or shift, `value` when there is none.
    fn constant(&mut self, params: &mut Params, len: usize, value: f32, device: &Device) -> P {
        match self.take(&[len], false) {
            Some(v) => params.load(&[len], v, device),
            None => params.constant(len, value, device),
        }
    }

    fn take(&mut self, shape: &[usize], transposed: bool) -> Option<Vec<f32>> {
        let w = &self.weights?[self.next];
        self.next += 1;
        Some(if transposed {
            transpose(w, shape[1], shape[0])
        } else {
            w.clone()
        })
    }
}

/// The transpose of a row-major `[rows, cols]` matrix.
fn transpose(v: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; v.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = v[r * cols + c];
        }
    }
    out
}

/// One node, compiled: where its inputs and parameters are.
#[derive(Clone, Debug)]
struct Kernel {
    op: Op,
    inputs: Vec<usize>,
    params: Vec<P>,
    /// Sample shape of each input, resolved.
    in_dims: Vec<Vec<usize>>,
    /// Sample shape of the output, resolved.
    out_dims: Vec<usize>,
    /// An average pool's window as a matrix (see [`avg_pool_matrix`]).
    pool_matrix: Option<Tensor<2>>,
}

/// A value flowing through the graph.
#[derive(Clone, Debug)]
pub enum Value {
    /// `[B, elements]` with the logical sample shape.
    Float(Tensor<2>),
    /// A convolution's output in the layout [`conv_im2col`] makes it in; element-wise
    /// ops and average pooling keep it, every other op reads it as [`Value::Float`].
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
    fn map(self, f: impl FnOnce(Tensor<2>) -> Tensor<2>) -> ConvRows {
        ConvRows {
            rows: f(self.rows),
            ..self
        }
    }

    /// `[B, C · spatial]` in NCHW order.
    fn canonical(self) -> Tensor<2> {
        let spatial = self.rows.dims()[1];
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
        labels: Tensor<2, Int>,
        label_lengths: Tensor<1, Int>,
    },
}

/// One batch: a value per graph input, and the target.
#[derive(Clone, Debug)]
pub struct Batch {
    pub inputs: Vec<Value>,
    pub target: Target,
    pub size: usize,
}

/// The graph compiled onto a device.
#[derive(Clone, Debug)]
pub struct Program {
    kernels: Vec<Kernel>,
    /// Slot of each graph input, then one per node.
    input_slots: usize,
    output_slot: usize,
    loss: LossKind,
    /// Sequence length, or 1 for models without one.
    pub seq_len: usize,
    pub out_dims: Vec<usize>,
}

/// Why a graph cannot be turned into a program.
#[derive(Debug, thiserror::Error)]
#[error("node `{node}`: the engine cannot train {what} yet")]
pub struct Unsupported {
    pub node: String,
    pub what: String,
}

impl Program {
    /// Compiles `graph` and creates its parameters on `device`, from the graph's
    /// trained values or randomly as `init` says.
    pub fn new(
        graph: &Graph,
        seq_len: usize,
        init: Init,
        device: &Device,
    ) -> Result<(Program, Params), Unsupported> {
        let mut params = Params {
            r1: Vec::new(),
            r2: Vec::new(),
            r3: Vec::new(),
            r4: Vec::new(),
        };
        let mut slot_of: std::collections::HashMap<&str, usize> = Default::default();
        for (i, input) in graph.inputs.iter().enumerate() {
            slot_of.insert(&input.name, i);
        }
        let mut kernels = Vec::with_capacity(graph.nodes.len());
        for (k, node) in graph.nodes.iter().enumerate() {
            let inputs: Vec<usize> = node.inputs.iter().map(|n| slot_of[n.as_str()]).collect();
            let in_dims: Vec<Vec<usize>> = node
                .inputs
                .iter()
                .map(|n| graph.shape_of(n).expect("shapes checked").resolve(seq_len))
                .collect();
            let p = compile_params(node, init, &mut params, device)?;
            let out_dims = node.shape.resolve(seq_len);
            let pool_matrix = match &node.op {
                Op::Pool {
                    pool: PoolKind::Avg,
                    window,
                } => avg_pool_matrix(&in_dims[0][1..], &out_dims[1..], window).map(|m| {
                    let shape = [m.len() / prod(&out_dims[1..]), prod(&out_dims[1..])];
                    Tensor::from_data(TensorData::new(m, shape), device)
                }),
                _ => None,
            };
            kernels.push(Kernel {
                op: node.op.clone(),
                inputs,
                params: p,
                in_dims,
                out_dims,
                pool_matrix,
            });
            slot_of.insert(&node.name, graph.inputs.len() + k);
        }
        let out = graph.output();
        Ok((
            Program {
                kernels,
                input_slots: graph.inputs.len(),
                output_slot: slot_of[out.name.as_str()],
                loss: graph.loss.kind,
                seq_len,
                out_dims: out.shape.resolve(seq_len),
            },
            params,
        ))
    }

    /// Runs the graph and returns the model output `[B, elements]`.
    pub fn forward(&self, params: &Params, batch: &Batch, train: bool) -> Tensor<2> {
        let mut slots: Vec<Option<Value>> =
            Vec::with_capacity(self.input_slots + self.kernels.len());
        slots.extend(batch.inputs.iter().cloned().map(Some));
        // Free each value after its last reader, as a framework's graph executor would.
        let mut last_use = vec![0usize; self.input_slots + self.kernels.len()];
        for (k, kernel) in self.kernels.iter().enumerate() {
            for &i in &kernel.inputs {
                last_use[i] = k;
            }
        }
        last_use[self.output_slot] = usize::MAX;
        for (k, kernel) in self.kernels.iter().enumerate() {
            let args: Vec<Value> = kernel
                .inputs
                .iter()
                .map(|&i| {
                    if last_use[i] == k
                        && kernel.inputs[..]
                            .iter()
                            .filter(|&&j| j == i)
                            .nth(1)
                            .is_none()
                    {
                        slots[i].take().expect("value computed")
                    } else {
                        slots[i].clone().expect("value computed")
                    }
                })
                .collect();
            slots.push(Some(run_kernel(kernel, params, args, batch.size, train)));
        }
        float(slots[self.output_slot].take().expect("output computed"))
    }

    /// The loss of `output` against the batch's target (a scalar tensor).
    pub fn loss(&self, output: Tensor<2>, target: &Target) -> Tensor<1> {
        let b = output.dims()[0];
        match (self.loss, target) {
            (LossKind::Mse, Target::Dense(y)) => (output - y.clone()).powi_scalar(2).mean(),
            (LossKind::CrossEntropy | LossKind::CrossEntropyPerFrame, Target::OneHot(y)) => {
                let classes = *self.out_dims.last().expect("logits have classes");
                let rows = output.dims()[0] * output.dims()[1] / classes;
                let logp = log_softmax(output.reshape([rows, classes]), 1);
                (logp * y.clone()).sum().neg().div_scalar(rows as f32)
            }
            (
                LossKind::Ctc { blank },
                Target::Ctc {
                    labels,
                    label_lengths,
                },
            ) => {
                let t = self.out_dims[0];
                let c = self.out_dims[1];
                let logp = log_softmax(output.reshape([b, t, c]).swap_dims(0, 1), 2);
                let device = logp.device();
                let input_lengths =
                    Tensor::<1, Int>::from_data(TensorData::new(vec![t as i64; b], [b]), &device);
                CTCLossConfig::new()
                    .with_blank(blank)
                    .init()
                    .forward_with_reduction(
                        logp,
                        labels.clone(),
                        input_lengths,
                        label_lengths.clone(),
                        Reduction::Mean,
                    )
            }
            _ => unreachable!("targets are made for the model's loss"),
        }
    }
}

/// Checks, without allocating anything, that the engine can train every node of `graph`.
pub fn check_trainable(graph: &Graph) -> Result<(), Unsupported> {
    for node in &graph.nodes {
        let what = match &node.op {
            Op::Conv { window, .. } if window.spatial() > 2 => Some("3-d convolution"),
            Op::Pool { window, .. } if window.spatial() > 2 => Some("3-d pooling"),
            Op::Add | Op::Mul if node.shape.rank() > 5 => {
                Some("broadcasting over more than 5 dimensions")
            }
            _ => None,
        };
        if let Some(what) = what {
            return Err(Unsupported {
                node: node.name.clone(),
                what: format!("{what} ({})", node.op.name()),
            });
        }
    }
    Ok(())
}

/// Creates the parameters of one node, in the layout the kernels use: from
/// the node's trained values (IR layout, converted) under [`Init::FromGraph`]
/// when it has them, else randomly.
fn compile_params(
    node: &Node,
    init: Init,
    params: &mut Params,
    device: &Device,
) -> Result<Vec<P>, Unsupported> {
    let unsupported = |what: &str| Unsupported {
        node: node.name.clone(),
        what: what.to_string(),
    };
    let weights = match (init, &node.weights) {
        (Init::FromGraph, Some(w)) => {
            let shapes = node.op.params();
            let fits = shapes.len() == w.len()
                && shapes
                    .iter()
                    .zip(w)
                    .all(|(p, v)| p.elements() as usize == v.len());
            if !fits {
                return Err(unsupported(
                    "trained weights that do not match its parameter shapes",
                ));
            }
            Some(w.as_slice())
        }
        _ => None,
    };
    let mut values = Values { weights, next: 0 };
    let mut param = |params: &mut Params, shape: &[usize], fan_in: usize, transposed: bool| {
        values.param(params, shape, fan_in, transposed, device)
    };
    Ok(match &node.op {
        Op::Linear {
            in_features,
            out_features,
            bias,
        } => {
            // Stored [in, out] so the forward pass is x W (burn's layout); the IR's is [out, in].
            let mut p = vec![param(
                params,
                &[*in_features, *out_features],
                *in_features,
                true,
            )];
            if *bias {
                p.push(param(params, &[*out_features], *in_features, false));
            }
            p
        }
        Op::Conv {
            in_channels,
            out_channels,
            window,
            groups,
            bias,
        } => {
            if window.spatial() > 2 {
                return Err(unsupported("3-d convolution"));
            }
            let fan_in = in_channels / groups * window.kernel_elements();
            let mut shape = vec![*out_channels, in_channels / groups];
            shape.extend(&window.kernel);
            let mut p = vec![param(params, &shape, fan_in, false)];
            if *bias {
                p.push(param(params, &[*out_channels], fan_in, false));
            }
            p
        }
        Op::BatchNorm { features } | Op::LayerNorm { features } => vec![
            values.constant(params, *features, 1.0, device),
            values.constant(params, *features, 0.0, device),
        ],
        Op::Embedding { vocab, dim } => vec![param(params, &[*vocab, *dim], 1, false)],
        Op::Rnn {
            cell,
            input_size,
            hidden,
            bidirectional,
            bias,
        } => {
            let g = cell.gates() * hidden;
            let dirs = if *bidirectional { 2 } else { 1 };
            let mut p = Vec::new();
            // Stored [in, gates * H] so each step is x W; the IR's are [gates * H, in].
            for _ in 0..dirs {
                p.push(param(params, &[*input_size, g], *hidden, true));
                p.push(param(params, &[*hidden, g], *hidden, true));
                p.push(param(params, &[g], *hidden, false));
                if *bias == RnnBias::Double {
                    p.push(param(params, &[g], *hidden, false));
                }
            }
            p
        }
        Op::Pool { window, .. } if window.spatial() > 2 => {
            return Err(unsupported("3-d pooling"));
        }
        _ => Vec::new(),
    })
}

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

/// Runs one node. Convolutions of a batch input, element-wise ops after them and
/// average pooling keep the convolution's own layout ([`Value::ConvRows`]); the
/// rest of the ops are in [`run_canonical`].
fn run_kernel(k: &Kernel, p: &Params, mut args: Vec<Value>, b: usize, train: bool) -> Value {
    let elementwise =
        |mut args: Vec<Value>, f: &dyn Fn(Tensor<2>) -> Tensor<2>| match args.remove(0) {
            Value::ConvRows(r) => Value::ConvRows(r.map(f)),
            v => Value::Float(f(float(v))),
        };
    match &k.op {
        Op::Conv { window, groups, .. }
            if *groups == 1 && window.dilation.iter().all(|&r| r == 1) =>
        {
            match args.remove(0) {
                // Only where the input needs no gradient (a graph input). For a
                // tracked input the window views' gradient (zeros, then a slice add per
                // window) is slower than burn's transposed convolution; a hand-written
                // col2im was 3-12 % faster on mnist-cnn but kept its 7.7x-the-input
                // matrix for the backward: +58-65 % peak memory, not worth it.
                Value::Float(x) if !x.is_tracked() => Value::ConvRows(conv_im2col_node(k, p, x, b)),
                x => Value::Float(run_canonical(k, p, vec![x], b, train)),
            }
        }
        Op::Relu => elementwise(args, &|t| relu(t)),
        Op::ClippedRelu { max } => elementwise(args, &|t| t.clamp(0.0, *max)),
        Op::Gelu => elementwise(args, &|t| gelu(t)),
        Op::Tanh => elementwise(args, &|t| tanh(t)),
        Op::Sigmoid => elementwise(args, &|t| sigmoid(t)),
        // One product with the window matrix, on rows of spatial values in either layout.
        Op::Pool { .. } if k.pool_matrix.is_some() => {
            let m = k.pool_matrix.clone().expect("checked");
            match args.remove(0) {
                Value::ConvRows(r) => Value::ConvRows(r.map(|rows| rows.matmul(m))),
                v => {
                    let (channels, spatial) = (k.in_dims[0][0], prod(&k.in_dims[0][1..]));
                    let rows = float(v).reshape([b * channels, spatial]).matmul(m);
                    Value::Float(rows.reshape([b, prod(&k.out_dims)]))
                }
            }
        }
        _ => Value::Float(run_canonical(k, p, args, b, train)),
    }
}

/// Ops on `[B, elements]` tensors in the graph's logical (NCHW) layout.
fn run_canonical(k: &Kernel, p: &Params, mut args: Vec<Value>, b: usize, train: bool) -> Tensor<2> {
    let out_elems = prod(&k.out_dims);
    match &k.op {
        Op::Linear {
            in_features,
            out_features,
            ..
        } => {
            let x = float(args.remove(0));
            let rows = prod(&k.in_dims[0]) / in_features;
            let mut y = x
                .reshape([b * rows, *in_features])
                .matmul(p.t2(k.params[0]));
            if let Some(&bias) = k.params.get(1) {
                y = y + p.t1(bias).unsqueeze::<2>();
            }
            y.reshape([b, rows * out_features])
        }
        Op::MatMul => {
            let (a_dims, b_dims) = (&k.in_dims[0], &k.in_dims[1]);
            let r = a_dims.len();
            let batch: usize = b * prod(&a_dims[..r - 2]);
            let a = float(args.remove(0)).reshape([batch, a_dims[r - 2], a_dims[r - 1]]);
            let c = float(args.remove(0)).reshape([batch, b_dims[r - 2], b_dims[r - 1]]);
            a.matmul(c).reshape([b, out_elems])
        }
        Op::Conv { window, groups, .. } => {
            let x = float(args.remove(0));
            let d = &k.in_dims[0];
            let bias = k.params.get(1).map(|&q| p.t1(q));
            if window.spatial() == 1 {
                let opts = ConvOptions::new_with_padding(
                    [window.stride[0]],
                    [(window.padding[0][0], window.padding[0][1])],
                    [window.dilation[0]],
                    *groups,
                );
                conv1d(x.reshape([b, d[0], d[1]]), p.t3(k.params[0]), bias, opts)
                    .reshape([b, out_elems])
            } else {
                let opts = ConvOptions::new_with_padding(
                    [window.stride[0], window.stride[1]],
                    pads2(window),
                    [window.dilation[0], window.dilation[1]],
                    *groups,
                );
                conv2d(
                    x.reshape([b, d[0], d[1], d[2]]),
                    p.t4(k.params[0]),
                    bias,
                    opts,
                )
                .reshape([b, out_elems])
            }
        }
        Op::BatchNorm { features } => {
            let x = float(args.remove(0)).reshape([b, *features, prod(&k.in_dims[0]) / features]);
            let mean = x.clone().mean_dim(0).mean_dim(2);
            let centered = x - mean;
            let var = centered.clone().powi_scalar(2).mean_dim(0).mean_dim(2);
            let y = centered / (var + 1e-5).sqrt();
            let gamma = p.t1(k.params[0]).reshape([1, *features, 1]);
            let beta = p.t1(k.params[1]).reshape([1, *features, 1]);
            (y * gamma + beta).reshape([b, out_elems])
        }
        Op::LayerNorm { features } => {
            let rows = b * prod(&k.in_dims[0]) / features;
            let x = float(args.remove(0)).reshape([rows, *features]);
            let mean = x.clone().mean_dim(1);
            let centered = x - mean;
            let var = centered.clone().powi_scalar(2).mean_dim(1);
            let y = centered / (var + 1e-5).sqrt();
            let y = y * p.t1(k.params[0]).unsqueeze::<2>() + p.t1(k.params[1]).unsqueeze::<2>();
            y.reshape([b, out_elems])
        }
        Op::Relu => relu(float(args.remove(0))),
        Op::ClippedRelu { max } => float(args.remove(0)).clamp(0.0, *max),
        Op::Gelu => gelu(float(args.remove(0))),
        Op::Tanh => tanh(float(args.remove(0))),
        Op::Sigmoid => sigmoid(float(args.remove(0))),
        Op::Softmax { axis } => {
            let d = &k.in_dims[0];
            let a = axis_index(d.len(), *axis);
            let x = float(args.remove(0)).reshape([b, prod(&d[..a]), d[a], prod(&d[a + 1..])]);
            softmax(x, 2).reshape([b, out_elems])
        }
        Op::Pool { pool, window } => {
            let x = float(args.remove(0));
            let d = &k.in_dims[0];
            if window.spatial() == 1 {
                let x = x.reshape([b, d[0], d[1]]);
                let pad = (window.padding[0][0], window.padding[0][1]);
                let y = match pool {
                    PoolKind::Max => max_pool1d(
                        x,
                        MaxPoolOptions {
                            kernel_size: [window.kernel[0]],
                            stride: [window.stride[0]],
                            padding: [pad],
                            dilation: [window.dilation[0]],
                            ceil_mode: false,
                        },
                    ),
                    PoolKind::Avg => avg_pool1d(
                        x,
                        AvgPoolOptions {
                            kernel_size: [window.kernel[0]],
                            stride: [window.stride[0]],
                            padding: [pad],
                            count_include_pad: false,
                            ceil_mode: false,
                        },
                    ),
                };
                y.reshape([b, out_elems])
            } else {
                let x = x.reshape([b, d[0], d[1], d[2]]);
                let kernel = [window.kernel[0], window.kernel[1]];
                let stride = [window.stride[0], window.stride[1]];
                let y = match pool {
                    PoolKind::Max => max_pool2d(
                        x,
                        MaxPoolOptions {
                            kernel_size: kernel,
                            stride,
                            padding: pads2(window),
                            dilation: [window.dilation[0], window.dilation[1]],
                            ceil_mode: false,
                        },
                    ),
                    PoolKind::Avg => avg_pool2d(
                        x,
                        AvgPoolOptions {
                            kernel_size: kernel,
                            stride,
                            padding: pads2(window),
                            count_include_pad: false,
                            ceil_mode: false,
                        },
                    ),
                };
                y.reshape([b, out_elems])
            }
        }
        Op::GlobalPool { pool } => {
            let d = &k.in_dims[0];
            let x = float(args.remove(0)).reshape([b, d[0], prod(&d[1..])]);
            let y = match pool {
                PoolKind::Max => x.max_dim(2),
                PoolKind::Avg => x.mean_dim(2),
            };
            y.reshape([b, out_elems])
        }
        Op::Flatten | Op::Reshape { .. } => float(args.remove(0)),
        Op::Concat { axis } => {
            let a = axis_index(k.out_dims.len(), *axis);
            let parts: Vec<Tensor<4>> = args
                .into_iter()
                .zip(&k.in_dims)
                .map(|(v, d)| float(v).reshape([b, prod(&d[..a]), d[a], prod(&d[a + 1..])]))
                .collect();
            Tensor::cat(parts, 2).reshape([b, out_elems])
        }
        Op::Add | Op::Mul => {
            let x = float(args.remove(0));
            let y = float(args.remove(0));
            let (x, y) = if k.in_dims[0] == k.in_dims[1] {
                (x, y)
            } else {
                return broadcast_binary(&k.op, x, &k.in_dims[0], y, &k.in_dims[1], b, out_elems);
            };
            if matches!(k.op, Op::Add) {
                x + y
            } else {
                x * y
            }
        }
        Op::Dropout { p: rate } => {
            let x = float(args.remove(0));
            if !train || *rate <= 0.0 {
                return x;
            }
            let keep = 1.0 - *rate as f64;
            let mask = Tensor::<2>::random(x.dims(), Distribution::Bernoulli(keep), &x.device());
            x * mask.div_scalar(keep as f32)
        }
        Op::Embedding { dim, .. } => {
            let ids = match args.remove(0) {
                Value::Tokens(t) => t,
                Value::Float(_) | Value::ConvRows(_) => unreachable!("embedding reads token ids"),
            };
            let steps = ids.dims()[1];
            embedding(p.t2(k.params[0]), ids).reshape([b, steps * dim])
        }
        Op::Rnn {
            cell,
            hidden,
            bidirectional,
            bias,
            ..
        } => {
            let d = &k.in_dims[0];
            let x = float(args.remove(0)).reshape([b, d[0], d[1]]);
            let per_dir = if *bias == RnnBias::Double { 4 } else { 3 };
            let dirs = if *bidirectional { 2 } else { 1 };
            let qs: Vec<&[P]> = (0..dirs)
                .map(|dir| &k.params[dir * per_dir..(dir + 1) * per_dir])
                .collect();
            let projections: Vec<Tensor<3>> =
                qs.iter().map(|q| rnn_projection(x.clone(), p, q)).collect();
            if *cell == Cell::Lstm && crate::cpu::available(&x) {
                // Both biases go into the projection; the fused op adds h W_hh per step.
                let with_biases = projections
                    .into_iter()
                    .zip(&qs)
                    .map(|(xp, q)| match q.get(3) {
                        Some(&b_hh) => xp + p.t1(b_hh).reshape([1, 1, cell.gates() * hidden]),
                        None => xp,
                    })
                    .collect::<Vec<_>>();
                let w_hh: Vec<Tensor<2>> = qs.iter().map(|q| p.t2(q[1])).collect();
                let y = crate::lstm::lstm_layer(&with_biases, &w_hh)
                    .expect("available() checked the device");
                return y.reshape([b, out_elems]);
            }
            let mut outs: Vec<Tensor<3>> = projections
                .into_iter()
                .zip(&qs)
                .enumerate()
                .map(|(dir, (xp, q))| rnn_direction(*cell, *hidden, xp, p, q, dir == 1))
                .collect();
            let y = if outs.len() == 1 {
                outs.remove(0)
            } else {
                Tensor::cat(outs, 2)
            };
            y.reshape([b, out_elems])
        }
    }
}

/// One direction's input projection `x W_ih + b_ih` `[B, T, gates·H]` of `x` `[B, T, I]`:
/// every step's in one matrix product.
fn rnn_projection(x: Tensor<3>, p: &Params, q: &[P]) -> Tensor<3> {
    let [b, t, i] = x.dims();
    let w_ih = p.t2(q[0]);
    let g = w_ih.dims()[1];
    (x.reshape([b * t, i]).matmul(w_ih) + p.t1(q[2]).unsqueeze::<2>()).reshape([b, t, g])
}

/// One direction of an LSTM or GRU from its input projection `xp` `[B, T, gates·H]`,
/// returning `[B, T, H]`, composed of burn ops step by step (gate order i, f, g, o for
/// LSTM; r, z, n for GRU). An LSTM on the CPU runs fused instead ([`crate::lstm`]).
fn rnn_direction(
    cell: Cell,
    h: usize,
    xp: Tensor<3>,
    p: &Params,
    q: &[P],
    reverse: bool,
) -> Tensor<3> {
    let [b, t, g] = xp.dims();
    let w_hh = p.t2(q[1]);
    let b_hh = q.get(3).map(|&r| p.t1(r).unsqueeze::<2>());
    let device = xp.device();
    let mut hs: Vec<Tensor<2>> = Vec::with_capacity(t);
    let mut h_t = Tensor::<2>::zeros([b, h], &device);
    let mut c_t = Tensor::<2>::zeros([b, h], &device);
    // The gradient of a slice is a zero tensor the size of the sliced one, so
    // slicing every step out of `xp` costs O(T^2) memory traffic in the
    // backward pass. Slicing blocks of about sqrt(T) steps first, then steps
    // out of a block, costs O(T^1.5).
    let block = (t as f64).sqrt().ceil() as usize;
    let blocks: Vec<Tensor<3>> = (0..t)
        .step_by(block)
        .map(|start| xp.clone().narrow(1, start, block.min(t - start)))
        .collect();
    for s in 0..t {
        let step = if reverse { t - 1 - s } else { s };
        let xs = blocks[step / block]
            .clone()
            .narrow(1, step % block, 1)
            .reshape([b, g]);
        let mut rec = h_t.clone().matmul(w_hh.clone());
        if let Some(bh) = &b_hh {
            rec = rec + bh.clone();
        }
        match cell {
            Cell::Lstm => {
                let gates = xs + rec;
                let mut c = gates.chunk(4, 1);
                let o = sigmoid(c.pop().expect("4 gates"));
                let gg = tanh(c.pop().expect("4 gates"));
                let f = sigmoid(c.pop().expect("4 gates"));
                let ig = sigmoid(c.pop().expect("4 gates"));
                c_t = f * c_t + ig * gg;
                h_t = o * tanh(c_t.clone());
            }
            Cell::Gru => {
                let mut xc = xs.chunk(3, 1);
                let mut rc = rec.chunk(3, 1);
                let (xn, rn) = (xc.pop().expect("3 gates"), rc.pop().expect("3 gates"));
                let z = sigmoid(xc.pop().expect("3 gates") + rc.pop().expect("3 gates"));
                let r = sigmoid(xc.pop().expect("3 gates") + rc.pop().expect("3 gates"));
                let n = tanh(xn + r * rn);
                h_t = (z.clone().neg() + 1.0) * n + z * h_t;
            }
        }
        hs.push(h_t.clone());
    }
    if reverse {
        hs.reverse();
    }
    Tensor::stack(hs, 1)
}

/// A 2-d convolution without dilation or groups as matrix products of the
/// im2col matrix `[B·OH·OW, kh·kw·C]` ([`crate::im2col`]) and the weight,
/// returning the output as [`ConvRows`]. burn-flex has no native conv weight
/// gradient (burn's fallback transposes and repacks serially, then runs skinny
/// GEMMs). Here the rows go in [`im2col_chunks`] (the plan's rule) chunks of
/// whole samples whose products run on separate threads, so the weight gradient
/// `dy_chunk x cols_chunk` (a long-K product with a tiny result, which one GEMM
/// parallelises poorly) is split over the cores; each chunk's output is
/// channel-major, so NCHW is a copy of `OH·OW`-long runs rather than an
/// element-wise transpose. On the CPU the product is one custom op
/// ([`conv_product_cpu`]); elsewhere one batched matmul ([`conv_product_views`]).
fn conv_im2col(
    x: Tensor<4>,
    w: Tensor<4>,
    bias: Option<Tensor<1>>,
    stride: [usize; 2],
    pads: [(usize, usize); 2],
) -> ConvRows {
    let [b, c, _, _] = x.dims();
    let [co, _, kh, kw] = w.dims();
    let k = kh * kw * c;
    let chunks = im2col_chunks(b);
    let per_chunk = b / chunks;
    // The weight in the matrix's (kh, kw, C) order, a small copy.
    let w = w.permute([0, 2, 3, 1]).reshape([co, k]);
    // [chunks, C_out, samples·OH·OW]
    let (mut y, [oh, ow]) = match conv_product_cpu(&x, w.clone(), [kh, kw], stride, pads, chunks) {
        Some(done) => done,
        None => conv_product_views(x, w, [kh, kw], stride, pads, chunks),
    };
    let spatial = oh * ow;
    if let Some(bias) = bias {
        y = y + bias.reshape([1, co, 1]);
    }
    ConvRows {
        rows: y.reshape([chunks * co * per_chunk, spatial]),
        chunks,
        channels: co,
        per_chunk,
    }
}

/// [`conv_product_cpu`] on any backend: the window views' im2col matrix in chunks,
/// `W [1, C_out, k] x cols_chunkᵀ` as one batched product (channel-major, so the
/// weight gradient `dY_chunk x cols_chunk` is the fast orientation).
fn conv_product_views(
    x: Tensor<4>,
    w: Tensor<2>,
    kernel: [usize; 2],
    stride: [usize; 2],
    pads: [(usize, usize); 2],
    chunks: usize,
) -> (Tensor<3>, [usize; 2]) {
    let (cols, out) = im2col_views(x, kernel, stride, pads);
    let [rows, k] = cols.dims();
    let cols = cols.reshape([chunks, rows / chunks, k]);
    (w.unsqueeze::<3>().matmul(cols.swap_dims(1, 2)), out)
}

/// [`conv_im2col`] for a graph node (1-d convolutions as 2-d ones over a single row).
fn conv_im2col_node(k: &Kernel, p: &Params, x: Tensor<2>, b: usize) -> ConvRows {
    let Op::Conv { window, .. } = &k.op else {
        unreachable!("a convolution node")
    };
    let d = &k.in_dims[0];
    let bias = k.params.get(1).map(|&q| p.t1(q));
    let (x, w, stride, pads) = if window.spatial() == 1 {
        let [co, ci, kw] = p.t3(k.params[0]).dims();
        (
            x.reshape([b, d[0], 1, d[1]]),
            p.t3(k.params[0]).reshape([co, ci, 1, kw]),
            [1, window.stride[0]],
            [(0, 0), (window.padding[0][0], window.padding[0][1])],
        )
    } else {
        (
            x.reshape([b, d[0], d[1], d[2]]),
            p.t4(k.params[0]),
            [window.stride[0], window.stride[1]],
            pads2(window),
        )
    };
    conv_im2col(x, w, bias, stride, pads)
}

/// An average pool as the matrix `[in spatial, out spatial]` whose product with a row
/// of input values gives the row of window means (padding left out of the count, as
/// `count_include_pad: false`). One small GEMM each way instead of flex's pooling
/// kernels (its backward scatters element by element); `None` for dilated windows or
/// a matrix over [`POOL_MATRIX_MAX`].
fn avg_pool_matrix(input: &[usize], output: &[usize], w: &Window) -> Option<Vec<f32>> {
    let (n_in, n_out) = (prod(input), prod(output));
    if w.dilation.iter().any(|&d| d != 1) || n_in * n_out > POOL_MATRIX_MAX {
        return None;
    }
    let mut m = vec![0.0f32; n_in * n_out];
    let mut out_idx = vec![0usize; output.len()];
    for o in 0..n_out {
        // The window's valid input range along each spatial axis.
        let ranges: Vec<(usize, usize)> = (0..output.len())
            .map(|a| {
                let start = (out_idx[a] * w.stride[a]) as i64 - w.padding[a][0] as i64;
                let end = (start + w.kernel[a] as i64).min(input[a] as i64);
                (start.max(0) as usize, end.max(0) as usize)
            })
            .collect();
        let count: usize = ranges.iter().map(|(a, b)| b.saturating_sub(*a)).product();
        if count > 0 {
            let mut in_idx: Vec<usize> = ranges.iter().map(|r| r.0).collect();
            'window: loop {
                let flat = in_idx
                    .iter()
                    .zip(input)
                    .fold(0, |acc, (&i, &n)| acc * n + i);
                m[flat * n_out + o] = 1.0 / count as f32;
                for a in (0..in_idx.len()).rev() {
                    in_idx[a] += 1;
                    if in_idx[a] < ranges[a].1 {
                        continue 'window;
                    }
                    in_idx[a] = ranges[a].0;
                }
                break;
            }
        }
        for a in (0..out_idx.len()).rev() {
            out_idx[a] += 1;
            if out_idx[a] < output[a] {
                break;
            }
            out_idx[a] = 0;
        }
    }
    Some(m)
}

fn pads2(w: &Window) -> [(usize, usize); 2] {
    [
        (w.padding[0][0], w.padding[0][1]),
        (w.padding[1][0], w.padding[1][1]),
    ]
}

/// A full-tensor axis (batch = 0, negative from the end) as an index into the sample dims.
fn axis_index(sample_rank: usize, axis: i64) -> usize {
    let full = sample_rank as i64 + 1;
    let a = if axis < 0 { axis + full } else { axis };
    (a - 1) as usize
}

/// Element-wise op with numpy broadcasting, through rank-6 tensors `[B, d1..d5]`.
fn broadcast_binary(
    op: &Op,
    x: Tensor<2>,
    xd: &[usize],
    y: Tensor<2>,
    yd: &[usize],
    b: usize,
    out_elems: usize,
) -> Tensor<2> {
    let pad = |d: &[usize]| -> [usize; 6] {
        let mut s = [1usize; 6];
        s[0] = b;
        let off = 6 - d.len();
        s[off..].copy_from_slice(d);
        s
    };
    assert!(
        xd.len() <= 5 && yd.len() <= 5,
        "broadcasting supports up to 5 sample dims"
    );
    let x6: Tensor<6> = x.reshape(pad(xd));
    let y6: Tensor<6> = y.reshape(pad(yd));
    let z = if matches!(op, Op::Add) {
        x6 + y6
    } else {
        x6 * y6
    };
    z.reshape([b, out_elems])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn max_rel_err<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> f32 {
        let scale = b.clone().abs().max().into_scalar::<f32>().max(1e-6);
        (a - b).abs().max().into_scalar::<f32>() / scale
    }

    /// The window matrix against burn's average pooling, with padding (left out of
    /// the count), strides, overlapping windows and a 1-d pool.
    #[test]
    fn avg_pool_matrix_matches_burn_pooling() {
        let device = Device::flex();
        device.seed(5);
        // (input [B, C, H, W], kernel, stride, padding)
        let cases = [
            ([2, 3, 9, 9], [3, 3], [3, 3], [(0, 0), (0, 0)]),
            ([2, 2, 7, 6], [3, 2], [2, 1], [(1, 1), (1, 0)]),
            ([3, 2, 1, 10], [1, 3], [1, 2], [(0, 0), (1, 1)]),
        ];
        for (xd, kernel, stride, pads) in cases {
            let x = Tensor::<4>::random(xd, Distribution::Normal(0.0, 1.0), &device);
            let opts = AvgPoolOptions {
                kernel_size: kernel,
                stride,
                padding: pads,
                count_include_pad: false,
                ceil_mode: false,
            };
            let want = avg_pool2d(x.clone(), opts);
            let [b, c, oh, ow] = want.dims();
            let window = Window {
                kernel: kernel.to_vec(),
                stride: stride.to_vec(),
                padding: pads.iter().map(|&(a, z)| [a, z]).collect(),
                dilation: vec![1, 1],
            };
            let m = avg_pool_matrix(&xd[2..], &[oh, ow], &window).expect("small");
            let m = Tensor::<2>::from_data(TensorData::new(m, [xd[2] * xd[3], oh * ow]), &device);
            let got = x
                .reshape([b * c, xd[2] * xd[3]])
                .matmul(m)
                .reshape([b, c, oh, ow]);
            assert!(max_rel_err(got, want) < 1e-5, "{xd:?} {kernel:?}");
        }
        let big = Window::square(2, 2, 2, 0);
        assert!(avg_pool_matrix(&[224, 224], &[112, 112], &big).is_none());
    }

    /// The im2col product against burn's convolution: output, weight and bias
    /// gradients, with asymmetric padding and a stride, in 2-d and as a 1-d row.
    #[test]
    fn im2col_conv_matches_burn_conv() {
        let device = Device::flex().autodiff();
        device.seed(3);
        // (x, weight, stride, padding)
        let cases = [
            ([3, 4, 7, 6], [5, 4, 3, 2], [1, 2], [(1, 0), (2, 1)]),
            ([2, 26, 9, 9], [26, 26, 3, 3], [1, 1], [(1, 1), (1, 1)]),
            ([4, 3, 1, 10], [2, 3, 1, 3], [1, 2], [(0, 0), (1, 2)]),
            // 2 chunks of 17 samples.
            ([34, 3, 5, 5], [4, 3, 3, 3], [1, 1], [(1, 1), (1, 1)]),
        ];
        for (xd, wd, stride, pads) in cases {
            let x = Tensor::<4>::random(xd, Distribution::Normal(0.0, 1.0), &device);
            // The CPU's hand-written matrix is the window views' (other devices') exactly.
            let kernel = [wd[2], wd[3]];
            let (host, hw) = im2col_host(&x, kernel, stride, pads).expect("a CPU tensor");
            let (views, vw) = im2col_views(x.clone(), kernel, stride, pads);
            assert_eq!(hw, vw);
            assert_eq!(host.into_data(), views.into_data());
            let w = Tensor::<4>::random(wd, Distribution::Normal(0.0, 1.0), &device).require_grad();
            // The CPU's product op against the views' batched matmul (other devices):
            // output and weight gradient.
            let (co, k) = (wd[0], wd[1] * wd[2] * wd[3]);
            let chunks = im2col_chunks(xd[0]);
            // (A tape per product: burn consumes it at backward.)
            let w2 = || w.clone().permute([0, 2, 3, 1]).reshape([co, k]);
            let (cpu, _) =
                conv_product_cpu(&x, w2(), kernel, stride, pads, chunks).expect("a CPU tensor");
            let (views, _) = conv_product_views(x.clone(), w2(), kernel, stride, pads, chunks);
            assert!(max_rel_err(cpu.clone(), views.clone()) < 1e-5);
            let r = Tensor::<3>::random(cpu.dims(), Distribution::Normal(0.0, 1.0), &device);
            let g_cpu = (cpu * r.clone()).sum().backward();
            let g_views = (views * r).sum().backward();
            let grad = |g: &burn::tensor::Gradients| w.grad(g).expect("weight gradient");
            assert!(max_rel_err(grad(&g_cpu), grad(&g_views)) < 1e-4);
            let bias = Tensor::<1>::random([wd[0]], Distribution::Normal(0.0, 1.0), &device)
                .require_grad();
            let opts = ConvOptions::new_with_padding(stride, pads, [1, 1], 1);
            let want = conv2d(x.clone(), w.clone(), Some(bias.clone()), opts.clone());
            let [b, co, oh, ow] = want.dims();
            let got = conv_im2col(x.clone(), w.clone(), Some(bias.clone()), stride, pads)
                .canonical()
                .reshape([b, co, oh, ow]);
            assert!(max_rel_err(got.clone(), want.clone()) < 1e-4);
            let r = Tensor::<4>::random([b, co, oh, ow], Distribution::Normal(0.0, 1.0), &device);
            let g_want = (want * r.clone()).sum().backward();
            let g_got = (got * r).sum().backward();
            let grad = |g: &burn::tensor::Gradients| w.grad(g).expect("weight gradient");
            assert!(max_rel_err(grad(&g_got), grad(&g_want)) < 1e-4);
            let grad = |g: &burn::tensor::Gradients| bias.grad(g).expect("bias gradient");
            assert!(max_rel_err(grad(&g_got), grad(&g_want)) < 1e-4);
        }
    }
}
