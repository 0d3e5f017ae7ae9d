//! 2-d max pooling on the CPU, as one custom autodiff op. burn-flex's goes through its
//! 3-d pool with i64 indices per output (cast to i32 after), checking every tap of every
//! window against the borders: 21 % of squeezenet1_1's training step at batch 32. Here
//! each window's valid rows and columns are worked out once per output row and column,
//! the planes run on rayon's threads, and only the winners' offsets in their plane
//! (u32) are kept for the backward, which adds dy onto them; PyTorch also keeps the
//! input, which the gradient does not need.

use crate::cpu::tensor::{
    Ad, FlexDevice, assume_init, contiguous, finish_op, from_vec, uninit, values, wide, zero_fill,
};
use burn::backend::Flex;
use burn::tensor::Tensor;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops};
use rayon::prelude::*;

/// Planes per rayon job: enough work per job on small feature maps.
const PLANES_PER_JOB: usize = 16;

/// A window's taps inside the input along one axis, for each output position:
/// `start..end` (the padding holds no taps).
fn taps(
    outputs: usize,
    input: usize,
    kernel: usize,
    stride: usize,
    pad: usize,
) -> Vec<(usize, usize)> {
    (0..outputs)
        .map(|o| {
            let first = (o * stride) as isize - pad as isize;
            let start = first.max(0) as usize;
            let end = ((first + kernel as isize).max(0) as usize).min(input);
            (start.min(end), end)
        })
        .collect()
}

/// One plane's widths and the window's step along a row.
#[derive(Clone, Copy)]
struct Plane {
    w: usize,
    ow: usize,
    stride: usize,
    pad: usize,
}

/// Takes tap `v` at `offset` when it beats the window's best so far: a larger value, or
/// NaN (NaN wins, as in PyTorch), or the window's first tap.
#[inline(always)]
fn take(v: f32, offset: u32, best: &mut f32, arg: &mut u32) {
    // `|`, not `||`: three compares and two selects, no branches.
    let wins = (v > *best) | v.is_nan() | (*arg == u32::MAX);
    *best = if wins { v } else { *best };
    *arg = if wins { offset } else { *arg };
}

/// Takes the contiguous `taps` into the windows' `best` and `arg`, one tap per window;
/// the taps' plane offsets are `base`, `base + step`, ... (u32 arithmetic, so that the
/// loop runs as wide as the f32 one).
#[inline(always)]
fn sweep(taps: &[f32], base: u32, step: u32, best: &mut [f32], arg: &mut [u32]) {
    let n = best.len();
    let (taps, arg) = (&taps[..n], &mut arg[..n]);
    for k in 0..n {
        let offset = base.wrapping_add((k as u32).wrapping_mul(step));
        take(taps[k], offset, &mut best[k], &mut arg[k]);
    }
}

/// A sweep's length is rounded up to this many windows, so that it runs in whole vectors
/// (16 f32 lanes with AVX-512, two vectors of 8 with AVX2): the rows of a small feature
/// map are 3 to 30 outputs wide, and in the loop's scalar remainder (compares and
/// branches per window) went most of a max pool's time.
const SWEEP_LANES: usize = 16;

/// Per-thread buffers of [`pool_plane`]: the row's windows rounded up to whole vectors,
/// and an input row (split into its stride's phases), each with a vector of slack.
struct Sweeps {
    best: Vec<f32>,
    arg: Vec<u32>,
    phases: Vec<f32>,
    phase_len: usize,
}

impl Sweeps {
    fn new(p: Plane) -> Self {
        let phase_len = p.w.div_ceil(p.stride) + SWEEP_LANES;
        Sweeps {
            best: vec![f32::NEG_INFINITY; p.ow.next_multiple_of(SWEEP_LANES)],
            arg: vec![u32::MAX; p.ow.next_multiple_of(SWEEP_LANES)],
            phases: vec![0.0f32; phase_len * p.stride],
            phase_len,
        }
    }
}

/// Max pool of one plane `x` into `y` and its winners: output row by output row, each
/// tap row and tap column swept across the row's interior outputs at once (the loop the
/// compiler vectorises, over whole vectors: the lanes past the row take taps from the
/// buffers' slack and are dropped), the windows clipped by the padding tap by tap. Each
/// input row is first copied into its s phases (`line[i]` to `phases[i % s][i / s]`;
/// stride 1: one phase), so that a sweep reads contiguous taps rather than gathering
/// every s-th.
#[inline(always)]
fn pool_plane(
    x: &[f32],
    y: &mut [f32],
    winners: &mut [u32],
    p: Plane,
    rows: &[(usize, usize)],
    cols: &[(usize, usize)],
    sw: &mut Sweeps,
) {
    let kw = cols.iter().map(|&(a, b)| b - a).max().unwrap_or(0);
    // Outputs whose window lies inside the row: lo..hi.
    let full = |ox: usize| {
        let (c0, c1) = cols[ox];
        c1 - c0 == kw && c0 + p.pad == ox * p.stride
    };
    let lo = (0..p.ow).find(|&o| full(o)).unwrap_or(p.ow);
    let hi = (lo..p.ow).find(|&o| !full(o)).unwrap_or(p.ow);
    let (n, phase_len) = (hi - lo, sw.phase_len);
    let lanes = n.next_multiple_of(SWEEP_LANES);
    for (oy, &(r0, r1)) in rows.iter().enumerate() {
        let best = &mut y[oy * p.ow..(oy + 1) * p.ow];
        let arg = &mut winners[oy * p.ow..(oy + 1) * p.ow];
        best.fill(f32::NEG_INFINITY);
        arg.fill(u32::MAX);
        let (sbest, sarg) = (&mut sw.best[..lanes], &mut sw.arg[..lanes]);
        sbest.fill(f32::NEG_INFINITY);
        sarg.fill(u32::MAX);
        for r in r0..r1 {
            let line = &x[r * p.w..(r + 1) * p.w];
            if lo < hi {
                for (ph, phase) in sw.phases.chunks_exact_mut(phase_len).enumerate() {
                    for (dst, &v) in phase.iter_mut().zip(line.iter().skip(ph).step_by(p.stride)) {
                        *dst = v;
                    }
                }
                for j in 0..kw {
                    let first = lo * p.stride + j - p.pad;
                    let at = (first % p.stride) * phase_len + first / p.stride;
                    let base = (r * p.w + first) as u32;
                    sweep(
                        &sw.phases[at..at + lanes],
                        base,
                        p.stride as u32,
                        sbest,
                        sarg,
                    );
                }
            }
            for ox in (0..lo).chain(hi..p.ow) {
                let (c0, c1) = cols[ox];
                for (col, &v) in line.iter().enumerate().take(c1).skip(c0) {
                    take(v, (r * p.w + col) as u32, &mut best[ox], &mut arg[ox]);
                }
            }
        }
        best[lo..hi].copy_from_slice(&sbest[..n]);
        arg[lo..hi].copy_from_slice(&sarg[..n]);
    }
}

/// A stride-1 pool's plane, padded: the windows of one output row, laid end to end with
/// the padded rows, are one run per tap. Output (oy, ox) sits at `oy * wp + ox` of every
/// run; the lanes between rows (`ox >= ow`) are dropped.
#[derive(Clone, Copy)]
struct Stride1 {
    h: usize,
    w: usize,
    kernel: [usize; 2],
    /// Padding before the first row and column.
    top: usize,
    left: usize,
    /// The padded plane's rows and row length.
    hp: usize,
    wp: usize,
    oh: usize,
    ow: usize,
}

impl Stride1 {
    /// The sweeps' length: every output's slot, rounded up to whole vectors.
    fn lanes(&self) -> usize {
        ((self.oh - 1) * self.wp + self.ow).next_multiple_of(SWEEP_LANES)
    }
}

/// Per-thread buffers of [`pool_plane_stride1`]: the padded plane (its border and the
/// slack past it -inf, never written) and the sweeps' best values and winners.
struct Stride1Buffers {
    padded: Vec<f32>,
    best: Vec<f32>,
    arg: Vec<u32>,
}

impl Stride1Buffers {
    fn new(p: Stride1) -> Self {
        let lanes = p.lanes();
        // The last sweep reads lanes past the last output, up to a vector beyond the plane.
        let reach = lanes + (p.kernel[0] - 1) * p.wp + p.kernel[1] - 1;
        Stride1Buffers {
            padded: vec![f32::NEG_INFINITY; reach.max(p.hp * p.wp)],
            best: vec![f32::NEG_INFINITY; lanes],
            arg: vec![u32::MAX; lanes],
        }
    }
}

/// Max pool of one plane with stride 1: the plane copied once into a -inf border, then
/// each tap swept across all the outputs at once (a small feature map's rows are 2 to 8
/// outputs wide: row by row, most of each vector and the clipped border windows, tap by
/// tap, took the time). A winner in the border (every tap of its window -inf, or no tap)
/// is worked out again from the window's taps inside the plane.
#[inline(always)]
fn pool_plane_stride1(
    x: &[f32],
    y: &mut [f32],
    winners: &mut [u32],
    p: Stride1,
    rows: &[(usize, usize)],
    cols: &[(usize, usize)],
    buf: &mut Stride1Buffers,
) {
    for (src, dst) in x
        .chunks_exact(p.w)
        .zip(buf.padded[p.top * p.wp..].chunks_exact_mut(p.wp))
    {
        dst[p.left..p.left + p.w].copy_from_slice(src);
    }
    let lanes = p.lanes();
    buf.best.fill(f32::NEG_INFINITY);
    buf.arg.fill(u32::MAX);
    for i in 0..p.kernel[0] {
        for j in 0..p.kernel[1] {
            let at = i * p.wp + j;
            let taps = &buf.padded[at..at + lanes];
            sweep(taps, at as u32, 1, &mut buf.best, &mut buf.arg);
        }
    }
    for (oy, (y, winners)) in y
        .chunks_exact_mut(p.ow)
        .zip(winners.chunks_exact_mut(p.ow))
        .enumerate()
    {
        for (ox, (y, winner)) in y.iter_mut().zip(winners.iter_mut()).enumerate() {
            let t = oy * p.wp + ox;
            let at = buf.arg[t] as usize;
            let (r, c) = (at / p.wp, at % p.wp);
            let inside = (p.top..p.top + p.h).contains(&r) && (p.left..p.left + p.w).contains(&c);
            if inside {
                *y = buf.best[t];
                *winner = ((r - p.top) * p.w + c - p.left) as u32;
            } else {
                let (mut best, mut arg) = (f32::NEG_INFINITY, u32::MAX);
                for r in rows[oy].0..rows[oy].1 {
                    for c in cols[ox].0..cols[ox].1 {
                        take(x[r * p.w + c], (r * p.w + c) as u32, &mut best, &mut arg);
                    }
                }
                (*y, *winner) = (best, arg);
            }
        }
    }
}

/// `max_pool2d` of `x` `[B, C, H, W]` without dilation, padding ignored (as -inf); `None`
/// off the CPU.
pub fn max_pool2d_cpu(
    x: Tensor<4>,
    kernel: [usize; 2],
    stride: [usize; 2],
    pads: [(usize, usize); 2],
) -> Option<Tensor<4>> {
    let [b, c, h, w] = x.dims();
    if stride.contains(&0) || kernel.contains(&0) {
        return None;
    }
    // Winners are u32 offsets in their plane.
    if h * w == 0 || h * w >= u32::MAX as usize {
        return None;
    }
    let oh = (h + pads[0].0 + pads[0].1).checked_sub(kernel[0])? / stride[0] + 1;
    let ow = (w + pads[1].0 + pads[1].1).checked_sub(kernel[1])? / stride[1] + 1;
    let xa = x.try_into_primitive::<Ad>().ok()?;
    let node = xa.node();
    let xf = contiguous(xa.into_primitive());
    let xv = values(&xf);
    let rows = taps(oh, h, kernel[0], stride[0], pads[0].0);
    let cols = taps(ow, w, kernel[1], stride[1], pads[1].0);
    let (plane_in, plane_out) = (h * w, oh * ow);
    // Every output is written (`zero_fill` only makes the job's part floats, in parallel).
    let mut y = uninit(b * c * plane_out);
    let mut winners = vec![0u32; b * c * plane_out];
    y.par_chunks_mut(PLANES_PER_JOB * plane_out)
        .zip(winners.par_chunks_mut(PLANES_PER_JOB * plane_out))
        .zip(xv.par_chunks(PLANES_PER_JOB * plane_in))
        .for_each(|((y, winners), x)| {
            let planes = zero_fill(y)
                .chunks_exact_mut(plane_out)
                .zip(winners.chunks_exact_mut(plane_out))
                .zip(x.chunks_exact(plane_in));
            let plane = Plane {
                w,
                ow,
                stride: stride[1],
                pad: pads[1].0,
            };
            if stride == [1, 1] {
                let (top, left) = (pads[0].0, pads[1].0);
                let (hp, wp) = (h + top + pads[0].1, w + left + pads[1].1);
                let p = Stride1 {
                    h,
                    w,
                    kernel,
                    top,
                    left,
                    hp,
                    wp,
                    oh,
                    ow,
                };
                let mut buffers = Stride1Buffers::new(p);
                wide(
                    #[inline(always)]
                    || {
                        for ((y, winners), x) in planes {
                            pool_plane_stride1(x, y, winners, p, &rows, &cols, &mut buffers);
                        }
                    },
                );
                return;
            }
            let mut sweeps = Sweeps::new(plane);
            wide(
                #[inline(always)]
                || {
                    for ((y, winners), x) in planes {
                        pool_plane(x, y, winners, plane, &rows, &cols, &mut sweeps);
                    }
                },
            );
        });
    // SAFETY: the jobs cover y (one per PLANES_PER_JOB planes of x, which is not empty).
    let y = from_vec(
        unsafe { assume_init(y) },
        &[b, c, oh, ow],
        &FlexDevice::default(),
    );
    let state = || PoolState {
        dims: [b, c, h, w],
        plane_out,
        winners,
    };
    Some(finish_op(MaxPoolOp, [node], state, y))
}

#[derive(Clone, Debug)]
struct PoolState {
    /// The input's `[B, C, H, W]`.
    dims: [usize; 4],
    /// Outputs per plane.
    plane_out: usize,
    /// Each output's winner, as an offset in its plane (`u32::MAX`: none).
    winners: Vec<u32>,
}

#[derive(Debug)]
struct MaxPoolOp;

impl Backward<Flex, 1> for MaxPoolOp {
    type State = PoolState;

    fn backward(self, ops: Ops<PoolState, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let PoolState {
            dims: [b, c, h, w],
            plane_out,
            winners,
        } = ops.state;
        let dy = contiguous(grads.consume::<Flex>(&ops.node));
        let [Some(node)] = &ops.parents else {
            return;
        };
        let plane_in = h * w;
        // Zeroed by each job before it adds onto its planes, not by the allocation.
        let mut dx = uninit(b * c * plane_in);
        dx.par_chunks_mut(PLANES_PER_JOB * plane_in)
            .zip(values(&dy).par_chunks(PLANES_PER_JOB * plane_out))
            .zip(winners.par_chunks(PLANES_PER_JOB * plane_out))
            .for_each(|((dx, dy), winners)| {
                let dx = zero_fill(dx);
                for ((dx, dy), winners) in dx
                    .chunks_exact_mut(plane_in)
                    .zip(dy.chunks_exact(plane_out))
                    .zip(winners.chunks_exact(plane_out))
                {
                    for (&d, &at) in dy.iter().zip(winners) {
                        if let Some(v) = dx.get_mut(at as usize) {
                            *v += d;
                        }
                    }
                }
            });
        // SAFETY: each job zeroed its planes, which cover dx.
        let dx = unsafe { assume_init(dx) };
        grads.register::<Flex>(node.id, from_vec(dx, &[b, c, h, w], &FlexDevice::default()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::max_rel_err;
    use burn::tensor::module::max_pool2d;
    use burn::tensor::ops::MaxPoolOptions;
    use burn::tensor::{Device, Distribution};

    /// A plane of -inf, stride 1 and padding: every border window's first tap is in the
    /// padding, so its winner is worked out again from the plane: the window's first tap
    /// inside it, as burn's and PyTorch's.
    #[test]
    fn windows_of_minus_infinity_win_inside_the_plane() {
        let (h, w) = (3, 4);
        let p = Stride1 {
            h,
            w,
            kernel: [3, 3],
            top: 1,
            left: 1,
            hp: h + 2,
            wp: w + 2,
            oh: h,
            ow: w,
        };
        let x = vec![f32::NEG_INFINITY; h * w];
        let (mut y, mut winners) = (vec![0.0; h * w], vec![0u32; h * w]);
        let (rows, cols) = (taps(h, h, 3, 1, 1), taps(w, w, 3, 1, 1));
        let mut buf = Stride1Buffers::new(p);
        pool_plane_stride1(&x, &mut y, &mut winners, p, &rows, &cols, &mut buf);
        assert!(y.iter().all(|&v| v == f32::NEG_INFINITY));
        for (o, &win) in winners.iter().enumerate() {
            let (oy, ox) = (o / w, o % w);
            let first = oy.saturating_sub(1) * w + ox.saturating_sub(1);
            assert_eq!(win as usize, first, "output ({oy}, {ox})");
        }
    }

    /// Output and input gradient against burn's max pool: overlapping and disjoint
    /// windows, asymmetric padding, a window wider than the input's remainder.
    #[test]
    fn matches_burn_max_pool_and_its_gradient() {
        let device = Device::flex().autodiff();
        device.seed(3);
        let cases = [
            ([2, 3, 9, 9], [3, 3], [2, 2], [(0, 0), (0, 0)]),
            ([3, 2, 8, 7], [2, 2], [2, 2], [(0, 0), (0, 0)]),
            ([2, 4, 7, 6], [3, 3], [1, 1], [(1, 1), (1, 1)]),
            ([1, 5, 6, 10], [3, 2], [2, 3], [(1, 0), (0, 1)]),
            ([17, 2, 5, 5], [5, 5], [1, 1], [(0, 0), (0, 0)]),
            // Rows of more than one whole sweep (38 and 19 interior windows).
            ([2, 2, 4, 40], [3, 3], [1, 1], [(0, 0), (0, 0)]),
            // Stride 1 on small planes, asymmetric padding.
            ([3, 4, 2, 2], [3, 3], [1, 1], [(1, 1), (1, 1)]),
            ([2, 3, 4, 3], [2, 3], [1, 1], [(0, 1), (1, 0)]),
            ([1, 2, 3, 3], [2, 2], [1, 1], [(1, 0), (0, 1)]),
            ([1, 3, 5, 41], [3, 3], [2, 2], [(1, 1), (1, 1)]),
        ];
        for (xd, kernel, stride, pads) in cases {
            let x = Tensor::<4>::random(xd, Distribution::Normal(0.0, 1.0), &device).require_grad();
            let opts = MaxPoolOptions {
                kernel_size: kernel,
                stride,
                padding: pads,
                dilation: [1, 1],
                ceil_mode: false,
            };
            let want = max_pool2d(x.clone(), opts);
            let got = max_pool2d_cpu(x.clone(), kernel, stride, pads).expect("a CPU tensor");
            assert_eq!(got.dims(), want.dims(), "{xd:?}");
            assert_eq!(max_rel_err(got.clone(), want.clone()), 0.0, "{xd:?}");
            let r = Tensor::<4>::random(want.dims(), Distribution::Normal(0.0, 1.0), &device);
            let g_want = (want * r.clone()).sum().backward();
            let g_got = (got * r).sum().backward();
            let dx = |g: &burn::tensor::Gradients| x.grad(g).expect("input gradient");
            assert!(max_rel_err(dx(&g_got), dx(&g_want)) < 1e-6, "{xd:?}");
        }
    }
}
