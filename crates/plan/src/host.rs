//! The CPU a burn step runs on, as rayon and gemm see it.

use crate::units::Bytes;

/// This machine as burn's CPU backend (flex) sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuHost {
    /// Threads of rayon's global pool: `RAYON_NUM_THREADS`, else the available parallelism.
    pub threads: u64,
    /// L2 cache bytes per core as gemm reads them (sysfs `size` over the CPUs sharing it;
    /// gemm's default 256 KiB when unknown).
    pub l2_bytes: u64,
    /// The f32 microkernel gemm picks on this CPU.
    pub gemm_kernel: GemmKernel,
}

/// gemm-common 0.19's f32 microkernel: its SIMD lanes and rows (`MR`). gemm picks it
/// at run time from the CPU's features (`init_gemm_fn`); the engine builds gemm with
/// `x86-v4`, so AVX-512 is used where the CPU has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmKernel {
    /// f32 lanes of one vector register (`N`).
    pub lanes: u64,
    /// Rows of the microkernel (`MR = MR_DIV_N x N`).
    pub rows: u64,
}

impl GemmKernel {
    /// AVX-512F: 16 lanes, four registers of rows.
    pub const AVX512: GemmKernel = GemmKernel {
        lanes: 16,
        rows: 64,
    };
    /// AVX2 with FMA: 8 lanes, two registers of rows.
    pub const AVX2: GemmKernel = GemmKernel { lanes: 8, rows: 16 };
    /// NEON (aarch64): 4 lanes, four registers of rows.
    pub const NEON: GemmKernel = GemmKernel { lanes: 4, rows: 16 };
    /// No SIMD gemm knows (scalar: 1 lane, 2 rows).
    pub const SCALAR: GemmKernel = GemmKernel { lanes: 1, rows: 2 };

    /// The kernel gemm picks on this CPU, detected as gemm does.
    pub fn detect() -> GemmKernel {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                GemmKernel::AVX512
            } else if std::arch::is_x86_feature_detected!("fma") {
                GemmKernel::AVX2
            } else {
                GemmKernel::SCALAR
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            GemmKernel::NEON
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            GemmKernel::SCALAR
        }
    }

    /// Whether gemm packs a product with `m` rows through its per-thread slab rather
    /// than a per-call buffer (`gemm_basic_generic`'s `do_prepack_lhs` is false): `m` over
    /// twice the largest row block (`mc` at most 8 `MR`, `kernel_params`), or a multiple
    /// of the lanes with a unit lhs row stride.
    pub fn uses_slab(self, m: u64, unit_lhs_stride: bool) -> bool {
        let twice_max_mc = 2 * 8 * self.rows;
        m > twice_max_mc || (m > 1 && unit_lhs_stride && m.is_multiple_of(self.lanes))
    }
}

impl CpuHost {
    /// Reads rayon's thread count and the L2 size the way rayon and gemm do.
    pub fn detect() -> CpuHost {
        let threads = std::env::var("RAYON_NUM_THREADS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|&n| n > 0)
            .or_else(|| {
                std::thread::available_parallelism()
                    .ok()
                    .map(|n| n.get() as u64)
            })
            .unwrap_or(1);
        CpuHost {
            threads,
            l2_bytes: l2_per_core().unwrap_or(256 * 1024),
            gemm_kernel: GemmKernel::detect(),
        }
    }

    /// gemm's packing buffer (gemm-common `L2_SLAB`): an L2-sized thread-local buffer that
    /// each thread allocates the first time it packs a matrix product, and keeps. Which
    /// threads pack depends on every product's shape (gemm-common `gemm_basic_generic`:
    /// matrix-vector products pack nothing, flex runs products under 192^3 multiply-adds
    /// on the calling thread and larger ones on the pool), so a step holds 0 to
    /// threads of them (the step runs on one of the pool's); the plan counts one.
    pub fn gemm_slabs(&self) -> Bytes {
        Bytes(self.l2_bytes)
    }
}

/// sysfs's level-2 cache of cpu0 divided by the CPUs that share it, as gemm-common's
/// `cache_info` computes it.
fn l2_per_core() -> Option<u64> {
    let dir = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        let read = |f: &str| std::fs::read_to_string(path.join(f)).ok();
        let (Some(level), Some(kind), Some(size)) = (read("level"), read("type"), read("size"))
        else {
            continue;
        };
        if level.trim() != "2" || kind.trim() == "Instruction" {
            continue;
        }
        let size = size.trim();
        let (digits, unit) = match size.char_indices().last()? {
            (i, 'K') => (&size[..i], 1024),
            (i, 'M') => (&size[..i], 1024 * 1024),
            (i, 'G') => (&size[..i], 1024 * 1024 * 1024),
            _ => (size, 1),
        };
        let bytes = digits.parse::<u64>().ok()? * unit;
        let shared = read("shared_cpu_list").map_or(1, |l| cpu_count(l.trim()));
        return Some(bytes / shared.max(1));
    }
    None
}

/// CPUs in a sysfs list such as `0-3,8`.
fn cpu_count(list: &str) -> u64 {
    list.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('-') {
            Some((a, b)) => match (a.parse::<u64>(), b.parse::<u64>()) {
                (Ok(a), Ok(b)) if b >= a => b - a + 1,
                _ => 1,
            },
            None => 1,
        })
        .sum()
}
