//! The planned memory of a step as a function of the batch: every moment's line.

use crate::host::GemmCall;
use crate::pages::DevicePages;
use crate::units::Bytes;
use serde::Serialize;

/// One moment of the step as a line in the batch: `fixed_bytes + per_sample_bytes x B`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Moment {
    /// The node whose backward it is (`NAME`), its forward (`NAME (forward)`), the loss
    /// (`INPUT (loss)`) or `optimizer`; a node's backward can have several moments.
    pub moment: String,
    /// Bytes that do not grow with the batch at this moment.
    pub fixed_bytes: Bytes,
    /// Bytes per sample at this moment.
    pub per_sample_bytes: Bytes,
    /// The matrix product running then whose packing buffers gemm allocates per call
    /// and frees: bytes that grow with the batch up to gemm's depth block (burn on a CPU).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gemm_call: Option<GemmCall>,
}

impl Moment {
    /// The moment's bytes at `b` samples: its line and its product's packing buffers.
    pub fn bytes_at(&self, b: u64) -> Bytes {
        self.fixed_bytes
            + self.per_sample_bytes * b
            + Bytes(self.gemm_call.map_or(0, |c| c.bytes_at(b)))
    }
}

/// The planned memory of a step as a function of the batch `B`.
///
/// [`Plan::bytes_at`](super::Plan::bytes_at) is, with `b = min(B, micro_batch)`: the largest of the
/// `moments`' lines at `b` ([`Moment::bytes_at`]), plus `rounding_bytes`. `fixed_bytes`
/// and `per_sample_bytes` are the line of the moment that is largest at large batches
/// (without `rounding_bytes`).
#[derive(Clone, Debug, Serialize)]
pub struct Memory {
    /// Fixed bytes of the moment that is largest at large batches.
    pub fixed_bytes: Bytes,
    /// Per-sample bytes of that moment.
    pub per_sample_bytes: Bytes,
    /// Every moment of the step, in step order (backward from the last node, the loss,
    /// forward from the first node, the optimizer).
    pub moments: Vec<Moment>,
    /// Added at every batch: the allocator's rounding (PyTorch's 512-byte blocks).
    pub rounding_bytes: Bytes,
    /// Burn on a GPU: the step's tensors as CubeCL's pools hold them; the planned
    /// bytes are then the pages reserved for them (see [`crate::pages`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_pages: Option<DevicePages>,
}
