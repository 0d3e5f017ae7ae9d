//! What both fused recurrent cells share: a layer's shape, the gate
//! nonlinearities through the engine's vectorised exp, and row access.

use crate::cpu::act::exp;

/// Batch, steps and hidden size of a recurrent layer (LSTM and GRU).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape3 {
    pub(crate) b: usize,
    pub(crate) t: usize,
    pub(crate) h: usize,
}

/// Row `cur` (mutable) and row `prev` of a row-major buffer with rows of `n`.
pub(crate) fn two_rows(v: &mut [f32], n: usize, cur: usize, prev: usize) -> (&mut [f32], &[f32]) {
    if cur < prev {
        let (lo, hi) = v.split_at_mut(prev * n);
        (&mut lo[cur * n..][..n], &hi[..n])
    } else {
        let (lo, hi) = v.split_at_mut(cur * n);
        (&mut hi[..n], &lo[prev * n..][..n])
    }
}

#[inline(always)]
pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// tanh as 1 - 2 / (e^2x + 1): glibc's `tanhf` goes through `expm1f` and took a
/// third of the bench BiLSTM's step. Within 2e-7 of it, saturating to ±1.
#[inline(always)]
pub(crate) fn tanh(x: f32) -> f32 {
    1.0 - 2.0 / (exp(2.0 * x) + 1.0)
}

/// The step index of the `s`-th step a direction processes.
pub(crate) fn step_index(s: usize, t: usize, reverse: bool) -> usize {
    if reverse { t - 1 - s } else { s }
}
