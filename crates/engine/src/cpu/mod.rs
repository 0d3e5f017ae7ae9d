//! The engine's own CPU backend: the ops burn's `flex` runs slowly or keeps
//! too much for, as custom autodiff ops over flex tensors, one file per op
//! family. Each registers its backward through one path
//! (`tensor::finish_op`); the plan's CPU rules (`batchfit_plan::rules::burn`)
//! are split by the same families, and a test holds the plan to the measured
//! peak (`crates/cli/tests/plan_peak.rs`).
//!
//! - `tensor`: burn's flex and autodiff types, moving values in and out of
//!   flex tensors, the one autodiff registration, SIMD dispatch;
//! - `act`: ReLU, clipped ReLU, GELU, softmax, cross-entropy;
//! - `conv` and `im2col`: convolutions;
//! - `dense`: dense layers and products of two activations;
//! - `norm`: batch and layer normalisation;
//! - `pool`: max pooling;
//! - `view`: permutations and slices of a sample's axes;
//! - [`recurrent`]: the fused LSTM and GRU layers;
//! - [`adam`]: Adam and AdamW in one pass per parameter.

pub(crate) mod act;
pub mod adam;
pub(crate) mod conv;
pub(crate) mod dense;
pub(crate) mod im2col;
pub(crate) mod norm;
pub(crate) mod pool;
pub mod recurrent;
pub(crate) mod tensor;
pub(crate) mod view;
