//! Which device a measurement was made on. Every piece of evidence and every
//! decision names its device with this type, so devices are compared as
//! values, never as strings; reports and JSON write it as `cpu`, `cuda:0`,
//! `wgpu:0` or `host`.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// A device: one batchfit trains on (`cpu`, `cuda:N`, `wgpu:N`), or the
/// machine a user's own command ran on when no GPU was seen in its processes
/// (`host`, `run` only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceSpec {
    Cpu,
    Cuda(usize),
    Wgpu(usize),
    /// A user's command (`batchfit run`) on whatever device it chose; NVML saw
    /// no GPU in its processes.
    Host,
}

/// A device name that names no device.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DeviceNameError {
    #[error("`{0}`: the device index must be a number, as in cuda:0")]
    BadIndex(String),
    #[error("unknown device `{0}`; use cpu, cuda:N or wgpu:N")]
    Unknown(String),
}

impl DeviceSpec {
    /// A device named on a command line: `cpu`, `cuda` (`gpu`), `cuda:1`,
    /// `wgpu:0` (`vulkan`). `host` is not one: batchfit trains on no such device.
    pub fn parse(s: &str) -> Result<DeviceSpec, DeviceNameError> {
        let (kind, index) = match s.split_once(':') {
            Some((k, i)) => (
                k,
                i.parse::<usize>()
                    .map_err(|_| DeviceNameError::BadIndex(s.to_string()))?,
            ),
            None => (s, 0),
        };
        match kind {
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" | "gpu" => Ok(DeviceSpec::Cuda(index)),
            "wgpu" | "vulkan" => Ok(DeviceSpec::Wgpu(index)),
            _ => Err(DeviceNameError::Unknown(s.to_string())),
        }
    }

    /// Whether this is a GPU (`host` may hold one batchfit did not see: no).
    pub fn is_gpu(self) -> bool {
        matches!(self, DeviceSpec::Cuda(_) | DeviceSpec::Wgpu(_))
    }

    /// Whether this is the CPU batchfit's engine trains on.
    pub fn is_cpu(self) -> bool {
        self == DeviceSpec::Cpu
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Cpu => write!(f, "cpu"),
            DeviceSpec::Cuda(i) => write!(f, "cuda:{i}"),
            DeviceSpec::Wgpu(i) => write!(f, "wgpu:{i}"),
            DeviceSpec::Host => write!(f, "host"),
        }
    }
}

impl FromStr for DeviceSpec {
    type Err = DeviceNameError;

    /// What [`fmt::Display`] writes, `host` included (documents read back).
    fn from_str(s: &str) -> Result<DeviceSpec, DeviceNameError> {
        match s {
            "host" => Ok(DeviceSpec::Host),
            _ => DeviceSpec::parse(s),
        }
    }
}

impl Serialize for DeviceSpec {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for DeviceSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<DeviceSpec, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Devices written as one comma-separated string (`cpu,wgpu:0`), as a sweep's
/// settings store the devices its runs trained on.
pub mod comma_separated {
    use super::DeviceSpec;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(devices: &[DeviceSpec], s: S) -> Result<S::Ok, S::Error> {
        let names: Vec<String> = devices.iter().map(|d| d.to_string()).collect();
        s.serialize_str(&names.join(","))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<DeviceSpec>, D::Error> {
        let s = String::deserialize(d)?;
        s.split(',')
            .map(|name| name.trim().parse().map_err(serde::de::Error::custom))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_writes_devices() {
        assert_eq!(DeviceSpec::parse("cpu").unwrap(), DeviceSpec::Cpu);
        assert_eq!(DeviceSpec::parse("cuda:1").unwrap(), DeviceSpec::Cuda(1));
        assert_eq!(DeviceSpec::parse("vulkan").unwrap(), DeviceSpec::Wgpu(0));
        assert!(DeviceSpec::parse("tpu").is_err());
        assert!(DeviceSpec::parse("cuda:x").is_err());
        assert!(
            DeviceSpec::parse("host").is_err(),
            "not a device to train on"
        );
        for d in [
            DeviceSpec::Cpu,
            DeviceSpec::Cuda(2),
            DeviceSpec::Wgpu(0),
            DeviceSpec::Host,
        ] {
            let json = serde_json::to_string(&d).unwrap();
            assert_eq!(json, format!("\"{d}\""));
            assert_eq!(serde_json::from_str::<DeviceSpec>(&json).unwrap(), d);
        }
        assert!(DeviceSpec::Wgpu(0).is_gpu() && !DeviceSpec::Host.is_gpu());
    }
}
