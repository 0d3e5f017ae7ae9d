//! Dense layers (`x W + b`) and products of two activations on the CPU, as custom
//! autodiff ops.
//!
//! They run the same gemm calls as flex's `matmul` and burn-autodiff's backward of it
//! (the same `m`, `n`, `k`, operand strides and parallelism rule, so the plan's account
//! of gemm's packing buffers holds), but write each product straight into its own
//! buffer: flex's `FlexTensor::empty` zero-fills a byte vector and then copies it into a
//! 16-byte-aligned allocation (cubecl's `Bytes::from_bytes_vec`), two extra passes and a
//! second buffer for every product, forward and backward. The bias is written into the
//! output before the product accumulates onto it (no separate broadcast add), and its
//! gradient is the column sums of dy. Each op keeps its inputs, as `float_matmul` does.
//! Outputs are not zero-filled first: gemm with `read_dst` false writes every element
//! of its destination without reading it (gemm-common `gemm.rs`, `gemv.rs`, `gevv.rs`:
//! the destination's factor is set to zero and stored, not multiplied).

use crate::cpu::tensor::{
    Ad, FlexDevice, FlexT, add_partials, assume_init, contiguous, finish_op, from_vec,
    one_piece_per_thread, uninit, values, wide,
};
use burn::backend::Flex;
use burn::tensor::Tensor;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops};
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// flex's threshold (`ops/matmul.rs` `PARALLEL_THRESHOLD`): a product of at least this
/// many multiply-adds is split across the pool by gemm.
const PARALLEL_THRESHOLD: usize = 192 * 192 * 192;
/// flex's `BATCH_PARALLEL_THRESHOLD`: a batch of products with at least this many
/// multiply-adds in all runs one product per pool job.
const BATCH_PARALLEL_THRESHOLD: usize = 128 * 128 * 128;

/// Makes every thread of rayon's pool allocate gemm's packing buffer (gemm-common
/// `L2_SLAB`, one L2-sized buffer a thread keeps from its first packed product) now.
/// A thread otherwise allocates it only once it wins a piece of a split product, a race
/// that small products lose or win from one step to the next, so a step's memory (and
/// its measured peak) would depend on it.
pub fn warm_packing_buffers() {
    // 64 x 64 x 64: a multiple of every kernel's lanes with unit strides, so gemm packs
    // the lhs through the slab (no per-call buffer, no matrix-vector shortcut).
    const N: usize = 64;
    rayon::broadcast(|_| {
        let (lhs, rhs) = (vec![0f32; N * N], vec![0f32; N * N]);
        let mut out = vec![MaybeUninit::<f32>::uninit(); N * N];
        let mats = |data| Mats {
            data,
            step: 0,
            row: N,
            col: 1,
        };
        products(&mut out, [1, N, N, N], mats(&lhs), mats(&rhs), false);
    });
}

/// `batch` matrices inside a slice: matrix `i`'s element (r, c) at
/// `i * step + r * row + c * col`.
#[derive(Clone, Copy)]
struct Mats<'a> {
    data: &'a [f32],
    step: usize,
    row: usize,
    col: usize,
}

impl<'a> Mats<'a> {
    /// Row-major `[batch, rows, cols]`.
    fn rows(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Mats {
            data,
            step: rows * cols,
            row: cols,
            col: 1,
        }
    }

    /// The transpose of row-major `[batch, rows, cols]` (a `[batch, cols, rows]` view).
    fn transposed(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Mats {
            data,
            step: rows * cols,
            row: 1,
            col: cols,
        }
    }

    /// Asserts that every element of `batch` matrices `rows x cols` is in the slice.
    fn check(&self, batch: usize, rows: usize, cols: usize) {
        let last = (batch.max(1) - 1) * self.step
            + (rows.max(1) - 1) * self.row
            + (cols.max(1) - 1) * self.col;
        assert!(batch * rows * cols == 0 || last < self.data.len());
    }
}

/// `batch` new products `[m, k] x [k, n]`, row-major `[batch, m, n]`.
fn new_products(dims: [usize; 4], lhs: Mats, rhs: Mats) -> Vec<f32> {
    let [batch, m, n, _] = dims;
    let mut out = uninit(batch * m * n);
    products(&mut out, dims, lhs, rhs, false);
    // SAFETY: gemm wrote every element of `out` (`products` without `accumulate`).
    unsafe { assume_init(out) }
}

/// `out[i] (+)= lhs[i] · rhs[i]` for `batch` products `[m, k] x [k, n]`, `out` row-major
/// `[batch, m, n]`: added onto `out` when `accumulate` (`out` initialised), else every
/// element written. Parallel as flex's `matmul`: gemm splits one large product across
/// the pool; a batch of small products with enough work in all runs one product per job.
fn products(
    out: &mut [MaybeUninit<f32>],
    [batch, m, n, k]: [usize; 4],
    lhs: Mats,
    rhs: Mats,
    accumulate: bool,
) {
    assert_eq!(out.len(), batch * m * n);
    lhs.check(batch, m, k);
    rhs.check(batch, k, n);
    if out.is_empty() {
        return;
    }
    let one = |out: &mut [MaybeUninit<f32>], i: usize, parallelism: gemm::Parallelism| {
        // SAFETY: `check` showed every element the product reads is inside its operand;
        // `out` is one unique `m x n` row-major matrix that no operand aliases, read only
        // when `accumulate`.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                out.as_mut_ptr().cast::<f32>(),
                1,
                n as isize,
                accumulate,
                lhs.data.as_ptr().add(i * lhs.step),
                lhs.col as isize,
                lhs.row as isize,
                rhs.data.as_ptr().add(i * rhs.step),
                rhs.col as isize,
                rhs.row as isize,
                if accumulate { 1.0 } else { 0.0 },
                1.0,
                false,
                false,
                false,
                parallelism,
            );
        }
    };
    let per_product = m.saturating_mul(n).saturating_mul(k);
    let total = batch.saturating_mul(per_product);
    let split = if per_product >= PARALLEL_THRESHOLD {
        gemm::Parallelism::Rayon(0)
    } else {
        gemm::Parallelism::None
    };
    if batch == 1 {
        one(out, 0, split);
    } else if per_product >= PARALLEL_THRESHOLD
        && !(batch >= 4 && total >= BATCH_PARALLEL_THRESHOLD)
    {
        for (i, out) in out.chunks_exact_mut(m * n).enumerate() {
            one(out, i, split);
        }
    } else if total >= BATCH_PARALLEL_THRESHOLD {
        out.par_chunks_exact_mut(m * n)
            .enumerate()
            .for_each(|(i, out)| one(out, i, gemm::Parallelism::None));
    } else {
        for (i, out) in out.chunks_exact_mut(m * n).enumerate() {
            one(out, i, gemm::Parallelism::None);
        }
    }
}

/// `x W + b` for `x` `[rows, in]`, `w` `[in, out]` and an optional `b` `[out]`; `None`
/// off the CPU.
pub fn linear_cpu(x: Tensor<2>, w: Tensor<2>, bias: Option<Tensor<1>>) -> Option<Tensor<2>> {
    let [rows, inputs] = x.dims();
    let outputs = w.dims()[1];
    let xa = x.try_into_primitive::<Ad>().ok()?;
    let wa = w.try_into_primitive::<Ad>().ok()?;
    let ba = match bias {
        Some(b) => Some(b.try_into_primitive::<Ad>().ok()?),
        None => None,
    };
    let (x_node, w_node) = (xa.node(), wa.node());
    let xf = contiguous(xa.into_primitive());
    let wf = contiguous(wa.into_primitive());
    let mut y = uninit(rows * outputs);
    let b_node = ba.map(|ba| {
        let node = ba.node();
        let bf = contiguous(ba.into_primitive());
        let bv = values(&bf);
        y.par_chunks_mut(outputs.max(1) * 256).for_each(|y| {
            for r in y.chunks_exact_mut(outputs) {
                for (d, &b) in r.iter_mut().zip(bv) {
                    d.write(b);
                }
            }
        });
        node
    });
    // With a bias the product adds onto the rows just written; without, it writes them.
    products(
        &mut y,
        [1, rows, outputs, inputs],
        Mats::rows(values(&xf), rows, inputs),
        Mats::rows(values(&wf), inputs, outputs),
        b_node.is_some(),
    );
    // SAFETY: every element is written, by the bias rows or by gemm.
    let y = unsafe { assume_init(y) };
    let y = from_vec(y, &[rows, outputs], &FlexDevice::default());
    let state = Operands {
        a: xf,
        b: wf,
        dims: [1, rows, inputs, outputs],
    };
    Some(match b_node {
        Some(b_node) => finish_op(LinearOp, [x_node, w_node, b_node], || state, y),
        None => finish_op(LinearOp, [x_node, w_node], || state, y),
    })
}

/// The product of two activations, `a` `[batch, m, k]` by `c` `[batch, k, n]`; `None` off
/// the CPU.
pub fn matmul_cpu(a: Tensor<3>, c: Tensor<3>) -> Option<Tensor<3>> {
    let [batch, m, k] = a.dims();
    let n = c.dims()[2];
    let aa = a.try_into_primitive::<Ad>().ok()?;
    let ca = c.try_into_primitive::<Ad>().ok()?;
    let nodes = [aa.node(), ca.node()];
    let af = contiguous(aa.into_primitive());
    let cf = contiguous(ca.into_primitive());
    let y = new_products(
        [batch, m, n, k],
        Mats::rows(values(&af), m, k),
        Mats::rows(values(&cf), k, n),
    );
    let y = from_vec(y, &[batch, m, n], &FlexDevice::default());
    let state = Operands {
        a: af,
        b: cf,
        dims: [batch, m, k, n],
    };
    Some(finish_op(MatMulOp, nodes, || state, y))
}

/// The two operands of a product, shared handles (no copies), and its sizes.
#[derive(Clone, Debug)]
struct Operands {
    a: FlexT,
    b: FlexT,
    /// `[batch, m, k, n]`: `a` is `[batch, m, k]`, `b` `[batch, k, n]` (a dense layer's
    /// weight: one `[k, n]` matrix, batch 1).
    dims: [usize; 4],
}

impl Operands {
    /// `da = dy b^T` (`[batch, m, k]`) and `db = a^T dy` (`[batch, k, n]`), in that order
    /// as burn-autodiff's `binary` makes them, each only when asked.
    fn gradients(&self, dy: &[f32], want_a: bool, want_b: bool) -> (Vec<f32>, Vec<f32>) {
        let [batch, m, k, n] = self.dims;
        let da = if want_a {
            new_products(
                [batch, m, k, n],
                Mats::rows(dy, m, n),
                Mats::transposed(values(&self.b), k, n),
            )
        } else {
            Vec::new()
        };
        let db = if want_b {
            new_products(
                [batch, k, n, m],
                Mats::transposed(values(&self.a), m, k),
                Mats::rows(dy, m, n),
            )
        } else {
            Vec::new()
        };
        (da, db)
    }
}

#[derive(Debug)]
struct LinearOp;

impl<const N: usize> Backward<Flex, N> for LinearOp {
    type State = Operands;

    fn backward(self, ops: Ops<Operands, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let state = ops.state;
        let [_, rows, inputs, outputs] = state.dims;
        let dy = contiguous(grads.consume::<Flex>(&ops.node));
        let dyv = values(&dy);
        let device = FlexDevice::default();
        let (x_node, w_node) = (&ops.parents[0], &ops.parents[1]);
        // The layer's weight gradient: `x^T dy` over all rows is one `[in, out]` product.
        let (dx, dw) = state.gradients(dyv, x_node.is_some(), w_node.is_some());
        if let Some(node) = x_node {
            grads.register::<Flex>(node.id, from_vec(dx, &[rows, inputs], &device));
        }
        if let Some(node) = w_node {
            grads.register::<Flex>(node.id, from_vec(dw, &[inputs, outputs], &device));
        }
        if let Some(Some(node)) = ops.parents.get(2) {
            grads.register::<Flex>(
                node.id,
                from_vec(column_sums(dyv, outputs), &[outputs], &device),
            );
        }
    }
}

#[derive(Debug)]
struct MatMulOp;

impl Backward<Flex, 2> for MatMulOp {
    type State = Operands;

    fn backward(self, ops: Ops<Operands, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let state = ops.state;
        let [batch, m, k, n] = state.dims;
        let dy = contiguous(grads.consume::<Flex>(&ops.node));
        let [a_node, c_node] = &ops.parents;
        let (da, dc) = state.gradients(values(&dy), a_node.is_some(), c_node.is_some());
        let device = FlexDevice::default();
        if let Some(node) = a_node {
            grads.register::<Flex>(node.id, from_vec(da, &[batch, m, k], &device));
        }
        if let Some(node) = c_node {
            grads.register::<Flex>(node.id, from_vec(dc, &[batch, k, n], &device));
        }
    }
}

/// The sums of each column of row-major `v` with rows of `n`: a dense layer's bias
/// gradient. Rows are split across the pool in blocks, each summing into its own row,
/// the blocks in at most one piece per thread so that the sum is the same in every run
/// ([`one_piece_per_thread`]).
fn column_sums(v: &[f32], n: usize) -> Vec<f32> {
    if n == 0 {
        return Vec::new();
    }
    let block = (1 << 14) / n + 1;
    let blocks = v.len().div_ceil(block * n);
    v.par_chunks(block * n)
        .with_min_len(one_piece_per_thread(blocks))
        .map(|rows| {
            let mut acc = vec![0.0f32; n];
            wide(
                #[inline(always)]
                || {
                    for r in rows.chunks_exact(n) {
                        for (a, &x) in acc.iter_mut().zip(r) {
                            *a += x;
                        }
                    }
                },
            );
            acc
        })
        .reduce(|| vec![0.0f32; n], add_partials)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::max_rel_err;
    use burn::tensor::{Device, Distribution};

    /// A dense layer with and without bias, and a batched product, against burn's
    /// A bias gradient is the same to the last bit in every run, whatever the pool's
    /// threads are doing: its partials add in one order. Sixteen sums of one
    /// 16,384 x 64 matrix run at once on a pool of four threads, so that each one's
    /// pieces are stolen in another pattern, eight times over.
    #[test]
    fn column_sums_are_the_same_in_every_run() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(4)
            .build()
            .unwrap();
        let n = 64;
        let v: Vec<f32> = (0..16_384 * n)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-3 + 1e-7 * i as f32)
            .collect();
        let first = pool.install(|| column_sums(&v, n));
        for round in 0..8 {
            let all: Vec<Vec<f32>> = pool.install(|| {
                (0..16)
                    .into_par_iter()
                    .map(|_| column_sums(&v, n))
                    .collect()
            });
            for sums in &all {
                let same = first
                    .iter()
                    .zip(sums)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "round {round}: the column sums changed");
            }
        }
    }

    /// `matmul` and broadcast add: outputs and every gradient, on sizes on both sides
    /// of flex's parallel thresholds.
    #[test]
    fn matches_burns_matmul() {
        let device = Device::flex().autodiff();
        device.seed(12);
        let normal = Distribution::Normal(0.0, 1.0);
        // One output column or row, and a depth of 2: gemm's gemv and gevv paths.
        for [rows, inputs, outputs] in [
            [3, 5, 2],
            [7, 2, 1],
            [1, 3, 4],
            [64, 17, 33],
            [300, 200, 150],
        ] {
            for with_bias in [true, false] {
                let x = Tensor::<2>::random([rows, inputs], normal, &device).require_grad();
                let w = Tensor::<2>::random([inputs, outputs], normal, &device).require_grad();
                let b = Tensor::<1>::random([outputs], normal, &device).require_grad();
                let bias = with_bias.then(|| b.clone());
                let got = linear_cpu(x.clone(), w.clone(), bias).expect("a CPU tensor");
                let mut want = x.clone().matmul(w.clone());
                if with_bias {
                    want = want + b.clone().unsqueeze::<2>();
                }
                assert!(max_rel_err(got.clone(), want.clone()) < 1e-5);
                let r = Tensor::<2>::random([rows, outputs], normal, &device);
                let g_got = (got * r.clone()).sum().backward();
                let g_want = (want * r).sum().backward();
                assert!(max_rel_err(x.grad(&g_got).unwrap(), x.grad(&g_want).unwrap()) < 1e-5);
                assert!(max_rel_err(w.grad(&g_got).unwrap(), w.grad(&g_want).unwrap()) < 1e-5);
                if with_bias {
                    assert!(max_rel_err(b.grad(&g_got).unwrap(), b.grad(&g_want).unwrap()) < 1e-5);
                } else {
                    assert!(b.grad(&g_got).is_none());
                }
            }
        }
        for [batch, m, k, n] in [
            [1, 4, 3, 5],
            [6, 65, 16, 65],
            [40, 70, 30, 20],
            [2, 200, 190, 210],
        ] {
            let a = Tensor::<3>::random([batch, m, k], normal, &device).require_grad();
            let c = Tensor::<3>::random([batch, k, n], normal, &device).require_grad();
            let got = matmul_cpu(a.clone(), c.clone()).expect("a CPU tensor");
            let want = a.clone().matmul(c.clone());
            assert!(max_rel_err(got.clone(), want.clone()) < 1e-5);
            let r = Tensor::<3>::random([batch, m, n], normal, &device);
            let g_got = (got * r.clone()).sum().backward();
            let g_want = (want * r).sum().backward();
            assert!(max_rel_err(a.grad(&g_got).unwrap(), a.grad(&g_want).unwrap()) < 1e-5);
            assert!(max_rel_err(c.grad(&g_got).unwrap(), c.grad(&g_want).unwrap()) < 1e-5);
        }
    }
}
