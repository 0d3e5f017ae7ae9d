//! Recurrent layers: LSTM, GRU and the plain cell, one or both directions. Every
//! step's input projection is one matrix product up front; the LSTM and GRU steps
//! then run fused on the CPU ([`crate::cpu::recurrent::lstm`],
//! [`crate::cpu::recurrent::gru`]); the rest are composed of burn ops.

use super::kernel::Kernel;
use super::params::{P, Params};
use batchfit_graph::{Cell, Op, RnnBias};
use burn::tensor::Tensor;
use burn::tensor::activation::{relu, sigmoid, tanh};

/// An LSTM or GRU layer over `x` `[B, sequences·T·I]`: every step's output
/// `[B, sequences·T·H·dirs]`, the directions side by side. A sample's several
/// sequences (a layer over a batch merged with another axis) run as more batch.
pub(super) fn rnn(k: &Kernel, p: &Params, x: Tensor<2>, b: usize) -> Tensor<2> {
    let Op::Rnn {
        cell,
        hidden,
        bidirectional,
        bias,
        ..
    } = k.op
    else {
        unreachable!("a recurrent node")
    };
    let out_elems = k.out_elems();
    let d = &k.in_dims[0];
    let lead = d.len() - 2;
    let sequences: usize = d[..lead].iter().product();
    let x = x.reshape([b * sequences, d[lead], d[lead + 1]]);
    // Per direction, in `Op::params` order: W_ih, W_hh, b_ih (or the single bias), b_hh.
    let per_dir = if bias == RnnBias::Double { 4 } else { 3 };
    let dirs = if bidirectional { 2 } else { 1 };
    let qs: Vec<&[P]> = (0..dirs)
        .map(|dir| &k.params[dir * per_dir..(dir + 1) * per_dir])
        .collect();
    let projections: Vec<Tensor<3>> = qs.iter().map(|q| rnn_projection(x.clone(), p, q)).collect();
    if cell == Cell::Lstm && crate::cpu::tensor::available(&x) {
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
        let y = crate::cpu::recurrent::lstm::lstm_layer(&with_biases, &w_hh)
            .expect("available() checked the device");
        return y.reshape([b, out_elems]);
    }
    if cell == Cell::Gru && crate::cpu::tensor::available(&x) {
        // b_hn sits inside the reset gate's product, so the recurrent bias is the fused
        // op's own input (zeros, untracked, for a layer with a single bias).
        let g = cell.gates() * hidden;
        let w_hh: Vec<Tensor<2>> = qs.iter().map(|q| p.t2(q[1])).collect();
        let b_hh: Vec<Tensor<1>> = qs
            .iter()
            .map(|q| match q.get(3) {
                Some(&b_hh) => p.t1(b_hh),
                None => Tensor::zeros([g], &x.device()),
            })
            .collect();
        let y = crate::cpu::recurrent::gru::gru_layer(&projections, &w_hh, &b_hh)
            .expect("available() checked the device");
        return y.reshape([b, out_elems]);
    }
    let mut outs: Vec<Tensor<3>> = projections
        .into_iter()
        .zip(&qs)
        .enumerate()
        .map(|(dir, (xp, q))| rnn_direction(cell, hidden, xp, p, q, dir == 1))
        .collect();
    let y = if outs.len() == 1 {
        outs.remove(0)
    } else {
        Tensor::cat(outs, 2)
    };
    y.reshape([b, out_elems])
}

/// One direction's input projection `x W_ih + b_ih` `[B, T, gates·H]` of `x` `[B, T, I]`:
/// every step's in one matrix product.
fn rnn_projection(x: Tensor<3>, p: &Params, q: &[P]) -> Tensor<3> {
    let [b, t, i] = x.dims();
    let w_ih = p.t2(q[0]);
    let g = w_ih.dims()[1];
    (x.reshape([b * t, i]).matmul(w_ih) + p.t1(q[2]).unsqueeze::<2>()).reshape([b, t, g])
}

/// One direction of an LSTM, GRU or plain cell from its input projection `xp`
/// `[B, T, gates·H]`, returning `[B, T, H]`, composed of burn ops step by step (gate
/// order i, f, g, o for LSTM; r, z, n for GRU). On the CPU LSTM and GRU run fused
/// instead.
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
            Cell::RnnTanh => h_t = tanh(xs + rec),
            Cell::RnnRelu => h_t = relu(xs + rec),
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
