//! Static memory and FLOP plan of a batchfit graph.
//!
//! Pure functions from a [`batchfit_graph::Graph`] and [`TrainOptions`] to
//! bytes and FLOPs: per-op rules for what the backward pass keeps
//! ([`rules`]), the fixed memory (weights, gradients, optimizer state,
//! runtime), the per-sample memory at the step's peak, and from them
//! `memory(B) = fixed + per_sample x B` and the largest batch for a budget.
//! No framework code: the plan is checked against measurements by the engine.

pub mod devices;
pub mod options;
pub mod plan;
pub mod rules;
pub mod units;

pub use devices::{DevicePreset, PRESETS, preset};
pub use options::{Optimizer, Precision, Runtime, TrainOptions};
pub use plan::{FixedMemory, LayerPlan, MemoryLine, PerSampleMemory, Plan, plan};
pub use units::{Bytes, Flops};

#[cfg(test)]
mod tests {
    use super::*;
    use batchfit_graph::{GraphBuilder, LossKind, Shape, zoo};

    fn opts(optimizer: Optimizer) -> TrainOptions {
        TrainOptions {
            optimizer,
            ..TrainOptions::default()
        }
    }

    #[test]
    fn optimizer_state_bytes_per_optimizer() {
        let g = zoo::build("seed2-dual").unwrap();
        let p = 87_229u64;
        for (o, state) in [
            (Optimizer::Sgd, 0),
            (Optimizer::Momentum, 4 * p),
            (Optimizer::Adam, 8 * p),
            (Optimizer::Adamw, 8 * p),
        ] {
            let plan = plan(&g, &opts(o));
            assert_eq!(plan.fixed.optimizer_state, Bytes(state), "{o:?}");
            assert_eq!(plan.fixed.weights, Bytes(4 * p));
            assert_eq!(plan.fixed.gradients, Bytes(4 * p));
        }
    }

    /// x[8] -> linear 4 -> relu -> linear 2, MSE: every byte by hand.
    #[test]
    fn tiny_mlp_by_hand() {
        let mut g = GraphBuilder::new("tiny");
        g.input("x", Shape::fixed(&[8])).unwrap();
        g.linear("fc1", "x", 4).unwrap();
        g.push("relu", batchfit_graph::Op::Relu, &["fc1"]).unwrap();
        g.linear("fc2", "relu", 2).unwrap();
        let g = g.finish(LossKind::Mse, "fc2").unwrap();
        let p = plan(&g, &opts(Optimizer::Sgd));
        // fc1 saves x (8 floats); relu saves its output (4); fc2's input is that same tensor.
        let saved: Vec<u64> = p
            .layers
            .iter()
            .map(|l| l.saved_bytes_per_sample.0)
            .collect();
        assert_eq!(saved, vec![32, 16, 0]);
        // Loss keeps the 2-float difference; data is 8 inputs + 2 targets.
        assert_eq!(p.per_sample.activations, Bytes(48 + 8));
        assert_eq!(p.per_sample.data, Bytes(40));
        // Params 8*4+4 + 4*2+2 = 46; weights + grads, no state; the optimizer
        // transient is the largest tensor (32) once.
        assert_eq!(p.parameters, 46);
        assert_eq!(p.memory.fixed_bytes, Bytes(46 * 4 * 2 + 32 * 4));
        // Linear conv FLOPs: 4*(2*8+1) + 4 + 2*(2*4+1) = 68 + 4 + 18, plus 4 per logit for the loss.
        assert_eq!(p.forward_flops_per_sample.0, 90.0 + 8.0);
    }

    #[test]
    fn max_batch_is_the_largest_that_fits() {
        let g = zoo::build("mnist-mlp").unwrap();
        let p = plan(&g, &opts(Optimizer::Adam));
        let budget = Bytes(64 * Bytes::MIB);
        let b = p.max_batch(budget).unwrap();
        assert!(p.bytes_at(b) <= budget);
        assert!(p.bytes_at(b + 1) > budget);
        // By hand: floor((budget - fixed) / per_sample).
        let hand = (budget.0 - p.memory.fixed_bytes.0) / p.memory.per_sample_bytes.0;
        assert_eq!(b, hand);
        assert_eq!(p.max_batch(Bytes(1000)), None);
    }

    #[test]
    fn checkpointing_and_half_precision_cut_activation_memory() {
        let g = zoo::build("rnn-tutorial").unwrap();
        let base = plan(&g, &TrainOptions::default());
        let ckpt = plan(
            &g,
            &TrainOptions {
                checkpointing: true,
                ..TrainOptions::default()
            },
        );
        let half = plan(
            &g,
            &TrainOptions {
                precision: Precision::Fp16Mixed,
                ..TrainOptions::default()
            },
        );
        assert!(ckpt.per_sample.total < base.per_sample.total);
        assert!(half.per_sample.activations < base.per_sample.activations);
        assert!(
            half.fixed.weights > base.fixed.weights,
            "master + half copy"
        );
    }

    #[test]
    fn micro_batch_caps_activation_memory() {
        let g = zoo::build("mnist-cnn").unwrap();
        let micro = plan(
            &g,
            &TrainOptions {
                micro_batch: Some(25),
                ..TrainOptions::default()
            },
        );
        assert_eq!(micro.bytes_at(250), micro.bytes_at(25));
    }

    #[test]
    fn pytorch_on_a_gpu_adds_the_cuda_context() {
        let g = zoo::build("digits-mlp").unwrap();
        let burn = plan(&g, &TrainOptions::default());
        let torch = plan(
            &g,
            &TrainOptions {
                runtime: Runtime::Pytorch,
                gpu: true,
                ..TrainOptions::default()
            },
        );
        assert!(torch.bytes_at(1) > burn.bytes_at(1) + plan::PYTORCH_CUDA_CONTEXT);
    }

    #[test]
    fn presets_and_host() {
        assert_eq!(preset("gtx1060-6gb").unwrap().memory, Bytes(6 << 30));
        assert!(preset("gtx9999").unwrap_err().contains("gtx1060-6gb"));
        assert!(preset("host").unwrap().memory.0 > 0);
    }
}
