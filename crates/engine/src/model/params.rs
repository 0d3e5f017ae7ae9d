//! The model's trainable tensors: their shapes from [`Op::params`], their
//! starting values from the graph or drawn at random.

use super::unsupported::Unsupported;
use batchfit_graph::{Node, Op};
use burn::module::{Module, Param};
use burn::tensor::{Device, Distribution, Tensor, TensorData};

/// Every trainable tensor of the model, grouped by rank.
#[derive(Module, Debug)]
pub struct Params {
    /// Rank-1 tensors (biases, norm scales and shifts).
    pub r1: Vec<Param<Tensor<1>>>,
    /// Rank-2 tensors (dense, embedding and recurrent weights).
    pub r2: Vec<Param<Tensor<2>>>,
    /// Rank-3 tensors (1-d convolution weights).
    pub r3: Vec<Param<Tensor<3>>>,
    /// Rank-4 tensors (2-d convolution weights).
    pub r4: Vec<Param<Tensor<4>>>,
}

/// Index of a parameter in [`Params`].
#[derive(Clone, Copy, Debug)]
pub(super) enum P {
    R1(usize),
    R2(usize),
    R3(usize),
    R4(usize),
}

impl Params {
    pub(super) fn t1(&self, p: P) -> Tensor<1> {
        match p {
            P::R1(i) => self.r1[i].val(),
            _ => unreachable!("rank-1 parameter expected"),
        }
    }
    pub(super) fn t2(&self, p: P) -> Tensor<2> {
        match p {
            P::R2(i) => self.r2[i].val(),
            _ => unreachable!("rank-2 parameter expected"),
        }
    }
    pub(super) fn t3(&self, p: P) -> Tensor<3> {
        match p {
            P::R3(i) => self.r3[i].val(),
            _ => unreachable!("rank-3 parameter expected"),
        }
    }
    pub(super) fn t4(&self, p: P) -> Tensor<4> {
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

/// Creates the parameters of one node, one per entry of [`Op::params`] and in
/// its order (the order random values are drawn in), in the engine's layout
/// ([`engine_layout`]): from the node's trained values under
/// [`Init::FromGraph`] when it has them, else as [`random_start`] says.
pub(super) fn compile_params(
    node: &Node,
    init: Init,
    params: &mut Params,
    device: &Device,
) -> Result<Vec<P>, Unsupported> {
    let unsupported = |what: &str| Unsupported {
        node: node.name.clone(),
        what: what.to_string(),
    };
    let shapes = node.op.params();
    let weights = match (init, &node.weights) {
        (Init::FromGraph, Some(w)) => {
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
    match &node.op {
        Op::Conv { window, .. } if window.spatial() > 2 => {
            return Err(unsupported("3-d convolution"));
        }
        Op::Pool { window, .. } if window.spatial() > 2 => {
            return Err(unsupported("3-d pooling"));
        }
        Op::ConvTranspose { window, .. } => {
            if let Some(why) = super::conv::transpose_unsupported(window) {
                return Err(unsupported(why));
            }
        }
        _ => {}
    }
    Ok(shapes
        .iter()
        .enumerate()
        .map(|(i, param)| {
            let layout = engine_layout(&node.op, param);
            match (weights, random_start(&node.op, param)) {
                (Some(w), _) => params.load(&layout.shape, layout.convert(&w[i]), device),
                (None, Start::Uniform { fan_in }) => params.push(&layout.shape, fan_in, device),
                (None, Start::Constant(value)) => params.constant(layout.shape[0], value, device),
            }
        })
        .collect())
}

/// How the engine stores one parameter of [`Op::params`].
struct Layout {
    /// The stored shape.
    shape: Vec<usize>,
    /// Whether it is the transpose of the graph's `[rows, cols]` matrix.
    transposed: bool,
}

impl Layout {
    /// Trained values in the graph's layout, in this one.
    fn convert(&self, values: &[f32]) -> Vec<f32> {
        if self.transposed {
            // The graph's matrix is [shape[1], shape[0]].
            transpose(values, self.shape[1], self.shape[0])
        } else {
            values.to_vec()
        }
    }
}

/// The one place where the engine's layout of a parameter differs from the
/// graph's ([`Op::params`]): the weight matrices of dense and recurrent layers
/// are stored transposed, `[in, out]` rather than PyTorch's `[out, in]`, so
/// the forward pass is `x W` (burn's matmul layout) with no transpose per
/// step. A learned addend is stored flat. Every other parameter is stored as the
/// graph describes it.
fn engine_layout(op: &Op, param: &batchfit_graph::Param) -> Layout {
    let transposed = matches!(op, Op::Linear { .. } | Op::Rnn { .. }) && param.shape.len() == 2;
    let shape = if transposed {
        vec![param.shape[1], param.shape[0]]
    } else if matches!(
        op,
        Op::AddParam { .. }
            | Op::MulParam { .. }
            | Op::PRelu { .. }
            | Op::AddTable { .. }
            | Op::ConcatParam { .. }
            | Op::BroadcastParam { .. }
            | Op::Parameter { .. }
    ) {
        // Flat: it broadcasts as one run of the sample's axes (elementwise `learned`).
        vec![param.elements() as usize]
    } else {
        param.shape.clone()
    };
    Layout { shape, transposed }
}

/// How a parameter starts when the graph has no value for it.
enum Start {
    /// PyTorch's default `U(-1/sqrt(fan_in), 1/sqrt(fan_in))`.
    Uniform { fan_in: usize },
    /// Every element `value` (a norm's scale 1 and shift 0).
    Constant(f32),
}

/// How `param` of `op` starts without a trained value: as PyTorch initialises it.
fn random_start(op: &Op, param: &batchfit_graph::Param) -> Start {
    // A standardised convolution's gain starts at ones (timm's `ScaledStdConv2d`).
    if param.name == "gain" {
        return Start::Constant(1.0);
    }
    let fan_in = match *op {
        Op::Linear { in_features, .. } => in_features,
        Op::Conv {
            in_channels,
            ref window,
            groups,
            ..
        } => in_channels / groups * window.kernel_elements(),
        // PyTorch's fan-in of `[in, out / groups, kernel..]` is its second axis times
        // the kernel.
        Op::ConvTranspose {
            out_channels,
            ref window,
            groups,
            ..
        } => out_channels / groups * window.kernel_elements(),
        // U(-1, 1) (PyTorch draws N(0, 1) here).
        Op::Embedding { .. } => 1,
        Op::Rnn { hidden, .. } => hidden,
        Op::BatchNorm { .. }
        | Op::LayerNorm { .. }
        | Op::RmsNorm { .. }
        | Op::InstanceNorm { .. } => {
            return Start::Constant(if param.name == "weight" { 1.0 } else { 0.0 });
        }
        // A positional embedding starts at zeros (`nn.Parameter(torch.zeros(..))`).
        Op::AddParam { .. }
        | Op::AddTable { .. }
        | Op::ConcatParam { .. }
        | Op::Parameter { .. } => {
            return Start::Constant(0.0);
        }
        // A latent query starts small and random, as timm draws it (a zero query would
        // attend uniformly and give every latent the same gradient).
        Op::BroadcastParam { ref shape } => shape.last().copied().unwrap_or(1),
        // A layer scale starts at ones unless the graph says otherwise.
        Op::MulParam { .. } => return Start::Constant(1.0),
        // `nn.PReLU`'s slope starts at 0.25.
        Op::PRelu { .. } => return Start::Constant(0.25),
        _ => unreachable!("{} has no parameters", op.name()),
    };
    Start::Uniform { fan_in }
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
