//! Which device a step runs on: `cpu`, `cuda:N`, `wgpu:N`.

use burn::tensor::Device;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A device name that cannot be used here.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    #[error("`{0}`: the device index must be a number, as in cuda:0")]
    BadIndex(String),
    #[error("unknown device `{0}`; use cpu, cuda:N or wgpu:N")]
    Unknown(String),
    /// A GPU this build was compiled without.
    #[error(
        "device `{device}` needs a GPU build: rebuild with `--features {feature}` (see docs/gpu.md)"
    )]
    NotBuilt {
        device: DeviceSpec,
        feature: &'static str,
    },
}

/// A device named on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeviceSpec {
    Cpu,
    Cuda(usize),
    Wgpu(usize),
}

impl DeviceSpec {
    /// Parses `cpu`, `cuda`, `cuda:1`, `wgpu:0`.
    pub fn parse(s: &str) -> Result<DeviceSpec, DeviceError> {
        let (kind, index) = match s.split_once(':') {
            Some((k, i)) => (
                k,
                i.parse::<usize>()
                    .map_err(|_| DeviceError::BadIndex(s.to_string()))?,
            ),
            None => (s, 0),
        };
        match kind {
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" | "gpu" => Ok(DeviceSpec::Cuda(index)),
            "wgpu" | "vulkan" => Ok(DeviceSpec::Wgpu(index)),
            _ => Err(DeviceError::Unknown(s.to_string())),
        }
    }

    /// Whether this is a GPU.
    pub fn is_gpu(self) -> bool {
        !matches!(self, DeviceSpec::Cpu)
    }

    /// The burn device with autodiff, or why this build cannot use it.
    pub fn autodiff_device(self) -> Result<Device, DeviceError> {
        Ok(self.device()?.autodiff())
    }

    /// The plain burn device.
    pub fn device(self) -> Result<Device, DeviceError> {
        match self {
            DeviceSpec::Cpu => Ok(Device::flex()),
            #[cfg(feature = "cuda")]
            DeviceSpec::Cuda(i) => Ok(Device::cuda(i)),
            // burn 0.22 picks a wgpu adapter by kind. `wgpu:0` is wgpu's default
            // adapter (a high-power GPU first, else whatever there is: an
            // integrated GPU, lavapipe on the CPU; CUBECL_WGPU_DEFAULT_DEVICE
            // overrides it); `wgpu:N` above 0 is the N-th discrete GPU.
            #[cfg(feature = "wgpu")]
            DeviceSpec::Wgpu(0) => Ok(Device::wgpu(burn::tensor::DeviceKind::DefaultDevice)),
            #[cfg(feature = "wgpu")]
            DeviceSpec::Wgpu(i) => Ok(Device::wgpu(burn::tensor::DeviceKind::DiscreteGpu(i))),
            #[allow(unreachable_patterns)]
            other => Err(DeviceError::NotBuilt {
                device: other,
                feature: if matches!(other, DeviceSpec::Cuda(_)) {
                    "cuda"
                } else {
                    "wgpu"
                },
            }),
        }
    }

    /// Devices this build can use and this machine has, and a line for each
    /// kind it cannot use, saying why.
    pub fn survey() -> Survey {
        #[allow(unused_mut)] // GPU builds push more
        let mut survey = Survey {
            found: vec![DeviceSpec::Cpu],
            missing: Vec::new(),
        };
        #[cfg(feature = "cuda")]
        if std::path::Path::new("/dev/nvidia0").exists() {
            survey.found.push(DeviceSpec::Cuda(0));
        } else {
            survey
                .missing
                .push("cuda: no NVIDIA device (/dev/nvidia0 is absent)".into());
        }
        #[cfg(not(feature = "cuda"))]
        survey
            .missing
            .push("cuda: not in this build (rebuild with --features cuda)".into());
        #[cfg(feature = "wgpu")]
        match wgpu_adapters().as_slice() {
            [] => survey.missing.push(
                "wgpu: no adapter (no Vulkan, Metal or DX12 driver; on Linux without a GPU, \
                 Mesa's lavapipe provides one)"
                    .into(),
            ),
            _ => survey.found.push(DeviceSpec::Wgpu(0)),
        }
        #[cfg(not(feature = "wgpu"))]
        survey
            .missing
            .push("wgpu: not in this build (rebuild with --features wgpu)".into());
        survey
    }
}

/// What [`DeviceSpec::survey`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Survey {
    /// Usable devices, the CPU first.
    pub found: Vec<DeviceSpec>,
    /// One line per kind of device that cannot be used, with the reason.
    pub missing: Vec<String>,
}

/// The adapters wgpu sees on this machine (any backend), by name.
#[cfg(feature = "wgpu")]
pub fn wgpu_adapters() -> Vec<String> {
    use burn::backend::wgpu::wgpu;
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle());
    ready(instance.enumerate_adapters(wgpu::Backends::all()))
        .iter()
        .map(|a| {
            let info = a.get_info();
            format!("{} ({:?}, {:?})", info.name, info.device_type, info.backend)
        })
        .collect()
}

/// The value of a future that is ready when first polled. Native wgpu's
/// adapter enumeration is synchronous behind its async signature, so no
/// executor crate is needed; a future that is not ready is polled again.
#[cfg(feature = "wgpu")]
fn ready<F: std::future::Future>(f: F) -> F::Output {
    use std::task::{Context, Poll, Waker};
    let mut f = std::pin::pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::yield_now();
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Cpu => write!(f, "cpu"),
            DeviceSpec::Cuda(i) => write!(f, "cuda:{i}"),
            DeviceSpec::Wgpu(i) => write!(f, "wgpu:{i}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_devices() {
        assert_eq!(DeviceSpec::parse("cpu").unwrap(), DeviceSpec::Cpu);
        assert_eq!(DeviceSpec::parse("cuda:1").unwrap(), DeviceSpec::Cuda(1));
        assert!(DeviceSpec::parse("tpu").is_err());
        assert!(DeviceSpec::parse("cuda:x").is_err());
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn a_gpu_in_a_cpu_build_says_how_to_get_one() {
        let e = DeviceSpec::Cuda(0).device().unwrap_err().to_string();
        assert!(e.contains("--features cuda"), "{e}");
    }
}
