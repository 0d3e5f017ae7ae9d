//! Batches: synthetic ones of the right shapes (seeded), or rows of a real dataset.

use crate::model::{Batch, Target, Value};
use batchfit_graph::{Graph, InputKind, LossKind};
use burn::tensor::{Device, Distribution, Int, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A synthetic batch of `b` samples: inputs ~ N(0, 1), regression targets ~ N(0, 1),
/// uniformly random classes, CTC labels of T/4 random non-blank symbols.
pub fn synthetic(graph: &Graph, seq_len: usize, b: usize, seed: u64, device: &Device) -> Batch {
    let mut rng = StdRng::seed_from_u64(seed);
    device.seed(seed);
    let inputs = graph
        .inputs
        .iter()
        .map(|input| {
            let elems = input.shape.elements(seq_len) as usize;
            match input.kind {
                InputKind::Float => Value::Float(Tensor::random(
                    [b, elems],
                    Distribution::Normal(0.0, 1.0),
                    device,
                )),
                InputKind::Tokens { vocab } => {
                    let ids: Vec<i64> = (0..b * elems)
                        .map(|_| rng.random_range(0..vocab as i64))
                        .collect();
                    Value::Tokens(Tensor::<2, Int>::from_data(
                        TensorData::new(ids, [b, elems]),
                        device,
                    ))
                }
            }
        })
        .collect();
    let out = graph.output().shape.resolve(seq_len);
    let target = match graph.loss.kind {
        LossKind::Mse => Target::Dense(Tensor::random(
            [b, out.iter().product::<usize>()],
            Distribution::Normal(0.0, 1.0),
            device,
        )),
        LossKind::CrossEntropy | LossKind::CrossEntropyPerFrame => {
            let classes = *out.last().expect("logits");
            let rows = b * out.iter().product::<usize>() / classes;
            let labels: Vec<usize> = (0..rows).map(|_| rng.random_range(0..classes)).collect();
            Target::OneHot(one_hot(&labels, classes, device))
        }
        LossKind::Ctc { blank } => {
            let classes = out[1];
            let len = (out[0] / 4).max(1);
            let labels: Vec<i64> = (0..b * len)
                .map(|_| {
                    let c = rng.random_range(0..classes - 1);
                    (if c >= blank { c + 1 } else { c }) as i64
                })
                .collect();
            Target::Ctc {
                labels: Tensor::<2, Int>::from_data(TensorData::new(labels, [b, len]), device),
                label_lengths: Tensor::<1, Int>::from_data(
                    TensorData::new(vec![len as i64; b], [b]),
                    device,
                ),
            }
        }
    };
    Batch {
        inputs,
        target,
        size: b,
    }
}

/// One-hot rows `[labels, classes]`.
pub fn one_hot(labels: &[usize], classes: usize, device: &Device) -> Tensor<2> {
    let mut v = vec![0f32; labels.len() * classes];
    for (i, &l) in labels.iter().enumerate() {
        v[i * classes + l] = 1.0;
    }
    Tensor::from_data(TensorData::new(v, [labels.len(), classes]), device)
}

/// The rows `idx` of a real dataset as a batch on `device`.
pub fn from_rows(
    dataset: &batchfit_data::Dataset,
    graph: &Graph,
    idx: &[usize],
    device: &Device,
) -> Batch {
    let b = idx.len();
    let inputs = graph
        .inputs
        .iter()
        .enumerate()
        .map(|(i, input)| {
            let values = dataset.gather_input(i, idx);
            let elems = dataset.input_elems[i];
            match input.kind {
                InputKind::Float => Value::Float(Tensor::from_data(
                    TensorData::new(values, [b, elems]),
                    device,
                )),
                InputKind::Tokens { .. } => {
                    let ids: Vec<i64> = values.into_iter().map(|v| v as i64).collect();
                    Value::Tokens(Tensor::<2, Int>::from_data(
                        TensorData::new(ids, [b, elems]),
                        device,
                    ))
                }
            }
        })
        .collect();
    let target = match &dataset.targets {
        batchfit_data::Targets::Dense { values, elems } => {
            let mut v = Vec::with_capacity(b * elems);
            for &r in idx {
                v.extend_from_slice(&values[r * elems..(r + 1) * elems]);
            }
            Target::Dense(Tensor::from_data(TensorData::new(v, [b, *elems]), device))
        }
        batchfit_data::Targets::Classes {
            labels,
            per_row,
            classes,
        } => {
            let mut l = Vec::with_capacity(b * per_row);
            for &r in idx {
                l.extend_from_slice(&labels[r * per_row..(r + 1) * per_row]);
            }
            Target::OneHot(one_hot(&l, *classes, device))
        }
        batchfit_data::Targets::Sequences {
            labels,
            width,
            lengths,
            ..
        } => {
            // Padded to the batch's longest sequence; CTC reads each to its length.
            let w = idx.iter().map(|&r| lengths[r]).max().unwrap_or(1);
            let mut l = Vec::with_capacity(b * w);
            for &r in idx {
                l.extend(labels[r * width..r * width + w].iter().map(|&c| c as i64));
            }
            let len: Vec<i64> = idx.iter().map(|&r| lengths[r] as i64).collect();
            Target::Ctc {
                labels: Tensor::<2, Int>::from_data(TensorData::new(l, [b, w]), device),
                label_lengths: Tensor::<1, Int>::from_data(TensorData::new(len, [b]), device),
            }
        }
    };
    Batch {
        inputs,
        target,
        size: b,
    }
}
