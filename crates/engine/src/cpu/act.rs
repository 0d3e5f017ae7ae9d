//! Softmax over the last axis, exact GELU, ReLU and the clipped ReLU on the CPU, as
//! custom autodiff ops.
//!
//! burn composes softmax from five tensor ops (max, subtract, exp, sum, divide), each a
//! pass and an allocation with its own backward, and flex's exp and erf are scalar
//! libm calls: on a small ViT at batch 32 the exponentials and erf alone took 18 % of
//! the step. Here each is one pass forward and one backward, with `exp` and `erf`
//! written as polynomials the compiler vectorises (compiled for the CPU's widest SIMD
//! through `pulp`'s dispatch). Softmax keeps its output (`dx = y (dy - sum(dy y))`), as
//! PyTorch's does; GELU keeps its input, as burn's does. burn's ReLU is one serial pass
//! each way, and its backward builds a one-byte mask and copies it to reshape it (4.5 %
//! of densenet121's step at batch 32, all on one thread); it keeps its input, which
//! stays alive beside the output the next layer keeps.

use crate::cpu::tensor::{
    Ad, FlexDevice, FlexT, assume_init, contiguous, finish_op, from_vec, uninit, values,
    values_mut, wide, zero_fill,
};
use burn::backend::Flex;
use burn::tensor::Tensor;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops};
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// Elements per rayon job.
const CHUNK: usize = 1 << 14;

/// `e^x` in f32 (Cephes' `expf`: `x = n ln 2 + r` with ln 2 in two parts, a degree-5
/// polynomial in `r`, `2^n` through the exponent bits): within 2 ulp, 0 below the
/// smallest normal's logarithm. Plain arithmetic, so a loop of it vectorises.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LO: f32 = -87.336_55;
    let clamped = x.clamp(LO, 88.376_26);
    // Rounded to the nearest integer by adding and removing 1.5 x 2^23 (no `floor`,
    // which is a library call without SSE4.1).
    const ROUND: f32 = 12_582_912.0;
    let shifted = clamped * std::f32::consts::LOG2_E + ROUND;
    let n = shifted - ROUND;
    let r = clamped - n * 0.693_359_4 + n * 2.121_944_4e-4;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 0.166_666_65)
        * r
        + 0.5;
    // 2^n from the bits of `shifted`, whose low mantissa bits hold n (plus 2^22, which the
    // shift drops): `n as i32` is a saturating cast, which the compiler does per lane
    // with compares and inserts; this stays in the vector registers.
    let two_n = f32::from_bits(shifted.to_bits().wrapping_add(127) << 23);
    let y = (p * r * r + r + 1.0) * two_n;
    if x < LO { 0.0 } else { y }
}

/// `erf(x)` and `e^{-x^2}` (Abramowitz and Stegun 7.1.26: absolute error under 1.5e-7
/// in exact arithmetic, 1e-6 in f32: a few ulp of GELU's `1 + erf`).
#[inline(always)]
fn erf_and_gauss(x: f32) -> (f32, f32) {
    let a = x.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let poly = ((((1.061_405_4 * t - 1.453_152_1) * t + 1.421_413_7) * t - 0.284_496_74) * t
        + 0.254_829_6)
        * t;
    let gauss = exp(-a * a);
    (f32::copysign(1.0 - poly * gauss, x), gauss)
}

/// One pass of the ops below over a chunk, run by [`Pass::run`] compiled for the CPU's
/// widest SIMD (AVX-512 or AVX2 where present, through `pulp`'s dispatch): every
/// function it calls is `inline(always)`, so the loops are compiled with those features.
enum Pass<'a> {
    SoftmaxForward {
        y: &'a mut [f32],
        x: &'a [f32],
        n: usize,
    },
    SoftmaxBackward {
        dx: &'a mut [f32],
        y: &'a [f32],
        dy: &'a [f32],
        n: usize,
    },
    GeluForward {
        y: &'a mut [f32],
        x: &'a [f32],
    },
    GeluBackward {
        dx: &'a mut [f32],
        x: &'a [f32],
        dy: &'a [f32],
    },
    ClampForward {
        y: &'a mut [f32],
        pass: &'a mut [u8],
        x: &'a [f32],
        min: f32,
        max: f32,
    },
    ClampBackward {
        d: &'a mut [f32],
        pass: &'a [u8],
    },
    ReluInPlace {
        v: &'a mut [f32],
    },
    ReluForward {
        y: &'a mut [MaybeUninit<f32>],
        x: &'a [f32],
    },
    ReluBackward {
        d: &'a mut [f32],
        y: &'a [f32],
    },
}

impl Pass<'_> {
    fn run(self) {
        pulp::Arch::new().dispatch(self)
    }
}

impl pulp::WithSimd for Pass<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        match self {
            Pass::SoftmaxForward { y, x, n } => {
                for (y, x) in y.chunks_exact_mut(n).zip(x.chunks_exact(n)) {
                    let m = max(x);
                    for (y, &x) in y.iter_mut().zip(x) {
                        *y = exp(x - m);
                    }
                    let inv = 1.0 / sum(y);
                    for y in y.iter_mut() {
                        *y *= inv;
                    }
                }
            }
            Pass::SoftmaxBackward { dx, y, dy, n } => {
                for ((dx, y), dy) in dx
                    .chunks_exact_mut(n)
                    .zip(y.chunks_exact(n))
                    .zip(dy.chunks_exact(n))
                {
                    // dx = y (dy - sum(dy y)); dx holds dy y first.
                    for ((d, &y), &g) in dx.iter_mut().zip(y).zip(dy) {
                        *d = g * y;
                    }
                    let dot = sum(dx);
                    for ((d, &y), &g) in dx.iter_mut().zip(y).zip(dy) {
                        *d = y * (g - dot);
                    }
                }
            }
            Pass::GeluForward { y, x } => {
                for (y, &x) in y.iter_mut().zip(x) {
                    let (erf, _) = erf_and_gauss(x * FRAC_1_SQRT_2);
                    *y = 0.5 * x * (1.0 + erf);
                }
            }
            Pass::ClampForward {
                y,
                pass,
                x,
                min,
                max,
            } => {
                // burn's `clamp` (`clamp_min` then `clamp_max`): NaN stays NaN, and the
                // gradient passes where min <= x <= max (and for NaN).
                for ((y, p), &x) in y.iter_mut().zip(pass.iter_mut()).zip(x) {
                    let (low, high) = (x < min, x > max);
                    *y = if low {
                        min
                    } else if high {
                        max
                    } else {
                        x
                    };
                    *p = u8::from(!(low | high));
                }
            }
            Pass::ClampBackward { d, pass } => {
                for (d, &p) in d.iter_mut().zip(pass) {
                    *d = if p == 0 { 0.0 } else { *d };
                }
            }
            // PyTorch's: NaN passes forward (NaN < 0 is false) and its gradient passes;
            // where the output is 0 the gradient is 0 (`threshold_backward`).
            Pass::ReluInPlace { v } => {
                for v in v.iter_mut() {
                    *v = if *v < 0.0 { 0.0 } else { *v };
                }
            }
            Pass::ReluForward { y, x } => {
                for (y, &x) in y.iter_mut().zip(x) {
                    y.write(if x < 0.0 { 0.0 } else { x });
                }
            }
            Pass::ReluBackward { d, y } => {
                for (d, &y) in d.iter_mut().zip(y) {
                    *d = if y <= 0.0 { 0.0 } else { *d };
                }
            }
            Pass::GeluBackward { dx, x, dy } => {
                // d/dx x Phi(x) = Phi(x) + x phi(x), phi(x) = e^{-x^2/2} / sqrt(2 pi).
                for ((d, &x), &g) in dx.iter_mut().zip(x).zip(dy) {
                    let (erf, gauss) = erf_and_gauss(x * FRAC_1_SQRT_2);
                    *d = g * (0.5 * (1.0 + erf) + x * gauss * FRAC_1_SQRT_2PI);
                }
            }
        }
    }
}

/// The sum of `v` in 16 lanes (so it vectorises), then across them.
#[inline(always)]
fn sum(v: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let mut chunks = v.chunks_exact(16);
    for c in &mut chunks {
        for (a, x) in acc.iter_mut().zip(c) {
            *a += x;
        }
    }
    acc.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>()
}

/// The largest element of `v` (NaN is skipped; it reaches the output through `exp`).
#[inline(always)]
fn max(v: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 16];
    let mut chunks = v.chunks_exact(16);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = a.max(x);
        }
    }
    let rest = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    acc.iter().fold(rest, |m, &x| m.max(x))
}

/// Rows of `n` per rayon job, at least one.
fn rows_per_job(n: usize) -> usize {
    (CHUNK / n.max(1)).max(1)
}

/// Softmax over the last axis of `x` `[rows, n]`; `None` off the CPU.
pub fn softmax_rows_cpu(x: Tensor<2>) -> Option<Tensor<2>> {
    let [rows, n] = x.dims();
    if n == 0 {
        return None;
    }
    let xa = x.try_into_primitive::<Ad>().ok()?;
    let node = xa.node();
    let xf = contiguous(xa.into_primitive());
    // Each job's part zeroed by the job (in parallel), then written by its pass.
    let mut y = uninit(rows * n);
    let job = rows_per_job(n) * n;
    y.par_chunks_mut(job)
        .zip(values(&xf).par_chunks(job))
        .for_each(|(y, x)| {
            Pass::SoftmaxForward {
                y: zero_fill(y),
                x,
                n,
            }
            .run()
        });
    // SAFETY: the jobs' chunks cover y.
    let y = from_vec(
        unsafe { assume_init(y) },
        &[rows, n],
        &FlexDevice::default(),
    );
    let kept = y.clone();
    Some(finish_op(SoftmaxOp, [node], || kept, y))
}

#[derive(Debug)]
struct SoftmaxOp;

impl Backward<Flex, 1> for SoftmaxOp {
    /// The output, a shared handle.
    type State = FlexT;

    fn backward(self, ops: Ops<FlexT, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let y = ops.state;
        let dy = contiguous(grads.consume::<Flex>(&ops.node));
        let [Some(node)] = &ops.parents else {
            return;
        };
        let shape = y.layout().shape().to_vec();
        let n = shape.last().copied().unwrap_or(1);
        let mut dx = uninit(values(&y).len());
        let job = rows_per_job(n) * n;
        dx.par_chunks_mut(job)
            .zip(values(&y).par_chunks(job))
            .zip(values(&dy).par_chunks(job))
            .for_each(|((dx, y), dy)| {
                Pass::SoftmaxBackward {
                    dx: zero_fill(dx),
                    y,
                    dy,
                    n,
                }
                .run()
            });
        // SAFETY: the jobs' chunks cover dx.
        let dx = unsafe { assume_init(dx) };
        grads.register::<Flex>(node.id, from_vec(dx, &shape, &FlexDevice::default()));
    }
}

/// `1 / sqrt(2)` and `1 / sqrt(2 pi)`.
const FRAC_1_SQRT_2: f32 = std::f32::consts::FRAC_1_SQRT_2;
const FRAC_1_SQRT_2PI: f32 = 0.398_942_3;

/// Exact GELU, `x Phi(x) = x (1 + erf(x / sqrt 2)) / 2`, element-wise; `None` off the CPU.
pub fn gelu_cpu<const D: usize>(x: Tensor<D>) -> Option<Tensor<D>> {
    let xa = x.try_into_primitive::<Ad>().ok()?;
    let node = xa.node();
    let xf = contiguous(xa.into_primitive());
    let shape = xf.layout().shape().to_vec();
    let mut y = uninit(values(&xf).len());
    y.par_chunks_mut(CHUNK)
        .zip(values(&xf).par_chunks(CHUNK))
        .for_each(|(y, x)| Pass::GeluForward { y: zero_fill(y), x }.run());
    // SAFETY: the jobs' chunks cover y.
    let y = from_vec(unsafe { assume_init(y) }, &shape, &FlexDevice::default());
    Some(finish_op(GeluOp, [node], || xf, y))
}

#[derive(Debug)]
struct GeluOp;

impl Backward<Flex, 1> for GeluOp {
    /// The input, a shared handle.
    type State = FlexT;

    fn backward(self, ops: Ops<FlexT, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let x = ops.state;
        let dy = contiguous(grads.consume::<Flex>(&ops.node));
        let [Some(node)] = &ops.parents else {
            return;
        };
        let mut dx = uninit(values(&x).len());
        dx.par_chunks_mut(CHUNK)
            .zip(values(&x).par_chunks(CHUNK))
            .zip(values(&dy).par_chunks(CHUNK))
            .for_each(|((dx, x), dy)| {
                let dx = zero_fill(dx);
                Pass::GeluBackward { dx, x, dy }.run()
            });
        let shape = x.layout().shape().to_vec();
        // SAFETY: the jobs' chunks cover dx.
        let dx = unsafe { assume_init(dx) };
        grads.register::<Flex>(node.id, from_vec(dx, &shape, &FlexDevice::default()));
    }
}

/// `x` clamped to `[min, max]` (ReLU6 and other clipped ReLUs, `F.normalize`'s
/// `clamp_min(eps)`), keeping one byte per
/// element (whether the gradient passes) for the backward, which writes into the
/// incoming gradient; `None` off the CPU. burn's `clamp` is two comparisons and two
/// `mask_fill`s each way: 18 % of mobilenet_v2's step.
pub fn clamp_cpu<const D: usize>(x: Tensor<D>, min: f32, max: f32) -> Option<Tensor<D>> {
    let xa = x.try_into_primitive::<Ad>().ok()?;
    let node = xa.node();
    let xf = contiguous(xa.into_primitive());
    let shape = xf.layout().shape().to_vec();
    let len = values(&xf).len();
    let (mut y, mut pass) = (uninit(len), vec![0u8; len]);
    y.par_chunks_mut(CHUNK)
        .zip(pass.par_chunks_mut(CHUNK))
        .zip(values(&xf).par_chunks(CHUNK))
        .for_each(|((y, pass), x)| {
            let y = zero_fill(y);
            Pass::ClampForward {
                y,
                pass,
                x,
                min,
                max,
            }
            .run()
        });
    drop(xf);
    // SAFETY: the jobs' chunks cover y.
    let y = from_vec(unsafe { assume_init(y) }, &shape, &FlexDevice::default());
    Some(finish_op(ClampOp, [node], || std::sync::Arc::new(pass), y))
}

#[derive(Debug)]
struct ClampOp;

impl Backward<Flex, 1> for ClampOp {
    /// Whether each element's gradient passes.
    type State = std::sync::Arc<Vec<u8>>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let pass = ops.state;
        let mut d = contiguous(grads.consume::<Flex>(&ops.node));
        let [Some(node)] = &ops.parents else {
            return;
        };
        values_mut(&mut d)
            .par_chunks_mut(CHUNK)
            .zip(pass.par_chunks(CHUNK))
            .for_each(|(d, pass)| Pass::ClampBackward { d, pass }.run());
        grads.register::<Flex>(node.id, d);
    }
}

/// `max(x, 0)` element-wise, keeping its output for the backward (as PyTorch's does),
/// which zeroes the incoming gradient in place where the output is not positive; `None`
/// off the CPU. When nothing else holds x (a norm's output, say) the result is written
/// over it.
pub fn relu_cpu<const D: usize>(x: Tensor<D>) -> Option<Tensor<D>> {
    let xa = x.try_into_primitive::<Ad>().ok()?;
    let node = xa.node();
    let mut xf = contiguous(xa.into_primitive());
    let y = if xf.is_unique() {
        values_mut(&mut xf)
            .par_chunks_mut(CHUNK)
            .for_each(|v| Pass::ReluInPlace { v }.run());
        xf
    } else {
        let mut y = uninit(values(&xf).len());
        y.par_chunks_mut(CHUNK)
            .zip(values(&xf).par_chunks(CHUNK))
            .for_each(|(y, x)| Pass::ReluForward { y, x }.run());
        // SAFETY: the pass wrote every element of `y`, one per element of x.
        let y = unsafe { assume_init(y) };
        from_vec(y, xf.layout().shape(), &FlexDevice::default())
    };
    let kept = y.clone();
    Some(finish_op(ReluOp, [node], || kept, y))
}

#[derive(Debug)]
struct ReluOp;

impl Backward<Flex, 1> for ReluOp {
    /// The output, a shared handle.
    type State = FlexT;

    fn backward(self, ops: Ops<FlexT, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let y = ops.state;
        let mut d = contiguous(grads.consume::<Flex>(&ops.node));
        let [Some(node)] = &ops.parents else {
            return;
        };
        values_mut(&mut d)
            .par_chunks_mut(CHUNK)
            .zip(values(&y).par_chunks(CHUNK))
            .for_each(|(d, y)| Pass::ReluBackward { d, y }.run());
        grads.register::<Flex>(node.id, d);
    }
}

/// The mean over rows of the cross-entropy of `logits` `[rows, classes]` against the
/// target distributions `target` (one-hot rows, say), `-sum_c y_c log softmax(x)_c`, as
/// one op; `None` off the CPU. burn's is its default `log_softmax` (five passes, `exp`
/// as scalar libm calls, recomputed in the backward) and a product with the target:
/// 25 % of a small GPT's step at batch 32, all on one thread. Keeps the logits (a shared
/// handle), the target and each row's log-sum-exp and target mass; the backward writes
/// `dx = g (softmax(x) sum_c y_c - y) / rows`.
pub fn cross_entropy_cpu(logits: Tensor<2>, target: Tensor<2>) -> Option<Tensor<1>> {
    let [rows, classes] = logits.dims();
    if target.dims() != [rows, classes] || rows == 0 || classes == 0 {
        return None;
    }
    let xa = logits.try_into_primitive::<Ad>().ok()?;
    let ya = target.try_into_primitive::<Ad>().ok()?;
    let node = xa.node();
    let xf = contiguous(xa.into_primitive());
    let yf = contiguous(ya.into_primitive());
    let job = rows_per_job(classes);
    // Per row: (log-sum-exp, target mass); per job: the sum of its rows' losses.
    let mut stats = vec![(0.0f32, 0.0f32); rows];
    let total: f64 = stats
        .par_chunks_mut(job)
        .zip(values(&xf).par_chunks(job * classes))
        .zip(values(&yf).par_chunks(job * classes))
        .map(|((stats, x), y)| {
            wide(
                #[inline(always)]
                || {
                    let mut loss = 0.0f64;
                    for ((st, x), y) in stats
                        .iter_mut()
                        .zip(x.chunks_exact(classes))
                        .zip(y.chunks_exact(classes))
                    {
                        let m = max(x);
                        let mut acc = [0.0f32; 16];
                        let mut chunks = x.chunks_exact(16);
                        for c in &mut chunks {
                            for (a, &v) in acc.iter_mut().zip(c) {
                                *a += exp(v - m);
                            }
                        }
                        let rest: f32 = chunks.remainder().iter().map(|&v| exp(v - m)).sum();
                        let lse = m + (acc.iter().sum::<f32>() + rest).ln();
                        let (mut mass, mut dot) = (0.0f32, 0.0f32);
                        for (&v, &t) in x.iter().zip(y) {
                            mass += t;
                            dot += t * v;
                        }
                        *st = (lse, mass);
                        loss += f64::from(lse * mass - dot);
                    }
                    loss
                },
            )
        })
        .sum();
    let loss = from_vec(
        vec![(total / rows as f64) as f32],
        &[1],
        &FlexDevice::default(),
    );
    let state = || CrossEntropyState {
        x: xf,
        y: yf,
        stats,
    };
    Some(finish_op(CrossEntropyOp, [node], state, loss))
}

#[derive(Clone, Debug)]
struct CrossEntropyState {
    /// The logits and the target, shared handles.
    x: FlexT,
    y: FlexT,
    /// Per row: log-sum-exp of the logits, and the target's mass.
    stats: Vec<(f32, f32)>,
}

#[derive(Debug)]
struct CrossEntropyOp;

impl Backward<Flex, 1> for CrossEntropyOp {
    type State = CrossEntropyState;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let CrossEntropyState { x, y, stats } = ops.state;
        let dloss = contiguous(grads.consume::<Flex>(&ops.node));
        let [Some(node)] = &ops.parents else {
            return;
        };
        let shape = x.layout().shape().to_vec();
        let (rows, classes) = (stats.len(), shape[1]);
        let g = values(&dloss)[0] / rows as f32;
        let job = rows_per_job(classes);
        let mut dx = uninit(rows * classes);
        dx.par_chunks_mut(job * classes)
            .zip(values(&x).par_chunks(job * classes))
            .zip(values(&y).par_chunks(job * classes))
            .zip(stats.par_chunks(job))
            .for_each(|(((dx, x), y), stats)| {
                wide(
                    #[inline(always)]
                    || {
                        for (((dx, x), y), &(lse, mass)) in dx
                            .chunks_exact_mut(classes)
                            .zip(x.chunks_exact(classes))
                            .zip(y.chunks_exact(classes))
                            .zip(stats)
                        {
                            for ((d, &v), &t) in dx.iter_mut().zip(x).zip(y) {
                                d.write(g * (exp(v - lse) * mass - t));
                            }
                        }
                    },
                )
            });
        // SAFETY: every row of dx was written whole.
        let dx = unsafe { assume_init(dx) };
        grads.register::<Flex>(node.id, from_vec(dx, &shape, &FlexDevice::default()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::max_rel_err;
    use burn::tensor::activation::{gelu, relu, softmax};
    use burn::tensor::{Device, Distribution, TensorData};

    /// Loss and logits' gradient against burn's log-softmax and product, one-hot and
    /// soft targets, fewer classes than a vector and more rows than a job.
    #[test]
    fn cross_entropy_matches_burn() {
        let device = Device::flex().autodiff();
        device.seed(13);
        for [rows, classes] in [[4, 5], [3, 1000], [700, 37]] {
            let x = Tensor::<2>::random([rows, classes], Distribution::Normal(0.0, 3.0), &device)
                .require_grad();
            let mut onehot = vec![0.0f32; rows * classes];
            for r in 0..rows {
                onehot[r * classes + (r * 7) % classes] = 1.0;
            }
            let onehot = Tensor::<2>::from_data(TensorData::new(onehot, [rows, classes]), &device);
            let soft = softmax(
                Tensor::<2>::random([rows, classes], Distribution::Normal(0.0, 1.0), &device),
                1,
            );
            for y in [onehot, soft] {
                let got = cross_entropy_cpu(x.clone(), y.clone()).expect("a CPU tensor");
                let want = (burn::tensor::activation::log_softmax(x.clone(), 1) * y)
                    .sum()
                    .neg()
                    .div_scalar(rows as f32);
                assert!(
                    max_rel_err(got.clone(), want.clone()) < 1e-5,
                    "[{rows}, {classes}]"
                );
                let dx = |g: &burn::tensor::Gradients| x.grad(g).expect("input gradient");
                let (g_got, g_want) = (got.backward(), want.backward());
                assert!(
                    max_rel_err(dx(&g_got), dx(&g_want)) < 1e-4,
                    "[{rows}, {classes}]"
                );
            }
        }
    }

    #[test]
    fn exp_and_erf_hold_to_f32_rounding() {
        // The normal range; below it, 0 (subnormals are flushed).
        for i in -1740..=1760 {
            let x = i as f32 * 0.05;
            let want = f64::from(x).exp();
            let got = f64::from(exp(x));
            assert!(
                (got - want).abs() <= 3e-7 * want,
                "exp({x}) = {got}, not {want}"
            );
            let (erf, gauss) = erf_and_gauss(x / 40.0);
            let want = libm::erf(f64::from(x / 40.0));
            // Abramowitz and Stegun's 1.5e-7 plus the f32 rounding of its terms (worst
            // near 0, where 1 - poly e^{-x^2} cancels): a few ulp of GELU's 1 + erf.
            let err = (f64::from(erf) - want).abs();
            assert!(err < 1e-6, "erf({}) off by {err}", x / 40.0);
            let want = (-f64::from(x / 40.0).powi(2)).exp();
            assert!((f64::from(gauss) - want).abs() <= 3e-7 * want);
        }
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert!(exp(f32::NAN).is_nan());
    }

    /// Output and input gradient against burn's softmax, GELU and clamp, on rows shorter
    /// and longer than a vector, with a masked (-inf) entry for the softmax.
    #[test]
    fn softmax_and_gelu_match_burn() {
        let device = Device::flex().autodiff();
        device.seed(11);
        for [rows, n] in [[3, 5], [40, 65], [2, 700]] {
            let x = Tensor::<2>::random([rows, n], Distribution::Normal(0.0, 3.0), &device)
                .require_grad();
            let r = Tensor::<2>::random([rows, n], Distribution::Normal(0.0, 1.0), &device);
            let mut mask = vec![0.0f32; rows * n];
            mask[1] = f32::NEG_INFINITY;
            let mask = Tensor::<2>::from_data(TensorData::new(mask, [rows, n]), &device);
            // Each side its own graph: burn's tape is consumed by a backward.
            let masked = || x.clone() + mask.clone();
            for (got, want) in [
                (
                    softmax_rows_cpu(masked()).expect("a CPU tensor"),
                    softmax(masked(), 1),
                ),
                (gelu_cpu(x.clone()).expect("a CPU tensor"), gelu(x.clone())),
                (
                    clamp_cpu(x.clone(), 0.0, 2.5).expect("a CPU tensor"),
                    x.clone().clamp(0.0, 2.5),
                ),
                (
                    clamp_cpu(x.clone(), -1.0, f32::MAX).expect("a CPU tensor"),
                    x.clone().clamp(-1.0, f32::MAX),
                ),
                // x is held by the test: the op writes a new tensor.
                (relu_cpu(x.clone()).expect("a CPU tensor"), relu(x.clone())),
                // A fresh tensor nothing else holds: the op writes over it.
                (
                    relu_cpu(x.clone() * 1.0).expect("a CPU tensor"),
                    relu(x.clone()),
                ),
            ] {
                assert!(
                    max_rel_err(got.clone(), want.clone()) < 1e-5,
                    "[{rows}, {n}]"
                );
                let g_got = (got * r.clone()).sum().backward();
                let g_want = (want * r.clone()).sum().backward();
                let dx = |g: &burn::tensor::Gradients| x.grad(g).expect("input gradient");
                assert!(max_rel_err(dx(&g_got), dx(&g_want)) < 1e-5, "[{rows}, {n}]");
            }
        }
    }
}
