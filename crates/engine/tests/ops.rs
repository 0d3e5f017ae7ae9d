//! Every op family trains (its loss falls on a small fixed problem) and its
//! gradients match finite differences.

use batchfit_engine::model::Params;
use batchfit_engine::{DeviceSpec, data};
use batchfit_graph::{GraphBuilder, LossKind, Op, Shape, Window};
use burn::module::Param;
use burn::tensor::Tensor;

mod common;

use common::{SEEDED, families, trainer};

#[test]
fn every_op_family_learns_a_fixed_batch() {
    let _turn = SEEDED.lock().unwrap_or_else(|e| e.into_inner());
    for g in families() {
        let mut t = trainer(&g, 0.01, DeviceSpec::Cpu);
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
        let mut t = trainer(&g, 0.0, DeviceSpec::Cpu);
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
            standardize: None,
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
