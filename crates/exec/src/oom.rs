//! Recognising out-of-memory in a finished process: by the text frameworks
//! print and by how the process ended.

/// Text by which frameworks, runtimes and the OS report running out of memory,
/// matched case-insensitively.
const MARKERS: &[(&str, &str)] = &[
    (
        "out of memory",
        "CUDA, PyTorch, MATLAB (\"Out of memory on device\"), cubecl",
    ),
    ("outofmemoryerror", "PyTorch's torch.OutOfMemoryError"),
    ("cuda_error_out_of_memory", "the CUDA driver"),
    ("cudnn_status_alloc_failed", "cuDNN"),
    ("cublas_status_alloc_failed", "cuBLAS"),
    ("resource_exhausted", "JAX / XLA"),
    ("resourceexhaustederror", "TensorFlow"),
    ("oom when allocating", "TensorFlow"),
    ("memoryerror", "Python's MemoryError"),
    ("std::bad_alloc", "C++ operator new"),
    ("cannot allocate memory", "the host allocator (ENOMEM)"),
    ("memory allocation of", "Rust's allocation failure"),
    ("outofmemory", "cubecl's OutOfMemory"),
    ("memory exhausted", "GNU tools (xalloc_die)"),
];

/// Whether a process that ended with `stderr`, terminating `signal` and exit
/// `code` ran out of memory; says how it was recognised. A process we killed
/// ourselves (time-out) must not be passed here.
pub fn looks_like_oom(stderr: &str, signal: Option<i32>, code: Option<i32>) -> Option<String> {
    let lower = stderr.to_lowercase();
    if let Some((m, who)) = MARKERS.iter().find(|(m, _)| lower.contains(m)) {
        return Some(format!("printed `{m}` ({who})"));
    }
    // SIGKILL with no message: the kernel's OOM killer. A shell in between
    // reports the same as exit status 128 + 9.
    if signal == Some(libc::SIGKILL) {
        return Some("killed by SIGKILL without a message (the kernel's OOM killer)".into());
    }
    if code == Some(128 + libc::SIGKILL) {
        return Some("exit status 137 = killed by SIGKILL (the kernel's OOM killer)".into());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_each_framework() {
        for text in [
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
            "RuntimeError: cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
            "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with shape[8192,512]",
            "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.2GiB.",
            "Error using trainNetwork\nOut of memory on device. To view more detail about available memory on the GPU, use 'gpuDevice()'.",
            "memory allocation of 1024 bytes failed",
            "terminate called after throwing an instance of 'std::bad_alloc'",
            "MemoryError: Unable to allocate 8.00 GiB for an array",
        ] {
            assert!(looks_like_oom(text, None, Some(1)).is_some(), "{text}");
        }
        assert!(looks_like_oom("", Some(libc::SIGKILL), None).is_some());
        assert!(looks_like_oom("", None, Some(137)).is_some());
    }

    #[test]
    fn other_crashes_are_not_out_of_memory() {
        for text in [
            "thread 'main' panicked at index out of bounds",
            "ValueError: Expected input batch_size (64) to match target batch_size (32)",
            "RuntimeError: CUDA error: device-side assert triggered",
            "Segmentation fault (core dumped)",
        ] {
            assert!(looks_like_oom(text, None, Some(1)).is_none(), "{text}");
        }
        assert!(looks_like_oom("", Some(libc::SIGSEGV), None).is_none());
    }
}
