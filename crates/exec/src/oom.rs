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

/// The kernel's count of processes its OOM killer has killed since boot
/// (`oom_kill` in /proc/vmstat, Linux 4.13 on; a memory cgroup's kills count
/// there too); `None` where it cannot be read.
pub fn oom_kills() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/vmstat").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
}

/// Whether a process that ended with `stderr`, terminating `signal` and exit
/// `code` ran out of memory; says how it was recognised. `oom_killed`: whether
/// the kernel's OOM killer killed a process while it ran ([`oom_kills`] before
/// and after; `None`: unknown). A SIGKILL (or a shell's exit status 137 for
/// one) is out of memory only where the kernel counted a kill: anyone can
/// send SIGKILL, and a crash is never called out of memory on a guess. A
/// process we killed ourselves (time-out) must not be passed here.
pub fn looks_like_oom(
    stderr: &str,
    signal: Option<i32>,
    code: Option<i32>,
    oom_killed: Option<bool>,
) -> Option<String> {
    let lower = stderr.to_lowercase();
    if let Some((m, who)) = MARKERS.iter().find(|(m, _)| lower.contains(m)) {
        return Some(format!("printed `{m}` ({who})"));
    }
    // Itself, through a shell (exit status 128 + 9), or a rank through a
    // launcher (torchrun: "Signal 9 (SIGKILL) received by PID ...").
    let killed = signal == Some(libc::SIGKILL)
        || code == Some(128 + libc::SIGKILL)
        || lower.contains("signal 9 (sigkill)");
    (killed && oom_killed == Some(true)).then(|| {
        "killed by SIGKILL while the kernel's OOM killer killed a process (its count in /proc/vmstat rose)"
            .into()
    })
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
            assert!(
                looks_like_oom(text, None, Some(1), None).is_some(),
                "{text}"
            );
        }
        let sigkill = Some(libc::SIGKILL);
        assert!(looks_like_oom("", sigkill, None, Some(true)).is_some());
        assert!(looks_like_oom("", None, Some(137), Some(true)).is_some());
    }

    /// SIGKILL (or exit status 137) without a kill the kernel counted is
    /// someone's `kill -9` or a script's own exit status: a crash.
    #[test]
    fn a_sigkill_is_out_of_memory_only_where_the_kernel_counted_one() {
        for known in [Some(false), None] {
            assert!(looks_like_oom("", Some(libc::SIGKILL), None, known).is_none());
            assert!(looks_like_oom("", None, Some(137), known).is_none());
        }
        assert!(looks_like_oom("", Some(libc::SIGSEGV), None, Some(true)).is_none());
        let rank = "torch.distributed.elastic.multiprocessing.api: failed (exitcode: -9)\nSignal 9 (SIGKILL) received by PID 4242";
        assert!(looks_like_oom(rank, None, Some(1), Some(true)).is_some());
        assert!(looks_like_oom(rank, None, Some(1), Some(false)).is_none());
        #[cfg(target_os = "linux")]
        assert!(
            oom_kills().is_some(),
            "/proc/vmstat has oom_kill since Linux 4.13"
        );
    }

    #[test]
    fn other_crashes_are_not_out_of_memory() {
        for text in [
            "thread 'main' panicked at index out of bounds",
            "ValueError: Expected input batch_size (64) to match target batch_size (32)",
            "RuntimeError: CUDA error: device-side assert triggered",
            "Segmentation fault (core dumped)",
        ] {
            assert!(
                looks_like_oom(text, None, Some(1), None).is_none(),
                "{text}"
            );
        }
        assert!(looks_like_oom("", Some(libc::SIGSEGV), None, Some(true)).is_none());
    }
}
