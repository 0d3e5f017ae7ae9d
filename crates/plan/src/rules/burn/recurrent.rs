//! burn's recurrent layers as the engine runs them: the fused LSTM and GRU
//! cells on the CPU (engine `cpu/recurrent/`), composed cells elsewhere and for the
//! plain cell everywhere (engine `model/recurrent.rs` `rnn_direction`).

use super::Burn;
use crate::rules::{BackwardMoment, Saved, Sizes, rnn_sequences_steps, rnn_steps_dirs};
use batchfit_graph::{Cell, Op};

/// What a recurrent layer keeps for its backward.
pub(super) fn saved(b: &Burn, op: &Op, s: &Sizes) -> Saved {
    let Op::Rnn { cell, hidden, .. } = op else {
        unreachable!("the dispatcher sends only recurrent layers here")
    };
    if fused(b, *cell) {
        // The fused cells keep per step and direction the gate activations and one more
        // row: LSTM i, f, g, o and c_t (5H), GRU r, z, n and `h W_hn + b_hn` (4H); and the
        // layer's output. The input projection's `matmul` keeps the input.
        return Saved {
            inputs: true,
            output: true,
            extra_elems: rnn_steps_dirs(op, s) * (cell.gates() + 1) as u64 * *hidden as u64,
            ..Saved::default()
        };
    }
    // The composed cells keep per step and direction: the GRU the recurrent product 3H
    // (its n slice is kept by `r * rn`), the three gate pre-activations, r, z, n, 1 - z and
    // h_t; the LSTM the gates' sum 4H (its slices are kept by the activations), i, f, g, o,
    // c_t, tanh(c_t) and h_t: 11H either way. The plain cell keeps the activation's input
    // (burn-autodiff's `relu` and `float_tanh` checkpoint it) and h_t (read by the next
    // step's `matmul`): 2H. Plus the input (`matmul`).
    let per_step = match cell {
        Cell::Lstm | Cell::Gru => 11,
        Cell::RnnTanh | Cell::RnnRelu => 2,
    };
    Saved {
        inputs: true,
        extra_elems: rnn_steps_dirs(op, s) * per_step * *hidden as u64,
        ..Saved::default()
    }
}

/// Whether the engine runs `cell` as its fused CPU layer (LSTM and GRU on the CPU).
fn fused(b: &Burn, cell: Cell) -> bool {
    !b.gpu && matches!(cell, Cell::Lstm | Cell::Gru)
}

/// Per-sample bytes the forward allocates besides its output and what it keeps.
pub(super) fn forward_temporaries(b: &Burn, op: &Op, s: &Sizes, act: u64) -> u64 {
    let Op::Rnn { cell, hidden, .. } = op else {
        return 0;
    };
    if fused(b, *cell) {
        // The fused cells: every direction's input projection `[T, gates x H]` and its h_t
        // `[T, H]` until the output is assembled.
        return rnn_steps_dirs(op, s) * (cell.gates() + 1) as u64 * *hidden as u64 * act;
    }
    // Per direction the input projection `[T, gates x H]` lives through the loop.
    let (sequences, steps) = rnn_sequences_steps(s);
    let steps = sequences * steps;
    steps * (cell.gates() * *hidden) as u64 * act
}

/// The moments of a recurrent layer's backward.
pub(super) fn backward(b: &Burn, op: &Op, s: &Sizes, dx: u64, act: u64) -> Vec<BackwardMoment> {
    let Op::Rnn {
        cell,
        hidden,
        bidirectional,
        ..
    } = op
    else {
        unreachable!("the dispatcher sends only recurrent layers here")
    };
    let out = s.output;
    let params: u64 = op.param_count();
    let largest = op.params().iter().map(|p| p.elements()).max().unwrap_or(0);
    let (sequences, steps) = rnn_sequences_steps(s);
    let steps = sequences * steps;
    let dirs = if *bidirectional { 2 } else { 1 };
    if fused(b, *cell) {
        // The fused cells' backward (both directions at once, one per thread): the output's
        // gradient, each direction's projection gradient `[T, gates x H]`, its h_{t-1} rows
        // `[T, H]` (and the GRU's gradient of `h W_hn + b_hn`, `[T, H]`), and the recurrent
        // weights' (and GRU biases') gradients; a bidirectional layer runs its directions on
        // the pool's threads (`rayon::join`), each with the gemm packing buffer every pool
        // thread holds from the start (`runtime_bytes`). Then each projection's `matmul`
        // makes dx (and its twin) and the input weight's gradient while the projection
        // gradients are alive.
        let (g, h) = ((cell.gates() * *hidden) as u64, *hidden as u64);
        let (per_step, bias) = match cell {
            Cell::Gru => (g + 2 * h, g),
            _ => (g + h, 0),
        };
        let hh = g * h;
        return vec![
            BackwardMoment {
                bytes: (out + dirs * steps * per_step) * act,
                param_elems: dirs * (hh + bias),
                ..BackwardMoment::default()
            },
            BackwardMoment {
                bytes: (dirs * steps * g + 2 * dx) * act,
                extras_freed: true,
                param_elems: params + largest.max(hh),
                ..BackwardMoment::default()
            },
        ];
    }
    // burn-autodiff visits nodes by depth, so both directions' steps are differentiated
    // together, from the last step: at the start all per-step tensors are alive, with the
    // output's gradient, each direction's running sum of the recurrent weight's gradient
    // and one step's product and its twin. The steps' gate gradients then wait for the
    // `narrow` nodes that sliced them out of each direction's input projection
    // `[T, gates x H]`; those come last, all at one depth: each makes a zeroed tensor of
    // the whole projection (`float_zeros` -> `empty`: two copies for a moment) added to the
    // projection's gradient. Last, each projection's `float_matmul` makes dx and the input
    // weight's gradient (twin included).
    let g = (cell.gates() * *hidden) as u64;
    let projection = steps * g;
    let hh = g * *hidden as u64;
    let ih = largest.max(hh);
    vec![
        BackwardMoment {
            bytes: out * act,
            param_elems: (dirs + 2) * hh,
            ..BackwardMoment::default()
        },
        BackwardMoment {
            bytes: (dirs + 3) * projection * act,
            extras_freed: true,
            param_elems: dirs * hh,
            ..BackwardMoment::default()
        },
        BackwardMoment {
            bytes: (dirs * projection + 2 * dx) * act,
            extras_freed: true,
            param_elems: params + ih,
            ..BackwardMoment::default()
        },
    ]
}
