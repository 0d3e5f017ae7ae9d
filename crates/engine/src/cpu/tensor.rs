//! What the engine's own CPU ops share: burn's flex and autodiff types, and moving
//! values between flex tensors and slices. A custom op takes its inputs as
//! `Autodiff<Flex>` primitives (`Tensor::try_into_primitive`), computes on their
//! flex tensors' values and registers its own backward (`burn_autodiff::ops::Backward`).

use burn::backend::Flex;
use burn::backend::ops::FloatTensorOps;
use burn::tensor::{DType, Tensor, TensorData};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::ops::{Backward, NodeGuard, OpsKind};
use rayon::prelude::*;
use std::mem::{ManuallyDrop, MaybeUninit};

/// burn's autodiff over flex: the device the engine's own ops run on.
pub type Ad = Autodiff<Flex>;
/// A flex float tensor, the values under an autodiff one.
pub type FlexT = <Flex as burn::backend::BackendTypes>::FloatTensorPrimitive;
/// An autodiff float tensor on flex, what a custom op takes and returns.
pub type AdT = <Ad as burn::backend::BackendTypes>::FloatTensorPrimitive;
/// flex has one device, the CPU.
pub type FlexDevice = <Flex as burn::backend::BackendTypes>::Device;

/// Whether `x` lives on the CPU's autodiff device, where the engine's own ops run.
pub fn available<const D: usize>(x: &Tensor<D>) -> bool {
    x.clone().try_into_primitive::<Ad>().is_ok()
}

/// Fewest elements of a strided tensor that [`contiguous`] copies on rayon's threads.
const PARALLEL_COPY_MIN: usize = 1 << 15;
/// Shortest contiguous run it copies that way: shorter runs (a transpose's) go through
/// flex's tiled copy.
const PARALLEL_COPY_MIN_RUN: usize = 16;

/// `x` with its elements in one row-major run, copied only if they are not. A large view
/// made of long runs (a slice of a concatenation's gradient along channels, say) is
/// copied in parallel: flex's copy is serial.
pub fn contiguous(x: FlexT) -> FlexT {
    let layout = x.layout();
    if layout.contiguous_offsets().is_some() {
        return x;
    }
    let n = layout.num_elements();
    let blocks = layout.strided_blocks();
    let run = blocks.block_len();
    if n < PARALLEL_COPY_MIN || run < PARALLEL_COPY_MIN_RUN || x.dtype() != DType::F32 {
        return x.to_contiguous();
    }
    let starts: Vec<usize> = blocks.block_starts().collect();
    let src = x.storage::<f32>();
    let per_job = (PARALLEL_COPY_MIN / run).max(1);
    let mut out = uninit(n);
    out.par_chunks_mut(per_job * run)
        .zip(starts.par_chunks(per_job))
        .for_each(|(out, starts)| {
            for (o, &at) in out.chunks_exact_mut(run).zip(starts) {
                o.write_copy_of_slice(&src[at..at + run]);
            }
        });
    // SAFETY: the runs cover the view's `n` elements, each written once.
    let out = unsafe { assume_init(out) };
    from_vec(out, layout.shape(), &FlexDevice::default())
}

/// The values of a contiguous f32 flex tensor.
pub fn values(x: &FlexT) -> &[f32] {
    let (start, end) = x.layout().contiguous_offsets().expect("made contiguous");
    &x.storage::<f32>()[start..end]
}

/// The values of a contiguous f32 flex tensor, to write; copied first if the tensor
/// shares them.
pub fn values_mut(x: &mut FlexT) -> &mut [f32] {
    let (start, end) = x.layout().contiguous_offsets().expect("made contiguous");
    &mut x.storage_mut::<f32>()[start..end]
}

/// A flex tensor of `shape` holding `v`.
pub fn from_vec(v: Vec<f32>, shape: &[usize], device: &FlexDevice) -> FlexT {
    Flex::float_from_data(TensorData::new(v, shape.to_vec()), device)
}

/// `len` floats that are not initialised: each is written before it is read.
pub fn uninit(len: usize) -> Vec<MaybeUninit<f32>> {
    let mut v = Vec::with_capacity(len);
    // SAFETY: `MaybeUninit` needs no initialisation, and the capacity is `len`.
    unsafe { v.set_len(len) };
    v
}

/// `v` as floats.
///
/// # Safety
/// Every element of `v` has been written.
pub unsafe fn assume_init(v: Vec<MaybeUninit<f32>>) -> Vec<f32> {
    let mut v = ManuallyDrop::new(v);
    // SAFETY: `MaybeUninit<f32>` has the layout of `f32`, so the allocation is one of
    // `capacity` floats; the caller vouches that all `len` are initialised.
    unsafe { Vec::from_raw_parts(v.as_mut_ptr().cast::<f32>(), v.len(), v.capacity()) }
}

/// `v` set to zeros, as floats: a job zeroes its own part of an [`uninit`] buffer (in
/// parallel, while it is in cache) before adding onto it.
pub fn zero_fill(v: &mut [MaybeUninit<f32>]) -> &mut [f32] {
    v.fill(MaybeUninit::new(0.0));
    // SAFETY: every element was just written, and `MaybeUninit<f32>` has `f32`'s layout.
    unsafe { &mut *(v as *mut [MaybeUninit<f32>] as *mut [f32]) }
}

/// `y` as the output of the custom op `op` over the inputs `nodes`, keeping `state` (made
/// only when a gradient is wanted) for its backward.
pub fn finish_op<O, const N: usize, const D: usize>(
    op: O,
    nodes: [NodeGuard; N],
    state: impl FnOnce() -> O::State,
    y: FlexT,
) -> Tensor<D>
where
    O: Backward<Flex, N> + 'static,
{
    let y = match op
        .prepare::<NoCheckpointing>(nodes)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(state(), y),
        OpsKind::UnTracked(prep) => prep.finish(y),
    };
    Tensor::from_primitive::<Ad>(y)
}

/// Runs `f` compiled for the CPU's widest SIMD (AVX-512, else AVX2 and FMA), through
/// pulp's run-time dispatch: the crate is built for baseline x86-64, whose SSE2 vectors
/// are a quarter as wide. `f` and what it calls must be `#[inline(always)]`, so that they
/// are compiled inside the dispatched function.
#[inline(always)]
pub fn wide<R>(f: impl FnOnce() -> R) -> R {
    pulp::Arch::new().dispatch(f)
}

/// The fewest items per piece that split `items` into at most one piece per thread of
/// the pool. A rayon `fold` starts one accumulator per piece it splits off, and work
/// stealing splits further: unbounded, a batch of 8 left up to five weight-gradient sums
/// (64 MB each for a 2,000 x 250 x 32 filter bank) alive at once where the plan counts
/// one per thread. Bounded so, the pieces are the same in every run (rayon splits in
/// halves while the pool's split budget lasts, and the bound stops it before stealing
/// can split further), so a reduction over them adds its partials in one order: with
/// the tree following the stealing, the last bits of a bias gradient changed from run
/// to run, and on an unstable training (raw MNIST pixels) the steps to a target with
/// them (73 and 79 at the same batch, rate and seed).
pub fn one_piece_per_thread(items: usize) -> usize {
    items.div_ceil(rayon::current_num_threads().max(1)).max(1)
}

/// Two partial sums added, as rayon's reductions combine them (an empty one, from a
/// thread that had no work, stands for zeros).
pub fn add_partials(mut a: Vec<f32>, b: Vec<f32>) -> Vec<f32> {
    if a.is_empty() {
        return b;
    }
    a.iter_mut().zip(&b).for_each(|(a, b)| *a += b);
    a
}

/// A matrix inside a slice: element (r, c) at `r * row + c * col`.
pub struct Strided<S> {
    data: S,
    row: usize,
    col: usize,
}

impl<S> Strided<S> {
    /// The matrix at `data` with rows `row` and columns `col` elements apart.
    pub fn new(data: S, row: usize, col: usize) -> Self {
        Strided { data, row, col }
    }
}

/// What a product can write into: floats, or floats not yet written, which gemm with
/// `read_dst` false stores without reading (gemm-common `gemm.rs`, `gemv.rs`, `gevv.rs`).
///
/// # Safety
/// The type has the layout of `f32`.
pub unsafe trait GemmDst {
    /// Whether the elements hold values (a product may add onto them).
    const WRITTEN: bool;
}
// SAFETY: both are `f32` in memory (`MaybeUninit<T>` has `T`'s layout).
unsafe impl GemmDst for f32 {
    const WRITTEN: bool = true;
}
unsafe impl GemmDst for MaybeUninit<f32> {
    const WRITTEN: bool = false;
}

/// `dst[m×n] (+)= lhs[m×k] · rhs[k×n]` on the calling thread (the callers already
/// run one product per thread). The gemm crate is what flex's matmul calls; it is used
/// directly here for strided operands and accumulation, which flex's matmul lacks.
pub fn gemm_into<T: GemmDst>(
    m: usize,
    n: usize,
    k: usize,
    dst: Strided<&mut [T]>,
    accumulate: bool,
    lhs: Strided<&[f32]>,
    rhs: Strided<&[f32]>,
) {
    assert!(
        T::WRITTEN || !accumulate,
        "a product added onto unwritten floats"
    );
    let last = |rows: usize, cols: usize, row: usize, col: usize| {
        (rows.max(1) - 1) * row + (cols.max(1) - 1) * col
    };
    assert!(last(m, n, dst.row, dst.col) < dst.data.len());
    assert!(last(m, k, lhs.row, lhs.col) < lhs.data.len());
    assert!(last(k, n, rhs.row, rhs.col) < rhs.data.len());
    // SAFETY: every index the product touches was checked in bounds above, and
    // `dst` is a unique borrow that neither operand aliases.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.data.as_mut_ptr().cast::<f32>(),
            dst.col as isize,
            dst.row as isize,
            accumulate,
            lhs.data.as_ptr(),
            lhs.col as isize,
            lhs.row as isize,
            rhs.data.as_ptr(),
            rhs.col as isize,
            rhs.row as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Views large enough for the parallel copy (slices along inner and outer axes) and
    /// ones below it or with short runs (flex's copy), all as flex copies them.
    #[test]
    fn contiguous_copies_views_as_flex() {
        let device = FlexDevice::default();
        let n = 4 * 96 * 200;
        let x = from_vec((0..n).map(|i| i as f32).collect(), &[4, 96, 200], &device);
        let views = [
            x.narrow(1, 10, 70),
            x.narrow(2, 3, 150),
            x.narrow(0, 1, 2).narrow(1, 0, 95),
            x.permute(&[0, 2, 1]),
            x.narrow(1, 2, 3),
            x.narrow(1, 0, 96).narrow(2, 0, 16),
        ];
        for (i, v) in views.into_iter().enumerate() {
            let want = v.to_contiguous();
            let got = contiguous(v);
            assert_eq!(got.layout().shape(), want.layout().shape(), "view {i}");
            assert_eq!(values(&got), values(&want), "view {i}");
        }
    }
}
