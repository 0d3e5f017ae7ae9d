//! The fused recurrent layers on the CPU: each layer's recurrence is one
//! autodiff op with hand-written backpropagation through time, instead of
//! burn's composed cell (some twenty autodiff nodes per step).

mod cell;
pub mod gru;
pub mod lstm;
