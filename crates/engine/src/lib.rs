//! Turns a batchfit graph into a real trainable program on burn and measures it.
//!
//! The CPU backend (burn's pure-Rust `flex`) is always built; CUDA and WGPU sit
//! behind the `cuda` and `wgpu` features. [`trainer::Trainer`] runs forward,
//! loss, backward and the optimizer; [`measure`] times steps and reads peak
//! memory from the counting allocator ([`alloc`]); [`worker`] runs each
//! measurement in a fresh child process, so running out of memory is a result.

mod act_cpu;
pub mod adam_cpu;
pub mod alloc;
mod conv_cpu;
mod cpu;
pub mod data;
pub mod device;
pub mod gru;
mod im2col;
pub mod lstm;
pub mod measure;
pub mod model;
pub mod noise;
mod norm_cpu;
mod pool_cpu;
pub mod sweep;
pub mod trainer;
pub mod worker;

pub use burn;
pub use device::{DeviceError, DeviceSpec};
pub use trainer::{EngineError, TrainConfig, Trainer};

/// The CPU thread pool was already set up in this process.
#[derive(Debug, thiserror::Error)]
#[error("cannot set {threads} threads")]
pub struct ThreadsError {
    pub threads: usize,
    #[source]
    source: rayon::ThreadPoolBuildError,
}

/// Sets the number of CPU threads burn's kernels use (rayon's global pool). Call once, early.
pub fn set_threads(n: usize) -> Result<(), ThreadsError> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build_global()
        .map_err(|source| ThreadsError { threads: n, source })
}
