//! Which device a step runs on: `cpu`, `cuda:N`, `wgpu:N`.

use burn::tensor::Device;

pub use batchfit_tune::device::{DeviceNameError, DeviceSpec};

/// A device name that cannot be used here.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    #[error(transparent)]
    Name(#[from] DeviceNameError),
    /// A GPU this build was compiled without.
    #[error(
        "device `{device}` needs a GPU build: rebuild with `--features {feature}` (see docs/gpu.md)"
    )]
    NotBuilt {
        device: DeviceSpec,
        feature: &'static str,
    },
    /// `host` names a user's command's machine in `run`, not a device to train on.
    #[error("`host` is not a device batchfit trains on; use cpu, cuda:N or wgpu:N")]
    Host,
}

/// The burn device behind a [`DeviceSpec`]: the engine's side of the device
/// type, which `batchfit_tune` keeps free of any framework.
pub trait BurnDevice {
    /// The burn device with autodiff, or why this build cannot use it.
    fn autodiff_device(self) -> Result<Device, DeviceError>;
    /// The plain burn device.
    fn device(self) -> Result<Device, DeviceError>;
}

/// Parses a device named on the command line (`cpu`, `cuda:1`, `wgpu:0`).
pub fn parse(s: &str) -> Result<DeviceSpec, DeviceError> {
    Ok(DeviceSpec::parse(s)?)
}

impl BurnDevice for DeviceSpec {
    fn autodiff_device(self) -> Result<Device, DeviceError> {
        Ok(self.device()?.autodiff())
    }

    fn device(self) -> Result<Device, DeviceError> {
        match self {
            DeviceSpec::Host => Err(DeviceError::Host),
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

/// What [`survey`] found.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_is_no_device_to_train_on() {
        assert_eq!(DeviceSpec::Host.device().unwrap_err(), DeviceError::Host);
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn a_gpu_in_a_cpu_build_says_how_to_get_one() {
        let e = DeviceSpec::Cuda(0).device().unwrap_err().to_string();
        assert!(e.contains("--features cuda"), "{e}");
    }
}
