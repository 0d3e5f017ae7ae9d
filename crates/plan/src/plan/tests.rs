use super::*;

/// A weight two layers share is one parameter; PyTorch holds it once, the engine
/// (which gives every layer its own tensor) twice.
#[test]
fn a_tied_weight_is_held_once_by_pytorch_and_per_layer_by_the_engine() {
    use batchfit_graph::{GraphBuilder, Shape};
    let mut g = GraphBuilder::new("tied");
    g.input("x", Shape::fixed(&[16])).unwrap();
    g.linear("a", "x", 16).unwrap();
    g.linear("b", "a", 16).unwrap();
    g.tie("b", 0, "a", 0).unwrap();
    assert!(
        g.tie("a", 1, "b", 1).is_err(),
        "ties point to earlier layers"
    );
    let graph = g.finish(LossKind::Mse, "b").unwrap();
    assert_eq!(graph.param_count(), 16 * 16 + 2 * 16);
    let weights = |runtime| {
        let opts = TrainOptions {
            runtime,
            ..TrainOptions::default()
        };
        let p = plan(&graph, &opts);
        assert_eq!(p.parameters, 16 * 16 + 2 * 16);
        p.fixed.weights.0
    };
    assert_eq!(weights(Runtime::Pytorch), 4 * (16 * 16 + 2 * 16));
    assert_eq!(weights(Runtime::Burn), 4 * (2 * 16 * 16 + 2 * 16));
}

/// A table computed once per step (a relative-position MLP over constant
/// coordinates) is fixed memory: widening its hidden layer leaves the bytes per
/// sample alone and adds its tensors (output and gradient) to the fixed bytes.
#[test]
fn a_shared_table_is_fixed_memory() {
    use batchfit_graph::{GraphBuilder, Shape};
    let with_hidden = |hidden: usize| {
        let mut g = GraphBuilder::new("relpos");
        g.input("x", Shape::fixed(&[4, 8])).unwrap();
        let coords = Op::Constant {
            shape: vec![4, 2],
            values: vec![0.5; 8],
        };
        g.push("coords", coords, &["x"]).unwrap();
        g.linear("fc1", "coords", hidden).unwrap();
        g.linear("fc2", "fc1", 8).unwrap();
        g.push("sum", Op::Add, &["x", "fc2"]).unwrap();
        g.linear("head", "sum", 3).unwrap();
        let graph = g.finish(LossKind::Mse, "head").unwrap();
        plan(&graph, &TrainOptions::default())
    };
    let (narrow, wide) = (with_hidden(4), with_hidden(1004));
    // Every node is a layer of the plan, its parameters with it.
    let fc1 = wide.layers.iter().find(|l| l.name == "fc1").unwrap();
    assert_eq!(fc1.parameters, 3 * 1004);
    assert_eq!(fc1.output_shape, "[4, 1004] once per step");
    assert_eq!(narrow.memory.per_sample_bytes, wide.memory.per_sample_bytes);
    // fc2 keeps its input, fc1's output [4, hidden] (PyTorch's linear keeps its input).
    assert_eq!(wide.fixed.shared.0 - narrow.fixed.shared.0, 4 * (4 * 1000));
    let params = |h: u64| (2 * h + h) + (h * 8 + 8);
    assert!(
        wide.memory.fixed_bytes.0 - narrow.memory.fixed_bytes.0
            >= 4 * 4 * 1000 + 4 * (params(1004) - params(4))
    );
}

/// A standardised convolution weight (BiT, NFNet) is computed once per step from the
/// parameter: what it keeps for the backward is fixed memory, by each runtime's rule,
/// and nothing per sample.
#[test]
fn a_standardised_weight_is_fixed_memory_by_each_runtime() {
    use batchfit_graph::{GraphBuilder, Shape, Standardize, Window};
    let conv = |standardize: Option<Standardize>| {
        let mut g = GraphBuilder::new("std-conv");
        g.input("x", Shape::fixed(&[3, 8, 8])).unwrap();
        let op = Op::Conv {
            in_channels: 3,
            out_channels: 16,
            window: Window::square(2, 3, 1, 1),
            groups: 1,
            bias: false,
            standardize,
        };
        g.push("c", op, &["x"]).unwrap();
        g.push("f", Op::Flatten, &["c"]).unwrap();
        g.linear("head", "f", 2).unwrap();
        g.finish(LossKind::Mse, "head").unwrap()
    };
    let plain = conv(None);
    let std = conv(Some(Standardize {
        eps: 1e-5,
        gain: true,
        scale: 1.0,
    }));
    assert_eq!(std.param_count(), plain.param_count() + 16);
    let weight = 16 * 3 * 9;
    for (runtime, kept) in [
        (Runtime::Pytorch, weight + 2 * 16),
        (Runtime::Burn, 2 * weight + 4 * 16),
    ] {
        let opts = TrainOptions {
            runtime,
            ..TrainOptions::default()
        };
        let (a, b) = (plan(&plain, &opts), plan(&std, &opts));
        assert_eq!(b.fixed.shared.0 - a.fixed.shared.0, 4 * kept, "{runtime:?}");
        assert_eq!(a.memory.per_sample_bytes, b.memory.per_sample_bytes);
    }
}

/// A dense layer's weight gradient `x^T dy` has the batch's rows as its depth: gemm's
/// per-call packing (here the lhs prepacked, 1,000 columns not a multiple of the lanes)
/// grows with the batch up to gemm's depth block of 512 rows, then stops; a product with
/// 1,024 columns packs through the slab instead, and a GPU packs nothing.
#[test]
fn a_weight_gradient_packs_per_call_up_to_the_depth_block() {
    use batchfit_graph::{GraphBuilder, Shape};
    let head = |classes: usize| {
        let mut g = GraphBuilder::new("head");
        g.input("x", Shape::fixed(&[32, 64])).unwrap();
        g.linear("lm", "x", classes).unwrap();
        g.finish(LossKind::Mse, "lm").unwrap()
    };
    let host = CpuHost {
        threads: 1,
        l2_bytes: 1 << 20,
        l2_ways: 16,
        gemm_kernel: GemmKernel::AVX512,
    };
    let packing = |graph: &Graph, batch: u64, gpu: bool| {
        let opts = TrainOptions {
            runtime: Runtime::Burn,
            gpu,
            ..TrainOptions::default()
        };
        let p = plan_on(graph, &opts, host);
        p.memory
            .moments
            .iter()
            .filter_map(|m| m.gemm_call)
            .map(|c| c.bytes_at(batch))
            .max()
            .unwrap_or(0)
    };
    let g = head(1000);
    // 32 rows a sample: depth 64 at batch 2, 256 at 8; `kc x (1,024 + 66)` floats.
    assert_eq!(packing(&g, 2, false), 64 * 1090 * 4);
    assert_eq!(packing(&g, 8, false), 256 * 1090 * 4);
    // From 16 samples (512 rows) the depth block is 512, and the row block it leaves in
    // the L2 too short for 1,000 columns: only the rhs is packed.
    assert_eq!(packing(&g, 32, false), 512 * 66 * 4);
    assert_eq!(packing(&g, 4096, false), 512 * 66 * 4);
    assert_eq!(packing(&head(1024), 8, false), 256 * 66 * 4);
    assert_eq!(packing(&g, 8, true), 0);
    let opts = TrainOptions {
        runtime: Runtime::Burn,
        ..TrainOptions::default()
    };
    let p = plan_on(&g, &opts, host);
    let line = |m: &Moment, b: u64| m.fixed_bytes + m.per_sample_bytes * b;
    assert!(
        p.memory
            .moments
            .iter()
            .all(|m| m.bytes_at(8).0 == line(m, 8).0 + m.gemm_call.map_or(0, |c| c.bytes_at(8)))
    );
}

/// The constants an op carries (a rotary table, a relative-position index) are fixed
/// memory where the runtime holds them as imported (the engine on a CPU), 4 bytes a value
/// and 8 an index.
#[test]
fn the_engine_holds_the_ops_constants() {
    use batchfit_graph::{GraphBuilder, Shape};
    let mut g = GraphBuilder::new("rotary");
    g.input("x", Shape::fixed(&[8, 16])).unwrap();
    let table = Op::MulConst {
        shape: vec![8, 16],
        values: vec![0.5; 128],
    };
    g.push("rot", table, &["x"]).unwrap();
    g.linear("out", "rot", 4).unwrap();
    let graph = g.finish(LossKind::Mse, "out").unwrap();
    let buffers = |runtime, gpu| {
        let opts = TrainOptions {
            runtime,
            gpu,
            ..TrainOptions::default()
        };
        plan(&graph, &opts).fixed.buffers.0
    };
    assert_eq!(buffers(Runtime::Burn, false), 128 * 4);
    assert_eq!(buffers(Runtime::Burn, true), 0);
    assert_eq!(buffers(Runtime::Pytorch, false), 0);
}
