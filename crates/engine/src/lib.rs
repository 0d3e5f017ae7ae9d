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
///
/// Every thread of the pool flushes subnormal floats to zero ([`flush_subnormals`]).
pub fn set_threads(n: usize) -> Result<(), ThreadsError> {
    flush_subnormals();
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .use_current_thread()
        .start_handler(|_| flush_subnormals())
        .build_global()
        .map_err(|source| ThreadsError { threads: n, source })?;
    cpu::dense::warm_packing_buffers();
    Ok(())
}

/// Makes the calling thread's floating-point arithmetic treat subnormal inputs
/// as zero and flush subnormal results to zero (x86-64's MXCSR DAZ and FTZ
/// bits), as TensorFlow's and XLA's CPU thread pools do; elsewhere it does
/// nothing. An operation on a subnormal float takes a microcode assist, many
/// times an ordinary one, and a network that fits its batches closely reaches
/// them: the probe of a 30-64-64-2 MLP at batch 8, stepping on one batch,
/// timed 83 µs a step over its first 530 steps and 187 µs over 1,700. Step
/// times would then depend on how far a training had gone, not on the batch.
/// Values below 1.2e-38 carry nothing a training step needs.
pub fn flush_subnormals() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: setting MXCSR's DAZ (bit 6) and FTZ (bit 15) changes only how
    // this thread rounds subnormals; no memory is touched. The intrinsics are
    // deprecated in favour of inline assembly, which would do the same.
    #[allow(deprecated)]
    unsafe {
        use std::arch::x86_64::{_mm_getcsr, _mm_setcsr};
        _mm_setcsr(_mm_getcsr() | (1 << 6) | (1 << 15));
    }
}

#[cfg(test)]
mod tests {
    use super::flush_subnormals;
    use std::hint::black_box;

    /// Half the smallest normal float is a subnormal; once flushed, it is zero,
    /// and a subnormal input reads as zero.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_flushed_thread_makes_subnormals_zero() {
        std::thread::spawn(|| {
            let subnormal = black_box(f32::MIN_POSITIVE) / black_box(2.0f32);
            assert!(subnormal > 0.0, "subnormals exist before the flush");
            flush_subnormals();
            assert_eq!(black_box(f32::MIN_POSITIVE) / black_box(2.0f32), 0.0);
            assert_eq!(black_box(subnormal) * black_box(4.0f32), 0.0);
        })
        .join()
        .expect("the thread's assertions hold");
    }
}
