//! Losses: mean squared error, cross-entropy (per sample or per frame) and CTC.

use super::Target;
use super::compile::Program;
use crate::cpu::act::cross_entropy_cpu;
use batchfit_graph::LossKind;
use burn::nn::loss::{CTCLossConfig, Reduction};
use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor, TensorData};

impl Program {
    /// The loss of `output` against the batch's target (a scalar tensor).
    pub fn loss(&self, output: Tensor<2>, target: &Target) -> Tensor<1> {
        let b = output.dims()[0];
        match (self.loss, target) {
            (LossKind::Mse, Target::Dense(y)) => (output - y.clone()).powi_scalar(2).mean(),
            (LossKind::CrossEntropy | LossKind::CrossEntropyPerFrame, Target::OneHot(y)) => {
                let classes = *self.out_dims.last().expect("logits have classes");
                let rows = output.dims()[0] * output.dims()[1] / classes;
                let logits = output.reshape([rows, classes]);
                if let Some(loss) = cross_entropy_cpu(logits.clone(), y.clone()) {
                    return loss;
                }
                let logp = log_softmax(logits, 1);
                (logp * y.clone()).sum().neg().div_scalar(rows as f32)
            }
            (
                LossKind::Ctc { blank },
                Target::Ctc {
                    labels,
                    label_lengths,
                },
            ) => {
                let t = self.out_dims[0];
                let c = self.out_dims[1];
                let logp = log_softmax(output.reshape([b, t, c]).swap_dims(0, 1), 2);
                let device = logp.device();
                let input_lengths =
                    Tensor::<1, Int>::from_data(TensorData::new(vec![t as i64; b], [b]), &device);
                CTCLossConfig::new()
                    .with_blank(blank)
                    .init()
                    .forward_with_reduction(
                        logp,
                        labels.clone(),
                        input_lengths,
                        label_lengths.clone(),
                        Reduction::Mean,
                    )
            }
            _ => unreachable!("targets are made for the model's loss"),
        }
    }
}
