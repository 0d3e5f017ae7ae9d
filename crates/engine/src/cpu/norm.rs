//! Batch normalisation in training mode and layer normalisation on the CPU, each as
//! one custom autodiff op. Composed of burn tensor ops (model/norm.rs), a norm takes
//! about ten passes over its input each way and keeps two tensors of its size
//! (`x - mean` and the normalised y); here the forward is two passes per channel (per
//! row for the layer norm), the backward two, and only x and two numbers per channel
//! or row (mean, 1/std) are kept, as PyTorch's `native_batch_norm` and
//! `native_layer_norm` keep them. Channels (rows) run in parallel on rayon's threads.

use crate::cpu::tensor::{
    Ad, FlexDevice, FlexT, add_partials, assume_init, contiguous, finish_op, from_vec,
    one_piece_per_thread, uninit, values, wide, zero_fill,
};
use burn::backend::Flex;
use burn::tensor::Tensor;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, NodeGuard, Ops};
use rayon::prelude::*;
use std::mem::MaybeUninit;

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

/// Positions per channel below which the batch norm treats each sample's `[C, S]` block
/// as one vector, with each channel's constants spread over a block-sized slab: rows
/// this short cost more in per-row set-up and remainder loops than in arithmetic (a
/// DenseNet's last blocks have 4 and 1 positions per channel at 32x32 pixels).
const SLAB_BELOW_POSITIONS: usize = 32;

/// Elements per rayon job of the batch norm's passes.
const BN_JOB_ELEMS: usize = 1 << 14;

/// The sizes of a batch norm's input `[B, C, S]`, and how its passes run.
#[derive(Clone, Copy, Debug)]
struct Channels {
    b: usize,
    c: usize,
    s: usize,
}

impl Channels {
    /// Elements over which each channel's statistics run.
    fn n(&self) -> f64 {
        (self.b * self.s) as f64
    }
    /// One sample's block.
    fn block(&self) -> usize {
        self.c * self.s
    }
    fn slabs(&self) -> bool {
        self.s < SLAB_BELOW_POSITIONS
    }
    /// Whole samples per job on the slab path, whole rows (one channel of one sample)
    /// per job on the other.
    fn job(&self) -> usize {
        let unit = if self.slabs() { self.block() } else { self.s };
        (BN_JOB_ELEMS / unit.max(1)).max(1) * unit
    }
    /// `v[ch]` spread over a sample's block (each repeated `s` times).
    fn slab<T: Copy>(&self, v: impl Iterator<Item = T>) -> Vec<T> {
        v.flat_map(|x| std::iter::repeat_n(x, self.s)).collect()
    }
    /// Per channel, the sums over the batch and the positions of the two terms
    /// `f(a_i, b_i, m)` of each element (`a`, `b` `[B, C, S]`; `m` the channel's value of
    /// `per_channel`), in f64.
    fn sums(
        &self,
        a: &[f32],
        b: &[f32],
        per_channel: &[f64],
        f: impl Fn(f64, f64, f64) -> (f64, f64) + Sync,
    ) -> Vec<(f64, f64)> {
        let Channels { c, s, .. } = *self;
        if !self.slabs() {
            // Per channel (in parallel), its rows of s in lanes.
            return (0..c)
                .into_par_iter()
                .map(|ch| {
                    let m = per_channel[ch];
                    wide(
                        #[inline(always)]
                        || {
                            (0..self.b)
                                .map(|i| (i * c + ch) * s..(i * c + ch + 1) * s)
                                .map(|r| lane_sums(&a[r.clone()], &b[r], |u, v| f(u, v, m)))
                                .fold((0.0, 0.0), |(s0, s1), (t0, t1)| (s0 + t0, s1 + t1))
                        },
                    )
                })
                .collect();
        }
        // Per job of whole samples, element-wise sums over its samples' blocks; then the
        // jobs' partial sums added, and each channel's s entries.
        let cs = self.block();
        let m_slab = self.slab(per_channel.iter().copied());
        let (s0, s1) = a
            .par_chunks(self.job())
            .zip(b.par_chunks(self.job()))
            .map(|(a, b)| {
                let (mut s0, mut s1) = (vec![0.0f64; cs], vec![0.0f64; cs]);
                wide(
                    #[inline(always)]
                    || {
                        for (a, b) in a.chunks_exact(cs).zip(b.chunks_exact(cs)) {
                            for ((((s0, s1), &u), &v), &m) in
                                s0.iter_mut().zip(s1.iter_mut()).zip(a).zip(b).zip(&m_slab)
                            {
                                let (t0, t1) = f(f64::from(u), f64::from(v), m);
                                *s0 += t0;
                                *s1 += t1;
                            }
                        }
                    },
                );
                (s0, s1)
            })
            .reduce_with(|(a0, a1), (b0, b1)| (add_f64(a0, b0), add_f64(a1, b1)))
            .unwrap_or_else(|| (vec![0.0; cs], vec![0.0; cs]));
        s0.chunks_exact(s.max(1))
            .zip(s1.chunks_exact(s.max(1)))
            .map(|(p0, p1)| (p0.iter().sum(), p1.iter().sum()))
            .collect()
    }
    /// `out = f(a, b, channel constants)` element-wise over `[B, C, S]`, `k[ch]` the
    /// channel's constants.
    fn map<K: Copy + Send + Sync>(
        &self,
        out: &mut [MaybeUninit<f32>],
        a: &[f32],
        b: &[f32],
        k: &[K],
        f: impl Fn(f32, f32, K) -> f32 + Sync,
    ) {
        let Channels { c, s, .. } = *self;
        let job = self.job();
        let k_slab = if self.slabs() {
            self.slab(k.iter().copied())
        } else {
            Vec::new()
        };
        out.par_chunks_mut(job)
            .zip(a.par_chunks(job).zip(b.par_chunks(job)))
            .enumerate()
            .for_each(|(j, (out, (a, b)))| {
                wide(
                    #[inline(always)]
                    || {
                        if self.slabs() {
                            for ((out, a), b) in out
                                .chunks_exact_mut(c * s)
                                .zip(a.chunks_exact(c * s))
                                .zip(b.chunks_exact(c * s))
                            {
                                for (((o, &u), &v), &k) in out.iter_mut().zip(a).zip(b).zip(&k_slab)
                                {
                                    o.write(f(u, v, k));
                                }
                            }
                        } else {
                            let first = j * job / s;
                            for (r, ((out, a), b)) in out
                                .chunks_exact_mut(s)
                                .zip(a.chunks_exact(s))
                                .zip(b.chunks_exact(s))
                                .enumerate()
                            {
                                let k = k[(first + r) % c];
                                for ((o, &u), &v) in out.iter_mut().zip(a).zip(b) {
                                    o.write(f(u, v, k));
                                }
                            }
                        }
                    },
                )
            });
    }
}

/// Two partial sums in f64 added.
fn add_f64(mut a: Vec<f64>, b: Vec<f64>) -> Vec<f64> {
    a.iter_mut().zip(&b).for_each(|(a, b)| *a += b);
    a
}

/// `x` `[B, C, S]` normalised per channel with the batch's statistics, scaled by `gamma`
/// and shifted by `beta` (`[C]` each); `None` off the CPU.
pub fn batch_norm_cpu(x: Tensor<3>, gamma: Tensor<1>, beta: Tensor<1>) -> Option<Tensor<3>> {
    let [b, c, s] = x.dims();
    let shape = Channels { b, c, s };
    let (nodes, [xf, gf, bf]) = operands(x, gamma, beta)?;
    let (xv, gv, bv) = (values(&xf), values(&gf), values(&bf));
    let n = shape.n();
    // Per channel: mean, then the variance about it (two passes, f64 sums).
    let zeros = vec![0.0f64; c];
    let mean: Vec<f64> = shape
        .sums(xv, xv, &zeros, |v, _, _| (v, 0.0))
        .into_iter()
        .map(|(sum, _)| sum / n)
        .collect();
    let var = shape.sums(xv, xv, &mean, |v, _, m| ((v - m).powi(2), 0.0));
    let stats: Vec<(f32, f32)> = mean
        .iter()
        .zip(&var)
        .map(|(&m, &(v, _))| (m as f32, 1.0 / ((v / n) as f32 + EPS).sqrt()))
        .collect();
    let affine: Vec<(f32, f32)> = stats
        .iter()
        .zip(gv.iter().zip(bv))
        .map(|(&(mean, rstd), (&g, &beta))| (g * rstd, beta - g * rstd * mean))
        .collect();
    let mut y = uninit(b * c * s);
    shape.map(&mut y, xv, xv, &affine, |v, _, (scale, shift)| {
        v * scale + shift
    });
    // SAFETY: `map` wrote every element.
    let y = from_vec(
        unsafe { assume_init(y) },
        &[b, c, s],
        &FlexDevice::default(),
    );
    let state = || NormState {
        dims: [b, c, s],
        x: xf,
        gamma: gf,
        stats,
    };
    Some(finish_op(BatchNormOp, nodes, state, y))
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
        let shape = Channels { b, c, s };
        let n = shape.n() as f32;
        // Per channel: sum(dy) (beta's gradient) and sum(dy * x_hat) (gamma's).
        let mean: Vec<f64> = stats.iter().map(|&(m, _)| f64::from(m)).collect();
        let sums: Vec<(f32, f32)> = shape
            .sums(dyv, xv, &mean, |d, v, m| (d, d * (v - m)))
            .into_iter()
            .zip(&stats)
            .map(|((db, dg), &(_, rstd))| (db as f32, dg as f32 * rstd))
            .collect();
        let [x_node, gamma_node, beta_node] = &ops.parents;
        let device = FlexDevice::default();
        if let Some(node) = x_node {
            // dx = gamma·rstd/N · (N·dy − Σdy − x_hat·Σ(dy·x_hat))
            let coefs: Vec<[f32; 4]> = stats
                .iter()
                .zip(&sums)
                .zip(gv)
                .map(|((&(mean, rstd), &(dbeta, dgamma)), &g)| {
                    [g * rstd, dbeta / n, mean, rstd * dgamma / n]
                })
                .collect();
            let mut dx = uninit(b * c * s);
            shape.map(&mut dx, dyv, xv, &coefs, |d, v, [k, mean_dy, mean, r]| {
                k * (d - mean_dy - (v - mean) * r)
            });
            // SAFETY: `map` wrote every element.
            let dx = unsafe { assume_init(dx) };
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
    if n == 0 {
        return None;
    }
    let (nodes, [xf, gf, bf]) = operands(x, gamma, beta)?;
    let (xv, gv, bv) = (values(&xf), values(&gf), values(&bf));
    let job = (LN_JOB_ELEMS / n.max(1)).max(1);
    let mut y = uninit(rows * n);
    let mut stats = vec![(0.0f32, 0.0f32); rows];
    y.par_chunks_mut(job * n)
        .zip(stats.par_chunks_mut(job))
        .zip(xv.par_chunks(job * n))
        .for_each(|((y, stats), x)| {
            let y = zero_fill(y);
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
    // SAFETY: the jobs' chunks cover y.
    let y = from_vec(
        unsafe { assume_init(y) },
        &[rows, n],
        &FlexDevice::default(),
    );
    let state = || NormState {
        dims: [rows, n],
        x: xf,
        gamma: gf,
        stats,
    };
    Some(finish_op(LayerNormOp, nodes, state, y))
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
        let mut dx = uninit(if want_dx { rows * n } else { 0 });
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
        // At most one piece per thread: the partials add in the same order every run.
        let pieces = one_piece_per_thread(rows.div_ceil(job));
        let parts = dyv
            .par_chunks(job * n)
            .zip(xv.par_chunks(job * n).zip(stats.par_chunks(job)));
        let (dgamma, dbeta) = if want_dx {
            dx.par_chunks_mut(job * n)
                .zip(parts)
                .with_min_len(pieces)
                .map(|(dx, (dy, (x, st)))| job_sums(zero_fill(dx), dy, x, st))
                .reduce(|| (vec![0.0; n], vec![0.0; n]), add)
        } else {
            parts
                .with_min_len(pieces)
                .map(|(dy, (x, st))| job_sums(&mut [], dy, x, st))
                .reduce(|| (vec![0.0; n], vec![0.0; n]), add)
        };
        let device = FlexDevice::default();
        if let Some(node) = x_node {
            // SAFETY: the jobs' chunks cover dx when it is wanted.
            let dx = unsafe { assume_init(dx) };
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

    /// Output and the three gradients against the same layer composed of burn ops: both
    /// paths (positions per channel below and above `SLAB_BELOW_POSITIONS`), one and
    /// several jobs, jobs whose rows start mid-way through the channels.
    #[test]
    fn matches_the_composed_batch_norm() {
        let device = Device::flex().autodiff();
        device.seed(9);
        for [b, c, s] in [
            [4, 3, 10],
            [1, 5, 7],
            [6, 2, 1],
            [40, 70, 9],
            [3, 4, 40],
            [2, 3, 3000],
        ] {
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
