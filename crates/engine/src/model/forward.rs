//! The forward pass: each kernel in graph order, dispatched to its op family.

use super::compile::Program;
use super::elementwise::Combine;
use super::kernel::Kernel;
use super::params::Params;
use super::{Batch, Value, conv, dense, elementwise, float, norm, pool, prod, recurrent, reshape};
use batchfit_graph::Op;
use burn::tensor::Tensor;

impl Program {
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
            let b = if kernel.shared { 1 } else { batch.size };
            slots.push(Some(run_kernel(kernel, params, args, b, train)));
        }
        float(slots[self.output_slot].take().expect("output computed"))
    }
}

/// Runs one node. Convolutions of a batch input, element-wise ops after them and
/// average pooling keep the convolution's own layout ([`Value::ConvRows`]); the
/// rest of the ops are in [`run_canonical`].
fn run_kernel(k: &Kernel, p: &Params, mut args: Vec<Value>, b: usize, train: bool) -> Value {
    match &k.op {
        Op::Conv { window, groups, .. }
            if *groups == 1 && window.dilation.iter().all(|&r| r == 1) =>
        {
            match args.remove(0) {
                // Only where the input needs no gradient (a graph input): the product
                // keeps its im2col matrix for the weight gradient. Keeping it for a
                // tracked input cost +58-65 % peak memory on mnist-cnn; there
                // `conv::conv` runs the CPU op that rebuilds the rows in the backward.
                Value::Float(x) if !x.is_tracked() => {
                    Value::ConvRows(conv::conv_im2col_node(k, p, x, b))
                }
                x => Value::Float(run_canonical(k, p, vec![x], b, train)),
            }
        }
        op if op.is_activation() => match args.remove(0) {
            Value::ConvRows(r) => Value::ConvRows(r.map(|t| elementwise::activation(&k.op, t))),
            v => Value::Float(elementwise::activation(&k.op, float(v))),
        },
        // One product with the window matrix, on rows of spatial values in either layout.
        Op::Pool { .. } if k.pool_matrix.is_some() => {
            let m = k.pool_matrix.clone().expect("checked");
            match args.remove(0) {
                Value::ConvRows(r) => Value::ConvRows(r.map(|rows| rows.matmul(m))),
                v => {
                    let (channels, spatial) = (k.in_dims[0][0], prod(&k.in_dims[0][1..]));
                    let rows = float(v).reshape([b * channels, spatial]).matmul(m);
                    Value::Float(rows.reshape([b, k.out_elems()]))
                }
            }
        }
        _ => Value::Float(run_canonical(k, p, args, b, train)),
    }
}

/// Ops on `[B, elements]` tensors in the graph's logical (NCHW) layout.
fn run_canonical(k: &Kernel, p: &Params, mut args: Vec<Value>, b: usize, train: bool) -> Tensor<2> {
    let mut first = || float(args.remove(0));
    match &k.op {
        Op::Linear {
            in_features,
            out_features,
            ..
        } => dense::linear(k, p, first(), b, *in_features, *out_features),
        Op::MatMul => {
            let x = first();
            dense::matmul(k, x, first(), b)
        }
        Op::Embedding { dim, .. } => dense::embedding_lookup(k, p, args.remove(0), b, *dim),
        Op::Conv { window, groups, .. } => conv::conv(k, p, first(), b, window, *groups),
        // `compile_params` refuses it before any forward runs.
        Op::ConvTranspose {
            window,
            output_padding,
            groups,
            ..
        } => conv::conv_transpose(k, p, first(), b, window, output_padding, *groups),
        Op::Pool { pool, window } => pool::pool(k, first(), b, *pool, window),
        Op::GlobalPool { pool } => pool::global_pool(k, first(), b, *pool),
        Op::Resize {
            size,
            mode,
            align_corners,
        } => pool::resize(k, first(), b, size, *mode, *align_corners),
        Op::BatchNorm { features } => norm::batch_norm(k, p, first(), b, *features),
        Op::InstanceNorm { channels, affine } => {
            norm::instance_norm(k, p, first(), b, *channels, *affine)
        }
        Op::LayerNorm { features } => norm::layer_norm(k, p, first(), b, *features),
        Op::RmsNorm { features } => norm::rms_norm(k, p, first(), b, *features),
        Op::Relu
        | Op::Clamp { .. }
        | Op::LeakyRelu { .. }
        | Op::Gelu
        | Op::Tanh
        | Op::Sigmoid
        | Op::Exp
        | Op::HardSigmoid { .. }
        | Op::HardSwish
        | Op::Scale { .. } => elementwise::activation(&k.op, first()),
        Op::Softmax { axis } => elementwise::softmax_along(k, first(), b, *axis),
        Op::Lrn {
            size,
            alpha,
            beta,
            bias,
        } => norm::lrn(k, first(), b, *size, *alpha, *beta, *bias),
        Op::Slice { axis, start, end } => reshape::slice(k, first(), b, *axis, *start, *end),
        Op::Transpose { perm } => reshape::transpose(k, first(), b, perm),
        Op::Pad { pads, value } => reshape::pad(k, first(), b, pads, *value),
        Op::Expand { .. } => reshape::expand(k, first(), b),
        Op::AddParam { shape } => elementwise::learned(k, p, first(), b, shape, Combine::Add),
        Op::MulParam { shape } => elementwise::learned(k, p, first(), b, shape, Combine::Mul),
        Op::PRelu { shape } => elementwise::learned(k, p, first(), b, shape, Combine::PRelu),
        Op::AddTable { shape, index, .. } => elementwise::add_table(k, p, first(), b, shape, index),
        Op::CausalMask => elementwise::causal_mask(k, first(), b),
        Op::AddConst { shape, values } => {
            elementwise::with_const(k, first(), b, shape, values, Combine::Add)
        }
        Op::MulConst { shape, values } => {
            elementwise::with_const(k, first(), b, shape, values, Combine::Mul)
        }
        Op::BroadcastParam { .. } => reshape::broadcast_param(k, p, b),
        // A learned tensor computed on once per step: a shared kernel, run at a batch of 1.
        Op::Parameter { .. } => reshape::broadcast_param(k, p, 1),
        Op::Constant { values, .. } => reshape::constant(values, &device_of(&args[0])),
        Op::Take { axis, indices } => reshape::take(k, first(), b, *axis, indices),
        Op::ConcatParam {
            axis,
            first: at_start,
            ..
        } => reshape::concat_param(k, p, first(), b, *axis, *at_start),
        Op::Reduce { reduce, axes, .. } => reshape::reduce(k, first(), b, *reduce, axes),
        Op::Add | Op::Mul | Op::Div => {
            let x = first();
            elementwise::binary(k, x, first(), b)
        }
        Op::Dropout { p: rate } => elementwise::dropout(first(), *rate, train),
        Op::DropPath { p: rate } => elementwise::drop_path(first(), *rate, train),
        Op::Flatten | Op::Reshape { .. } => first(),
        Op::Concat { axis } => reshape::concat(k, args, b, *axis),
        Op::Rnn { .. } => recurrent::rnn(k, p, first(), b),
    }
}

/// The device a value lives on.
fn device_of(v: &Value) -> burn::tensor::Device {
    match v {
        Value::Float(t) => t.device(),
        Value::ConvRows(r) => r.device(),
        Value::Tokens(t) => t.device(),
    }
}
