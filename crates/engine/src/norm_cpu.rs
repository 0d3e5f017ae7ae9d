//! Batch normalisation in training mode on the CPU, as one custom autodiff op.
//! Composed of burn tensor ops (model/norm.rs `batch_norm`), the layer takes about
//! ten passes over its input each way and keeps two tensors of its size (`x - mean`
//! and the normalised y); here the forward is two passes per channel, the backward
//! two, and only x and two numbers per channel (mean, 1/std) are kept, as PyTorch's
//! `native_batch_norm` keeps them. Channels run in parallel on rayon's threads.

use crate::cpu::{Ad, FlexDevice, FlexT, contiguous, from_vec, values, wide};
use burn::backend::Flex;
use burn::tensor::Tensor;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use rayon::prelude::*;

/// The variance's epsilon (PyTorch's default, as the composed version).
const EPS: f32 = 1e-5;

/// Independent running sums per lane: one sum would chain every add on the last (no
/// vectorising, one add per add's latency).
const LANES: usize = 8;

/// The sums over `a` and `b` (equal lengths) of the two terms `f(a_i, b_i)`, in f64,
/// in [`LANES`] lanes.
#[inline(always)]
fn lane_sums(a: &[f32], b: &[f32], f: impl Fn(f64, f64) -> (f64, f64)) -> (f64, f64) {
    let (mut s0, mut s1) = ([0.0f64; LANES], [0.0f64; LANES]);
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (a, b) in ca.zip(cb) {
        for l in 0..LANES {
            let (t0, t1) = f(f64::from(a[l]), f64::from(b[l]));
            s0[l] += t0;
            s1[l] += t1;
        }
    }
    let (mut t0, mut t1) = (s0.iter().sum::<f64>(), s1.iter().sum::<f64>());
    for (&a, &b) in ra.iter().zip(rb) {
        let (u0, u1) = f(f64::from(a), f64::from(b));
        t0 += u0;
        t1 += u1;
    }
    (t0, t1)
}

/// `x` `[B, C, S]` normalised per channel with the batch's statistics, scaled by `gamma`
/// and shifted by `beta` (`[C]` each); `None` off the CPU.
pub fn batch_norm_cpu(x: Tensor<3>, gamma: Tensor<1>, beta: Tensor<1>) -> Option<Tensor<3>> {
    let [b, c, s] = x.dims();
    let xa = x.try_into_primitive::<Ad>().ok()?;
    let ga = gamma.try_into_primitive::<Ad>().ok()?;
    let ba = beta.try_into_primitive::<Ad>().ok()?;
    let nodes = [xa.node(), ga.node(), ba.node()];
    let xf = contiguous(xa.into_primitive());
    let gf = contiguous(ga.into_primitive());
    let bf = contiguous(ba.into_primitive());
    let (xv, gv, bv) = (values(&xf), values(&gf), values(&bf));
    let n = (b * s) as f64;
    // Per channel: mean and 1/std over the batch and the positions (f64 sums).
    let stats: Vec<(f32, f32)> = (0..c)
        .into_par_iter()
        .map(|ch| {
            wide(
                #[inline(always)]
                || {
                    let rows = (0..b).map(|i| &xv[(i * c + ch) * s..(i * c + ch + 1) * s]);
                    let sum: f64 = rows
                        .clone()
                        .map(|r| lane_sums(r, r, |v, _| (v, 0.0)).0)
                        .sum();
                    let mean = sum / n;
                    let var: f64 = rows
                        .map(|r| lane_sums(r, r, |v, _| ((v - mean).powi(2), 0.0)).0)
                        .sum::<f64>()
                        / n;
                    (mean as f32, 1.0 / (var as f32 + EPS).sqrt())
                },
            )
        })
        .collect();
    let mut y = vec![0.0f32; b * c * s];
    y.par_chunks_mut(s).enumerate().for_each(|(row, out)| {
        let ch = row % c;
        let (mean, rstd) = stats[ch];
        let (scale, shift) = (gv[ch] * rstd, bv[ch] - gv[ch] * rstd * mean);
        let x = &xv[row * s..(row + 1) * s];
        wide(
            #[inline(always)]
            || {
                for (o, &v) in out.iter_mut().zip(x) {
                    *o = v * scale + shift;
                }
            },
        );
    });
    let y = from_vec(y, &[b, c, s], &FlexDevice::default());
    let y = match BatchNormOp
        .prepare::<NoCheckpointing>(nodes)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(
            NormState {
                dims: [b, c, s],
                x: xf,
                gamma: gf,
                stats,
            },
            y,
        ),
        OpsKind::UnTracked(prep) => prep.finish(y),
    };
    Some(Tensor::from_primitive::<Ad>(y))
}

#[derive(Clone, Debug)]
struct NormState {
    /// `[B, C, S]`.
    dims: [usize; 3],
    /// The input and the scale, shared handles (no copies).
    x: FlexT,
    gamma: FlexT,
    /// Mean and 1/std per channel.
    stats: Vec<(f32, f32)>,
}

#[derive(Debug)]
struct BatchNormOp;

impl Backward<Flex, 3> for BatchNormOp {
    type State = NormState;

    fn backward(self, ops: Ops<NormState, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let NormState {
            dims: [b, c, s],
            x,
            gamma,
            stats,
        } = ops.state;
        let dy = contiguous(grads.consume::<Flex>(&ops.node));
        let (xv, dyv, gv) = (values(&x), values(&dy), values(&gamma));
        let n = (b * s) as f64;
        // Per channel: sum(dy) (beta's gradient) and sum(dy * x_hat) (gamma's).
        let sums: Vec<(f32, f32)> = (0..c)
            .into_par_iter()
            .map(|ch| {
                let (mean, rstd) = stats[ch];
                let (mut dbeta, mut dgamma) = (0.0f64, 0.0f64);
                for i in 0..b {
                    let at = (i * c + ch) * s;
                    let (db, dg) = wide(
                        #[inline(always)]
                        || {
                            lane_sums(&dyv[at..at + s], &xv[at..at + s], |d, v| {
                                (d, d * f64::from((v as f32 - mean) * rstd))
                            })
                        },
                    );
                    dbeta += db;
                    dgamma += dg;
                }
                (dbeta as f32, dgamma as f32)
            })
            .collect();
        let [x_node, gamma_node, beta_node] = &ops.parents;
        let device = FlexDevice::default();
        if let Some(node) = x_node {
            // dx = gamma·rstd/N · (N·dy − Σdy − x_hat·Σ(dy·x_hat))
            let mut dx = vec![0.0f32; b * c * s];
            dx.par_chunks_mut(s).enumerate().for_each(|(row, out)| {
                let ch = row % c;
                let (mean, rstd) = stats[ch];
                let (dbeta, dgamma) = sums[ch];
                let k = gv[ch] * rstd;
                let (mean_dy, mean_dyx) = (dbeta / n as f32, dgamma / n as f32);
                let (dy, x) = (&dyv[row * s..(row + 1) * s], &xv[row * s..(row + 1) * s]);
                wide(
                    #[inline(always)]
                    || {
                        for ((o, &d), &v) in out.iter_mut().zip(dy).zip(x) {
                            *o = k * (d - mean_dy - (v - mean) * rstd * mean_dyx);
                        }
                    },
                );
            });
            grads.register::<Flex>(node.id, from_vec(dx, &[b, c, s], &device));
        }
        if let Some(node) = gamma_node {
            let dgamma = sums.iter().map(|&(_, g)| g).collect();
            grads.register::<Flex>(node.id, from_vec(dgamma, &[c], &device));
        }
        if let Some(node) = beta_node {
            let dbeta = sums.iter().map(|&(d, _)| d).collect();
            grads.register::<Flex>(node.id, from_vec(dbeta, &[c], &device));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::max_rel_err;
    use burn::tensor::{Device, Distribution};

    /// Output and the three gradients against the same layer composed of burn ops.
    #[test]
    fn matches_the_composed_batch_norm() {
        let device = Device::flex().autodiff();
        device.seed(9);
        for [b, c, s] in [[4, 3, 10], [1, 5, 7], [6, 2, 1]] {
            let x = Tensor::<3>::random([b, c, s], Distribution::Normal(1.0, 2.0), &device)
                .require_grad();
            let gamma =
                Tensor::<1>::random([c], Distribution::Normal(1.0, 0.5), &device).require_grad();
            let beta =
                Tensor::<1>::random([c], Distribution::Normal(0.0, 1.0), &device).require_grad();
            let got = batch_norm_cpu(x.clone(), gamma.clone(), beta.clone()).expect("a CPU tensor");
            let mean = x.clone().mean_dim(0).mean_dim(2);
            let centered = x.clone() - mean;
            let var = centered.clone().powi_scalar(2).mean_dim(0).mean_dim(2);
            let want = centered / (var + EPS).sqrt() * gamma.clone().reshape([1, c, 1])
                + beta.clone().reshape([1, c, 1]);
            assert!(max_rel_err(got.clone(), want.clone()) < 1e-4);
            let r = Tensor::<3>::random([b, c, s], Distribution::Normal(0.0, 1.0), &device);
            let g_got = (got * r.clone()).sum().backward();
            let g_want = (want * r).sum().backward();
            assert!(max_rel_err(x.grad(&g_got).unwrap(), x.grad(&g_want).unwrap()) < 1e-3);
            assert!(max_rel_err(gamma.grad(&g_got).unwrap(), gamma.grad(&g_want).unwrap()) < 1e-4);
            assert!(max_rel_err(beta.grad(&g_got).unwrap(), beta.grad(&g_want).unwrap()) < 1e-4);
        }
    }
}
