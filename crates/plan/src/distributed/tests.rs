//! Hand-computed cases of the distributed plan.

use super::*;
use crate::options::Optimizer;

fn opts(precision: Precision, optimizer: Optimizer) -> TrainOptions {
    TrainOptions {
        precision,
        optimizer,
        ..TrainOptions::default()
    }
}

/// ZeRO's Table 1 setting: mixed-precision Adam, K = 12, 2 + 2 + K = 16 bytes.
#[test]
fn state_bytes_follow_zero_for_mixed_adam_and_the_plan_otherwise() {
    let mixed = StateBytes::of(&opts(Precision::Fp16Mixed, Optimizer::Adam));
    assert_eq!(
        mixed,
        StateBytes {
            params: 2,
            gradients: 2,
            optimizer: 12
        }
    );
    assert_eq!(mixed.total(), 16);
    // fp32 Adam: 4 + 4 + two fp32 moments; fp32 SGD: no state at all.
    let fp32 = StateBytes::of(&opts(Precision::Fp32, Optimizer::Adam));
    assert_eq!((fp32.params, fp32.gradients, fp32.optimizer), (4, 4, 8));
    assert_eq!(
        StateBytes::of(&opts(Precision::Fp32, Optimizer::Sgd)).total(),
        8
    );
    // Mixed SGD still keeps fp32 master weights: K = 4.
    assert_eq!(
        StateBytes::of(&opts(Precision::Bf16Mixed, Optimizer::Sgd)).optimizer,
        4
    );
}

/// ZeRO §5: with Psi = 7.5e9 and N_d = 64, 120 GB (DDP), 31.4 GB (P_os), 16.6 GB
/// (P_os+g), 1.9 GB (P_os+g+p).
#[test]
fn zero_paper_figure_one() {
    let per = StateBytes {
        params: 2,
        gradients: 2,
        optimizer: 12,
    };
    let psi = 7_500_000_000u64;
    let gb = |s: Strategy| model_states(psi, per, s, 64).total().as_f64() / 1e9;
    assert!((gb(Strategy::Ddp) - 120.0).abs() < 1e-9);
    assert!((gb(Strategy::Zero1) - 31.40625).abs() < 1e-6);
    assert!((gb(Strategy::Zero2) - 16.640625).abs() < 1e-6);
    assert!((gb(Strategy::Zero3) - 1.875).abs() < 1e-6);
    assert_eq!(
        model_states(psi, per, Strategy::Fsdp, 64),
        model_states(psi, per, Strategy::Zero3, 64)
    );
    // One device shards nothing.
    assert_eq!(
        model_states(psi, per, Strategy::Zero3, 1).total(),
        Bytes(16 * psi)
    );
}

#[test]
fn ddp_buckets_fill_from_the_last_layer() {
    let mib = Bytes::MIB;
    // Backward order: 2 MiB (first bucket, over 1 MiB), then 10 + 20 MiB close the second
    // at 30 MiB, then 5 MiB is left open.
    let layers = [5 * mib, 20 * mib, 10 * mib, 0, 2 * mib];
    assert_eq!(ddp_buckets(&layers), vec![2 * mib, 30 * mib, 5 * mib]);
    assert!(ddp_buckets(&[]).is_empty());
}

#[test]
fn comm_buffers_by_hand() {
    let per = StateBytes {
        params: 2,
        gradients: 2,
        optimizer: 12,
    };
    let layers = [100, 400, 300];
    assert_eq!(comm_buffers(&layers, per, Strategy::Ddp), Bytes(1600));
    assert_eq!(comm_buffers(&layers, per, Strategy::Zero2), Bytes(1600));
    // Gathered: the two largest layers (400 + 300) x 2 B; the largest's gradient 400 x 2 B.
    assert_eq!(comm_buffers(&layers, per, Strategy::Zero3), Bytes(2200));
}

#[test]
fn ring_collectives_by_hand() {
    let link = Link {
        name: "test".into(),
        bytes_per_s: 1e9,
        latency_s: 1e-5,
    };
    // 4 devices, 1 GB: all-reduce moves 2 x 3/4 GB = 1.5 s plus 6 steps x 10 us.
    let t = Collective::AllReduce.seconds(1_000_000_000, 4, &link);
    assert!((t - (1.5 + 6e-5)).abs() < 1e-12);
    let t = Collective::AllGather.seconds(1_000_000_000, 4, &link);
    assert!((t - (0.75 + 3e-5)).abs() < 1e-12);
    assert_eq!(Collective::ReduceScatter.seconds(1000, 1, &link), 0.0);
}

#[test]
fn link_presets_and_the_slowest_hop() {
    assert_eq!(LinkPreset::Ib200.link().bytes_per_s, 25e9);
    assert_eq!(LinkPreset::Nvlink.link().bytes_per_s, 300e9);
    assert!((LinkPreset::Pcie4.link().bytes_per_s - 31.507_692e9).abs() < 1e3);
    let ring = Link::ring(&LinkPreset::Nvlink.link(), Some(&LinkPreset::Eth25.link()));
    assert_eq!(ring.bytes_per_s, 3.125e9);
    assert_eq!(ring.latency_s, SOCKET_LATENCY_S);
    assert_eq!(Link::gbps(100.0).bytes_per_s, 12.5e9);
}

fn unit_link() -> Link {
    Link {
        name: "unit".into(),
        bytes_per_s: 1e6,
        latency_s: 0.0,
    }
}

/// DDP on 2 devices, fp32 gradients: one bucket of 4 MB all-reduced = 2 x 1/2 x 4 MB / 1 MB/s
/// = 4 s, all exposed (the last bucket is the only one).
#[test]
fn ddp_comm_by_hand() {
    let per = StateBytes {
        params: 4,
        gradients: 4,
        optimizer: 8,
    };
    let c = comm_time(
        &CommModel {
            layer_params: &[1_000_000],
            per,
            forward_share: 1.0 / 3.0,
        },
        Strategy::Ddp,
        2,
        4,
        Some(1.0),
        &unit_link(),
    );
    assert_eq!(c.collectives, 1);
    assert!((c.seconds - 4.0).abs() < 1e-9);
    assert!((c.exposed_s.unwrap() - 4.0).abs() < 1e-9);
    // Two buckets (2 MiB from the last layer first, then 30 MiB): the first hides behind
    // the 20 s backward, the last is exposed.
    let mib = Bytes::MIB;
    let c = comm_time(
        &CommModel {
            layer_params: &[30 * mib, 2 * mib],
            per: StateBytes {
                params: 1,
                gradients: 1,
                optimizer: 0,
            },
            forward_share: 1.0 / 3.0,
        },
        Strategy::Ddp,
        2,
        1,
        Some(30.0),
        &unit_link(),
    );
    assert_eq!(c.collectives, 2);
    assert!((c.exposed_s.unwrap() - 30.0 * mib as f64 / 1e6).abs() < 1e-9);
    assert!((c.seconds - 32.0 * mib as f64 / 1e6).abs() < 1e-9);
}

/// ZeRO-3 on 4 devices, two layers of 1e6 parameters at 2 bytes: each all-gather or
/// reduce-scatter moves 3/4 x 2 MB = 1.5 s; forward 2 gathers, backward 2 gathers + 2
/// reduce-scatters; ZeRO paper: 3 Psi per step.
#[test]
fn zero3_comm_by_hand() {
    let per = StateBytes {
        params: 2,
        gradients: 2,
        optimizer: 12,
    };
    let c = comm_time(
        &CommModel {
            layer_params: &[1_000_000, 1_000_000],
            per,
            forward_share: 1.0 / 3.0,
        },
        Strategy::Zero3,
        4,
        2,
        Some(3.0),
        &unit_link(),
    );
    assert_eq!(c.collectives, 2 * 6);
    assert!((c.bytes_per_device - 2.0 * 6.0 * 1.5e6).abs() < 1e-3);
    assert!((c.seconds - 2.0 * 9.0).abs() < 1e-9);
    // Forward: first gather 1.5 s exposed, the other 1.5 s under the 1 s forward: 0.5 s
    // more. Backward: last reduce-scatter 1.5 s, the other 4.5 s under 2 s: 2.5 s more.
    // Per micro-step 6 s, two micro-steps.
    assert!((c.exposed_s.unwrap() - 12.0).abs() < 1e-9);
    // ZeRO-1 moves the gradients once and the parameters once per update: 2 Psi.
    let z1 = comm_time(
        &CommModel {
            layer_params: &[1_000_000, 1_000_000],
            per,
            forward_share: 1.0 / 3.0,
        },
        Strategy::Zero1,
        4,
        2,
        None,
        &unit_link(),
    );
    assert!((z1.bytes_per_device - 2.0 * 0.75 * 4e6).abs() < 1e-3);
    assert_eq!(z1.exposed_s, None);
    let z2 = comm_time(
        &CommModel {
            layer_params: &[1_000_000, 1_000_000],
            per,
            forward_share: 1.0 / 3.0,
        },
        Strategy::Zero2,
        4,
        2,
        Some(1.0),
        &unit_link(),
    );
    // Two reduce-scatters (one per micro-step) and one all-gather, 3 s each, exposed.
    assert!((z2.exposed_s.unwrap() - 9.0).abs() < 1e-9);
}

#[test]
fn one_device_communicates_nothing() {
    let per = StateBytes {
        params: 4,
        gradients: 4,
        optimizer: 8,
    };
    for s in Strategy::ALL {
        let c = comm_time(
            &CommModel {
                layer_params: &[10, 20],
                per,
                forward_share: 0.5,
            },
            s,
            1,
            3,
            Some(1.0),
            &unit_link(),
        );
        assert_eq!(c.seconds, 0.0);
        assert_eq!(c.exposed_s, Some(0.0));
        assert_eq!(c.collectives, 0);
    }
}

#[test]
fn global_batch_split() {
    // 1000 over 8 devices, micro at most 32: 125 per device, 4 steps of 32.
    assert_eq!(split_global_batch(1000, 8, 32), (32, 4));
    // 512 over 8 with room for 100: one step of 64.
    assert_eq!(split_global_batch(512, 8, 100), (64, 1));
    // Fewer samples than devices: one each.
    assert_eq!(split_global_batch(3, 8, 10), (1, 1));
}

#[test]
fn device_memory_swaps_the_model_states() {
    let g = batchfit_graph::zoo::build("mnist-mlp").unwrap();
    let o = TrainOptions {
        precision: Precision::Fp16Mixed,
        runtime: crate::options::Runtime::Pytorch,
        gpu: true,
        ..TrainOptions::default()
    };
    let p = crate::plan::plan(&g, &o);
    let one = DeviceMemory::new(&p, Strategy::Ddp, 1);
    let z3 = DeviceMemory::new(&p, Strategy::Zero3, 8);
    // DDP: the plan's 6 + 4 + 8 = 18 bytes become 16, plus one gradient copy (2 B).
    assert_eq!(
        one.bytes_at(&p, 10).0 as i128 - p.bytes_at(10).0 as i128,
        one.delta()
    );
    // One DDP device holds every gradient at its peak; the plan's peak moment (a backward
    // moment: `zero_grad(set_to_none)` frees them each step) holds those made by then.
    assert_eq!(
        one.delta(),
        (p.parameters * 4) as i128 - p.fixed.gradients.0 as i128
    );
    assert!(z3.bytes_at(&p, 10) < one.bytes_at(&p, 10));
    let budget = Bytes(600 * Bytes::MIB);
    let m = z3.max_micro_batch(&p, budget).unwrap();
    assert!(z3.bytes_at(&p, m) <= budget && z3.bytes_at(&p, m + 1) > budget);
    assert_eq!(z3.max_micro_batch(&p, Bytes(1)), None);
}

#[test]
fn compute_times_by_hand() {
    let g = batchfit_graph::zoo::build("mnist-mlp").unwrap();
    let p = crate::plan::plan(&g, &plan_options(&TrainOptions::default()));
    let given = Compute::StepTime {
        seconds: 0.2,
        micro_batch: 32,
    };
    // In proportion to the micro-batch: 64 samples take twice 32's time.
    assert!((given.micro_step_s(&p, 64).unwrap() - 0.4).abs() < 1e-12);
    let flops = Compute::Flops { tflops: 10.0 };
    let want = p.train_flops_per_sample.0 * 100.0 / 1e13;
    assert!((flops.micro_step_s(&p, 100).unwrap() - want).abs() < 1e-18);
    assert_eq!(Compute::Unknown.micro_step_s(&p, 1), None);
}

/// The table: a global batch split over world sizes, update = compute + exposed.
#[test]
fn scale_table_rows() {
    let g = batchfit_graph::zoo::build("mnist-mlp").unwrap();
    let p = crate::plan::plan(&g, &plan_options(&TrainOptions::default()));
    let req = ScaleRequest {
        gpus_per_node: vec![1, 4],
        nodes: 2,
        strategies: vec![Strategy::Ddp, Strategy::Zero3],
        budget_bytes: Some(Bytes(2 * Bytes::GIB)),
        micro_batch: Some(50),
        global_batch: Some(1000),
        link: LinkPreset::Ib100.link(),
        compute: Compute::StepTime {
            seconds: 0.1,
            micro_batch: 50,
        },
    };
    let rows = scale_table(&p, &req);
    assert_eq!(rows.len(), 4);
    // 2 devices: 500 each, 10 steps of 50; 8 devices: 125 each, 3 steps of 42.
    let r = &rows[0];
    assert_eq!(r.memory.world_size, 2);
    assert_eq!((r.micro_batch, r.accumulation), (Some(50), Some(10)));
    assert_eq!(r.global_batch, Some(1000));
    assert!((r.compute_s.unwrap() - 1.0).abs() < 1e-12);
    let r = &rows[3];
    assert_eq!((r.memory.world_size, r.stage), (8, 3));
    assert_eq!((r.micro_batch, r.accumulation), (Some(42), Some(3)));
    assert_eq!(r.global_batch, Some(8 * 42 * 3));
    for r in &rows {
        let step = r.step_s.unwrap();
        assert!((step - r.compute_s.unwrap() - r.comm.exposed_s.unwrap()).abs() < 1e-12);
        assert!(r.max_micro_batch.unwrap() >= 50);
    }
}
