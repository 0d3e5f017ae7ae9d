//! Batch normalisation in training mode and layer normalisation on the CPU, each as
//! one custom autodiff op. Composed of burn tensor ops (model/norm.rs), a norm takes
//! about ten passes over its input each way and keeps two tensors of its size
//! (`x - mean` and the normalised y); here the forward is two passes per channel (per
//! row for the layer norm), the backward two, and only x and two numbers per channel
//! or row (mean, 1/std) are kept, as PyTorch's `native_batch_norm` and
//! `native_layer_norm` keep them. Channels (rows) run in parallel on rayon's threads.

use crate::cpu::{Ad, FlexDevice, FlexT, add_partials, contiguous, from_vec, values, wide};
use burn::backend::Flex;
use burn::tensor::Tensor;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, NodeGuard, Ops, OpsKind};
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

/// A norm's input, scale and shift as autodiff nodes and contiguous flex tensors; `None`
/// off the CPU.
fn operands<const D: usize>(
    x: Tensor<D>,
    gamma: Tensor<1>,
    beta: Tensor<1>,
) -> Option<([NodeGuard; 3], [FlexT; 3])> {
    let xa = x.try_into_primitive::<Ad>().ok()?;
    let ga = gamma.try_into_primitive::<Ad>().ok()?;
    let ba = beta.try_into_primitive::<Ad>().ok()?;
    let nodes = [xa.node(), ga.node(), ba.node()];
    let flex = [xa, ga, ba].map(|t| contiguous(t.into_primitive()));
    Some((nodes, flex))
}

/// `x` `[B, C, S]` normalised per channel with the batch's statistics, scaled by `gamma`
/// and shifted by `beta` (`[C]` each); `None` off the CPU.
pub fn batch_norm_cpu(x: Tensor<3>, gamma: Tensor<1>, beta: Tensor<1>) -> Option<Tensor<3>> {
    let [b, c, s] = x.dims();
    let (nodes, [xf, gf, bf]) = operands(x, gamma, beta)?;
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

/// What a fused norm keeps for its backward.
#[derive(Clone, Debug)]
struct NormState<const D: usize> {
    /// Batch norm `[B, C, S]`, layer norm `[rows, n]`.
    dims: [usize; D],
    /// The input and the scale, shared handles (no copies).
    x: FlexT,
    gamma: FlexT,
    /// Mean and 1/std per channel (per row).
    stats: Vec<(f32, f32)>,
}

#[derive(Debug)]
struct BatchNormOp;

impl Backward<Flex, 3> for BatchNormOp {
    type State = NormState<3>;

    fn backward(self, ops: Ops<NormState<3>, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
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

/// Rows per rayon job of the layer norm: enough work per job for rows of a few dozen
/// features (a transformer's width), few enough partial parameter gradients to add.
const LN_JOB_ELEMS: usize = 1 << 14;

/// `x` `[rows, n]` normalised over each row, scaled by `gamma` and shifted by `beta`
/// (`[n]` each); `None` off the CPU.
pub fn layer_norm_cpu(x: Tensor<2>, gamma: Tensor<1>, beta: Tensor<1>) -> Option<Tensor<2>> {
    let [rows, n] = x.dims();
    let (nodes, [xf, gf, bf]) = operands(x, gamma, beta)?;
    let (xv, gv, bv) = (values(&xf), values(&gf), values(&bf));
    let job = (LN_JOB_ELEMS / n.max(1)).max(1);
    let mut y = vec![0.0f32; rows * n];
    let mut stats = vec![(0.0f32, 0.0f32); rows];
    y.par_chunks_mut(job * n)
        .zip(stats.par_chunks_mut(job))
        .zip(xv.par_chunks(job * n))
        .for_each(|((y, stats), x)| {
            wide(
                #[inline(always)]
                || {
                    for ((y, st), x) in y.chunks_exact_mut(n).zip(stats).zip(x.chunks_exact(n)) {
                        // Two passes in f64 lanes: the variance of the centred row, not
                        // E[x^2] - E[x]^2, which cancels for rows far from zero.
                        let mean = lane_sums(x, x, |v, _| (v, 0.0)).0 / n as f64;
                        let var = lane_sums(x, x, |v, _| ((v - mean).powi(2), 0.0)).0 / n as f64;
                        let (mean, rstd) = (mean as f32, 1.0 / (var as f32 + EPS).sqrt());
                        *st = (mean, rstd);
                        for (((o, &v), &g), &b) in y.iter_mut().zip(x).zip(gv).zip(bv) {
                            *o = (v - mean) * rstd * g + b;
                        }
                    }
                },
            )
        });
    let y = from_vec(y, &[rows, n], &FlexDevice::default());
    let y = match LayerNormOp
        .prepare::<NoCheckpointing>(nodes)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(
            NormState {
                dims: [rows, n],
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

#[derive(Debug)]
struct LayerNormOp;

impl Backward<Flex, 3> for LayerNormOp {
    type State = NormState<2>;

    fn backward(self, ops: Ops<NormState<2>, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let NormState {
            dims: [rows, n],
            x,
            gamma,
            stats,
        } = ops.state;
        let dy = contiguous(grads.consume::<Flex>(&ops.node));
        let (xv, dyv, gv) = (values(&x), values(&dy), values(&gamma));
        let [x_node, gamma_node, beta_node] = &ops.parents;
        let want_dx = x_node.is_some();
        let job = (LN_JOB_ELEMS / n.max(1)).max(1);
        let mut dx = vec![0.0f32; if want_dx { rows * n } else { 0 }];
        // Per job: its rows' dx, and its partial sums of dy * x_hat (gamma's gradient) and
        // dy (beta's), added across jobs after.
        let job_sums = |dx: &mut [f32], dy: &[f32], x: &[f32], stats: &[(f32, f32)]| {
            let mut dgamma = vec![0.0f32; n];
            let mut dbeta = vec![0.0f32; n];
            wide(
                #[inline(always)]
                || {
                    for (r, (&(mean, rstd), (dy, x))) in stats
                        .iter()
                        .zip(dy.chunks_exact(n).zip(x.chunks_exact(n)))
                        .enumerate()
                    {
                        // dx = rstd (g - mean(g) - x_hat mean(g x_hat)), g = dy gamma.
                        let (mut sum_g, mut sum_gx) = (0.0f32, 0.0f32);
                        for ((((&d, &v), &gm), dg), db) in dy
                            .iter()
                            .zip(x)
                            .zip(gv)
                            .zip(dgamma.iter_mut())
                            .zip(dbeta.iter_mut())
                        {
                            let xhat = (v - mean) * rstd;
                            *dg += d * xhat;
                            *db += d;
                            let g = d * gm;
                            sum_g += g;
                            sum_gx += g * xhat;
                        }
                        if want_dx {
                            let (mean_g, mean_gx) = (sum_g / n as f32, sum_gx / n as f32);
                            let out = &mut dx[r * n..(r + 1) * n];
                            for (((o, &d), &v), &gm) in out.iter_mut().zip(dy).zip(x).zip(gv) {
                                let xhat = (v - mean) * rstd;
                                *o = rstd * (d * gm - mean_g - xhat * mean_gx);
                            }
                        }
                    }
                },
            );
            (dgamma, dbeta)
        };
        let add = |(g0, b0), (g1, b1)| (add_partials(g0, g1), add_partials(b0, b1));
        let parts = dyv
            .par_chunks(job * n)
            .zip(xv.par_chunks(job * n).zip(stats.par_chunks(job)));
        let (dgamma, dbeta) = if want_dx {
            dx.par_chunks_mut(job * n)
                .zip(parts)
                .map(|(dx, (dy, (x, st)))| job_sums(dx, dy, x, st))
                .reduce(|| (vec![0.0; n], vec![0.0; n]), add)
        } else {
            parts
                .map(|(dy, (x, st))| job_sums(&mut [], dy, x, st))
                .reduce(|| (vec![0.0; n], vec![0.0; n]), add)
        };
        let device = FlexDevice::default();
        if let Some(node) = x_node {
            grads.register::<Flex>(node.id, from_vec(dx, &[rows, n], &device));
        }
        if let Some(node) = gamma_node {
            grads.register::<Flex>(node.id, from_vec(dgamma, &[n], &device));
        }
        if let Some(node) = beta_node {
            grads.register::<Flex>(node.id, from_vec(dbeta, &[n], &device));
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

    /// Output and the three gradients against the layer norm composed of burn ops, on
    /// rows shorter and longer than a vector and over more rows than one job.
    #[test]
    fn matches_the_composed_layer_norm() {
        let device = Device::flex().autodiff();
        device.seed(10);
        for [rows, n] in [[5, 3], [700, 64], [3, 130]] {
            let x = Tensor::<2>::random([rows, n], Distribution::Normal(3.0, 2.0), &device)
                .require_grad();
            let gamma =
                Tensor::<1>::random([n], Distribution::Normal(1.0, 0.5), &device).require_grad();
            let beta =
                Tensor::<1>::random([n], Distribution::Normal(0.0, 1.0), &device).require_grad();
            let got = layer_norm_cpu(x.clone(), gamma.clone(), beta.clone()).expect("a CPU tensor");
            let mean = x.clone().mean_dim(1);
            let centered = x.clone() - mean;
            let var = centered.clone().powi_scalar(2).mean_dim(1);
            let want = centered / (var + EPS).sqrt() * gamma.clone().unsqueeze::<2>()
                + beta.clone().unsqueeze::<2>();
            assert!(
                max_rel_err(got.clone(), want.clone()) < 1e-4,
                "[{rows}, {n}]"
            );
            let r = Tensor::<2>::random([rows, n], Distribution::Normal(0.0, 1.0), &device);
            let g_got = (got * r.clone()).sum().backward();
            let g_want = (want * r).sum().backward();
            let grad = |t: &Tensor<2>, g| t.grad(g).expect("a gradient");
            assert!(max_rel_err(grad(&x, &g_got), grad(&x, &g_want)) < 1e-3);
            assert!(max_rel_err(gamma.grad(&g_got).unwrap(), gamma.grad(&g_want).unwrap()) < 1e-4);
            assert!(max_rel_err(beta.grad(&g_got).unwrap(), beta.grad(&g_want).unwrap()) < 1e-4);
        }
    }
}
