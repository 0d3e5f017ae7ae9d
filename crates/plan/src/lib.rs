//! Static memory and FLOP plan of a batchfit graph.
//!
//! Pure functions from a [`batchfit_graph::Graph`] and [`TrainOptions`] to
//! bytes and FLOPs: per-op rules for what the backward pass keeps, one set per
//! runtime ([`rules`]), the fixed memory (weights, gradients, optimizer state,
//! runtime) and the per-sample memory.
//!
//! The memory of a step is not one line. Each moment of the step (a node's
//! forward, each moment of its backward, the loss, the optimizer) holds its own
//! `fixed + per_sample x B`, because gradients are made as backward goes (burn, and
//! PyTorch after its default `zero_grad(set_to_none=True)`); the planned bytes at a batch ([`Plan::bytes_at`]) are the largest of these
//! lines at that batch, plus the allocator's rounding, less a CPU buffer that small
//! batches do not allocate ([`plan::Memory`] has the exact rule). The largest batch
//! for a budget ([`Plan::max_batch`]) searches that function. `Plan::memory`'s
//! `fixed_bytes` and `per_sample_bytes` are the line of the moment that is largest at
//! large batches; at small batches another moment can be larger.
//! No framework code: the plan is checked against measurements by the engine and,
//! for PyTorch's rules, by bench/pytorch_memory.py ([`accuracy`] has the figures).

#![warn(missing_docs)]

pub mod accuracy;
pub mod devices;
pub mod distributed;
mod fused;
pub mod host;
pub mod lengths;
pub mod options;
pub mod pages;
pub mod plan;
pub mod rules;
pub mod units;

pub use devices::{DevicePreset, PRESETS, PresetError, preset};
pub use options::{Optimizer, Precision, Runtime, TrainOptions};
pub use plan::{FixedMemory, LayerPlan, Memory, Moment, PerSampleMemory, Plan, plan};
pub use units::{Bytes, Flops, ParseBytesError};

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
            // The peak line holds the gradients made by then, at most all of them.
            assert!(plan.fixed.gradients <= Bytes(4 * p));
        }
    }

    /// x[8] -> linear 4 -> relu -> linear 2, MSE.
    fn tiny() -> batchfit_graph::Graph {
        let mut g = GraphBuilder::new("tiny");
        g.input("x", Shape::fixed(&[8])).unwrap();
        g.linear("fc1", "x", 4).unwrap();
        g.push("relu", batchfit_graph::Op::Relu, &["fc1"]).unwrap();
        g.linear("fc2", "relu", 2).unwrap();
        g.finish(LossKind::Mse, "fc2").unwrap()
    }

    /// The tiny MLP under PyTorch's rules: every byte by hand.
    #[test]
    fn tiny_mlp_by_hand() {
        let g = tiny();
        let p = plan(
            &g,
            &TrainOptions {
                runtime: Runtime::Pytorch,
                ..opts(Optimizer::Sgd)
            },
        );
        // fc1 saves x, the batch's own tensor (counted as data); relu saves its output (4
        // floats); fc2's input is that same tensor.
        let saved: Vec<u64> = p
            .layers
            .iter()
            .map(|l| l.saved_bytes_per_sample.0)
            .collect();
        assert_eq!(saved, vec![0, 16, 0]);
        // Loss keeps the 2-float output; data is 8 inputs + 2 targets.
        assert_eq!(p.per_sample.activations, Bytes(16 + 8));
        assert_eq!(p.per_sample.data, Bytes(40));
        // The largest moments per sample are relu's and fc1's backward: data, relu's output
        // (until fc1's), the output's and input's gradients, 40 + 16 + 32 = 40 + 0 + 48.
        // The later one, fc1's, holds every gradient (46 params, none made before backward:
        // set_to_none) with the weights; SGD has no state and no temporaries, and the CPU
        // allocator no pool.
        assert_eq!(p.parameters, 46);
        assert_eq!(p.memory.per_sample_bytes, Bytes(88));
        assert_eq!(p.memory.fixed_bytes, Bytes(46 * 4 * 2));
        assert_eq!(p.peak_at, "fc1");
        // Linear conv FLOPs: 4*(2*8+1) + 4 + 2*(2*4+1) = 68 + 4 + 18, plus 4 per logit for the loss.
        assert_eq!(p.forward_flops_per_sample.0, 90.0 + 8.0);
    }

    fn pytorch_sgd() -> TrainOptions {
        TrainOptions {
            runtime: Runtime::Pytorch,
            ..opts(Optimizer::Sgd)
        }
    }

    /// `x * sigmoid(x)` is PyTorch's SiLU: x kept once, the sigmoid not at all; a
    /// sigmoid whose product is of another tensor (a squeeze-excitation gate) keeps its
    /// output.
    #[test]
    fn silu_keeps_its_input_alone() {
        let mut g = GraphBuilder::new("silu");
        g.input("x", Shape::fixed(&[8])).unwrap();
        g.linear("fc1", "x", 6).unwrap();
        g.push("sig", batchfit_graph::Op::Sigmoid, &["fc1"])
            .unwrap();
        g.push("silu", batchfit_graph::Op::Mul, &["fc1", "sig"])
            .unwrap();
        g.linear("fc2", "silu", 6).unwrap();
        g.push("gate", batchfit_graph::Op::Sigmoid, &["x"]).unwrap();
        g.linear("fc3", "gate", 6).unwrap();
        g.push("se", batchfit_graph::Op::Mul, &["fc2", "fc3"])
            .unwrap();
        let g = g.finish(LossKind::Mse, "se").unwrap();
        let p = plan(&g, &pytorch_sgd());
        let saved: Vec<(&str, u64)> = p
            .layers
            .iter()
            .map(|l| (l.name.as_str(), l.saved_bytes_per_sample.0))
            .collect();
        assert_eq!(
            saved,
            vec![
                ("fc1", 0),
                ("sig", 0),
                ("silu", 24),
                ("fc2", 24),
                ("gate", 32),
                ("fc3", 0),
                ("se", 48)
            ]
        );
    }

    /// Attention as the exporter writes `F.scaled_dot_product_attention` without dropout:
    /// PyTorch's fused kernel keeps q, k, v, its output and a log-sum-exp per query, and
    /// no `T x T` score or probability.
    #[test]
    fn fused_attention_keeps_no_scores() {
        use batchfit_graph::Op;
        let attention = |dropout: Option<f32>| {
            let mut g = GraphBuilder::new("attention");
            g.input("x", Shape::fixed(&[16, 8])).unwrap();
            for name in ["q", "k", "v"] {
                g.linear(name, "x", 8).unwrap();
            }
            g.push("kt", Op::Transpose { perm: vec![1, 0] }, &["k"])
                .unwrap();
            g.push("qs", Op::Scale { factor: 0.5 }, &["q"]).unwrap();
            g.push("ks", Op::Scale { factor: 0.5 }, &["kt"]).unwrap();
            g.push("scores", Op::MatMul, &["qs", "ks"]).unwrap();
            g.push("probs", Op::Softmax { axis: -1 }, &["scores"])
                .unwrap();
            let mut last = "probs";
            if let Some(p) = dropout {
                g.push("drop", Op::Dropout { p }, &["probs"]).unwrap();
                last = "drop";
            }
            g.push("out", Op::MatMul, &[last, "v"]).unwrap();
            g.linear("fc", "out", 2).unwrap();
            let g = g.finish(LossKind::Mse, "fc").unwrap();
            plan(&g, &pytorch_sgd())
        };
        let saved = |p: &Plan, name: &str| {
            p.layers
                .iter()
                .find(|l| l.name == name)
                .unwrap()
                .saved_bytes_per_sample
                .0
        };
        let fused = attention(None);
        for inner in ["qs", "ks", "scores", "probs"] {
            assert_eq!(saved(&fused, inner), 0, "{inner}");
        }
        // q, k (the transpose views it), v: 128 floats each; the output, 128; 16
        // log-sum-exps.
        assert_eq!(saved(&fused, "out"), (3 * 128 + 128 + 16) * 4);
        assert_eq!(saved(&fused, "fc"), 0);
        // With a dropout, PyTorch on a CPU runs the composition: the probabilities are kept.
        let composed = attention(Some(0.1));
        assert_eq!(saved(&composed, "probs"), 16 * 16 * 4);
        assert!(composed.bytes_at(64) > fused.bytes_at(64));
    }

    /// A layer keeping a slice of a tensor keeps the whole tensor under PyTorch's rules
    /// (`y[:, -1]` is a view of `y`), counted once.
    #[test]
    fn a_slice_keeps_its_whole_input() {
        let mut g = GraphBuilder::new("last");
        g.input("x", Shape::fixed(&[10, 4])).unwrap();
        g.linear("fc1", "x", 6).unwrap();
        let last = batchfit_graph::Op::Slice {
            axis: 1,
            start: 9,
            end: 10,
        };
        g.push("last", last, &["fc1"]).unwrap();
        g.push("flat", batchfit_graph::Op::Flatten, &["last"])
            .unwrap();
        g.linear("fc2", "flat", 2).unwrap();
        let g = g.finish(LossKind::Mse, "fc2").unwrap();
        let p = plan(&g, &pytorch_sgd());
        let fc2 = p.layers.iter().find(|l| l.name == "fc2").unwrap();
        assert_eq!(fc2.saved_bytes_per_sample, Bytes(10 * 6 * 4));
    }

    /// The tiny MLP under burn's rules, on a 2-thread CPU with 512 KiB of L2: by hand.
    #[test]
    fn tiny_mlp_by_hand_on_burn() {
        let g = tiny();
        let host = plan::CpuHost {
            threads: 2,
            l2_bytes: 512 * 1024,
            l2_ways: 8,
            gemm_kernel: plan::GemmKernel::AVX2,
        };
        let p = plan::plan_on(&g, &opts(Optimizer::Sgd), host);
        // x is the batch (counted as data); relu keeps its output (4 floats; the engine's
        // own ReLU on the CPU), which is fc2's input, kept once.
        let saved: Vec<u64> = p
            .layers
            .iter()
            .map(|l| l.saved_bytes_per_sample.0)
            .collect();
        assert_eq!(saved, vec![0, 16, 0]);
        assert_eq!(p.per_sample.data, Bytes(40));
        // Fixed for every moment: weights 46 * 4 and gemm's packing buffer (L2) on each of
        // the pool's two threads, which the engine allocates when it starts its pool.
        let slab = 512 * 1024;
        let base = 46 * 4 + 2 * slab;
        // Largest per sample: fc2's backward (the engine's own dense layer, each product
        // written once): the output's gradient (2 floats) and dx (4 floats) over everything
        // kept (16 B), plus data; its weight gradient (10 floats) is made while they are
        // alive, so that moment is the peak.
        assert_eq!(p.memory.fixed_bytes, Bytes(base + 10 * 4));
        assert_eq!(p.memory.per_sample_bytes, Bytes(40 + 16 + (2 + 4) * 4));
        assert_eq!(p.peak_at, "fc2");
        // At small batches another moment is larger: fc1's dW (36 floats with its bias)
        // being made after fc2's gradients (10 floats): nothing kept is left but the
        // output's gradient (4 floats).
        // Each dW product has the batch as its depth: gemm prepacks its 4 or 2 columns,
        // rounded up to 16 rows, `min(B, 512)` deep, in a buffer of its own (a depth of 1
        // or 2 goes to gemm's vector kernels, which pack nothing).
        let packed = |b: u64| if b <= 2 { 0 } else { b.min(512) * 16 * 4 };
        let fc1_dw = |b: u64| base + (10 + 36) * 4 + b * (40 + 4 * 4) + packed(b);
        assert_eq!(p.bytes_at(2), Bytes(fc1_dw(2)));
        assert_eq!(p.bytes_at(1), Bytes(fc1_dw(1)));
        assert_eq!(
            p.bytes_at(1000),
            Bytes(base + 40 + 1000 * (40 + 16 + 24) + packed(1000))
        );
    }

    #[test]
    fn max_batch_is_the_largest_that_fits() {
        let g = zoo::build("mnist-mlp").unwrap();
        let p = plan(&g, &opts(Optimizer::Adam));
        let budget = Bytes(64 * Bytes::MIB);
        let b = p.max_batch(budget).unwrap();
        assert!(p.bytes_at(b) <= budget);
        assert!(p.bytes_at(b + 1) > budget);
        // By hand: floor((budget - fixed - packing) / per_sample), the packing of the peak
        // moment's product at its largest (gemm's depth block is reached by then).
        let packing = p
            .memory
            .moments
            .iter()
            .filter(|m| m.moment == p.peak_at && m.per_sample_bytes == p.memory.per_sample_bytes)
            .map(|m| m.gemm_call.map_or(0, |c| c.bytes_at(b)))
            .max()
            .unwrap();
        let hand = (budget.0 - p.memory.fixed_bytes.0 - packing) / p.memory.per_sample_bytes.0;
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
        // Checkpointing keeps fewer activations; under PyTorch's rules that lowers the peak.
        // (Under burn's the peak of this model is the BiLSTM's own per-step tensors, which
        // one layer's recomputation cannot spread, and the recomputed segment can even
        // raise it a little: the clipped ReLUs before it keep one byte per element.)
        assert!(ckpt.per_sample.activations < base.per_sample.activations);
        let torch = |checkpointing| {
            plan(
                &g,
                &TrainOptions {
                    checkpointing,
                    runtime: Runtime::Pytorch,
                    ..TrainOptions::default()
                },
            )
        };
        assert!(torch(true).per_sample.total < torch(false).per_sample.total);
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
        // Against PyTorch on the CPU: burn's CPU plan holds gemm's packing buffers,
        // threads x L2 (4 MiB on a 2-core host with 2 MiB L2s), which would blur it.
        let g = zoo::build("digits-mlp").unwrap();
        let torch = |gpu: bool| {
            plan(
                &g,
                &TrainOptions {
                    runtime: Runtime::Pytorch,
                    gpu,
                    ..TrainOptions::default()
                },
            )
        };
        let (cpu, gpu) = (torch(false), torch(true));
        assert!(gpu.bytes_at(1) >= cpu.bytes_at(1) + plan::PYTORCH_CUDA_CONTEXT);
        assert!(gpu.bytes_at(1) < cpu.bytes_at(1) + plan::PYTORCH_CUDA_CONTEXT * 2);
    }

    #[test]
    fn presets_and_host() {
        assert_eq!(preset("gtx1060-6gb").unwrap().memory, Bytes(6 << 30));
        let unknown = preset("gtx9999").unwrap_err();
        assert!(matches!(unknown, PresetError::Unknown { .. }));
        assert!(unknown.to_string().contains("gtx1060-6gb"));
        assert!(preset("host").unwrap().memory.0 > 0);
    }
}
