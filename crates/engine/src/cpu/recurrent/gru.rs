//! The GRU recurrence as one autodiff op on the CPU (flex), as [`crate::cpu::recurrent::lstm`] is for
//! the LSTM.
//!
//! burn's composed cell (model/recurrent.rs `rnn_direction`) builds some twenty
//! autodiff nodes per step and keeps eleven values per hidden unit; here each step is
//! one GEMM (`h_{t-1} W_hh + b_hh`) and the gate math in one pass, and the backward is
//! hand-written backpropagation through time with the recurrent weight's gradient as
//! one product over all steps at the end. The two directions run on separate threads.
//!
//! PyTorch's (and ONNX's `linear_before_reset = 1`) cell, gate order r, z, n:
//! r = σ(x_r + h W_hr + b_hr), z = σ(x_z + h W_hz + b_hz),
//! n = tanh(x_n + r (h W_hn + b_hn)), h_t = (1 - z) n + z h_{t-1}.
//! The recurrent bias of n sits inside the reset product, so it cannot join the input
//! projection as the LSTM's does: it is the op's third input per direction.
//!
//! Kept for the backward, per step and direction: r, z, n and `h W_hn + b_hn` (4H),
//! plus the output.

use super::cell::{Shape3, sigmoid, step_index, tanh, two_rows};
use crate::cpu::tensor::{
    Ad, AdT, FlexDevice, FlexT, Strided, contiguous, finish_op, from_vec, gemm_into, values, wide,
};
use burn::backend::Flex;
use burn::tensor::{DType, Tensor};
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops};

/// One GRU layer's recurrence: per direction the input projection `[B, T, 3H]` (input
/// bias included), the recurrent weight `[H, 3H]` and the recurrent bias `[3H]` (zeros
/// for a layer without one); the second direction runs from the last step. Returns
/// `[B, T, dirs·H]`, or `None` when the tensors are not on the CPU's autodiff device
/// (the caller then uses burn's ops).
pub fn gru_layer(
    projections: &[Tensor<3>],
    w_hh: &[Tensor<2>],
    b_hh: &[Tensor<1>],
) -> Option<Tensor<3>> {
    let [b, t, g3] = projections[0].dims();
    let h = g3 / 3;
    let mut ad: Vec<AdT> = Vec::with_capacity(3 * projections.len());
    for ((x, w), bias) in projections.iter().zip(w_hh).zip(b_hh) {
        ad.push(x.clone().try_into_primitive::<Ad>().ok()?);
        ad.push(w.clone().try_into_primitive::<Ad>().ok()?);
        ad.push(bias.clone().try_into_primitive::<Ad>().ok()?);
    }
    if ad.iter().any(|x| x.primitive().dtype() != DType::F32) {
        return None;
    }
    let shape = Shape3 { b, t, h };
    let out = match ad.len() {
        3 => run::<3>(ad.try_into().ok()?, shape),
        6 => run::<6>(ad.try_into().ok()?, shape),
        _ => return None,
    };
    Some(out)
}

/// What one direction's backward reads.
#[derive(Clone, Debug)]
struct Direction {
    /// r, z and n `[B, T, 3H]`.
    acts: Vec<f32>,
    /// `h_{t-1} W_hn + b_hn` `[B, T, H]`.
    hn: Vec<f32>,
    w: FlexT,
    reverse: bool,
}

#[derive(Clone, Debug)]
struct State {
    shape: Shape3,
    dirs: Vec<Direction>,
    /// The layer's output `[B, T, dirs·H]` (h_t: the update gate's and the recurrent
    /// weight's gradients read h_{t-1}).
    out: FlexT,
}

#[derive(Debug)]
struct GruBackward;

/// `N` = 3 per direction: (projection, recurrent weight, recurrent bias).
fn run<const N: usize>(inputs: [AdT; N], shape: Shape3) -> Tensor<3> {
    let Shape3 { b, t, h } = shape;
    let nodes = inputs.each_ref().map(|x| x.node());
    let prims: [FlexT; N] = inputs.map(|x| contiguous(x.into_primitive()));
    let device = FlexDevice::default();
    let dirs = N / 3;
    let step = |d: usize| {
        let (xp, w, bias) = (
            values(&prims[3 * d]),
            values(&prims[3 * d + 1]),
            values(&prims[3 * d + 2]),
        );
        wide(
            #[inline(always)]
            || forward_direction(xp, w, bias, shape, d == 1),
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
            .map(|(d, (acts, hn, _))| Direction {
                acts,
                hn,
                w: prims[3 * d + 1].clone(),
                reverse: d == 1,
            })
            .collect(),
        out: out.clone(),
    };
    finish_op(GruBackward, nodes, || state, out)
}

impl<const N: usize> Backward<Flex, N> for GruBackward {
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
        for (d, (dxp, dw, db)) in results.into_iter().enumerate() {
            if let Some(node) = &ops.parents[3 * d] {
                grads.register::<Flex>(node.id, from_vec(dxp, &[b, t, 3 * h], &device));
            }
            if let Some(node) = &ops.parents[3 * d + 1] {
                grads.register::<Flex>(node.id, from_vec(dw, &[h, 3 * h], &device));
            }
            if let Some(node) = &ops.parents[3 * d + 2] {
                grads.register::<Flex>(node.id, from_vec(db, &[3 * h], &device));
            }
        }
    }
}

/// One step of the cell for one sample: `a` holds the projection's r, z, n blocks and
/// leaves with the gates r, z, n; `rec` is `h_{t-1} W_hh + b_hh`. Slices as arguments:
/// only arguments tell the compiler that they do not overlap, without which it does
/// not vectorise the loop.
#[inline(always)]
fn cell_forward(a: &mut [f32], rec: &[f32], hn: &mut [f32], h_prev: &[f32], h_t: &mut [f32]) {
    let n = h_t.len();
    let (ar, rest) = a.split_at_mut(n);
    let (az, an) = rest.split_at_mut(n);
    let an = &mut an[..n];
    let (rr, rz, rn) = (&rec[..n], &rec[n..2 * n], &rec[2 * n..3 * n]);
    let (hn, h_prev) = (&mut hn[..n], &h_prev[..n]);
    for j in 0..n {
        let r = sigmoid(ar[j] + rr[j]);
        let z = sigmoid(az[j] + rz[j]);
        let nn = tanh(an[j] + r * rn[j]);
        hn[j] = rn[j];
        ar[j] = r;
        az[j] = z;
        an[j] = nn;
        h_t[j] = nn + z * (h_prev[j] - nn);
    }
}

/// One step of backpropagation through the cell for one sample: from the gates r, z,
/// n, `hn` = `h_{t-1} W_hn + b_hn`, h_{t-1} and dL/dh_t from the output (`dy`) and from
/// the next step (`dh`, which leaves holding the direct part `dh_t z` of dL/dh_{t-1}),
/// the gradients of the gate pre-activations (`dr`, `dz`, `dn`: the projection's) and
/// of `hn` (`dhn`).
// Eleven slices as separate arguments: only arguments tell the compiler that they do
// not overlap, without which it does not vectorise the loop.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn cell_backward(
    r: &[f32],
    z: &[f32],
    nn: &[f32],
    hn: &[f32],
    h_prev: &[f32],
    dy: &[f32],
    dh: &mut [f32],
    dr: &mut [f32],
    dz: &mut [f32],
    dn: &mut [f32],
    dhn: &mut [f32],
) {
    let n = dh.len();
    let (r, z, nn, hn, h_prev, dy) = (&r[..n], &z[..n], &nn[..n], &hn[..n], &h_prev[..n], &dy[..n]);
    let (dr, dz, dn, dhn) = (&mut dr[..n], &mut dz[..n], &mut dn[..n], &mut dhn[..n]);
    for j in 0..n {
        let dh_t = dy[j] + dh[j];
        let dn_pre = dh_t * (1.0 - z[j]) * (1.0 - nn[j] * nn[j]);
        dz[j] = dh_t * (h_prev[j] - nn[j]) * z[j] * (1.0 - z[j]);
        dr[j] = dn_pre * hn[j] * r[j] * (1.0 - r[j]);
        dn[j] = dn_pre;
        dhn[j] = dn_pre * r[j];
        dh[j] = dh_t * z[j];
    }
}

/// One direction's forward (run through [`wide`]): returns the gates `[B, T, 3H]`,
/// `h_{t-1} W_hn + b_hn` and the outputs (both `[B, T, H]`).
#[inline(always)]
fn forward_direction(
    xp: &[f32],
    w: &[f32],
    bias: &[f32],
    shape: Shape3,
    reverse: bool,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let Shape3 { b, t, h } = shape;
    let g3 = 3 * h;
    let mut acts = xp.to_vec();
    let zeros = vec![0.0f32; h];
    let mut hn = vec![0.0f32; b * t * h];
    let mut hs = vec![0.0f32; b * t * h];
    let mut rec = vec![0.0f32; b * g3];
    for s in 0..t {
        let ti = step_index(s, t, reverse);
        let prev = (s > 0).then(|| step_index(s - 1, t, reverse));
        for row in rec.chunks_exact_mut(g3) {
            row.copy_from_slice(&bias[..g3]);
        }
        if let Some(tp) = prev {
            // rec = b_hh + h_{t-1} W_hh
            let lhs = Strided::new(&hs[tp * h..], t * h, 1);
            gemm_into(
                b,
                g3,
                h,
                Strided::new(&mut rec, g3, 1),
                true,
                lhs,
                Strided::new(w, g3, 1),
            );
        }
        for bi in 0..b {
            let row = bi * t;
            let a = &mut acts[(row + ti) * g3..][..g3];
            let hn_t = &mut hn[(row + ti) * h..][..h];
            let (h_t, h_prev) = match prev {
                Some(tp) => two_rows(&mut hs, h, row + ti, row + tp),
                None => (&mut hs[(row + ti) * h..][..h], &zeros[..]),
            };
            cell_forward(a, &rec[bi * g3..][..g3], hn_t, h_prev, h_t);
        }
    }
    (acts, hn, hs)
}

/// One direction's backward through time (run through [`wide`]): the gradients of its
/// input projection `[B, T, 3H]`, recurrent weight `[H, 3H]` and recurrent bias `[3H]`.
/// `dout` and `out` are the layer's `[B, T, dirs·H]` output gradient and output; this
/// direction is column block `d`.
#[inline(always)]
fn backward_direction(
    dir: &Direction,
    dout: &[f32],
    out: &[f32],
    d: usize,
    dirs: usize,
    shape: Shape3,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let Shape3 { b, t, h } = shape;
    let (g3, width) = (3 * h, dirs * h);
    let w = values(&dir.w);
    let mut dxp = vec![0.0f32; b * t * g3];
    let mut dhn = vec![0.0f32; b * t * h];
    // The gradient flowing back from the next step into h_{t-1}.
    let mut dh = vec![0.0f32; b * h];
    let zeros = vec![0.0f32; h];
    for s in (0..t).rev() {
        let ti = step_index(s, t, dir.reverse);
        let prev = (s > 0).then(|| step_index(s - 1, t, dir.reverse));
        for bi in 0..b {
            let row = bi * t;
            let a = &dir.acts[(row + ti) * g3..][..g3];
            let (r, z, nn) = (&a[..h], &a[h..2 * h], &a[2 * h..]);
            let (dr, rest) = dxp[(row + ti) * g3..][..g3].split_at_mut(h);
            let (dz, dn) = rest.split_at_mut(h);
            let h_prev = match prev {
                Some(tp) => &out[(row + tp) * width + d * h..][..h],
                None => &zeros[..],
            };
            cell_backward(
                r,
                z,
                nn,
                &dir.hn[(row + ti) * h..][..h],
                h_prev,
                &dout[(row + ti) * width + d * h..][..h],
                &mut dh[bi * h..][..h],
                dr,
                dz,
                dn,
                &mut dhn[(row + ti) * h..][..h],
            );
        }
        if prev.is_some() {
            // dh_{t-1} = dh_t z + [dr, dz] W_h{r,z}^T + dhn W_hn^T
            gemm_into(
                b,
                h,
                2 * h,
                Strided::new(&mut dh, h, 1),
                true,
                Strided::new(&dxp[ti * g3..], t * g3, 1),
                Strided::new(w, 1, g3),
            );
            gemm_into(
                b,
                h,
                h,
                Strided::new(&mut dh, h, 1),
                true,
                Strided::new(&dhn[ti * h..], t * h, 1),
                Strided::new(&w[2 * h..], 1, g3),
            );
        }
    }
    // dW_hh = sum over steps of h_{t-1}^T [dr, dz, dhn]: two products over all B·T
    // rows, with h_{t-1} laid out at step t's row (zero at the first step).
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
    let mut dw = vec![0.0f32; h * g3];
    gemm_into(
        h,
        2 * h,
        b * t,
        Strided::new(&mut dw, g3, 1),
        false,
        Strided::new(&h_prev, 1, h),
        Strided::new(&dxp, g3, 1),
    );
    gemm_into(
        h,
        h,
        b * t,
        Strided::new(&mut dw[2 * h..], g3, 1),
        false,
        Strided::new(&h_prev, 1, h),
        Strided::new(&dhn, h, 1),
    );
    // db_hh: the same sums with a row of ones, every step (the bias enters step 0 too).
    let mut db = vec![0.0f32; g3];
    for (dg, dn) in dxp.chunks_exact(g3).zip(dhn.chunks_exact(h)) {
        db[..2 * h]
            .iter_mut()
            .zip(&dg[..2 * h])
            .for_each(|(s, v)| *s += v);
        db[2 * h..].iter_mut().zip(dn).for_each(|(s, v)| *s += v);
    }
    (dxp, dw, db)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::activation::{sigmoid, tanh};
    use burn::tensor::{Device, Distribution};

    /// The cell composed of burn ops, as the equations read (gate order r, z, n).
    fn reference(xp: Tensor<3>, w: Tensor<2>, bias: Tensor<1>, reverse: bool) -> Tensor<3> {
        let [b, t, g3] = xp.dims();
        let h = g3 / 3;
        let device = xp.device();
        let mut hs = Vec::new();
        let mut h_t = Tensor::<2>::zeros([b, h], &device);
        for s in 0..t {
            let ti = step_index(s, t, reverse);
            let x = xp.clone().narrow(1, ti, 1).reshape([b, g3]);
            let rec = h_t.clone().matmul(w.clone()) + bias.clone().unsqueeze::<2>();
            let gate = |v: &Tensor<2>, n: usize| v.clone().narrow(1, n * h, h);
            let r = sigmoid(gate(&x, 0) + gate(&rec, 0));
            let z = sigmoid(gate(&x, 1) + gate(&rec, 1));
            let n = tanh(gate(&x, 2) + r * gate(&rec, 2));
            h_t = (z.clone().neg() + 1.0) * n + z * h_t;
            hs.push(h_t.clone());
        }
        if reverse {
            hs.reverse();
        }
        Tensor::stack(hs, 1)
    }

    fn max_rel_err<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> f32 {
        let scale = b.clone().abs().max().into_scalar::<f32>().max(1e-6);
        (a - b).abs().max().into_scalar::<f32>() / scale
    }

    type TensorGradients = burn::tensor::Gradients;

    /// Output and every gradient of the fused bidirectional layer against the
    /// composed cell.
    #[test]
    fn fused_gru_matches_the_composed_cell() {
        let device = Device::flex().autodiff();
        device.seed(11);
        let (b, t, h) = (3, 5, 4);
        let n = Distribution::Normal(0.0, 1.0);
        let xps: Vec<Tensor<3>> = (0..2)
            .map(|_| Tensor::random([b, t, 3 * h], n, &device).require_grad())
            .collect();
        let ws: Vec<Tensor<2>> = (0..2)
            .map(|_| Tensor::random([h, 3 * h], n, &device).require_grad())
            .collect();
        let bs: Vec<Tensor<1>> = (0..2)
            .map(|_| Tensor::random([3 * h], n, &device).require_grad())
            .collect();
        assert!(crate::cpu::tensor::available(&xps[0]));
        let got = gru_layer(&xps, &ws, &bs).expect("on the CPU");
        let want = Tensor::cat(
            (0..2)
                .map(|d| reference(xps[d].clone(), ws[d].clone(), bs[d].clone(), d == 1))
                .collect(),
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
            let bias = |g: &TensorGradients| bs[d].grad(g).expect("bias gradient");
            assert!(max_rel_err(bias(&g_got), bias(&g_want)) < 1e-4, "db {d}");
        }
    }

    /// A bias that is a constant (a layer without one) gets no gradient, and the
    /// others are unchanged by it.
    #[test]
    fn an_untracked_bias_gets_no_gradient() {
        let device = Device::flex().autodiff();
        device.seed(3);
        let (b, t, h) = (2, 4, 3);
        let n = Distribution::Normal(0.0, 1.0);
        let xp = Tensor::<3>::random([b, t, 3 * h], n, &device).require_grad();
        let w = Tensor::<2>::random([h, 3 * h], n, &device).require_grad();
        let bias = Tensor::<1>::zeros([3 * h], &device);
        use std::slice::from_ref;
        let got = gru_layer(from_ref(&xp), from_ref(&w), from_ref(&bias)).expect("on the CPU");
        let want = reference(xp.clone(), w.clone(), bias.clone(), false);
        assert!(max_rel_err(got.clone(), want.clone()) < 1e-5);
        let (g_got, g_want) = (got.sum().backward(), want.sum().backward());
        assert!(bias.grad(&g_got).is_none());
        assert!(max_rel_err(xp.grad(&g_got).unwrap(), xp.grad(&g_want).unwrap()) < 1e-4);
        assert!(max_rel_err(w.grad(&g_got).unwrap(), w.grad(&g_want).unwrap()) < 1e-4);
    }
}
