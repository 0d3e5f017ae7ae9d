//! Burn on a GPU: how the tensors of a step become the pages CubeCL reserves.
//!
//! burn's GPU backends (wgpu, CUDA) allocate through CubeCL's memory management
//! (cubecl-server 0.11.3, `memory_management/dynamic/adaptive.rs` and `arena.rs`),
//! which never hands a tensor to the driver by itself: it carves slices out of pages
//! and keeps the pages. What the device must have free is the pages, not the bytes
//! live in tensors, and for a small model the difference is most of it. The layout:
//!
//! - tensors of at most [`SMALL_SLICE`] (64 KiB) share pages of [`SMALL_PAGE`] (8 MiB),
//!   also used by kernel metadata, so there is always one;
//! - every larger tensor is carved from the arena, whose pages are at least
//!   [`MIN_PAGE`] (2 MiB) and grow to the largest tensor served plus [`PAGE_SLACK`]
//!   (1 MiB), rounded up to the MiB ([`page_size`]). A tensor never spans two pages, so
//!   the arena holds as many pages as its tensors need when packed whole into them;
//! - pages of an earlier, smaller size stay while they hold anything: the weights are
//!   made before the first step, so when the step's tensors grow the pages, the
//!   weights' pages of the size before are reserved beside the new ones.
//!
//! The plan packs the tensors alive at a moment of the step into such pages, largest
//! first into the first page with room (first-fit decreasing: the fewest pages such a
//! packing needs, which the allocator's first-fit in time order reaches when the same
//! tensors recur every step), takes the fullest of the moments it knows, and adds the
//! runtime's own buffers outside these pools ([`DevicePages::outside_pools`]).

use crate::units::Bytes;
use serde::Serialize;

/// Page size of the pool for small tensors (cubecl-server `SMALL_PAGE`).
pub const SMALL_PAGE: u64 = 8 << 20;
/// The largest tensor served from the small pool (cubecl-server `SMALL_SLICE`).
pub const SMALL_SLICE: u64 = 64 << 10;
/// The arena's smallest page (cubecl-server `MIN_PAGE`).
pub const MIN_PAGE: u64 = 2 << 20;
/// Room a grown arena page keeps beyond the tensor that grew it (cubecl-server `PAGE_SLACK`).
pub const PAGE_SLACK: u64 = 1 << 20;
/// A grown arena page is a whole number of these (cubecl-server `PAGE_GRANULE`).
pub const PAGE_GRANULE: u64 = 1 << 20;

/// Bytes the runtime reserves outside the tensor pools: wgpu's staging and uniform
/// buffers, measured on lavapipe (Mesa 22.3.6) as the reserved bytes of
/// `zoo:digits-mlp` at batch 32 (whose tensors all fit the small pool) less that
/// pool's one page: 1.65 MB; `zoo:mnist-mlp` at 32 leaves the same beside its pages.
pub const WGPU_OUTSIDE_POOLS: u64 = 1_648_000;

/// The tensors alive at one moment of the step.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PageMoment {
    /// The moment, named as in [`crate::plan::Moment`].
    pub moment: String,
    /// Bytes of each tensor that does not grow with the batch: the parameters, their
    /// optimizer state, their gradients once backward made them, the optimizer's
    /// temporary copy of the largest parameter at the update.
    pub fixed_tensors: Vec<u64>,
    /// Per-sample bytes of each tensor that grows with the batch: the batch, the
    /// tensors kept for backward that are alive then, the moment's own.
    pub per_sample_tensors: Vec<u64>,
}

/// The tensors of a step as the device pools see them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DevicePages {
    /// The moments whose tensors can need the most pages: the step's peak, the start
    /// of backward, the optimizer's update. Pages stay once made, so the step
    /// reserves what the fullest of them needs.
    pub moments: Vec<PageMoment>,
    /// The parameters as first made, before any step (their pages stay if the step
    /// grows the arena's pages).
    pub weights: Vec<u64>,
    /// Bytes the runtime reserves outside these pools ([`WGPU_OUTSIDE_POOLS`]).
    pub outside_pools: u64,
}

impl DevicePages {
    /// Bytes reserved at `batch` samples: for the fullest moment, the small pool's
    /// pages and the arena's; the weights' pages of the size before the step, if the
    /// step grew them; the buffers outside the pools.
    pub fn reserved_at(&self, batch: u64) -> Bytes {
        let weights: Vec<u64> = self
            .weights
            .iter()
            .copied()
            .filter(|&t| t > SMALL_SLICE)
            .collect();
        let before = page_size(weights.iter().copied().max().unwrap_or(0));
        let mut page = before;
        let mut pools = 0u64;
        for m in &self.moments {
            let tensors = m
                .fixed_tensors
                .iter()
                .copied()
                .chain(m.per_sample_tensors.iter().map(|t| t * batch))
                .filter(|&t| t > 0);
            let (small, arena): (Vec<u64>, Vec<u64>) = tensors.partition(|&t| t <= SMALL_SLICE);
            let size = page_size(arena.iter().copied().max().unwrap_or(0)).max(before);
            page = page.max(size);
            let small_pages = small.iter().sum::<u64>().div_ceil(SMALL_PAGE).max(1);
            pools = pools.max(small_pages * SMALL_PAGE + pages_needed(&arena, size) * size);
        }
        let outdated = if page > before {
            pages_needed(&weights, before) * before
        } else {
            0
        };
        Bytes(pools + outdated + self.outside_pools)
    }
}

/// The arena's page size once it has served a tensor of `largest` bytes: at least
/// [`MIN_PAGE`]; past it, the tensor plus [`PAGE_SLACK`] rounded up to the MiB
/// (cubecl-server `PageSizing::fit`).
pub fn page_size(largest: u64) -> u64 {
    if largest <= MIN_PAGE {
        MIN_PAGE
    } else {
        (largest + PAGE_SLACK).next_multiple_of(PAGE_GRANULE)
    }
}

/// Pages of `page` bytes that hold `tensors`, each whole in one page, packed
/// largest first into the first page with room.
pub fn pages_needed(tensors: &[u64], page: u64) -> u64 {
    let mut sorted = tensors.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let mut free: Vec<u64> = Vec::new();
    for t in sorted {
        match free.iter_mut().find(|f| **f >= t) {
            Some(f) => *f -= t,
            None => free.push(page.saturating_sub(t)),
        }
    }
    free.len() as u64
}

/// A moment's own per-sample `bytes` as the tensors it is made of: the rules give
/// their sum, made of the node's gradients, copies and kernel temporaries, none
/// larger than the node's largest input or output (`largest`). A real node's
/// moment is a handful of them; past [`MAX_PIECES`] (a degenerate graph: a huge
/// sum over a tiny tensor) the rest is one last piece, which packs no tighter.
pub(crate) fn pieces(bytes: u64, largest: u64) -> Vec<u64> {
    if largest == 0 {
        return vec![bytes];
    }
    let whole = (bytes / largest).min(MAX_PIECES);
    let mut v = vec![largest; whole as usize];
    let rest = bytes - whole * largest;
    if rest > 0 {
        v.push(rest);
    }
    v
}

/// The most tensors [`pieces`] splits a moment into.
const MAX_PIECES: u64 = 64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_moment_splits_into_whole_tensors_and_at_most_max_pieces() {
        assert_eq!(pieces(10, 4), [4, 4, 2]);
        assert_eq!(pieces(8, 4), [4, 4]);
        assert_eq!(pieces(5, 0), [5]);
        // A degenerate graph (found by fuzzing: a huge sum over a 4-byte tensor)
        // asked for 2^58 pieces; the rest rides in one last piece.
        let huge = pieces(1 << 60, 4);
        assert_eq!(huge.len() as u64, MAX_PIECES + 1);
        assert_eq!(huge.iter().sum::<u64>(), 1 << 60);
    }

    #[test]
    fn page_size_follows_the_largest_tensor() {
        assert_eq!(page_size(0), MIN_PAGE);
        assert_eq!(page_size(MIN_PAGE), MIN_PAGE);
        // 19.4 MB + 1 MiB, up to the MiB: 20 MiB.
        assert_eq!(page_size(19_400_000), 20 << 20);
    }

    #[test]
    fn tensors_pack_whole_into_pages() {
        let w1 = 784 * 512 * 4; // 1.6 MB: one per 2 MiB page
        let w2 = 512 * 512 * 4; // exactly 1 MiB: two per page
        assert_eq!(pages_needed(&[w1, w1, w1], MIN_PAGE), 3);
        assert_eq!(pages_needed(&[w2, w2, w2], MIN_PAGE), 2);
        // A small tensor fits the room a large one leaves.
        assert_eq!(pages_needed(&[w1, 100_000], MIN_PAGE), 1);
        assert_eq!(pages_needed(&[], MIN_PAGE), 0);
    }

    fn moment(fixed: Vec<u64>, per_sample: Vec<u64>) -> PageMoment {
        PageMoment {
            moment: "m".into(),
            fixed_tensors: fixed,
            per_sample_tensors: per_sample,
        }
    }

    #[test]
    fn small_tensors_share_one_page_and_weights_keep_theirs_when_pages_grow() {
        let only_small = DevicePages {
            moments: vec![moment(vec![32_768; 4], vec![512])],
            weights: vec![32_768],
            outside_pools: 0,
        };
        assert_eq!(only_small.reserved_at(32), Bytes(SMALL_PAGE));
        // A 3 MiB-per-sample tensor at batch 4 grows the arena's pages to 13 MiB; the
        // 1 MiB weight made before stays on its 2 MiB page.
        let grows = DevicePages {
            moments: vec![moment(vec![1 << 20], vec![3 << 20])],
            weights: vec![1 << 20],
            outside_pools: 0,
        };
        assert_eq!(
            grows.reserved_at(4),
            Bytes(SMALL_PAGE + (13 << 20) + MIN_PAGE)
        );
    }

    #[test]
    fn the_fullest_moment_decides() {
        let two = DevicePages {
            moments: vec![
                moment(vec![1 << 20], vec![]),
                moment(vec![1 << 20; 5], vec![]),
            ],
            weights: vec![],
            outside_pools: 0,
        };
        assert_eq!(two.reserved_at(1), Bytes(SMALL_PAGE + 3 * MIN_PAGE));
    }
}
