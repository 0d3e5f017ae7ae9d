//! Every op family on a wgpu device computes what the CPU engine computes: the
//! same weights and batch give the same loss and gradients, and a few Adam
//! steps stay together. Built only with `--features wgpu`; CI runs it on
//! lavapipe (Mesa's Vulkan driver on the CPU), where speed means nothing but
//! every kernel is compiled and run for real.
#![cfg(feature = "wgpu")]

mod common;

use batchfit_engine::burn::module::Module;
use batchfit_engine::{DeviceSpec, Trainer, data};
use common::{SEEDED, families, trainer};

/// The largest difference between `a` and `b`, relative to `b`'s largest magnitude.
fn max_rel_diff(a: &[f64], b: &[f64]) -> f64 {
    let scale = b.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-6);
    a.iter()
        .zip(b)
        .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()))
        / scale
}

/// The op families burn's GPU kernels train (`check_trainable_on_gpu`); the others must
/// be refused by name, never reach a kernel that panics.
fn gpu_families() -> Vec<batchfit_graph::Graph> {
    let (on_gpu, refused): (Vec<_>, Vec<_>) = families()
        .into_iter()
        .partition(|g| batchfit_engine::model::check_trainable_on_gpu(g).is_ok());
    for g in refused {
        let config = batchfit_engine::TrainConfig {
            optimizer: batchfit_plan::Optimizer::Adam,
            lr: 0.01,
            seq_len: 1,
            seed: 7,
            device: DeviceSpec::Wgpu(0),
            init_random: false,
        };
        let err = Trainer::new(&g, config).err().expect("refused on a GPU");
        assert!(err.to_string().contains("resiz"), "{}: {err}", g.name);
    }
    on_gpu
}

/// A CPU trainer and a wgpu trainer holding the CPU's initial weights.
fn pair(g: &batchfit_graph::Graph, lr: f64) -> (Trainer, Trainer) {
    let cpu = trainer(g, lr, DeviceSpec::Cpu);
    let mut gpu = trainer(g, lr, DeviceSpec::Wgpu(0));
    gpu.set_params(cpu.params().clone().fork(&gpu.device));
    (cpu, gpu)
}

#[test]
fn every_op_family_matches_the_cpu_on_wgpu() {
    let _turn = SEEDED.lock().unwrap_or_else(|e| e.into_inner());
    for g in gpu_families() {
        let (cpu, gpu) = pair(&g, 0.0);
        let batch = data::synthetic(&g, cpu.program.seq_len, 8, 5, &cpu.device);
        let on_gpu = batch.to_device(&gpu.device);
        let (loss_cpu, grads_cpu) = cpu.gradients_with(&batch, false);
        let (loss_gpu, grads_gpu) = gpu.gradients_with(&on_gpu, false);
        let loss_err = f64::from((loss_gpu - loss_cpu).abs() / loss_cpu.abs().max(1e-6));
        assert!(
            loss_err < 1e-4,
            "{}: loss {loss_gpu} on wgpu vs {loss_cpu} on the CPU",
            g.name
        );
        let (gc, gg) = (cpu.grad_vector(&grads_cpu), gpu.grad_vector(&grads_gpu));
        assert_eq!(
            gc.len(),
            gg.len(),
            "{}: every parameter has a gradient",
            g.name
        );
        let grad_err = max_rel_diff(&gg, &gc);
        assert!(
            grad_err < 1e-3,
            "{}: gradients differ by {grad_err:.2e}",
            g.name
        );
    }
}

#[test]
fn adam_steps_on_wgpu_follow_the_cpu() {
    let _turn = SEEDED.lock().unwrap_or_else(|e| e.into_inner());
    for g in gpu_families() {
        let (mut cpu, mut gpu) = pair(&g, 0.01);
        let batch = data::synthetic(&g, cpu.program.seq_len, 8, 3, &cpu.device);
        let on_gpu = batch.to_device(&gpu.device);
        let mut losses = Vec::new();
        for _ in 0..5 {
            // Dropout off: the two devices draw different masks.
            let (lc, gc) = cpu.gradients_with(&batch, false);
            let (lg, gg) = gpu.gradients_with(&on_gpu, false);
            cpu.apply(gc);
            gpu.apply(gg);
            losses.push((lc, lg));
        }
        let (first, _) = losses[0];
        for (step, &(lc, lg)) in losses.iter().enumerate() {
            let err = f64::from((lg - lc).abs() / first.abs().max(1e-6));
            assert!(
                err < 1e-3,
                "{}: step {step}: loss {lg} on wgpu vs {lc} on the CPU",
                g.name
            );
        }
        assert!(losses[4].1 < first, "{}: the loss falls on wgpu", g.name);
    }
}
