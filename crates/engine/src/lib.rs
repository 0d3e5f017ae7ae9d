//! Turns a batchfit graph into a real trainable program on burn and measures it.
//!
//! The CPU backend (burn's pure-Rust `flex`) is always built; CUDA and WGPU sit
//! behind the `cuda` and `wgpu` features. [`trainer::Trainer`] runs forward,
//! loss, backward and the optimizer; [`measure`] times steps and reads peak
//! memory from the counting allocator ([`alloc`]); [`worker`] runs each
//! measurement in a fresh child process, so running out of memory is a result.

pub mod alloc;
pub mod cpu;
pub mod data;
pub mod device;
pub mod measure;
pub mod model;
pub mod noise;
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

/// Sets the number of CPU threads burn's kernels use (rayon's global pool; 0: one per
/// core), the calling thread among them. Call once, early, from the thread that will run
/// the training steps.
///
/// The calling thread is the pool's first thread (`use_current_thread`): a kernel that
/// splits its work (`par_iter`) from outside the pool queues it and sleeps until the pool
/// is done, a futex sleep and wake-up per kernel; from a pool thread it works on its share
/// while the others steal the rest. A transformer's step has hundreds of small kernels:
/// gpt at batch 32 took 41 ms from outside the pool, 31 ms from within. Steps stay on this
/// one thread, so gemm's per-thread packing buffer is this thread's (the plan's count).
pub fn set_threads(n: usize) -> Result<(), ThreadsError> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .use_current_thread()
        .build_global()
        .map_err(|source| ThreadsError { threads: n, source })?;
    cpu::dense::warm_packing_buffers();
    Ok(())
}
