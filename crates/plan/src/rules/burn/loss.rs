//! burn's losses as the engine composes them, and the targets it feeds them.

use super::Burn;
use batchfit_graph::LossKind;

/// Burn: per-sample elements live at the start of backward besides the kept tensors (the
/// loss's own kept tensor included). The engine's losses are composed of tensor ops, whose
/// backward makes logits-sized gradients one after another: MSE `(y - t).powi_scalar(2)
/// .mean()` = `mean` (expands the gradient), `mul(d, d)` (a product for each factor);
/// cross-entropy = burn-backend's default `log_softmax` (`x - max`, `float_exp`, which
/// recomputes the exponentials from its kept input, `sum`, `log`, `-`) then `logp * onehot`.
/// Two logits-sized tensors beside the kept one, measured for both. On the CPU
/// cross-entropy is the engine's own (engine `cpu/act.rs`, keeping the logits): its
/// backward writes the logits' gradient alone. CTC: the gradient.
pub(super) fn loss_backward_elems(b: &Burn, kind: LossKind, logits: u64) -> u64 {
    match kind {
        LossKind::CrossEntropy | LossKind::CrossEntropyPerFrame if !b.gpu => logits,
        LossKind::Mse | LossKind::CrossEntropy | LossKind::CrossEntropyPerFrame => 2 * logits,
        LossKind::Ctc { .. } => logits,
    }
}

/// CTC on a CPU: burn-flex has no CTC kernel, so burn-autodiff runs burn-backend's
/// `ctc_loss_default` (`ops/modules/ctc.rs`) as tensor ops and keeps what each needs.
/// Over the label with blanks, S = 2L + 1 (the engine's labels: L = T / 4, `data.rs`):
/// for the whole loss alpha `[T, S]`, the log-probabilities gathered at the labels
/// `[T, S]` and the gather's int64 indices `[T, S]` (16 bytes per entry); then per
/// frame after the first, two `log_sum_exp`, each keeping `abs`'s input and `exp`'s
/// output (f32 `[S]`) and four bool masks `[S]` (24 bytes per entry in all). The log-
/// softmax's kept input comes first. On a GPU burn-cubecl's kernel keeps the
/// log-probabilities only, as PyTorch's does (the shared rule).
pub(super) fn loss_saved_bytes(b: &Burn, kind: LossKind, logits: u64, steps: u64) -> u64 {
    match kind {
        LossKind::Ctc { .. } if !b.gpu => {
            let s = 2 * (steps / 4).max(1) + 1;
            4 * logits + 16 * steps * s + 24 * steps.saturating_sub(1) * s
        }
        _ => crate::rules::loss_saved_elems(kind, logits, steps) * 4,
    }
}

/// The input's shape for MSE; the engine feeds cross-entropy one-hot fp32 rows
/// (`data::one_hot`): the logits' size; CTC a label sequence of up to T int64.
pub(super) fn target_bytes(kind: LossKind, logits: u64, seq: usize) -> u64 {
    match kind {
        LossKind::Mse | LossKind::CrossEntropy | LossKind::CrossEntropyPerFrame => logits * 4,
        LossKind::Ctc { .. } => 8 * seq as u64,
    }
}
