//! The LSTM recurrence as one autodiff op on the CPU (flex).
//!
//! burn's composed cell (`model/recurrent.rs` `rnn_direction`) builds some twenty autodiff nodes
//! per step, slices the input projection per step and differentiates every
//! element-wise op separately: 5x PyTorch's time on the bench BiLSTM. Here the
//! forward runs each step as one GEMM (`h_{t-1} W_hh`, accumulated onto the input
//! projection) and the gate math in place; the backward is hand-written
//! backpropagation through time, with the recurrent weight's gradient as one GEMM
//! over all steps at the end. The two directions run on separate threads.
//!
//! Kept for the backward, per step and direction: the gate activations i, f, g, o
//! and the cell state c (5H), plus the output. Gate order i, f, g, o, as PyTorch.
//! Off the CPU the engine keeps the composed cell; the GRU has its own ([`crate::cpu::recurrent::gru`]).

use super::cell::{Shape3, sigmoid, step_index, tanh, two_rows};
use crate::cpu::tensor::{
    Ad, AdT, FlexDevice, FlexT, Strided, contiguous, finish_op, from_vec, gemm_into, values, wide,
};
use burn::backend::Flex;
use burn::tensor::{DType, Tensor};
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops};

/// One LSTM layer's recurrence: per direction the input projection `[B, T, 4H]`
/// (every bias included) and the recurrent weight `[H, 4H]`; the second direction
/// runs from the last step. Returns `[B, T, dirs·H]`, or `None` when the tensors
/// are not on the CPU's autodiff device (the caller then uses burn's ops).
pub fn lstm_layer(projections: &[Tensor<3>], w_hh: &[Tensor<2>]) -> Option<Tensor<3>> {
    let [b, t, g4] = projections[0].dims();
    let h = g4 / 4;
    let mut ad: Vec<AdT> = Vec::with_capacity(2 * projections.len());
    for (x, w) in projections.iter().zip(w_hh) {
        ad.push(x.clone().try_into_primitive::<Ad>().ok()?);
        ad.push(w.clone().try_into_primitive::<Ad>().ok()?);
    }
    if ad.iter().any(|x| x.primitive().dtype() != DType::F32) {
        return None;
    }
    let shape = Shape3 { b, t, h };
    let out = match ad.len() {
        2 => run::<2>(ad.try_into().ok()?, shape),
        4 => run::<4>(ad.try_into().ok()?, shape),
        _ => return None,
    };
    Some(out)
}

/// What one direction's backward reads.
#[derive(Clone, Debug)]
struct Direction {
    /// Gate activations `[B, T, 4H]`.
    acts: Vec<f32>,
    /// Cell states `[B, T, H]`.
    c: Vec<f32>,
    w: FlexT,
    reverse: bool,
}

#[derive(Clone, Debug)]
struct State {
    shape: Shape3,
    dirs: Vec<Direction>,
    /// The layer's output `[B, T, dirs·H]` (h_t, for the recurrent weight's gradient).
    out: FlexT,
}

#[derive(Debug)]
struct LstmBackward;

/// `N` = 2 per direction: (projection, recurrent weight).
fn run<const N: usize>(inputs: [AdT; N], shape: Shape3) -> Tensor<3> {
    let Shape3 { b, t, h } = shape;
    let nodes = inputs.each_ref().map(|x| x.node());
    let prims: [FlexT; N] = inputs.map(|x| contiguous(x.into_primitive()));
    let device = FlexDevice::default();
    let dirs = N / 2;
    let step = |d: usize| {
        let (xp, w) = (values(&prims[2 * d]), values(&prims[2 * d + 1]));
        wide(
            #[inline(always)]
            || forward_direction(xp, w, shape, d == 1),
        )
    };
    let results: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = if dirs == 2 {
        let (f, r) = rayon::join(|| step(0), || step(1));
        vec![f, r]
    } else {
        vec![step(0)]
    };
    // Interleave the directions' h into [B, T, dirs·H].
    let mut out = vec![0.0f32; b * t * dirs * h];
    for (d, (_, _, hs)) in results.iter().enumerate() {
        for (row, src) in hs.chunks_exact(h).enumerate() {
            out[row * dirs * h + d * h..][..h].copy_from_slice(src);
        }
    }
    let out = from_vec(out, &[b, t, dirs * h], &device);
    let state = State {
        shape,
        dirs: results
            .into_iter()
            .enumerate()
            .map(|(d, (acts, c, _))| Direction {
                acts,
                c,
                w: prims[2 * d + 1].clone(),
                reverse: d == 1,
            })
            .collect(),
        out: out.clone(),
    };
    finish_op(LstmBackward, nodes, || state, out)
}

impl<const N: usize> Backward<Flex, N> for LstmBackward {
    type State = State;

    fn backward(self, ops: Ops<State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let state = ops.state;
        let Shape3 { b, t, h } = state.shape;
        let dout = contiguous(grads.consume::<Flex>(&ops.node));
        let device = FlexDevice::default();
        let (dout, out) = (values(&dout), values(&state.out));
        let dirs = state.dirs.len();
        let step = |d: usize| {
            let dir = &state.dirs[d];
            wide(
                #[inline(always)]
                || backward_direction(dir, dout, out, d, dirs, state.shape),
            )
        };
        let results = if dirs == 2 {
            let (f, r) = rayon::join(|| step(0), || step(1));
            vec![f, r]
        } else {
            vec![step(0)]
        };
        for (d, (dxp, dw)) in results.into_iter().enumerate() {
            if let Some(node) = &ops.parents[2 * d] {
                grads.register::<Flex>(node.id, from_vec(dxp, &[b, t, 4 * h], &device));
            }
            if let Some(node) = &ops.parents[2 * d + 1] {
                grads.register::<Flex>(node.id, from_vec(dw, &[h, 4 * h], &device));
            }
        }
    }
}

/// One step of the cell for one sample: c_t = f c_{t-1} + i g, h_t = o tanh(c_t).
/// Slices as arguments: only arguments tell the compiler that they do not overlap,
/// without which it does not vectorise the loop.
#[inline(always)]
fn cell_forward(
    i: &[f32],
    f: &[f32],
    g: &[f32],
    o: &[f32],
    c_prev: &[f32],
    c_t: &mut [f32],
    h_t: &mut [f32],
) {
    let n = c_t.len();
    let (i, f, g, o, c_prev, h_t) = (
        &i[..n],
        &f[..n],
        &g[..n],
        &o[..n],
        &c_prev[..n],
        &mut h_t[..n],
    );
    for j in 0..n {
        c_t[j] = f[j] * c_prev[j] + i[j] * g[j];
        h_t[j] = o[j] * tanh(c_t[j]);
    }
}

/// One step of backpropagation through the cell for one sample: from the gates
/// i, f, g, o, the cell states c_t and c_{t-1}, and dL/dh_t from the output (`dy`)
/// and from the next step, the gradients of the gate pre-activations; `dc` holds the
/// cell gradient from the next step and leaves with the one for the step before.
// Thirteen slices as separate arguments: only arguments tell the compiler that
// they do not overlap, without which it does not vectorise the loop.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn cell_backward(
    i: &[f32],
    f: &[f32],
    g: &[f32],
    o: &[f32],
    c_t: &[f32],
    c_prev: &[f32],
    dy: &[f32],
    dh_next: &[f32],
    dc: &mut [f32],
    dgi: &mut [f32],
    dgf: &mut [f32],
    dgg: &mut [f32],
    dgo: &mut [f32],
) {
    let n = dc.len();
    let (i, f, g, o) = (&i[..n], &f[..n], &g[..n], &o[..n]);
    let (c_t, c_prev, dy, dh_next) = (&c_t[..n], &c_prev[..n], &dy[..n], &dh_next[..n]);
    let (dgi, dgf, dgg, dgo) = (&mut dgi[..n], &mut dgf[..n], &mut dgg[..n], &mut dgo[..n]);
    for j in 0..n {
        let dh_t = dy[j] + dh_next[j];
        let tc = tanh(c_t[j]);
        let d_o = dh_t * tc;
        let dc_t = dh_t * o[j] * (1.0 - tc * tc) + dc[j];
        dgi[j] = dc_t * g[j] * i[j] * (1.0 - i[j]);
        dgf[j] = dc_t * c_prev[j] * f[j] * (1.0 - f[j]);
        dgg[j] = dc_t * i[j] * (1.0 - g[j] * g[j]);
        dgo[j] = d_o * o[j] * (1.0 - o[j]);
        dc[j] = dc_t * f[j];
    }
}

/// One direction's forward (run through [`wide`]): returns the gate activations `[B, T, 4H]`, the cell
/// states and the outputs (both `[B, T, H]`).
#[inline(always)]
fn forward_direction(
    xp: &[f32],
    w: &[f32],
    shape: Shape3,
    reverse: bool,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let Shape3 { b, t, h } = shape;
    let g4 = 4 * h;
    let mut acts = xp.to_vec();
    let zeros = vec![0.0f32; h];
    let mut c = vec![0.0f32; b * t * h];
    let mut hs = vec![0.0f32; b * t * h];
    for s in 0..t {
        let ti = step_index(s, t, reverse);
        let prev = (s > 0).then(|| step_index(s - 1, t, reverse));
        if let Some(tp) = prev {
            // gates(t) = x_t W_ih + b + h_{t-1} W_hh
            let dst = Strided::new(&mut acts[ti * g4..], t * g4, 1);
            let lhs = Strided::new(&hs[tp * h..], t * h, 1);
            gemm_into(b, g4, h, dst, true, lhs, Strided::new(w, g4, 1));
        }
        for bi in 0..b {
            let row = bi * t;
            let a = &mut acts[(row + ti) * g4..][..g4];
            let (sig, rest) = a.split_at_mut(2 * h);
            let (g, o) = rest.split_at_mut(h);
            sig.iter_mut()
                .chain(o.iter_mut())
                .for_each(|v| *v = sigmoid(*v));
            g.iter_mut().for_each(|v| *v = tanh(*v));
            let (i, f) = sig.split_at(h);
            let (g, o) = (&g[..h], &o[..h]);
            let h_t = &mut hs[(row + ti) * h..][..h];
            match prev {
                Some(tp) => {
                    let (c_t, c_prev) = two_rows(&mut c, h, row + ti, row + tp);
                    cell_forward(i, f, g, o, c_prev, c_t, h_t);
                }
                None => {
                    let c_t = &mut c[(row + ti) * h..][..h];
                    cell_forward(i, f, g, o, &zeros, c_t, h_t);
                }
            }
        }
    }
    (acts, c, hs)
}

/// One direction's backward through time (run through [`wide`]): the gradient of its input projection
/// `[B, T, 4H]` and of its recurrent weight `[H, 4H]`. `dout` and `out` are the
/// layer's `[B, T, dirs·H]` output gradient and output; this direction is column
/// block `d`.
#[inline(always)]
fn backward_direction(
    dir: &Direction,
    dout: &[f32],
    out: &[f32],
    d: usize,
    dirs: usize,
    shape: Shape3,
) -> (Vec<f32>, Vec<f32>) {
    let Shape3 { b, t, h } = shape;
    let (g4, width) = (4 * h, dirs * h);
    let w = values(&dir.w);
    let mut dxp = vec![0.0f32; b * t * g4];
    // Gradients flowing back from the next step: into h_{t-1} and c_{t-1}.
    let mut dh = vec![0.0f32; b * h];
    let mut dc = vec![0.0f32; b * h];
    let zeros = vec![0.0f32; h];
    for s in (0..t).rev() {
        let ti = step_index(s, t, dir.reverse);
        let prev = (s > 0).then(|| step_index(s - 1, t, dir.reverse));
        for bi in 0..b {
            let row = bi * t;
            let a = &dir.acts[(row + ti) * g4..][..g4];
            let (i, f, g, o) = (&a[..h], &a[h..2 * h], &a[2 * h..3 * h], &a[3 * h..][..h]);
            let (dgi, rest) = dxp[(row + ti) * g4..][..g4].split_at_mut(h);
            let (dgf, rest) = rest.split_at_mut(h);
            let (dgg, dgo) = rest.split_at_mut(h);
            let dgo = &mut dgo[..h];
            let dy = &dout[(row + ti) * width + d * h..][..h];
            let dh_next = &dh[bi * h..][..h];
            let dc_next = &mut dc[bi * h..][..h];
            let c_t = &dir.c[(row + ti) * h..][..h];
            let c_prev = match prev {
                Some(tp) => &dir.c[(row + tp) * h..],
                None => &zeros[..],
            };
            cell_backward(
                i, f, g, o, c_t, c_prev, dy, dh_next, dc_next, dgi, dgf, dgg, dgo,
            );
        }
        if prev.is_some() {
            // dh_{t-1} = dgates_t W_hh^T
            let lhs = Strided::new(&dxp[ti * g4..], t * g4, 1);
            gemm_into(
                b,
                h,
                g4,
                Strided::new(&mut dh, h, 1),
                false,
                lhs,
                Strided::new(w, 1, g4),
            );
        }
    }
    // dW_hh = sum over steps of h_{t-1}^T dgates_t: one product over all B·T rows,
    // with h_{t-1} laid out at step t's row (zero at the first step).
    let mut h_prev = vec![0.0f32; b * t * h];
    for bi in 0..b {
        for s in 1..t {
            let (ti, tp) = (
                step_index(s, t, dir.reverse),
                step_index(s - 1, t, dir.reverse),
            );
            h_prev[(bi * t + ti) * h..][..h]
                .copy_from_slice(&out[(bi * t + tp) * width + d * h..][..h]);
        }
    }
    let mut dw = vec![0.0f32; h * g4];
    gemm_into(
        h,
        g4,
        b * t,
        Strided::new(&mut dw, g4, 1),
        false,
        Strided::new(&h_prev, 1, h),
        Strided::new(&dxp, g4, 1),
    );
    (dxp, dw)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::activation::{sigmoid, tanh};
    use burn::tensor::{Device, Distribution};

    /// The cell composed of burn ops, as the equations read (gate order i, f, g, o).
    fn reference(xp: Tensor<3>, w: Tensor<2>, reverse: bool) -> Tensor<3> {
        let [b, t, g4] = xp.dims();
        let h = g4 / 4;
        let device = xp.device();
        let (mut hs, mut c) = (Vec::new(), Tensor::<2>::zeros([b, h], &device));
        let mut h_t = Tensor::<2>::zeros([b, h], &device);
        for s in 0..t {
            let ti = step_index(s, t, reverse);
            let gates = xp.clone().narrow(1, ti, 1).reshape([b, g4]) + h_t.matmul(w.clone());
            let gate = |n: usize| gates.clone().narrow(1, n * h, h);
            c = sigmoid(gate(1)) * c + sigmoid(gate(0)) * tanh(gate(2));
            h_t = sigmoid(gate(3)) * tanh(c.clone());
            hs.push(h_t.clone());
        }
        if reverse {
            hs.reverse();
        }
        Tensor::stack(hs, 1)
    }

    #[test]
    fn tanh_through_exp_is_tanh() {
        for i in -2000..=2000 {
            let x = i as f32 / 40.0;
            assert!((super::tanh(x) - x.tanh()).abs() < 2e-7, "{x}");
        }
        assert_eq!(super::tanh(1e4), 1.0);
        assert_eq!(super::tanh(-1e4), -1.0);
    }

    fn max_rel_err<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> f32 {
        let scale = b.clone().abs().max().into_scalar::<f32>().max(1e-6);
        (a - b).abs().max().into_scalar::<f32>() / scale
    }

    /// Output and every gradient of the fused bidirectional layer against the
    /// composed cell.
    #[test]
    fn fused_lstm_matches_the_composed_cell() {
        let device = Device::flex().autodiff();
        device.seed(7);
        let (b, t, h) = (3, 5, 4);
        let n = Distribution::Normal(0.0, 1.0);
        let xps: Vec<Tensor<3>> = (0..2)
            .map(|_| Tensor::random([b, t, 4 * h], n, &device).require_grad())
            .collect();
        let ws: Vec<Tensor<2>> = (0..2)
            .map(|_| Tensor::random([h, 4 * h], n, &device).require_grad())
            .collect();
        assert!(crate::cpu::tensor::available(&xps[0]));
        let got = lstm_layer(&xps, &ws).expect("on the CPU");
        let want = Tensor::cat(
            vec![
                reference(xps[0].clone(), ws[0].clone(), false),
                reference(xps[1].clone(), ws[1].clone(), true),
            ],
            2,
        );
        assert_eq!(got.dims(), [b, t, 2 * h]);
        assert!(max_rel_err(got.clone(), want.clone()) < 1e-5);
        let r = Tensor::<3>::random([b, t, 2 * h], n, &device);
        let g_got = (got * r.clone()).sum().backward();
        let g_want = (want * r).sum().backward();
        for d in 0..2 {
            let x = |g: &TensorGradients| xps[d].grad(g).expect("projection gradient");
            assert!(max_rel_err(x(&g_got), x(&g_want)) < 1e-4, "dxp {d}");
            let w = |g: &TensorGradients| ws[d].grad(g).expect("weight gradient");
            assert!(max_rel_err(w(&g_got), w(&g_want)) < 1e-4, "dw {d}");
        }
    }

    type TensorGradients = burn::tensor::Gradients;
}
