//! Every op family trains (its loss falls on a small fixed problem) and its
//! gradients match finite differences.

use batchfit_engine::model::Params;
use batchfit_engine::{DeviceSpec, TrainConfig, Trainer, data};
use batchfit_graph::{
    Cell, Graph, GraphBuilder, InputKind, LossKind, Op, PoolKind, RnnBias, Shape, Window,
};
use batchfit_plan::Optimizer;
use burn::module::Param;
use burn::tensor::Tensor;
use std::sync::Mutex;

/// One small model per op family.
fn families() -> Vec<Graph> {
    let mut out = Vec::new();
    let mut g = GraphBuilder::new("linear-relu-mse");
    g.input("x", Shape::fixed(&[6])).unwrap();
    g.linear("fc1", "x", 8).unwrap();
    g.push("act", Op::Relu, &["fc1"]).unwrap();
    g.linear("fc2", "act", 3).unwrap();
    out.push(g.finish(LossKind::Mse, "fc2").unwrap());

    let mut g = GraphBuilder::new("conv2d-pools-ce");
    g.input("x", Shape::fixed(&[2, 6, 6])).unwrap();
    g.conv("c", "x", 3, 2, 3, 1, None).unwrap();
    g.push("t", Op::Tanh, &["c"]).unwrap();
    g.pool("mp", "t", PoolKind::Max, 2, 2, 2, Some(0)).unwrap();
    g.pool("ap", "mp", PoolKind::Avg, 2, 3, 1, None).unwrap();
    g.push(
        "gp",
        Op::GlobalPool {
            pool: PoolKind::Avg,
        },
        &["ap"],
    )
    .unwrap();
    g.push("f", Op::Flatten, &["gp"]).unwrap();
    g.linear("out", "f", 4).unwrap();
    out.push(g.finish(LossKind::CrossEntropy, "out").unwrap());

    let mut g = GraphBuilder::new("conv1d-norms");
    g.input("x", Shape::fixed(&[3, 10])).unwrap();
    g.push(
        "c",
        Op::Conv {
            in_channels: 3,
            out_channels: 4,
            window: Window {
                kernel: vec![3],
                stride: vec![2],
                padding: vec![[1, 2]],
                dilation: vec![1],
            },
            groups: 1,
            bias: true,
        },
        &["x"],
    )
    .unwrap();
    g.batch_norm("bn", "c").unwrap();
    g.push("s", Op::Sigmoid, &["bn"]).unwrap();
    g.layer_norm("ln", "s").unwrap();
    g.push(
        "gm",
        Op::GlobalPool {
            pool: PoolKind::Max,
        },
        &["ln"],
    )
    .unwrap();
    g.push("f", Op::Flatten, &["gm"]).unwrap();
    g.linear("out", "f", 2).unwrap();
    out.push(g.finish(LossKind::Mse, "out").unwrap());

    let mut g = GraphBuilder::new("branches");
    g.input("a", Shape::fixed(&[4])).unwrap();
    g.input("b", Shape::fixed(&[4])).unwrap();
    g.linear("la", "a", 4).unwrap();
    g.push("ga", Op::Gelu, &["la"]).unwrap();
    g.push("sum", Op::Add, &["ga", "b"]).unwrap();
    g.push("prod", Op::Mul, &["sum", "a"]).unwrap();
    g.push("cat", Op::Concat { axis: 1 }, &["prod", "b"])
        .unwrap();
    g.push("r", Op::Reshape { shape: vec![2, 4] }, &["cat"])
        .unwrap();
    g.push("rt", Op::Reshape { shape: vec![4, 2] }, &["cat"])
        .unwrap();
    g.push("mm", Op::MatMul, &["r", "rt"]).unwrap();
    g.push("sm", Op::Softmax { axis: -1 }, &["mm"]).unwrap();
    g.push("cl", Op::ClippedRelu { max: 0.8 }, &["sm"]).unwrap();
    g.push("d", Op::Dropout { p: 0.1 }, &["cl"]).unwrap();
    g.push("f", Op::Flatten, &["d"]).unwrap();
    g.linear("out", "f", 3).unwrap();
    out.push(g.finish(LossKind::CrossEntropy, "out").unwrap());

    let mut g = GraphBuilder::new("bilstm-ctc");
    g.input(
        "x",
        Shape(vec![
            batchfit_graph::Dim::Seq,
            batchfit_graph::Dim::Fixed(5),
        ]),
    )
    .unwrap();
    g.seq_len(8);
    g.rnn("rnn", "x", Cell::Lstm, 6, true, RnnBias::Single)
        .unwrap();
    g.linear("out", "rnn", 5).unwrap();
    out.push(g.finish(LossKind::Ctc { blank: 4 }, "out").unwrap());

    // Seed 2's path: the conv's own row layout through ReLU, a conv of a tracked
    // input, the pool's window matrix, then NCHW; and a one-direction LSTM with
    // PyTorch's two biases.
    let mut g = GraphBuilder::new("conv-relu-avgpool-lstm");
    g.input("x", Shape::fixed(&[3, 6, 6])).unwrap();
    g.conv("c", "x", 4, 2, 3, 1, None).unwrap();
    g.push("r", Op::Relu, &["c"]).unwrap();
    // A conv of a tracked input: the transposed matrix and col2im, stride 2.
    g.push(
        "c2",
        Op::Conv {
            in_channels: 4,
            out_channels: 4,
            window: Window {
                kernel: vec![3, 2],
                stride: vec![1, 2],
                padding: vec![[1, 1], [0, 1]],
                dilation: vec![1, 1],
            },
            groups: 1,
            bias: true,
        },
        &["r"],
    )
    .unwrap();
    g.pool("ap", "c2", PoolKind::Avg, 2, 3, 3, None).unwrap();
    g.push("f", Op::Flatten, &["ap"]).unwrap();
    g.linear("fc", "f", 6).unwrap();
    g.push("seq", Op::Reshape { shape: vec![3, 2] }, &["fc"])
        .unwrap();
    g.rnn("lstm", "seq", Cell::Lstm, 4, false, RnnBias::Double)
        .unwrap();
    g.push("flat", Op::Flatten, &["lstm"]).unwrap();
    g.linear("out", "flat", 2).unwrap();
    out.push(g.finish(LossKind::Mse, "out").unwrap());

    let mut g = GraphBuilder::new("embedding-gru-frames");
    g.input_of(
        "tok",
        Shape(vec![batchfit_graph::Dim::Seq]),
        InputKind::Tokens { vocab: 7 },
    )
    .unwrap();
    g.seq_len(6);
    g.push("emb", Op::Embedding { vocab: 7, dim: 4 }, &["tok"])
        .unwrap();
    g.rnn("gru", "emb", Cell::Gru, 5, false, RnnBias::Double)
        .unwrap();
    g.linear("out", "gru", 3).unwrap();
    out.push(g.finish(LossKind::CrossEntropyPerFrame, "out").unwrap());
    out
}

/// The backend's random generator is global: tests that seed it and draw
/// initial weights take turns, so each one's weights are the same every run.
static SEEDED: Mutex<()> = Mutex::new(());

fn trainer(g: &Graph, lr: f64) -> Trainer {
    Trainer::new(
        g,
        TrainConfig {
            optimizer: Optimizer::Adam,
            lr,
            seq_len: g.default_seq_len.unwrap_or(1),
            seed: 7,
            device: DeviceSpec::Cpu,
            init_random: false,
        },
    )
    .unwrap()
}

#[test]
fn every_op_family_learns_a_fixed_batch() {
    let _turn = SEEDED.lock().unwrap_or_else(|e| e.into_inner());
    for g in families() {
        let mut t = trainer(&g, 0.01);
        let batch = data::synthetic(&g, t.program.seq_len, 16, 3, &t.device);
        let first = t.step(&batch);
        let mut last = first;
        for _ in 0..100 {
            last = t.step(&batch);
        }
        assert!(
            first.is_finite() && last.is_finite(),
            "{}: {first} -> {last}",
            g.name
        );
        assert!(last < 0.85 * first, "{}: loss {first} -> {last}", g.name);
    }
}

/// `params + eps * dir`, as new parameters.
fn shifted(p: &Params, dir: &Params, eps: f32) -> Params {
    Params {
        r1: p
            .r1
            .iter()
            .zip(&dir.r1)
            .map(|(a, d)| Param::from_tensor((a.val() + d.val() * eps).detach()))
            .collect(),
        r2: p
            .r2
            .iter()
            .zip(&dir.r2)
            .map(|(a, d)| Param::from_tensor((a.val() + d.val() * eps).detach()))
            .collect(),
        r3: p
            .r3
            .iter()
            .zip(&dir.r3)
            .map(|(a, d)| Param::from_tensor((a.val() + d.val() * eps).detach()))
            .collect(),
        r4: p
            .r4
            .iter()
            .zip(&dir.r4)
            .map(|(a, d)| Param::from_tensor((a.val() + d.val() * eps).detach()))
            .collect(),
    }
}

/// A direction of the same shapes, from its own seeded generator: the
/// backend's generator is shared by the tests running in parallel, and a
/// direction drawn from it would change from run to run.
fn random_like(p: &Params) -> Params {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    fn r<const D: usize>(
        v: &[Param<Tensor<D>>],
        rng: &mut rand::rngs::StdRng,
    ) -> Vec<Param<Tensor<D>>> {
        v.iter()
            .map(|a| {
                let t = a.val();
                let dims = t.dims();
                let n: usize = dims.iter().product();
                let values: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
                Param::from_tensor(Tensor::from_data(
                    burn::tensor::TensorData::new(values, dims),
                    &t.device(),
                ))
            })
            .collect()
    }
    Params {
        r1: r(&p.r1, &mut rng),
        r2: r(&p.r2, &mut rng),
        r3: r(&p.r3, &mut rng),
        r4: r(&p.r4, &mut rng),
    }
}

/// The directional derivative along a random direction equals g . v (central
/// differences, f32; a 2 % tolerance catches a wrong or missing gradient).
#[test]
fn gradients_match_finite_differences() {
    let _turn = SEEDED.lock().unwrap_or_else(|e| e.into_inner());
    for g in families() {
        let mut t = trainer(&g, 0.0);
        let batch = data::synthetic(&g, t.program.seq_len, 4, 5, &t.device);
        let (_, grads) = t.gradients_with(&batch, false);
        let gvec = t.grad_vector(&grads);
        let base = Params {
            r1: t.params().r1.clone(),
            r2: t.params().r2.clone(),
            r3: t.params().r3.clone(),
            r4: t.params().r4.clone(),
        };
        let dir = random_like(&base);
        let dvec: Vec<f64> = {
            let mut v = Vec::new();
            for p in &dir.r1 {
                v.extend(p.val().into_data().try_to_vec::<f32>().unwrap());
            }
            for p in &dir.r2 {
                v.extend(p.val().into_data().try_to_vec::<f32>().unwrap());
            }
            for p in &dir.r3 {
                v.extend(p.val().into_data().try_to_vec::<f32>().unwrap());
            }
            for p in &dir.r4 {
                v.extend(p.val().into_data().try_to_vec::<f32>().unwrap());
            }
            v.into_iter().map(f64::from).collect()
        };
        assert_eq!(
            gvec.len(),
            dvec.len(),
            "{}: every parameter has a gradient",
            g.name
        );
        let analytic: f64 = gvec.iter().zip(&dvec).map(|(a, b)| a * b).sum();
        let eps = 1e-3;
        let mut loss_at = |e: f32| -> f64 {
            t.set_params(shifted(&base, &dir, e));
            f64::from(t.loss(&batch, false).into_scalar::<f32>())
        };
        let numeric = (loss_at(eps) - loss_at(-eps)) / (2.0 * eps as f64);
        let err = (numeric - analytic).abs() / analytic.abs().max(1e-3);
        assert!(
            err < 0.02,
            "{}: numeric {numeric} vs analytic {analytic}",
            g.name
        );
    }
}

#[test]
fn an_op_the_engine_cannot_train_is_named() {
    let mut g = GraphBuilder::new("volumes");
    g.input("x", Shape::fixed(&[1, 4, 4, 4])).unwrap();
    g.push(
        "c3",
        Op::Conv {
            in_channels: 1,
            out_channels: 2,
            window: Window::square(3, 3, 1, 1),
            groups: 1,
            bias: true,
        },
        &["x"],
    )
    .unwrap();
    g.push("f", Op::Flatten, &["c3"]).unwrap();
    let g = g.finish(LossKind::Mse, "f").unwrap();
    let err = batchfit_engine::model::check_trainable(&g)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("node `c3`") && err.contains("3-d convolution"),
        "{err}"
    );
}
