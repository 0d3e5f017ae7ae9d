//! What the engine's own CPU ops share: burn's flex and autodiff types, and moving
//! values between flex tensors and slices. A custom op takes its inputs as
//! `Autodiff<Flex>` primitives (`Tensor::try_into_primitive`), computes on their
//! flex tensors' values and registers its own backward (`burn_autodiff::ops::Backward`).

use burn::backend::Flex;
use burn::backend::ops::FloatTensorOps;
use burn::tensor::{Tensor, TensorData};
use burn_autodiff::Autodiff;

pub type Ad = Autodiff<Flex>;
pub type FlexT = <Flex as burn::backend::BackendTypes>::FloatTensorPrimitive;
pub type AdT = <Ad as burn::backend::BackendTypes>::FloatTensorPrimitive;
/// flex has one device, the CPU.
pub type FlexDevice = <Flex as burn::backend::BackendTypes>::Device;

/// Whether `x` lives on the CPU's autodiff device, where the engine's own ops run.
pub fn available<const D: usize>(x: &Tensor<D>) -> bool {
    x.clone().try_into_primitive::<Ad>().is_ok()
}

pub fn contiguous(x: FlexT) -> FlexT {
    if x.layout().contiguous_offsets().is_some() {
        x
    } else {
        x.to_contiguous()
    }
}

/// The values of a contiguous f32 flex tensor.
pub fn values(x: &FlexT) -> &[f32] {
    let (start, end) = x.layout().contiguous_offsets().expect("made contiguous");
    &x.storage::<f32>()[start..end]
}

pub fn from_vec(v: Vec<f32>, shape: &[usize], device: &FlexDevice) -> FlexT {
    Flex::float_from_data(TensorData::new(v, shape.to_vec()), device)
}
