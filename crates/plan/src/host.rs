//! The CPU a burn step runs on, as rayon and gemm see it.

use crate::units::Bytes;
use serde::Serialize;

/// This machine as burn's CPU backend (flex) sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuHost {
    /// Threads of rayon's global pool: `RAYON_NUM_THREADS`, else the available parallelism.
    pub threads: u64,
    /// L2 cache bytes per core as gemm reads them (sysfs `size` over the CPUs sharing it;
    /// gemm's default 256 KiB when unknown).
    pub l2_bytes: u64,
    /// Ways of associativity of that L2 (sysfs; gemm's 8 when unknown).
    pub l2_ways: u64,
    /// The f32 microkernel gemm picks on this CPU.
    pub gemm_kernel: GemmKernel,
}

/// gemm-common 0.19's f32 microkernel: its SIMD lanes and rows (`MR`). gemm picks it
/// at run time from the CPU's features (`init_gemm_fn`); the engine builds gemm with
/// `x86-v4`, so AVX-512 is used where the CPU has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct GemmKernel {
    /// f32 lanes of one vector register (`N`).
    pub lanes: u64,
    /// Rows of the microkernel (`MR = MR_DIV_N x N`).
    pub rows: u64,
    /// Columns of the microkernel (`NR`).
    pub cols: u64,
}

impl GemmKernel {
    /// AVX-512F: 16 lanes, four registers of rows.
    pub const AVX512: GemmKernel = GemmKernel {
        lanes: 16,
        rows: 64,
        cols: 6,
    };
    /// AVX2 with FMA: 8 lanes, two registers of rows.
    pub const AVX2: GemmKernel = GemmKernel {
        lanes: 8,
        rows: 16,
        cols: 6,
    };
    /// NEON (aarch64): 4 lanes, four registers of rows.
    pub const NEON: GemmKernel = GemmKernel {
        lanes: 4,
        rows: 16,
        cols: 4,
    };
    /// No SIMD gemm knows (scalar: 1 lane, 2 rows).
    pub const SCALAR: GemmKernel = GemmKernel {
        lanes: 1,
        rows: 2,
        cols: 4,
    };

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

    /// The bytes one call of an `m x n x k` product allocates and frees, in gemm's own
    /// orientation (a row-major output is computed transposed: `m` = its columns, the lhs
    /// = the right operand transposed), with an L2 of `l2_bytes` in `l2_ways` ways.
    /// gemm-common 0.19 `gemm_basic_generic` prepacks the lhs, `kc x m` rounded up to
    /// `MR`, where `m <= 2 mc` and its rows are strided or not a multiple of the lanes,
    /// and packs the rhs, `kc x n` rounded up to `NR`, where the rhs rows are strided and
    /// `m > 2 MR`. Matrix-vector products (`m` or `n` of 1, `k` of at most 2) allocate
    /// nothing. Not counted: the rhs packing of unit-stride rows past `128 MR` columns
    /// (8,192 with AVX-512), whose width the L3 bounds.
    pub fn call_buffer_bytes(
        self,
        [m, n, k]: [u64; 3],
        unit_lhs_rows: bool,
        unit_rhs_rows: bool,
        [l2_bytes, l2_ways]: [u64; 2],
    ) -> u64 {
        if m <= 1 || n <= 1 || k <= 2 {
            return 0;
        }
        let (kc, mc) = self.blocks([m, n, k], [l2_bytes, l2_ways]);
        let lhs = if m <= 2 * mc && (!m.is_multiple_of(self.lanes) || !unit_lhs_rows) {
            m.next_multiple_of(self.rows)
        } else {
            0
        };
        let rhs = if !unit_rhs_rows && m > 2 * self.rows {
            n.next_multiple_of(self.cols)
        } else {
            0
        };
        kc * (lhs + rhs) * 4
    }

    /// gemm-common 0.19 `kernel_params`' depth and row blocks (`kc`, `mc`) for f32. `kc`:
    /// the whole depth up to 512, beyond it equal blocks of at most 512 (its L1-derived
    /// block is at most 512 for L1 caches of 32-48 KiB in 8-12 ways, the common x86
    /// cores: computed from `kernel_params`, measured on an AVX-512 one; products within
    /// 64 x 64 take `min(k, 512)` unsplit). `mc`: the rows whose `kc`-deep panel fits the L2's ways
    /// less those of one rhs micropanel, in equal blocks of `MR`, at most `8 MR` (within
    /// 64 x 64: the L2 over `kc`, uncapped).
    fn blocks(self, [m, n, k]: [u64; 3], [l2_bytes, l2_ways]: [u64; 2]) -> (u64, u64) {
        const BLOCK: u64 = 512;
        let mr = self.rows;
        if m <= 64 && n <= 64 {
            let kc = k.min(BLOCK);
            return (kc, (l2_bytes / 4 / kc) / mr * mr);
        }
        let kc = k.div_ceil(k.div_ceil(BLOCK));
        let ways = l2_ways.max(2);
        let rhs_ways = (self.cols * kc * 4).div_ceil((l2_bytes / ways).max(1));
        let lhs_ways = ways.saturating_sub(1 + rhs_ways).max(1);
        let fit = (lhs_ways * l2_bytes / (ways * 4 * kc)) / mr * mr;
        let mc = match fit {
            0 => mr,
            fit => m.div_ceil(m.div_ceil(fit) * mr) * mr,
        };
        (kc, mc.min(8 * mr))
    }
}

/// One matrix product of a step as gemm runs it on this CPU, one of whose sizes is the
/// batch's rows: the buffer it allocates and frees (see
/// [`GemmKernel::call_buffer_bytes`]) as a function of the batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct GemmCall {
    /// The microkernel.
    pub kernel: GemmKernel,
    /// The L2 it blocks for: `[bytes, ways]`.
    pub l2: [u64; 2],
    /// `[m, n, k]` in gemm's orientation, with the batch's axis at one sample.
    pub mnk: [u64; 3],
    /// Which of `mnk` grows with the batch (its value is one sample's rows).
    pub batch_axis: usize,
    /// Whether the lhs's and the rhs's rows are contiguous.
    pub unit_rows: [bool; 2],
}

impl GemmCall {
    /// The bytes of the call's packing buffers at batch `batch`.
    pub fn bytes_at(&self, batch: u64) -> u64 {
        let mut mnk = self.mnk;
        mnk[self.batch_axis] *= batch.max(1);
        self.kernel
            .call_buffer_bytes(mnk, self.unit_rows[0], self.unit_rows[1], self.l2)
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
        let (l2_bytes, l2_ways) = l2_per_core().unwrap_or((256 * 1024, 8));
        CpuHost {
            threads,
            l2_bytes,
            l2_ways,
            gemm_kernel: GemmKernel::detect(),
        }
    }

    /// gemm's packing buffer (gemm-common `L2_SLAB`): an L2-sized thread-local buffer that
    /// a thread allocates the first time it packs a matrix product, and keeps; the engine
    /// has every thread of its pool allocate it when it starts the pool.
    pub fn gemm_slabs(&self) -> Bytes {
        Bytes(self.l2_bytes)
    }
}

/// sysfs's level-2 cache of cpu0 divided by the CPUs that share it, and its ways, as
/// gemm-common's `cache_info` computes them.
fn l2_per_core() -> Option<(u64, u64)> {
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
        let ways = read("ways_of_associativity")
            .and_then(|w| w.trim().parse::<u64>().ok())
            .filter(|&w| w > 0)
            .unwrap_or(8);
        return Some((bytes / shared.max(1), ways));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes gemm-common 0.19 allocated for these calls, read with a counting allocator
    /// around `gemm::gemm` (x86-v4 build, AVX-512, a 1 MiB 16-way L2): the engine's weight
    /// gradient of a 64 -> 1,000 layer at 256 and 1,024 rows, of a 64 -> 4,000 and a 64 ->
    /// 256 layer at 256 rows, and its input gradient at 256 rows.
    #[test]
    fn a_call_allocates_what_gemm_allocated() {
        let l2 = [1 << 20, 16];
        let avx512 = GemmKernel::AVX512;
        let bytes = |mnk, unit_lhs, unit_rhs| avx512.call_buffer_bytes(mnk, unit_lhs, unit_rhs, l2);
        assert_eq!(bytes([1000, 64, 256], true, false), 1_116_160);
        assert_eq!(bytes([1000, 64, 1024], true, false), 135_168);
        assert_eq!(bytes([4000, 64, 256], true, false), 67_584);
        assert_eq!(bytes([256, 64, 256], true, false), 67_584);
        assert_eq!(bytes([64, 256, 1000], false, true), 128_000);
        assert_eq!(bytes([64, 256, 192], false, true), 49_152);
        // Matrix-vector products pack nothing.
        assert_eq!(bytes([1000, 1, 256], true, false), 0);
    }
}
