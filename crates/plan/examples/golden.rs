//! Prints every plan figure for the zoo and two extra graphs over a spread of options, so a
//! refactor of the plan can be checked byte for byte: run before and after, diff the outputs.
//! Keys added to the JSON after the first run are stripped (see `ADDED`).

use batchfit_graph::{
    Cell, Dim, Graph, GraphBuilder, InputKind, LossKind, Op, PoolKind, RnnBias, Shape, zoo,
};
use batchfit_plan::plan::{CpuHost, GemmKernel, plan_on};
use batchfit_plan::{Bytes, Optimizer, Precision, Runtime, TrainOptions, plan};

/// Keys of `memory` added by the refactor, removed before printing.
const ADDED: &[&str] = &[
    "moments",
    "rounding_bytes",
    "gemm_buffer_bytes",
    "gemm_buffer_from_batch",
    "gemm_pool_bytes",
    "gemm_pool_from_batch",
];

fn kitchen() -> Graph {
    let mut g = GraphBuilder::new("kitchen");
    g.input("img", Shape::fixed(&[3, 16, 16])).unwrap();
    g.input("aux", Shape::fixed(&[12])).unwrap();
    g.conv("c1", "img", 8, 2, 3, 1, None).unwrap();
    g.batch_norm("bn", "c1").unwrap();
    g.push("gelu", Op::Gelu, &["bn"]).unwrap();
    g.conv("c2", "gelu", 8, 2, 3, 2, None).unwrap();
    g.push("tanh", Op::Tanh, &["c2"]).unwrap();
    g.pool("avg", "tanh", PoolKind::Avg, 2, 2, 2, Some(0))
        .unwrap();
    g.push("sig", Op::Sigmoid, &["avg"]).unwrap();
    g.push(
        "gmax",
        Op::GlobalPool {
            pool: PoolKind::Max,
        },
        &["sig"],
    )
    .unwrap();
    g.push(
        "gavg",
        Op::GlobalPool {
            pool: PoolKind::Avg,
        },
        &["tanh"],
    )
    .unwrap();
    g.push("sum", Op::Add, &["gmax", "gavg"]).unwrap();
    g.push("prod", Op::Mul, &["sum", "gavg"]).unwrap();
    g.push("flat", Op::Flatten, &["prod"]).unwrap();
    g.push("cat", Op::Concat { axis: 1 }, &["flat", "aux"])
        .unwrap();
    g.linear("fc", "cat", 32).unwrap();
    g.layer_norm("ln", "fc").unwrap();
    g.push("clip", Op::Clamp { min: 0.0, max: 6.0 }, &["ln"])
        .unwrap();
    g.push("drop", Op::Dropout { p: 0.1 }, &["clip"]).unwrap();
    g.linear("out", "drop", 5).unwrap();
    g.push("soft", Op::Softmax { axis: -1 }, &["out"]).unwrap();
    g.finish(LossKind::Mse, "soft").unwrap()
}

fn tokens() -> Graph {
    let mut g = GraphBuilder::new("tokens");
    g.seq_len(20);
    g.input_of(
        "tok",
        Shape(vec![Dim::Seq]),
        InputKind::Tokens { vocab: 100 },
    )
    .unwrap();
    g.push(
        "emb",
        Op::Embedding {
            vocab: 100,
            dim: 16,
        },
        &["tok"],
    )
    .unwrap();
    g.rnn("gru", "emb", Cell::Gru, 24, true, RnnBias::Double)
        .unwrap();
    g.rnn("lstm", "gru", Cell::Lstm, 16, false, RnnBias::Single)
        .unwrap();
    g.linear("fc", "lstm", 7).unwrap();
    g.finish(LossKind::CrossEntropyPerFrame, "fc").unwrap()
}

fn main() {
    let mut graphs: Vec<(String, Graph)> = zoo::NAMES
        .iter()
        .map(|n| (n.to_string(), zoo::build(n).unwrap()))
        .collect();
    graphs.push(("kitchen".into(), kitchen()));
    graphs.push(("tokens".into(), tokens()));
    let hosts = [
        CpuHost {
            threads: 2,
            l2_bytes: 512 * 1024,
            l2_ways: 8,
            gemm_kernel: GemmKernel::AVX2,
        },
        CpuHost {
            threads: 16,
            l2_bytes: 2 << 20,
            l2_ways: 8,
            gemm_kernel: GemmKernel::AVX512,
        },
    ];
    let batches = [
        1u64, 2, 3, 4, 5, 7, 8, 9, 16, 25, 31, 32, 33, 64, 100, 128, 255, 256, 1000, 4096, 65536,
        1_000_000,
    ];
    let budgets = [
        1000u64,
        1 << 20,
        3 << 20,
        64 << 20,
        1 << 30,
        6 << 30,
        80 << 30,
        1 << 40,
    ];
    for (name, g) in &graphs {
        let seqs: Vec<Option<usize>> = if g.has_seq() {
            vec![None, Some(7)]
        } else {
            vec![None]
        };
        for runtime in [Runtime::Burn, Runtime::Pytorch] {
            for optimizer in [
                Optimizer::Sgd,
                Optimizer::Momentum,
                Optimizer::Adam,
                Optimizer::Adamw,
            ] {
                for precision in [Precision::Fp32, Precision::Fp16Mixed, Precision::Bf16Mixed] {
                    for checkpointing in [false, true] {
                        for micro_batch in [None, Some(8)] {
                            for gpu in [false, true] {
                                for &seq_len in &seqs {
                                    let opts = TrainOptions {
                                        optimizer,
                                        precision,
                                        checkpointing,
                                        micro_batch,
                                        runtime,
                                        seq_len,
                                        gpu,
                                    };
                                    for (h, host) in hosts.iter().enumerate() {
                                        let p = plan_on(g, &opts, *host);
                                        let mut v = serde_json::to_value(&p).unwrap();
                                        if let Some(m) =
                                            v.get_mut("memory").and_then(|m| m.as_object_mut())
                                        {
                                            for k in ADDED {
                                                m.remove(*k);
                                            }
                                        }
                                        println!("== {name} host{h} {opts:?}");
                                        println!("{v}");
                                        let at: Vec<u64> =
                                            batches.iter().map(|&b| p.bytes_at(b).0).collect();
                                        println!("bytes_at {at:?}");
                                        let mb: Vec<Option<u64>> = budgets
                                            .iter()
                                            .map(|&b| p.max_batch(Bytes(b)))
                                            .collect();
                                        println!("max_batch {mb:?}");
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    // The detected host once, for the default options.
    let p = plan(&zoo::build("seed2-dual").unwrap(), &TrainOptions::default());
    println!(
        "== detected host: bytes_at(128) {} max_batch(1GiB) {:?}",
        p.bytes_at(128).0,
        p.max_batch(Bytes(1 << 30))
    );
}
