//! Device presets: one table of the memory each device has.

use crate::units::Bytes;
use serde::Serialize;

/// A device whose memory is the budget of a plan.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DevicePreset {
    /// Name on the command line (`--device-preset`).
    pub name: &'static str,
    /// One line for people.
    pub description: &'static str,
    /// Total memory, the budget.
    pub memory: Bytes,
    /// Whether it is a GPU (plans for it add the runtime's device context).
    pub gpu: bool,
}

const GIB: u64 = Bytes::GIB;

/// Known devices. Memory is what the card reports in total (`nvidia-smi`), before
/// the framework's context takes its share; the runtime profile adds that.
pub const PRESETS: &[DevicePreset] = &[
    DevicePreset {
        name: "gtx1050ti-4gb",
        description: "4 GB consumer card (GTX 1050 Ti)",
        memory: Bytes(4 * GIB),
        gpu: true,
    },
    DevicePreset {
        name: "gtx1060-6gb",
        description: "6 GB consumer card (GTX 1060 6GB)",
        memory: Bytes(6 * GIB),
        gpu: true,
    },
    DevicePreset {
        name: "rtx3090",
        description: "RTX 3090, 24 GB",
        memory: Bytes(24 * GIB),
        gpu: true,
    },
    DevicePreset {
        name: "a100-40gb",
        description: "A100 40 GB",
        memory: Bytes(40 * GIB),
        gpu: true,
    },
    DevicePreset {
        name: "a100-80gb",
        description: "A100 80 GB",
        memory: Bytes(80 * GIB),
        gpu: true,
    },
    DevicePreset {
        name: "h100-80gb",
        description: "H100 80 GB",
        memory: Bytes(80 * GIB),
        gpu: true,
    },
    DevicePreset {
        name: "h200",
        description: "H200 141 GB (HBM3e)",
        memory: Bytes(141_000_000_000),
        gpu: true,
    },
];

/// Why no preset could be given ([`preset`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PresetError {
    /// No preset has this name.
    #[error("unknown device preset `{name}`; known: {known}, host")]
    Unknown {
        /// The name asked for.
        name: String,
        /// The known names, comma-separated.
        known: String,
    },
    /// `host` was asked for but `/proc/meminfo` gives no total.
    #[error("cannot read this machine's memory from /proc/meminfo")]
    HostMemory,
}

/// The preset called `name`; `host` is this machine's RAM.
pub fn preset(name: &str) -> Result<DevicePreset, PresetError> {
    if name == "host" {
        return host_memory()
            .map(|memory| DevicePreset {
                name: "host",
                description: "this machine's RAM (MemTotal)",
                memory,
                gpu: false,
            })
            .ok_or(PresetError::HostMemory);
    }
    PRESETS
        .iter()
        .find(|p| p.name == name)
        .cloned()
        .ok_or_else(|| {
            let names: Vec<&str> = PRESETS.iter().map(|p| p.name).collect();
            PresetError::Unknown {
                name: name.to_string(),
                known: names.join(", "),
            }
        })
}

/// Total RAM of this machine, from `/proc/meminfo`.
pub fn host_memory() -> Option<Bytes> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(Bytes(kib * 1024))
}
